"""GPU time and memory growth of a stage, from CUDA events recorded around it and torch.

Host wall time does not show asynchronous GPU work: a stage that launches kernels returns
before they run. A CUDA event pair measures the GPU side. Reading it means waiting for the
end event, which the stage's own thread must never do (it would serialise the pipeline), so a
worker thread waits, then records the GPU time on the span and in the histogram and ends the
span with the host end time taken when the stage finished. ``flush`` and ``shutdown`` wait for
it (``wait_idle``, bounded); spans it has not ended by then are counted as dropped.

torch is never imported here: a process that has not imported torch has no CUDA work to time.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from typing import Any

from otelkit import semconv
from otelkit._core.hotmetrics import HistogramSeries
from otelkit._core.spans import RecordingSpan

__all__ = ["GpuRun", "abandon", "finish", "pending_spans", "start", "wait_idle"]

logger = logging.getLogger("otelkit")
_warned = False


class GpuRun:
    __slots__ = ("allocated", "start_event", "torch")

    def __init__(self, torch: Any, start_event: Any) -> None:
        self.torch = torch
        self.start_event = start_event
        self.allocated: int = torch.cuda.memory_allocated()  # a host-side counter: no wait


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        logger.warning("otelkit: %s; stages are timed on the host only", message)


def start(gpu: bool | None) -> GpuRun | None:
    """Record the start event if this stage is to be timed on the GPU; else ``None``."""
    if gpu is False:
        return None
    torch = sys.modules.get("torch")
    if torch is None:
        if gpu:
            _warn_once("a stage asked for GPU timing, but torch is not imported")
        return None
    cuda = torch.cuda
    if gpu is None and not cuda.is_initialized():
        return None
    if not cuda.is_available():
        _warn_once("a stage asked for GPU timing, but CUDA is not available")
        return None
    event = cuda.Event(enable_timing=True)
    event.record()
    return GpuRun(torch, event)


def finish(run: GpuRun, histogram: HistogramSeries, span: RecordingSpan | None) -> None:
    """Record the end event; the worker adds the GPU time and ends ``span`` (if sampled).

    The span also gets the growth of torch's allocated memory over the stage.
    """
    cuda = run.torch.cuda
    end_event = cuda.Event(enable_timing=True)
    end_event.record()
    if span is not None:
        span.attributes[semconv.STAGE_GPU_MEMORY_GROWTH] = cuda.memory_allocated() - run.allocated
    with _lock:
        _pending[span is not None] += 1
    _worker().put((run.start_event, end_event, histogram, span, time.time_ns(), _epoch))


def pending_spans() -> int:
    """Sampled stage spans the worker has not ended yet."""
    return _pending[True]


def abandon() -> int:
    """Shutdown gives up on the stages still waiting: their spans will not be ended (the
    caller counts them as dropped, once); returns how many spans that is."""
    global _epoch
    with _lock:
        _epoch += 1
        return _pending[True]


def wait_idle(timeout_s: float) -> bool:
    """Wait until the worker has ended every stage handed to it, at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    with _idle:
        while _pending[True] or _pending[False]:
            left = deadline - time.monotonic()
            if left <= 0 or not _idle.wait(left):
                return False
    return True


# start event, end event, histogram, span (None when not sampled), host end time, epoch
_Item = tuple[Any, Any, HistogramSeries, RecordingSpan | None, int, int]
_epoch = 0  # spans handed in before the last ``abandon`` are not ended
_pending = {True: 0, False: 0}  # stages handed to the worker and not done, with a span or not
_queue: queue.SimpleQueue[_Item] | None = None
_lock = threading.Lock()
_idle = threading.Condition(_lock)


def _worker() -> queue.SimpleQueue[_Item]:
    global _queue
    if _queue is None:
        with _lock:
            if _queue is None:
                _queue = queue.SimpleQueue()
                threading.Thread(
                    target=_drain, args=(_queue,), name="otelkit-gpu-timer", daemon=True
                ).start()
    return _queue


def _drain(
    pending: queue.SimpleQueue[_Item],
) -> None:
    while True:
        start_event, end_event, histogram, span, end_ns, epoch = pending.get()
        try:
            end_event.synchronize()
            seconds = start_event.elapsed_time(end_event) / 1e3
            if span is None:
                histogram.observe(seconds)
                continue
            context = span.context
            histogram.observe(seconds, context.trace_id, context.span_id)
            span.attributes[semconv.STAGE_GPU_S] = seconds
        except Exception:
            logger.exception("otelkit: reading a stage's CUDA events failed")
        if span is not None and epoch == _epoch:
            span.end(end_ns)
        with _idle:
            _pending[span is not None] -= 1
            if not (_pending[True] or _pending[False]):
                _idle.notify_all()


def _after_fork() -> None:
    global _queue, _lock, _idle
    _queue = None  # the worker thread did not survive the fork; the parent ends its stages
    _lock = threading.Lock()
    _idle = threading.Condition(_lock)
    _pending[True] = _pending[False] = 0


os.register_at_fork(after_in_child=_after_fork)
