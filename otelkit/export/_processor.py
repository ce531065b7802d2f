"""The export pipeline otelkit owns: a batching span processor and a metric pusher.

The SDK's BatchSpanProcessor drops spans when its queue is full and only logs; it keeps
exporting with a client it built before a fork, and its shutdown waits as long as its exporter
does. Ours counts every span it loses, by reason, logs the losses at most once per interval,
rebuilds its exporter in a forked child, never blocks the thread that ends a span, and shuts
down within the time it is given: at any moment every span it took is exported, dropped (by
reason), queued, or in the export under way; when shutdown runs out of time, what is still
queued or in export is counted as dropped (``shutdown``), so nothing leaves uncounted.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader, MetricsData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otelkit import semconv
from otelkit._core.context import instrumentation_suppressed
from otelkit._core.hotmetrics import HOT, HotRegistry, with_hot_metrics

__all__ = ["BatchExportProcessor", "LossCounter", "MetricPusher", "PullReader", "within"]

logger = logging.getLogger("otelkit")


class LossCounter:
    """Counts telemetry lost, by reason, and logs it at most once per ``interval_s``."""

    def __init__(self, interval_s: float, what: str, metric: semconv.MetricSpec) -> None:
        self.interval_s = interval_s
        self.what = what
        self.metric_name = semconv.prometheus_name(metric)
        self.totals: collections.Counter[str] = collections.Counter()
        self._unlogged: collections.Counter[str] = collections.Counter()
        self._last_log = 0.0
        self._lock = threading.Lock()

    def add(self, reason: str, count: int) -> None:
        if count <= 0:
            return
        with self._lock:
            self.totals[reason] += count
            self._unlogged[reason] += count
            due = time.monotonic() - self._last_log >= self.interval_s
        if due:
            self.log()

    def log(self) -> None:
        """Log what was lost since the last log line, if anything."""
        with self._lock:
            unlogged, self._unlogged = self._unlogged, collections.Counter()
            self._last_log = time.monotonic()
        if unlogged:
            detail = ", ".join(f"{reason}: {n}" for reason, n in sorted(unlogged.items()))
            logger.warning(
                "otelkit: lost %d %s (%s); totals are in the %s metric",
                sum(unlogged.values()),
                self.what,
                detail,
                self.metric_name,
            )


#: Seconds of a shutdown's bound kept for the exporter's own shutdown (at most a quarter of it).
SHUTDOWN_RESERVE_S = 0.25


class BatchExportProcessor(SpanProcessor):
    """Queues ended, sampled spans and exports them in batches from one worker thread."""

    def __init__(
        self,
        make_exporter: Callable[[], SpanExporter],
        *,
        max_queue_size: int,
        max_batch_size: int,
        schedule_delay_s: float,
        loss: LossCounter,
    ) -> None:
        self._make_exporter = make_exporter
        self._exporter = make_exporter()
        self._max_queue_size = max_queue_size
        self._max_batch_size = max_batch_size
        self._delay_s = schedule_delay_s
        self.loss = loss
        self.exported = 0
        self.export_errors = 0
        self.in_export = 0  # spans of the batch the worker is exporting now
        self._abandoned = False  # shutdown gave up waiting and counted what was left
        self._counts = threading.Lock()  # the batch taken, its outcome and shutdown's count
        self._init_threading()
        self._shutdown = False
        self_ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _call(self_ref, "_after_fork_in_child"))

    def _init_threading(self) -> None:
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._wake = threading.Event()
        self._flush_requests: list[threading.Event] = []
        self._worker: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def _after_fork_in_child(self) -> None:
        # The parent exports what it had queued; the child starts empty with its own client.
        self._init_threading()
        try:
            self._exporter = self._make_exporter()
        except Exception:
            logger.exception("otelkit: could not rebuild the span exporter after fork")

    def queued(self) -> int:
        return len(self._queue)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:
            return
        if self._shutdown:
            self.loss.add(semconv.DROP_REASON_SHUTDOWN, 1)
            return
        if len(self._queue) >= self._max_queue_size:
            self.loss.add(semconv.DROP_REASON_QUEUE_FULL, 1)
            return
        self._queue.append(span)
        if self._abandoned:  # shutdown emptied the queue between the check above and here
            self._count_left()
            return
        if self._worker is None:
            self._start_worker()
        if len(self._queue) >= self._max_batch_size and not self._wake.is_set():
            self._wake.set()  # Event.set takes a lock: only when the worker is not yet woken

    def _start_worker(self) -> None:
        with self._start_lock:
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._run, name="otelkit-span-export", daemon=True
                )
                self._worker.start()

    def _run(self) -> None:
        while True:
            self._wake.wait(self._delay_s)
            self._wake.clear()
            requests, self._flush_requests = self._flush_requests, []
            self._drain()
            for request in requests:
                request.set()
            if self._shutdown and not self._queue:
                return

    def _drain(self) -> None:
        while True:
            with self._counts:
                if self._abandoned or not self._queue:
                    return
                batch: list[ReadableSpan] = []
                while self._queue and len(batch) < self._max_batch_size:
                    batch.append(self._queue.popleft())
                self.in_export = len(batch)
            self._export(batch)

    def _export(self, batch: Sequence[ReadableSpan]) -> None:
        """Export ``batch``; count what reached the backend and what was lost."""
        try:
            with instrumentation_suppressed():
                delivered = _delivered(self._exporter, batch)
        except Exception:
            logger.exception("otelkit: span exporter raised; %d spans lost", len(batch))
            delivered = 0
        with self._counts:
            if self._abandoned:
                return  # shutdown counted this batch as dropped when it stopped waiting
            self.in_export = 0
            self.exported += delivered
            if delivered < len(batch):
                self.export_errors += 1
                self.loss.add(semconv.DROP_REASON_EXPORT_FAILED, len(batch) - delivered)

    def counts(self) -> dict[str, int]:
        """Exported, queued and in export, read together (the dropped are in ``loss``)."""
        with self._counts:
            return {
                "exported": self.exported,
                "queued": len(self._queue),
                "in_export": self.in_export,
            }

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        if self._worker is None or not self._worker.is_alive():
            return not self._queue
        done = threading.Event()
        self._flush_requests.append(done)
        self._wake.set()
        return done.wait(timeout_millis / 1000)

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        """Export what is queued within ``timeout_millis``; count what is left as dropped.

        The exporter's own shutdown (which may wait for an export in progress) gets what is
        left of the time, in a thread of its own, so a backend that never answers cannot hold
        the process past the bound. It is kept the end of the bound (``SHUTDOWN_RESERVE_S``):
        closing its channel ends an export stuck on such a backend (gRPC cancels the call), and
        the worker is waited for once more so that the exporter's own report of that failure
        comes before the count of what was lost, not after it."""
        if self._shutdown:
            return
        deadline = time.monotonic() + timeout_millis / 1000
        reserve = min(SHUTDOWN_RESERVE_S, timeout_millis / 1000 / 4)
        self._shutdown = True
        self._wake.set()
        self._join_worker(deadline - reserve)
        with self._counts:
            self._abandoned = True  # before the queue is emptied: a late span sees it
            left = self.in_export
            self.in_export = 0
        self.loss.add(semconv.DROP_REASON_SHUTDOWN, left)
        self._count_left()
        within(deadline, self._exporter.shutdown, "span exporter shutdown")
        self._join_worker(deadline)
        self.loss.log()

    def _count_left(self) -> None:
        """Take every span still queued and count it as dropped at shutdown: span by span, so
        one that a thread appends meanwhile is either taken here or, appended after, taken by
        that thread's own call (``on_end`` checks ``_abandoned`` after appending)."""
        left = 0
        with self._counts:
            while True:
                try:
                    self._queue.popleft()
                except IndexError:
                    break
                left += 1
        self.loss.add(semconv.DROP_REASON_SHUTDOWN, left)

    def _join_worker(self, deadline: float) -> None:
        """Wait for the worker thread to end, until ``deadline`` (monotonic) at the latest."""
        worker = self._worker
        if worker is not None and worker.is_alive():
            worker.join(max(0.0, deadline - time.monotonic()))


def within(deadline: float, work: Callable[[], object], what: str) -> bool:
    """Run ``work`` in a daemon thread and wait for it until ``deadline`` (monotonic); ``False``
    when it did not finish (it goes on, and dies with the process). Exporters block on the
    network without a bound of their own: exit must not wait for them."""

    def run() -> None:
        try:
            work()
        except Exception:
            logger.exception("otelkit: %s failed", what)

    thread = threading.Thread(target=run, name=f"otelkit-{what.replace(' ', '-')}", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if thread.is_alive():
        logger.warning("otelkit: %s did not finish in time; not waiting for it", what)
        return False
    return True


def _delivered(exporter: SpanExporter, batch: Sequence[ReadableSpan]) -> int:
    """How many spans of ``batch`` ``exporter`` delivered: all or none, but for an exporter that
    can deliver part of a batch and says so (``deliver``: otelkit's OTLP/HTTP one, which halves
    a batch refused as too large)."""
    deliver = getattr(exporter, "deliver", None)
    if deliver is not None:
        return int(deliver(batch))
    return len(batch) if exporter.export(batch) is SpanExportResult.SUCCESS else 0


class PullReader(MetricReader):
    """A metric reader that collects only when asked and returns what it collected."""

    def __init__(self) -> None:
        super().__init__()
        self._latest: MetricsData | None = None
        self._read_lock = threading.Lock()

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object
    ) -> None:
        self._latest = metrics_data

    def read(self, timeout_millis: float = 10_000) -> MetricsData | None:
        with self._read_lock:
            self._latest = None
            self.collect(timeout_millis=timeout_millis)
            return self._latest

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        return None


class MetricPusher:
    """Pushes the metrics of a ``PullReader`` and of ``hot`` to an exporter every ``interval_s``.

    Like the span processor, it restarts its thread and rebuilds its exporter in a forked child.
    """

    def __init__(
        self,
        reader: PullReader,
        make_exporter: Callable[[], MetricExporter],
        interval_s: float,
        loss: LossCounter,
        resource: Resource,
        hot: HotRegistry = HOT,
    ) -> None:
        self.reader = reader
        self.resource = resource  # for the hot metrics when the SDK has none to send
        self.hot = hot
        self._make_exporter = make_exporter
        self._exporter = make_exporter()
        self._interval_s = interval_s
        self.loss = loss
        self._stop = threading.Event()
        self._start()
        self_ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _call(self_ref, "_after_fork_in_child"))

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="otelkit-metric-push", daemon=True)
        self._thread.start()

    def _after_fork_in_child(self) -> None:
        if self._stop.is_set():
            return
        self._stop = threading.Event()
        self._exporter = self._make_exporter()
        self._start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.push()

    def push(self) -> bool:
        """Collect and export once; a failure is counted, never raised."""
        try:
            data = with_hot_metrics(self.reader.read(), self.hot.collect(), self.resource)
            if data is None:
                return True
            with instrumentation_suppressed():
                ok = self._exporter.export(data).name == "SUCCESS"
        except Exception:
            logger.exception("otelkit: metric export raised")
            ok = False
        if not ok:
            self.loss.add(semconv.DROP_REASON_EXPORT_FAILED, 1)
        return ok

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Push once more and stop, within ``timeout_s``; a last push not done in time is
        counted as lost."""
        if self._stop.is_set():
            return
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        pushed: list[bool] = []
        if not within(deadline, lambda: pushed.append(self.push()), "last metric push"):
            self.loss.add(semconv.DROP_REASON_SHUTDOWN, 1)
        within(deadline, self._exporter.shutdown, "metric exporter shutdown")
        self.loss.log()


def _call(ref: weakref.ref[Any], method: str) -> None:
    target = ref()
    if target is not None:
        getattr(target, method)()
