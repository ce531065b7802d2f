"""The reference pipeline on Ray Serve (``gnn_tracking.serving.ray_app``), on a real local Ray,
called by the same instrumented ``tritonclient.http`` code as Triton and the FastAPI twin."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch
from gnn_tracking.driving.client import event_pool
from gnn_tracking.driving.options import OPTIONS, PACK, ROOT_SPAN, UNPACK, Remote, reconstruct
from gnn_tracking.physics.models import Models, load_models
from gnn_tracking.serving.stages import ENSEMBLE_STAGE, FEATURES, STAGE_ORDER, TRACK_LABELS
from opentelemetry import trace

import otelkit
from otelkit import semconv
from otelkit.analysis import Span, build_traces
from otelkit.analysis._breakdown import SERVER_OTHER, SERVER_QUEUE, TOTAL, trace_components
from otelkit.receiver import Receiver
from otelkit.testing import ReceiverCapture, tree
from otelkit.tritonserver import free_port
from tests.support import LocalRay, TrackingServer

pytest.importorskip("ray.serve")


@pytest.fixture(scope="module")
def ray_grpc_url() -> str:
    """Where Serve's gRPC proxy serves the KServe v2 gRPC service (started by ``ray_url``)."""
    return f"127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def ray_url(
    ray_local: LocalRay, otelkit_receiver_server: Receiver, ray_grpc_url: str
) -> Iterator[str]:
    from gnn_tracking.serving.ray_app import ray_serve_app

    otelkit.configure(
        service_name="gnn-tracking-ray-tests",
        traces_endpoint=otelkit_receiver_server.traces_url,
        bsp_schedule_delay_ms=50,
    )
    with ray_serve_app(
        otelkit_receiver_server.traces_url,
        env_vars={"OTEL_BSP_SCHEDULE_DELAY": "50"},
        grpc_port=int(ray_grpc_url.rsplit(":", 1)[1]),
    ) as url:
        yield url
    otelkit.shutdown()


@pytest.fixture(scope="module")
def models() -> Models:
    return load_models()


@pytest.fixture(scope="module")
def events() -> list[torch.Tensor]:
    return event_pool(3, 30, seed=31)


@pytest.mark.triton
def test_ray_serve_and_triton_give_the_same_track_labels(
    ray_url: str,
    ray_grpc_url: str,
    tracking_triton: TrackingServer,
    models: Models,
    events: list[torch.Tensor],
) -> None:
    from gnn_tracking.serving.ray_app import COMPOSED

    triton = Remote(tracking_triton.server.http_url, "http")
    rays = [Remote(ray_url, "http"), Remote(ray_grpc_url, "grpc")]  # HTTP and gRPC proxies
    composed = dataclasses.replace(ENSEMBLE_STAGE, name=COMPOSED)
    for features in events:
        expected = reconstruct(OPTIONS[0], features, models, None)
        assert torch.equal(reconstruct(OPTIONS[4], features, None, triton), expected)
        for ray in rays:
            assert torch.equal(reconstruct(OPTIONS[4], features, None, ray), expected)
            assert torch.equal(reconstruct(OPTIONS[3], features, None, ray), expected)
            assert torch.equal(ray.infer(composed, {FEATURES: features})[TRACK_LABELS], expected)
    for remote in [triton, *rays]:
        remote.close()


def spans_root(spans: list[Span]) -> Span:
    (root,) = [s for s in spans if s.parent_span_id is None]
    return root


def _composed_trace(
    ray: Remote, spans: ReceiverCapture, features: torch.Tensor
) -> tuple[str, list[Span]]:
    """One event through the composed stage deployments, under a root span: its trace."""
    from gnn_tracking.serving.ray_app import COMPOSED

    composed = dataclasses.replace(ENSEMBLE_STAGE, name=COMPOSED)
    with trace.get_tracer("tests").start_as_current_span(ROOT_SPAN) as root:
        trace_id = f"{root.get_span_context().trace_id:032x}"
        ray.infer(composed, {FEATURES: features})
    ray.close()
    otelkit.flush()
    return trace_id, spans.wait_for_trace(trace_id, 8 + 5 * len(STAGE_ORDER))


def _composed_tree(client: str, proxy: str, method: str, server: str) -> list[tuple[int, str, str]]:
    """The tree of ``_composed_trace``: client, Serve's proxy, router and replica spans (its
    own tracing, on in the session's Ray) around the ingress, then each stage's wait, Serve's
    router and replica spans around its deployment's span, and its stage span."""
    from gnn_tracking.serving.ray_app import COMPOSED

    rows = [
        (0, ROOT_SPAN, "INTERNAL"),
        (1, PACK, "INTERNAL"),
        (1, f"{client} {COMPOSED}", "CLIENT"),
        (2, proxy, "SERVER"),
    ]
    if method == "ModelInfer":  # Serve's gRPC proxy calls the ingress through a handle
        rows.append((3, semconv.RAY_SERVE_QUEUE_SPAN, "INTERNAL"))
    rows += [
        (3, f"route_to_replica Ingress {method}", "SERVER"),
        (4, f"replica_handle_request Ingress {method}", "SERVER"),
        (5, server, "SERVER"),
    ]
    for name in STAGE_ORDER:
        rows += [
            (6, semconv.RAY_SERVE_QUEUE_SPAN, "INTERNAL"),
            (6, f"route_to_replica stage_{name} run", "SERVER"),
            (7, f"replica_handle_request stage_{name} run", "SERVER"),
            (8, f"stage_{name}.run", "SERVER"),
            (9, name, "INTERNAL"),
        ]
    return [*rows, (1, UNPACK, "INTERNAL")]


def test_composed_deployments_trace_from_client_to_every_stage(
    ray_url: str, otelkit_receiver: ReceiverCapture, events: list[torch.Tensor]
) -> None:
    from gnn_tracking.serving.ray_app import COMPOSED

    route = "/v2/models/{model_name}/infer"
    trace_id, spans = _composed_trace(Remote(ray_url, "http"), otelkit_receiver, events[0])
    proxy = f"proxy_http_request Ingress POST /v2/models/{COMPOSED}/infer"
    assert tree(spans) == _composed_tree("v2/models/infer", proxy, "__call__", f"POST {route}")
    by_id = {span.span_id: span for span in spans}
    for span in spans:  # each of otelkit's spans inside its parent, on this host's one clock
        parent = by_id.get(span.parent_span_id or "")
        while parent is not None and parent.scope.startswith("ray."):
            parent = by_id.get(parent.parent_span_id or "")  # Serve's own end late
        if parent is not None and not span.scope.startswith("ray."):
            assert parent.start_ns <= span.start_ns <= span.end_ns <= parent.end_ns, span.name
    components, problems = trace_components(build_traces(spans)[trace_id], spans_root(spans))
    assert problems == []
    assert components[SERVER_QUEUE] > 0  # the queued spans: the wait for each stage's replica
    assert {f"server {name}" for name in STAGE_ORDER} <= components.keys()
    # each deployment's own time (its span less its calls and stages) is a part of its own
    deployments = {
        str(s.attributes[semconv.RAY_SERVE_DEPLOYMENT])
        for s in spans
        if s.kind.name == "SERVER" and semconv.RAY_SERVE_DEPLOYMENT in s.attributes
    }
    replicas = {f"server {name} replica" for name in deployments}
    assert len(replicas) == 1 + len(STAGE_ORDER)
    assert all(components.get(name, 0.0) > 0 for name in replicas), components
    assert abs(components[SERVER_OTHER]) < 1e-6, components
    assert sum(v for k, v in components.items() if k != TOTAL) == pytest.approx(
        components[TOTAL], rel=1e-6
    )
    (server,) = [s for s in spans if s.name == f"POST {route}"]
    assert server.attributes[semconv.RAY_SERVE_DEPLOYMENT] == "Ingress"
    assert server.attributes[semconv.HTTP_ROUTE] == route


def test_a_grpc_call_through_serves_grpc_proxy_is_one_trace(
    ray_url: str, ray_grpc_url: str, otelkit_receiver: ReceiverCapture, events: list[torch.Tensor]
) -> None:
    _, spans = _composed_trace(Remote(ray_grpc_url, "grpc"), otelkit_receiver, events[0])
    # the proxy's call is parented on the gRPC metadata
    proxy = f"proxy_grpc_request Ingress /{semconv.RPC_METHOD_GRPC_INFER}"
    expected = _composed_tree(
        semconv.RPC_METHOD_GRPC_INFER, proxy, "ModelInfer", "Ingress.ModelInfer"
    )
    assert tree(spans) == expected
    (server,) = [s for s in spans if s.name == "Ingress.ModelInfer"]
    assert server.attributes[semconv.RAY_SERVE_DEPLOYMENT] == "Ingress"
    assert server.attributes[semconv.RAY_SERVE_APPLICATION] == "gnn-tracking"
