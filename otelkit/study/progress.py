"""Progress of a sweep on the terminal: a line per point, redrawn while it runs on a terminal.

On a terminal the running point's line is redrawn twice a second (elapsed time, requests so
far, the sweep's share done); elsewhere (a log file, CI) only the finished points are written.

>>> import io
>>> out = io.StringIO()
>>> progress = Progress(2, stream=out)
>>> progress.start(0, "concurrency=1", planned_s=6.0)
>>> progress.done(0, "concurrency=1", "95.0 requests/s, p99 12.1 ms")
>>> print(out.getvalue().strip())
[1/2] concurrency=1: 95.0 requests/s, p99 12.1 ms
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """Reports on ``total`` points to ``stream`` (standard error by default)."""

    def __init__(self, total: int, *, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self._live = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self._label = ""
        self._index = 0
        self._planned = 0.0
        self._started = time.monotonic()

    def start(self, index: int, label: str, planned_s: float) -> None:
        """A point begins; ``planned_s`` is its warm-up and measured time (0 when unknown)."""
        self._index, self._label, self._planned = index, label, planned_s
        self._started = time.monotonic()
        self._draw("starting")

    def tick(self, elapsed_s: float, done: int) -> None:
        """Called by the driver twice a second: ``done`` requests answered so far."""
        bar = ""
        if self._planned > 0:
            share = min(1.0, elapsed_s / self._planned)
            filled = int(share * 20)
            bar = f"[{'#' * filled}{'.' * (20 - filled)}] "
        self._draw(f"{bar}{elapsed_s:.1f} s, {done} requests")

    def note(self, text: str) -> None:
        """A step between the load and the next point (restarting a server, reading traces)."""
        self._draw(text)

    def done(self, index: int, label: str, text: str) -> None:
        """A point is over: its line stays."""
        if not self.enabled:
            return
        end = "\r\033[K" if self._live else ""
        self.stream.write(f"{end}[{index + 1}/{self.total}] {label}: {text}\n")
        self.stream.flush()

    def _draw(self, text: str) -> None:
        if not self._live:
            return
        sweep = f"sweep {self._index}/{self.total} done"
        line = f"[{self._index + 1}/{self.total}] {self._label}: {text} ({sweep})"
        self.stream.write(f"\r\033[K{line}")
        self.stream.flush()
