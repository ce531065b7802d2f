"""Progress of a sweep on the terminal: a bar for the running point and one for the sweep.

On a terminal the running point's line is redrawn twice a second: the point's bar (its planned
warm-up and measured time), requests so far, then the sweep's bar (points done, with the time
left estimated from the points so far). Elsewhere (a log file, CI) only the finished points
are written.

>>> import io
>>> out = io.StringIO()
>>> progress = Progress(2, stream=out)
>>> progress.start(0, "concurrency=1", planned_s=6.0)
>>> progress.done(0, "concurrency=1", "95.0 requests/s, p99 12.1 ms")
>>> print(out.getvalue().strip())
[1/2] concurrency=1: 95.0 requests/s, p99 12.1 ms
>>> sweep_bar(done=3, total=8, elapsed_s=60.0)
'sweep [#######.............] 3/8, 1m00s, ~1m40s left'
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress", "sweep_bar"]


def bar(share: float, width: int = 20) -> str:
    """``[####......]``: ``share`` (0 to 1) of ``width`` filled."""
    filled = int(min(1.0, max(0.0, share)) * width)
    return f"[{'#' * filled}{'.' * (width - filled)}]"


def _clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{rest}s"


def sweep_bar(done: int, total: int, elapsed_s: float, running_s: float = 0.0) -> str:
    """The sweep's bar: ``done`` of ``total`` points in ``elapsed_s``; the time left is the
    mean time of the points done for each point to come, less the running one's ``running_s``."""
    left = ""
    if 0 < done < total:
        per_point = (elapsed_s - running_s) / done
        left = f", ~{_clock(max(0.0, per_point * (total - done) - running_s))} left"
    return f"sweep {bar(done / total if total else 1.0)} {done}/{total}, {_clock(elapsed_s)}{left}"


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
        self._sweep_started = self._started
        self._done = 0

    def start(self, index: int, label: str, planned_s: float) -> None:
        """A point begins; ``planned_s`` is its warm-up and measured time (0 when unknown)."""
        self._index, self._label, self._planned = index, label, planned_s
        self._started = time.monotonic()
        self._draw("starting")

    def tick(self, elapsed_s: float, done: int) -> None:
        """Called by the driver twice a second: ``done`` requests answered so far."""
        point = f"{bar(elapsed_s / self._planned)} " if self._planned > 0 else ""
        self._draw(f"{point}{elapsed_s:.1f} s, {done} requests")

    def note(self, text: str) -> None:
        """A step between the load and the next point (restarting a server, reading traces)."""
        self._draw(text)

    def done(self, index: int, label: str, text: str) -> None:
        """A point is over: its line stays."""
        self._done = index + 1
        if not self.enabled:
            return
        end = "\r\033[K" if self._live else ""
        self.stream.write(f"{end}[{index + 1}/{self.total}] {label}: {text}\n")
        if self._live and self._done < self.total:
            self.stream.write(self._sweep(0.0))
        self.stream.flush()

    def _sweep(self, running_s: float) -> str:
        elapsed = time.monotonic() - self._sweep_started
        return sweep_bar(self._done, self.total, elapsed, running_s)

    def _draw(self, text: str) -> None:
        if not self._live:
            return
        running = time.monotonic() - self._started
        line = f"[{self._index + 1}/{self.total}] {self._label}: {text} | {self._sweep(running)}"
        self.stream.write(f"\r\033[K{line}")
        self.stream.flush()
