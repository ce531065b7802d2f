"""Shared test set-up.

Real servers started once per test session; under CI a skip fails (``tests/ci_skips.py``).
"""

from __future__ import annotations

import math
import os

# otelkit's own failures re-raise in tests instead of being logged once and swallowed.
os.environ.setdefault("OTELKIT_RAISE_INTERNAL_ERRORS", "1")

from collections.abc import Iterator

import pytest

from otelkit.receiver import Receiver
from otelkit.tritonserver import TritonServer, free_port
from tests.paths import MODELS
from tests.support import GRPC_JOINS, LocalRay, TrackingServer

pytest_plugins = ["tests.ci_skips", "tests.triton_crashes", "otelkit.testing.pytest_plugin"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that need the session's Ray run last, in their own order: an idle Ray (GCS,
    raylet, Serve's controller and proxies) keeps 0.25 to 0.38 of a core busy here, which the
    tests that measure the host's CPU (the truth table, the fleet, the windows) read as another
    process's load, and Ray, once started, stays up to the session's end."""
    items[:] = sorted(items, key=lambda item: "ray_local" in getattr(item, "fixturenames", ()))


# -- real servers, started once per test session ---------------------------------------------


@pytest.fixture(scope="session")
def receiver(otelkit_receiver_server: Receiver) -> Receiver:
    """The embedded OTLP receiver, as a sink every traced server of the session exports to
    (``otelkit_receiver`` reads one test's part of it)."""
    return otelkit_receiver_server


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
        MODELS,
        trace_url=receiver.traces_url,
        trace_resource={"service.name": "triton-tests"},
        env=models_env,
    ) as server:
        yield server


@pytest.fixture(scope="session")
def tracking_triton(
    receiver: Receiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TrackingServer]:
    """A real tritonserver serving the reference deployment (``examples/gnn_tracking``).

    Requests carrying a trace context are traced, to the session's receiver; of the others
    none (tritonserver 2.51 crashes under heavy tracing: ``gnn_tracking.driving.demo``).
    """
    from gnn_tracking.serving.serve import triton_server

    log = tmp_path_factory.mktemp("gnn-triton") / "triton.log"
    server = triton_server(receiver.traces_url, log_path=log, trace_rate=1_000_000)
    with server:
        yield TrackingServer(server)


@pytest.fixture(scope="session")
def ray_local(
    tmp_path_factory: pytest.TempPathFactory, otelkit_receiver_server: Receiver
) -> Iterator[LocalRay]:
    """One local Ray for the whole session, sized for this machine's 2 cores (every test that
    needs Ray shares it: Ray allows one ``ray.init`` per process). Its metrics are served on
    ``metrics_port`` for a Prometheus to scrape. Serve's own tracing is on, through otelkit:
    its proxy exports to the session's receiver the requests whose callers sampled them."""
    import ray

    from otelkit.server.ray_serve import runtime_env

    metrics_port = free_port()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _metrics_export_port=metrics_port,
        _temp_dir=str(tmp_path_factory.mktemp("ray")),
        log_to_driver=False,
        # Serve's proxy too imports code of this checkout (the gRPC servicer function)
        runtime_env=runtime_env(
            LocalRay.replica_env(
                otelkit_receiver_server.traces_url, OTEL_SERVICE_NAME="ray-serve-proxy"
            ),
            serve_tracing=True,
        ),
    )
    try:
        yield LocalRay(metrics_port=metrics_port)
    finally:
        ray.shutdown()


def above_five_percent(resends: int, calls: int, confidence: float = 0.99) -> bool:
    """Whether ``resends`` of ``calls + resends`` attempts show a loss rate above 5 % with the
    given confidence (an exact one-sided binomial test): a handful of calls cannot tell 3 %
    from 5 %, so a bare ratio would fail at random.

    >>> above_five_percent(3, 20), above_five_percent(6, 20), above_five_percent(60, 1000)
    (False, True, False)
    """
    n = calls + resends

    def probability(k: int) -> float:  # binomial(n, 0.05) at k, in log space: n may be large
        log_comb = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
        return math.exp(log_comb + k * math.log(0.05) + (n - k) * math.log(0.95))

    return sum(probability(k) for k in range(resends, n + 1)) < 1 - confidence


@pytest.fixture(scope="session", autouse=True)
def grpc_resends_stay_rare() -> Iterator[None]:
    """Only gRPC joins may resend a call (Triton 2.51 loses a few % of gRPC contexts); the
    session fails when the resends show that more than 5 % of calls needed one."""
    yield
    calls, resends = GRPC_JOINS["calls"], GRPC_JOINS["resends"]
    assert not above_five_percent(resends, calls), f"{resends} resends for {calls} gRPC joins"


@pytest.fixture
def fresh_warnings() -> Iterator[None]:
    """Each test sees its own degradations logged (``otelkit._core.deps``: once per name)."""
    from otelkit._core import deps

    saved = dict(deps.DEGRADED)
    deps.DEGRADED.clear()
    yield
    deps.DEGRADED.clear()
    deps.DEGRADED.update(saved)
