"""GPU time and memory growth of a stage, from CUDA events recorded around it and torch.

Host wall time does not show asynchronous GPU work: a stage that launches kernels returns
before they run. A CUDA event pair measures the GPU side. Reading it means waiting for the
end event, which the stage's own thread must never do (it would serialise the pipeline), so a
worker thread waits, then records the GPU time on the span and in the histogram and ends the
span with the host end time taken when the stage finished.

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

__all__ = ["GpuRun", "finish", "start"]

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
    _worker().put((run.start_event, end_event, histogram, span, time.time_ns()))


_queue: queue.SimpleQueue[tuple[Any, Any, HistogramSeries, RecordingSpan | None, int]] | None = None
_lock = threading.Lock()


def _worker() -> queue.SimpleQueue[tuple[Any, Any, HistogramSeries, RecordingSpan | None, int]]:
    global _queue
    if _queue is None:
        with _lock:
            if _queue is None:
                _queue = queue.SimpleQueue()
                threading.Thread(target=_drain, args=(_queue,), name="otelkit-gpu-timer",
                                 daemon=True).start()  # fmt: skip
    return _queue


def _drain(
    pending: queue.SimpleQueue[tuple[Any, Any, HistogramSeries, RecordingSpan | None, int]],
) -> None:
    while True:
        start_event, end_event, histogram, span, end_ns = pending.get()
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
        if span is not None:
            span.end(end_ns)


def _after_fork() -> None:
    global _queue
    _queue = None  # the worker thread did not survive the fork


os.register_at_fork(after_in_child=_after_fork)
