"""The CPU time of a group of threads, counted apart from the rest of their process.

A tool that runs in the process it serves (the embedded trace receiver in a study's client)
puts its threads in a ``ThreadGroup``, so that the process's CPU figure can leave them out. A
member thread is known by its native id and, where the platform has one, by its CPU clock,
read while the thread runs (``clock_gettime``, nanoseconds); else by
``/proc/self/task/<id>/stat`` (clock ticks, Linux). A thread that ends adds its CPU time to the
group's as it leaves. Where a member's time cannot be read, ``cpu_s`` is ``None``.

>>> group = ThreadGroup()
>>> with group.member():
...     spent = group.cpu_s()
>>> spent is None or spent >= 0.0, group.native_ids
(True, set())
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

__all__ = ["ThreadGroup"]


class ThreadGroup:
    """Threads whose CPU time is counted together: the live members' and the ended ones'."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clocks: dict[int, int | None] = {}  # native id -> the thread's CPU clock
        self._ended_s = 0.0

    @contextlib.contextmanager
    def member(self) -> Iterator[None]:
        """Count the calling thread in the group while the block runs."""
        native = threading.get_native_id()
        with self._lock:
            self._clocks[native] = _own_clock()
        try:
            yield
        finally:
            with self._lock:  # its time moves to the ended ones' at once: no gap, no overlap
                del self._clocks[native]
                self._ended_s += time.thread_time()

    @property
    def native_ids(self) -> set[int]:
        """The native ids of the live members."""
        with self._lock:
            return set(self._clocks)

    def cpu_s(self) -> float | None:
        """CPU seconds the group's threads have used, the ended ones' included; ``None`` when
        a live member's cannot be read on this platform."""
        with self._lock:
            total = self._ended_s
            for native, clock in self._clocks.items():
                spent = _thread_cpu_s(native, clock)
                if spent is None:
                    return None
                total += spent
            return total


def _own_clock() -> int | None:
    """The calling thread's CPU clock (read from another thread by ``clock_gettime``)."""
    try:
        return time.pthread_getcpuclockid(threading.get_ident())
    except (AttributeError, OSError):  # not on every platform
        return None


def _thread_cpu_s(native: int, clock: int | None) -> float | None:
    if clock is not None:
        with contextlib.suppress(OSError):
            return time.clock_gettime(clock)
    try:
        with open(f"/proc/self/task/{native}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except (OSError, ValueError, IndexError):
        return None
