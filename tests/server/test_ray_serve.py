"""Ray Serve traced by otelkit, on a real local Ray: an HTTP ingress composed with a child and a
batched deployment through handles (``tests/server/ray_apps.py``), each replica exporting to
the session's receiver (read through ``otelkit_receiver``)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pytest
from opentelemetry import trace

import otelkit
from otelkit import semconv
from otelkit.analysis import Span, build_traces
from otelkit.analysis._breakdown import SERVER_OTHER, SERVER_QUEUE, TOTAL, trace_components
from otelkit.analysis._server_time import SERVE_PROXY, SERVE_ROUTER
from otelkit.receiver import Receiver
from otelkit.testing import ReceiverCapture, tree, wait_until
from otelkit.tritonserver import free_port
from tests.support import LocalRay

serve = pytest.importorskip("ray.serve")

PREFIX = "/t"
KSERVE_APP = "kserve"  # the KServe v2 ingress's application, on route "/"


@pytest.fixture(scope="module")
def port(ray_local: LocalRay, otelkit_receiver_server: Receiver) -> Iterator[int]:
    """Serve's HTTP proxy on a free port, the three deployments instrumented behind it."""
    from otelkit.server.ray_serve import instrument_deployment
    from tests.server.ray_apps import Batched, Child, Ingress, KServeIngress

    otelkit.configure(
        service_name="ray-tests-client",
        traces_endpoint=otelkit_receiver_server.traces_url,
        bsp_schedule_delay_ms=50,
    )
    bound = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": bound})
    env = ray_local.replica_env(otelkit_receiver_server.traces_url, OTEL_SERVICE_NAME="ray-tests")
    child, batched = (instrument_deployment(d, env).bind() for d in (Child, Batched))
    serve.run(instrument_deployment(Ingress, env).bind(child, batched), route_prefix=PREFIX)
    kserve_child = instrument_deployment(Child, env).bind()
    serve.run(
        instrument_deployment(KServeIngress, env).bind(kserve_child),
        name=KSERVE_APP,
        route_prefix="/",
    )
    yield bound
    serve.shutdown()
    otelkit.shutdown()


def post(port: int, path: str, body: object, headers: dict[str, str]) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{PREFIX}/{path}",
        json.dumps({"x": body}).encode(),
        headers,
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def traced_post(port: int, path: str, body: object) -> tuple[str, int, bytes]:
    """``post`` under a CLIENT span of this process; its trace id, status and body."""
    tracer = trace.get_tracer("tests.ray")
    with tracer.start_as_current_span("client", kind=trace.SpanKind.CLIENT) as span:
        status, content = post(port, path, body, otelkit.inject({}))
        trace_id = f"{span.get_span_context().trace_id:032x}"
    otelkit.flush()
    return trace_id, status, content


def assert_nested(spans: list[Span]) -> None:
    """Every span of otelkit's lies within its nearest otelkit ancestor's time (clocks of one
    host). Serve's own spans do not: Serve ends a replica's span after the caller has its
    answer, and its proxy's after the client has it."""
    by_id = {span.span_id: span for span in spans}
    for span in spans:
        if not span.scope.startswith("otelkit"):
            continue
        parent = by_id.get(span.parent_span_id or "")
        while parent is not None and not parent.scope.startswith(("otelkit", "tests")):
            parent = by_id.get(parent.parent_span_id or "")
        if parent is not None:
            assert parent.start_ns <= span.start_ns <= span.end_ns <= parent.end_ns, span.name


def test_a_request_through_composed_deployments_is_one_trace(
    port: int, otelkit_receiver: ReceiverCapture
) -> None:
    trace_id, status, content = traced_post(port, "double", [1.0, 2.0])
    assert (status, json.loads(content)) == (200, {"y": [2.0, 4.0]})
    spans = otelkit_receiver.wait_for_trace(trace_id, 10)
    # Serve's own spans (its tracing, through otelkit: the proxy, the router, the replica)
    # hold otelkit's spans of the request
    assert tree(spans) == [
        (0, "client", "CLIENT"),
        (1, "proxy_http_request Ingress POST /double", "SERVER"),
        (2, "route_to_replica Ingress __call__", "SERVER"),
        (3, "replica_handle_request Ingress __call__", "SERVER"),
        (4, f"POST {PREFIX}", "SERVER"),
        (5, semconv.RAY_SERVE_QUEUE_SPAN, "INTERNAL"),
        (5, "route_to_replica Child run", "SERVER"),
        (6, "replica_handle_request Child run", "SERVER"),
        (7, "Child.run", "SERVER"),
        (8, "double", "INTERNAL"),
    ]
    assert_nested(spans)
    named = {s.name: s for s in spans}
    ingress, child = named[f"POST {PREFIX}"], named["Child.run"]
    assert ingress.attributes[semconv.HTTP_ROUTE] == PREFIX
    assert ingress.attributes[semconv.HTTP_RESPONSE_STATUS_CODE] == 200
    assert ingress.attributes[semconv.RAY_SERVE_DEPLOYMENT] == "Ingress"
    assert child.attributes[semconv.RAY_SERVE_METHOD] == "run"
    assert {s.attributes.get(semconv.RAY_SERVE_APPLICATION) for s in (ingress, child)} == {
        "default"
    }
    services = {s.name.split(" ")[0]: s.resource[semconv.SERVICE_NAME] for s in spans}
    assert services["proxy_http_request"] == "ray-serve-proxy"  # the job's environment
    assert {services[name] for name in ("client", "POST", "Child.run")} == {
        "ray-tests-client",
        "ray-tests",
    }


def test_the_breakdown_names_serves_proxy_router_replicas_and_queues(
    port: int, otelkit_receiver: ReceiverCapture
) -> None:
    """With Serve's own tracing on, a request's time splits into Serve's proxy, its router,
    each replica's queue and own time and the stage, with nothing left unexplained."""
    with trace.get_tracer("tests.ray").start_as_current_span("event") as event:
        trace_id, status, _ = traced_post(port, "double", [1.0])
    otelkit.flush()
    assert status == 200
    spans = otelkit_receiver.wait_for_trace(trace_id, 11)
    (built,) = build_traces(spans).values()
    root = built.spans[f"{event.get_span_context().span_id:016x}"]
    components, problems = trace_components(built, root)
    assert problems == []
    for name in (SERVE_PROXY, SERVE_ROUTER, SERVER_QUEUE, "server Ingress replica"):
        assert components[name] > 0, name
    assert components["server Child replica"] > 0 and components["server double"] > 0
    assert abs(components[SERVER_OTHER]) < 1e-6
    total = components.pop(TOTAL)
    assert sum(components.values()) == pytest.approx(total, rel=0.01)


def test_a_batched_call_is_linked_to_every_request_of_its_batch(
    port: int, otelkit_receiver: ReceiverCapture
) -> None:
    trace_id, status, content = traced_post(port, "batch", [1.0, 2.0, 3.0, 4.0])
    assert (status, json.loads(content)) == (200, {"y": [3.0, 6.0, 9.0, 12.0]})
    spans = otelkit_receiver.wait_for_trace(trace_id, 2 + 4 * 2 + 2)
    calls = {s.span_id for s in spans if s.name == "Batched.__call__"}
    (batch,) = [s for s in spans if s.name.startswith(semconv.RAY_SERVE_BATCH_SPAN)]
    assert len(calls) == 4
    assert {link.span_id for link in batch.links} == calls
    assert batch.attributes[semconv.RAY_SERVE_BATCH_SIZE] == 4
    (stage,) = [s for s in spans if s.name == "triple"]
    assert stage.parent_span_id == batch.span_id


def test_a_malformed_traceparent_starts_a_new_trace_and_the_request_is_served(
    port: int, otelkit_receiver: ReceiverCapture
) -> None:
    marker = f"malformed-{uuid.uuid4().hex}"
    bad = {"traceparent": "00-not-a-trace-id-01"}
    assert post(port, f"{marker}/double", [5.0], bad) == post(port, "double", [5.0], {})
    path = f"{PREFIX}/{marker}/double"
    (server,) = otelkit_receiver.wait_for_spans(
        lambda s: s.attributes.get(semconv.URL_PATH) == path, what="a span of the malformed request"
    )
    assert server.parent_span_id is None
    spans = otelkit_receiver.wait_for_trace(server.trace_id, 6)
    assert [name for _, name, _ in tree(spans)] == [
        f"POST {PREFIX}",
        semconv.RAY_SERVE_QUEUE_SPAN,
        "route_to_replica Child run",
        "replica_handle_request Child run",
        "Child.run",
        "double",
    ]


def kserve_infer(port: int, model: str, x: list[float]) -> tuple[str, float, Exception | None]:
    """One call of an instrumented ``tritonclient.http`` client to the KServe ingress, under a
    root span: its trace id, the seconds it took and the error it raised, if any."""
    import numpy as np
    import tritonclient.http as httpclient

    client = otelkit.instrument(httpclient.InferenceServerClient(f"127.0.0.1:{port}"))
    data = httpclient.InferInput("x", [len(x)], "FP32")
    data.set_data_from_numpy(np.asarray(x, dtype=np.float32))
    error: Exception | None = None
    start = time.monotonic()
    with trace.get_tracer("tests.ray").start_as_current_span("request") as root:
        try:
            client.infer(model, [data])
        except Exception as raised:
            error = raised
    seconds = time.monotonic() - start
    client.close()
    otelkit.flush()
    return f"{root.get_span_context().trace_id:032x}", seconds, error


def assert_http_500(error: Exception | None) -> None:
    from tritonclient.utils import InferenceServerException

    assert isinstance(error, InferenceServerException), error
    assert str(error.status()) == "500", error


def ancestors(spans: list[Span], span: Span) -> list[Span]:
    """``span``'s parent, its parent's, and so on, nearest first."""
    by_id = {found.span_id: found for found in spans}
    out = []
    while (parent := by_id.get(span.parent_span_id or "")) is not None:
        out.append(parent)
        span = parent
    return out


def _ingress(spans: list[Span]) -> list[Span]:
    return [s for s in spans if s.kind.name == "SERVER" and s.name.startswith("POST")]


def assert_failed_at_both_ends(captured: ReceiverCapture, trace_id: str, model: str) -> list[Span]:
    """The trace's CLIENT span and the ingress's SERVER span (its child) are both errors;
    the trace's spans, once both arrived (the replicas' export in their own time)."""

    def joined() -> list[Span]:
        """The trace's spans once the ingress's span is there and joins the client's through
        Serve's own spans of its proxy, router and replica (each process exports in its own
        time); empty before."""
        spans = captured.trace(trace_id)
        clients = [s for s in spans if s.kind.name == "CLIENT"]
        ingress = _ingress(spans)
        if len(clients) != 1 or len(ingress) != 1:
            return []
        return spans if clients[0] in ancestors(spans, ingress[0]) else []

    spans = wait_until(joined, what=f"{trace_id}'s ingress joined to its client")
    (client,) = [s for s in spans if s.kind.name == "CLIENT"]
    (ingress,) = _ingress(spans)
    assert (client.name, client.status_code.name) == (f"v2/models/infer {model}", "ERROR")
    assert client.attributes[semconv.ERROR_TYPE] == "500"
    between = ancestors(spans, ingress)[: ancestors(spans, ingress).index(client)]
    assert [s.name.split(" ")[0] for s in between] == [
        "replica_handle_request",
        "route_to_replica",
        "proxy_http_request",
    ]
    assert ingress.status_code.name == "ERROR"
    assert ingress.attributes[semconv.HTTP_RESPONSE_STATUS_CODE] == 500
    assert ingress.attributes[semconv.RAY_SERVE_APPLICATION] == KSERVE_APP
    return spans


def test_a_replica_that_raises_gives_error_spans_and_500_and_keeps_serving(
    port: int, otelkit_receiver: ReceiverCapture
) -> None:
    trace_id, _, error = kserve_infer(port, "fail", [1.0])
    assert "refused [1.0]" in str(error)
    assert_http_500(error)
    otelkit_receiver.wait_for_trace(trace_id, 5)
    spans = assert_failed_at_both_ends(otelkit_receiver, trace_id, "fail")
    failed = {s.name for s in spans if s.status_code.name == "ERROR"}
    assert failed == {
        "v2/models/infer fail",
        "proxy_http_request KServeIngress POST /v2/models/fail/infer",  # Serve's, by its status
        "POST /v2/models/{model_name}/infer",
        "Child.fail",
    }
    (child,) = [s for s in spans if s.name == "Child.fail"]
    assert child.attributes[semconv.ERROR_TYPE] == "ValueError"
    assert post(port, "double", [1.0], {}) == (200, b'{"y":[2.0]}')


def test_a_replica_killed_under_load_leaves_error_spans_at_both_ends_and_nothing_hangs(
    port: int, otelkit_receiver: ReceiverCapture
) -> None:
    import ray

    results: list[tuple[str, float, Exception | None]] = []
    senders = [
        threading.Thread(target=lambda: results.append(kserve_infer(port, "slow", [3.0])))
        for _ in range(4)
    ]
    for sender in senders:
        sender.start()
    time.sleep(1.0)  # the four requests are in the child's replica, sleeping
    (name,) = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if f"{KSERVE_APP}#Child#" in a["name"]
    ]
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=False)
    for sender in senders:
        sender.join(90)
        assert not sender.is_alive(), "a request hung after its replica was killed"
    # each failed soon after the kill, not after its 3 s of sleep nor a client timeout
    assert len(results) == 4 and all(seconds < 3.0 for _, seconds, _ in results), results
    for _, _, error in results:
        assert_http_500(error)
    for trace_id, _, _ in results:  # the child's SERVER spans died with it
        assert_failed_at_both_ends(otelkit_receiver, trace_id, "slow")
    wait_until(  # Serve replaces the replica; requests succeed again
        lambda: kserve_infer(port, "slow", [0.0])[2] is None,
        60,
        "a request served by the replaced replica",
        interval=0.5,
    )


def test_instrument_returns_a_traced_deployment_once_and_uninstrument_the_original() -> None:
    from tests.server.ray_apps import Child

    traced = otelkit.instrument(Child)
    assert traced.func_or_class is not Child.func_or_class
    assert traced.func_or_class.__mro__[1] is Child.func_or_class
    assert traced.func_or_class.__name__ == "Child"
    assert traced.ray_actor_options["num_cpus"] == 0  # the deployment's own options kept
    assert "env_vars" in traced.ray_actor_options["runtime_env"]
    assert otelkit.instrument(traced) is traced
    assert otelkit.uninstrument(traced).func_or_class is Child.func_or_class
    with pytest.raises(TypeError, match="send_context=False applies to one tritonclient"):
        otelkit.instrument(Child, send_context=False)
