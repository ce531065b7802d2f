"""The engines a fleet runs on one machine (etcd, Envoy) as child processes: for ``make fleet``,
a study's fleet, the benchmarks and the tests. A site runs its own."""

from __future__ import annotations

import http.client
import signal
import subprocess
import time
from pathlib import Path

from otelkit._errors import FleetError

__all__ = ["LocalProcess"]


class LocalProcess:
    """A child process with its output appended to ``log``: ``start()`` returns once
    ``serving()`` says it serves (``FleetError`` with the log's tail when it exits first or
    does not within ``timeout_s``); ``stop()`` ends it, killing it when it does not end."""

    what = "the process"

    def __init__(self, log: str | Path) -> None:
        self.log = Path(log)
        self._process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def serving(self) -> bool:
        """Whether it serves yet; an ``OSError`` or a malformed answer counts as not yet."""
        raise NotImplementedError

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float = 30.0) -> LocalProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._process.poll() is None:
            try:
                if self.serving():
                    return self
            except (OSError, ValueError, http.client.HTTPException):
                pass
            time.sleep(0.05)
        self.stop()
        tail = self.log.read_text(errors="replace")[-2000:]
        raise FleetError(f"{self.what} did not serve within {timeout_s} s: {tail}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.send_signal(sig)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=timeout_s)

    def __enter__(self) -> LocalProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
