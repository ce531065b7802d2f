"""Helpers the test folders share: what a test needs from the machine, and waiting for traces."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from otelkit import semconv
from otelkit.analysis import Span, load_spans
from otelkit.testing import Capture
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


@dataclass(frozen=True)
class LocalRay:
    """The session's local Ray (``ray_local``): connected in the test process."""

    metrics_port: int

    @staticmethod
    def replica_env(traces_url: str, **extra: str) -> dict[str, str]:
        """What Ray Serve replicas of the tests need: this checkout's otelkit, tests and
        examples on their path (whatever the venv installed), spans to ``traces_url`` soon."""
        root = Path(__file__).resolve().parents[1]
        return {
            "PYTHONPATH": f"{root}:{root / 'examples'}",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces_url,
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            **extra,
        }


class _TraceFiles(Capture):
    """The spans of the trace files under a folder, read again at each look."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def spans(self) -> list[Span]:
        return load_spans(self.directory)

    def clear(self) -> None:
        raise NotImplementedError("trace files are read whole")


def wait_for_trace(directory: Path, trace_id: str, count: int, timeout: float = 15.0) -> list[Span]:
    """The spans of one trace once ``count`` of them have arrived; fails after ``timeout``."""
    return _TraceFiles(directory).wait_for_trace(trace_id, count, timeout)


#: gRPC calls that ``joined_trace`` joined to Triton's trace, and how many needed a resend
#: (conftest's session check fails when more than 5 % did).
GRPC_JOINS = {"calls": 0, "resends": 0}


def _protocol_of(spans: list[Span]) -> str | None:
    """The protocol of the CLIENT span among ``spans``, when otelkit made one."""
    for span in spans:
        if span.kind.name == "CLIENT":
            system = span.attributes.get(semconv.RPC_SYSTEM_NAME)
            return "grpc" if system == semconv.RPC_SYSTEM_TRITON_GRPC else "http"
    return None


def joined_trace(
    call: Callable[[], str],
    directory: Path,
    count: int,
    attempts: int = 3,
    protocol: str | None = None,
) -> tuple[str, list[Span]]:
    """Run ``call`` (it returns a trace id) until Triton's spans join that trace.

    Triton 2.51 loses the ``traceparent`` of about 2-3 % of gRPC requests: its gRPC carrier
    reads the metadata value with ``strlen`` past its end, the parse fails and the request
    starts a trace of its own. A gRPC request hit by that is sent again, at most ``attempts``
    times, and counted in ``GRPC_JOINS``. An HTTP request must join on the first try.
    ``protocol``: the call's, when its trace has no otelkit CLIENT span that says it.
    """
    for attempt in range(1, attempts + 1):
        trace_id = call()
        deadline = time.monotonic() + 5.0
        spans: list[Span] = []
        while time.monotonic() < deadline:
            spans = [s for s in load_spans(directory) if s.trace_id == trace_id]
            if len(spans) >= count:
                break
            time.sleep(0.05)
        called = protocol or _protocol_of(spans)
        if len(spans) >= count:
            if called == "grpc":
                GRPC_JOINS["calls"] += 1
            return trace_id, spans
        if called != "grpc" or attempt == attempts:
            return trace_id, wait_for_trace(directory, trace_id, count, timeout=0)
        GRPC_JOINS["resends"] += 1
    raise AssertionError("unreachable")


def otelkit_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What otelkit's logger said, line by line (its degradations begin ``otelkit: ``)."""
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("otelkit: ")]
