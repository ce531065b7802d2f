"""Helpers the test folders share: what a test needs from the machine, and waiting for traces."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from otelkit.analysis import Span, load_spans
from otelkit.tritonserver import TritonServer


def require_binary(name: str) -> str:
    """Path of an executable that a test needs; skip locally, fail under CI, when missing."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (make test installs it)")
    return path


@dataclass(frozen=True)
class TrackingServer:
    """The reference deployment's Triton; stage model ``i`` serves ``/metrics`` on
    ``models_metrics_port + i`` (``gnn_tracking.serving.stages.STAGE_ORDER``, from 1)."""

    server: TritonServer
    models_metrics_port: int


def wait_for_trace(directory: Path, trace_id: str, count: int, timeout: float = 15.0) -> list[Span]:
    """The spans of one trace once ``count`` of them have arrived; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        spans = [s for s in load_spans(directory) if s.trace_id == trace_id]
        if len(spans) >= count or time.monotonic() > deadline:
            assert len(spans) >= count, (
                f"trace {trace_id}: {len(spans)} of {count} spans arrived: "
                f"{sorted((s.name, s.parent_span_id) for s in spans)}"
            )
            return spans
        time.sleep(0.05)


def joined_trace(
    call: Callable[[], str], directory: Path, count: int, attempts: int = 3
) -> tuple[str, list[Span]]:
    """Run ``call`` (it returns a trace id) until Triton's spans join that trace.

    Triton 2.51 loses the ``traceparent`` of about 2-3 % of gRPC requests: its gRPC carrier
    reads the metadata value with ``strlen`` past its end, the parse fails and the request
    starts a trace of its own. A request hit by that is sent again, at most ``attempts`` times.
    """
    for attempt in range(1, attempts + 1):
        trace_id = call()
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            spans = [s for s in load_spans(directory) if s.trace_id == trace_id]
            if len(spans) >= count:
                return trace_id, spans
            time.sleep(0.05)
        if attempt == attempts:
            return trace_id, wait_for_trace(directory, trace_id, count, timeout=0)
    raise AssertionError("unreachable")
