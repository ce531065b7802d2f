"""Shared test set-up.

Under CI (``CI=true``) a skipped test fails unless it is marked ``gpu``: every other component
(Triton, Prometheus, uvicorn) runs on CI's machines, so a skip there would hide a missing install.
"""

from __future__ import annotations

import os

# otelkit's own failures re-raise in tests instead of being logged once and swallowed.
os.environ.setdefault("OTELKIT_RAISE_INTERNAL_ERRORS", "1")

import shutil
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from otelkit.analysis import Span, load_spans
from otelkit.receiver import Receiver
from otelkit.tritonserver import TritonServer, free_port

ON_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_binary(name: str) -> str:
    """Path of an executable that a test needs; skip locally, fail under CI, when missing."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (make test installs it)")
    return path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report = outcome.get_result()
    if ON_CI and report.skipped and item.get_closest_marker("gpu") is None:
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"skipped under CI, where only GPU tests may skip: {reason}"


# -- real servers, started once per test session ---------------------------------------------

MODELS = Path(__file__).parent / "models"


@pytest.fixture(scope="session")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    """The embedded OTLP receiver, as a sink every traced server of the session exports to."""
    with Receiver(tmp_path_factory.mktemp("receiver"), max_concurrent=16) as running:
        yield running


@pytest.fixture(scope="session")
def model_metrics_port() -> int:
    """The Prometheus port of otelkit inside the Python-backend models of the ``triton`` fixture."""
    return free_port()


@pytest.fixture(scope="session")
def triton(receiver: Receiver, model_metrics_port: int) -> Iterator[TritonServer]:
    """A real tritonserver (from nvidia-pytriton) serving tests/models, tracing every request.

    otelkit inside its Python-backend models exports spans to the same receiver and serves
    its metrics on ``model_metrics_port``.
    """
    models_env = {
        "OTEL_SERVICE_NAME": "triton-models",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.traces_url,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTELKIT_METRICS_EXPORTER": "prometheus",
        "OTELKIT_PROMETHEUS_PORT": str(model_metrics_port),
        "OTELKIT_PROMETHEUS_HOST": "127.0.0.1",
    }
    with TritonServer(
        MODELS, trace_url=receiver.traces_url, trace_resource={"service.name": "triton-tests"},
        env=models_env,
    ) as server:  # fmt: skip
        yield server


@dataclass(frozen=True)
class TrackingServer:
    """The reference deployment's Triton; stage model ``i`` serves ``/metrics`` on
    ``models_metrics_port + i`` (``gnn_tracking.stages.STAGE_ORDER``, from 1)."""

    server: TritonServer
    models_metrics_port: int


@pytest.fixture(scope="session")
def tracking_triton(
    receiver: Receiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TrackingServer]:
    """A real tritonserver serving the reference deployment (``examples/gnn_tracking``).

    Requests carrying a trace context are traced, to the session's receiver; of the others
    none (tritonserver 2.51 crashes under heavy tracing: ``gnn_tracking.demo``).
    """
    from gnn_tracking.serve import models_metrics_base, triton_server

    port = models_metrics_base()
    log = tmp_path_factory.mktemp("gnn-triton") / "triton.log"
    with triton_server(
        receiver.traces_url, models_metrics_port=port, log_path=log, trace_rate=1_000_000
    ) as server:
        yield TrackingServer(server, port)


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
