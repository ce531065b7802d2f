"""Work taken off the caller's path: what is left of a call once its result is in hand.

Ending a sampled call (the span's phases and attributes, four metrics with an exemplar, the
``ReadableSpan`` to the export queue) is the largest part of its telemetry, right after a
network wait, and none of it changes what the caller gets. So the call hands that work to
``LATER`` (``add``) and returns; a background thread runs it within about 10 ms, in batches,
mostly while the caller waits on the network again. Polling, not a wake-up per call: waking
the thread as each call ended made it contend for the GIL with the caller's next request and
cost more latency than it saved; and handing the GIL back after every item instead of every
batch multiplied the CPU cost per call (CHANGELOG.md, "Overhead history", has the figures).

Whoever needs the results now drains first, so nothing read is stale: the metric snapshot
(``HOT.collect``) and, through ``DrainFirst``, the first span processor of otelkit's tracer
provider, a ``force_flush`` or ``shutdown`` of it (``otelkit.flush()``, ``shutdown()``, exit).

Nothing is lost unseen: when ``limit`` items wait (a starved worker), a caller runs its own
work at once; a failure in the work is counted (``failed``, and in the health metric
``otelkit.telemetry.internal.errors``) and logged, never raised (but by the next ``drain``
when ``OTELKIT_RAISE_INTERNAL_ERRORS=1``, as in otelkit's tests). A forked child drops what
its parent had pending (the parent ends those) and starts a worker of its own.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable

from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from otelkit import _errors as errors
from otelkit._core.guard import caught

__all__ = ["LATER", "DrainFirst", "Later"]

Work = Callable[[], None]
_CHUNK = 64  # items run per hold of the lock (and, mostly, of the GIL)


class Later:
    """A queue of zero-argument callables (``waiting``), run by a polling daemon thread or by
    ``drain``. ``add`` is the way in; the hottest caller, a client call's end, does its check
    and append inline, in one place (``client._call.MeteredCall.finish``), since the frame
    measurably costs every call."""

    def __init__(self, interval_s: float = 0.01, limit: int = 4096) -> None:
        self._interval_s = interval_s
        self.limit = limit
        self.waiting: deque[Work] = deque()
        self._each_cycle: list[Work] = []
        self.failed = 0
        self._failure: Exception | None = None
        # Held while items run: drain waits for the worker's. Reentrant, because SIGTERM's flush
        # runs on the main thread, which may hold it already (a flush, the overflow path).
        self._lock = threading.RLock()
        self._closed = False
        self._thread: threading.Thread | None = None  # started by ``start``: nothing at import

    def start(self) -> None:
        """Start the worker thread unless it runs (``configure()`` and ``instrument()`` do)."""
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._start_worker()

    def add(self, work: Work) -> None:
        """Run ``work`` soon, off this thread (at once, here, when too much waits)."""
        items = self.waiting
        if len(items) < self.limit:
            items.append(work)  # one step of C code under the GIL: no lock needed
            if self._thread is None:
                self.start()
            return
        with self._lock:
            self._run(work)

    def each_cycle(self, work: Work) -> None:
        """Run ``work`` every time the worker wakes, before the items (e.g. to prepare what
        calls will take ready-made)."""
        self._each_cycle.append(work)

    def pending(self) -> int:
        return len(self.waiting)

    def drain(self, timeout_s: float | None = None) -> bool:
        """Run everything handed in so far; on return, all of it has run (the item the worker
        was running included). With ``timeout_s``, give up waiting for the worker after that
        long and return ``False``: an exit path must not hang on it."""
        items = self.waiting
        if not self._lock.acquire(timeout=-1 if timeout_s is None else timeout_s):
            return False
        try:
            while items:
                self._run(items.popleft())
        finally:
            self._lock.release()
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure
        return True

    def close(self) -> None:
        """Stop the worker after it ran what waits (for instances other than ``LATER``)."""
        self._closed = True
        self.drain()

    def _work(self) -> None:
        items = self.waiting
        while not self._closed:
            time.sleep(self._interval_s)
            with self._lock:
                for work in self._each_cycle:
                    self._run(work)
            while items:
                with self._lock:
                    for _ in range(min(len(items), _CHUNK)):
                        self._run(items.popleft())
                time.sleep(0)  # between chunks, not items: each hand-over of the GIL costs CPU

    def _run(self, work: Work) -> None:
        try:
            work()
        except Exception as error:
            self.failed += 1
            if errors.RAISE_INTERNAL_ERRORS:
                self._failure = error  # raised by the next drain, where a test sees it
            else:
                caught("ending a call's span and metrics")

    def _start_worker(self) -> None:
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="otelkit-later", daemon=True)
        self._thread.start()

    def _after_fork_in_child(self) -> None:
        self.waiting.clear()
        self._lock = threading.RLock()
        if self._thread is not None:  # the parent's worker is gone: the child gets its own
            self._start_worker()


class DrainFirst(SpanProcessor):
    """The first span processor of otelkit's tracer provider: a flush or a shutdown of the
    provider first ends the calls still waiting in ``later``, so their spans are exported."""

    def __init__(self, later: Later, timeout_s: float = 5.0) -> None:
        self._later = later
        self._timeout_s = timeout_s  # a provider's shutdown passes no bound of its own

    def on_start(self, span: Span, parent_context: object = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._later.drain(timeout_millis / 1000)

    def shutdown(self) -> None:
        self._later.drain(self._timeout_s)


LATER = Later()
os.register_at_fork(after_in_child=LATER._after_fork_in_child)
