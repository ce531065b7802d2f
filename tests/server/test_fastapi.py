"""``otelkit.instrument(app)`` on a FastAPI app served by a real uvicorn, requests over real HTTP.

Each instrumented behaviour is checked against an uninstrumented twin of the same app: otelkit
must not change a status or a body, for good requests, failing handlers or bad trace headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import inspect
import json
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import pytest
import uvicorn
from fastapi import FastAPI, HTTPException
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

import otelkit
from otelkit import semconv
from otelkit.analysis import Span, SpanKind, StatusCode, build_traces, trace_components
from otelkit.analysis._breakdown import SERVER_OTHER
from otelkit.receiver import Receiver
from otelkit.testing import ReceiverCapture, tree, wait_until
from tests.core.test_propagation import INVALID_TRACEPARENTS
from tests.core.test_telemetry import samples, scrape

SCOPE = "otelkit.server.fastapi"
RECEIVED = semconv.HTTP_REQUEST_RECEIVED
STARTED = semconv.HTTP_RESPONSE_STARTED
SENT = semconv.HTTP_RESPONSE_SENT
CONTRIB_SCOPE = "opentelemetry.instrumentation.fastapi"
CONTRIB_COUNT = "http_server_duration_milliseconds_count"  # its duration histogram, in ms
DURATION_COUNT = "http_server_request_duration_seconds_count"
INFER = "/v2/models/{model}/infer"
INFER_SYNC = "/v2/models/{model}/infer_sync"
TENANT = "/tenants/{tenant}"  # a FastAPI app mounted there serves the same routes
Headers = Sequence[tuple[str, str | bytes]]


class Response(NamedTuple):
    status: int
    content_type: str | None
    body: bytes


def make_app(native_telemetry: bool = True) -> FastAPI:
    """The inference-server shape under test: async and sync handlers with nested stages.

    ``native_telemetry=False`` turns FastAPI's own tracing off (FastAPI >= 0.165), for the
    uninstrumented twin: its spans and metrics would otherwise join otelkit's pipeline.
    """
    options: dict[str, Any] = {}
    if not native_telemetry and "telemetry" in inspect.signature(FastAPI).parameters:
        options["telemetry"] = {"tracing": False, "metrics": False}
    app = FastAPI(**options)
    add_routes(app)
    tenant = FastAPI(**options)
    add_routes(tenant)
    app.mount(TENANT, tenant)
    return app


def add_routes(app: FastAPI) -> None:
    @app.post(INFER)
    async def infer(model: str) -> dict[str, Any]:
        async with otelkit.stage("preprocess"):
            with otelkit.stage("embed"):
                await asyncio.sleep(0)
        return {"model": model, "outputs": [1.0, 2.0]}

    @otelkit.stage("preprocess")
    def preprocess() -> None:
        with otelkit.stage("embed"):
            time.sleep(0)

    @app.post(INFER_SYNC)
    def infer_sync(model: str) -> dict[str, Any]:  # run by Starlette in its thread pool
        preprocess()
        return {"model": model, "outputs": [1.0, 2.0]}

    @app.post("/scale/{token}")
    async def scale(token: str, tensor: list[float]) -> dict[str, list[float]]:
        with otelkit.stage("scale"):
            scaled = [2 * x for x in tensor]
        return {"outputs": scaled}

    @app.get("/probe/{token}")
    async def probe(token: str) -> dict[str, bool]:
        return {"ok": True}

    @app.get("/downstream")
    async def downstream() -> dict[str, str]:
        return otelkit.inject({})  # what this service would send to the next one

    @app.get("/fail/{token}")
    async def fail(token: str) -> None:
        raise RuntimeError("model crashed")

    @app.get("/missing/{token}")
    async def missing(token: str) -> None:
        raise HTTPException(404, "no such model")


@contextlib.contextmanager
def serving(app: FastAPI) -> Iterator[int]:
    """``app`` on a real uvicorn in a thread; yields its port."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()

    def started() -> bool:
        assert thread.is_alive(), "uvicorn exited"
        return bool(server.started)

    wait_until(started, 10, "uvicorn started", interval=0.01)
    try:
        yield int(server.servers[0].sockets[0].getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(10)


def request(
    port: int, method: str, path: str, headers: Headers = (), body: bytes | None = None
) -> Response:
    """One request; headers as pairs so that a name can repeat, values ``str`` or raw bytes."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.putrequest(method, path)
        for name, value in headers:
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("content-type", "application/json")
            connection.putheader("content-length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return Response(response.status, response.getheader("content-type"), response.read())
    finally:
        connection.close()


def new_ids() -> tuple[str, str]:
    return uuid.uuid4().hex, uuid.uuid4().hex[:16]


def server_spans(spans: ReceiverCapture, paths: set[str]) -> dict[str, Span]:
    """otelkit's SERVER span of each request path, once all have arrived."""

    def server(span: Span) -> bool:
        return (
            span.scope == SCOPE
            and span.kind is SpanKind.SERVER
            and span.attributes.get(semconv.URL_PATH) in paths
        )

    found = spans.wait_for_spans(server, len(paths), what=f"a SERVER span for each of {paths}")
    return {str(s.attributes.get(semconv.URL_PATH)): s for s in found}


@pytest.fixture(scope="module")
def telemetry(otelkit_receiver_server: Receiver) -> Iterator[otelkit.Telemetry]:
    yield otelkit.configure(
        service_name="fastapi-tests",
        traces_endpoint=otelkit_receiver_server.traces_url,
        bsp_schedule_delay_ms=50,
        metrics_exporter="prometheus",
        prometheus_port=0,
    )
    otelkit.shutdown()


@pytest.fixture(scope="module")
def port(telemetry: otelkit.Telemetry) -> Iterator[int]:
    """The instrumented app (FastAPI's native telemetry left on, for otelkit to switch off)."""
    app = make_app()
    assert otelkit.instrument(app) is app
    with serving(app) as bound:
        yield bound
    otelkit.uninstrument(app)


@pytest.fixture(scope="module")
def plain_port(telemetry: otelkit.Telemetry) -> Iterator[int]:
    """The same app, not instrumented."""
    with serving(make_app(native_telemetry=False)) as bound:
        yield bound


@pytest.mark.parametrize(
    "route", [INFER, INFER_SYNC, TENANT + INFER], ids=["async", "sync", "mounted-app"]
)
def test_traceparent_parents_the_server_span_and_stages_nest_under_it(
    port: int, plain_port: int, otelkit_receiver: ReceiverCapture, route: str
) -> None:
    trace_id, parent_id = new_ids()
    path = route.replace("{model}", "gnn").replace("{tenant}", "acme")
    headers = [("traceparent", f"00-{trace_id}-{parent_id}-01")]
    response = request(port, "POST", path, headers)
    assert (
        response
        == request(plain_port, "POST", path)
        == (200, "application/json", b'{"model":"gnn","outputs":[1.0,2.0]}')
    )
    otelkit_receiver.wait_for_trace(trace_id, 3)
    otelkit.flush()  # any span beyond the three ended before the SERVER span: here by now
    spans = otelkit_receiver.trace(trace_id)
    assert tree(spans) == [
        (0, f"POST {route}", "SERVER"),
        (1, "preprocess", "INTERNAL"),
        (2, "embed", "INTERNAL"),
    ]
    (server,) = [s for s in spans if s.kind is SpanKind.SERVER]
    assert (server.parent_span_id, server.scope, server.status_code) == (
        parent_id,
        SCOPE,
        StatusCode.UNSET,
    )
    assert server.attributes == {
        semconv.HTTP_REQUEST_METHOD: "POST",
        semconv.HTTP_ROUTE: route,
        semconv.HTTP_RESPONSE_STATUS_CODE: 200,
        semconv.URL_PATH: path,
        semconv.URL_SCHEME: "http",
        semconv.SERVER_ADDRESS: "127.0.0.1",
        semconv.SERVER_PORT: port,
        semconv.CLIENT_ADDRESS: "127.0.0.1",
        semconv.NETWORK_PROTOCOL_VERSION: "1.1",
    }


def test_an_unsampled_caller_gets_no_spans_from_the_server_or_its_stages(
    port: int, otelkit_receiver: ReceiverCapture
) -> None:
    trace_id, parent_id = new_ids()
    headers = [("traceparent", f"00-{trace_id}-{parent_id}-00")]
    assert request(port, "POST", "/v2/models/gnn/infer", headers).status == 200
    # The marker: a sampled request after it, whose three spans end after any of the first's
    marker, parent_id = new_ids()
    headers = [("traceparent", f"00-{marker}-{parent_id}-01")]
    assert request(port, "POST", "/v2/models/gnn/infer", headers).status == 200
    otelkit_receiver.assert_absent(
        # the stages followed the caller's decision: no new roots either
        lambda s: s.trace_id == trace_id or (s.name == "preprocess" and s.trace_id != marker),
        after=marker,
        count=3,
    )


@pytest.mark.parametrize("flags", ["00", "01"])
def test_the_service_passes_on_a_parent_id_of_its_own_sampled_or_not(port: int, flags: str) -> None:
    """Trace Context Level 2: every participant replaces the parent-id, whatever it samples."""
    trace_id, parent_id = new_ids()
    headers = [
        ("traceparent", f"00-{trace_id}-{parent_id}-{flags}"),
        ("tracestate", "congo=t61,rojo=1"),
    ]
    seen = [json.loads(request(port, "GET", "/downstream", headers).body) for _ in range(2)]
    ids = []
    for sent in seen:
        version, sent_trace, sent_parent, sent_flags = sent["traceparent"].split("-")
        assert (version, sent_trace, sent_flags) == ("00", trace_id, flags)
        assert sent["tracestate"] == "congo=t61,rojo=1"
        ids.append(sent_parent)
    assert parent_id not in ids and len(set(ids)) == 2  # its own, new for every request


def invalid_trace_headers(trace_id: str, parent_id: str) -> dict[str, Headers]:
    """Every malformed ``traceparent`` of the propagation tests, on this request's ids, as a
    server receives it, plus two headers that are each valid but may not come together."""
    cases: dict[str, Headers] = {}
    for case in INVALID_TRACEPARENTS:
        (value,) = case.values
        assert isinstance(value, str) and isinstance(case.id, str)
        value = value.replace("4bf92f3577b34da6a3ce929d0e0e4736", trace_id)
        value = value.replace("00f067aa0ba902b7", parent_id)
        cases[case.id] = [("traceparent", value.encode())]  # bytes: one case is not ASCII
    valid = f"00-{trace_id}-{parent_id}-01"
    cases["two-headers"] = [("traceparent", valid), ("traceparent", valid)]
    cases["two-headers-other-case"] = [("traceparent", valid), ("TraceParent", valid)]
    return cases


def test_an_invalid_traceparent_starts_a_new_trace_and_changes_no_response(
    port: int, plain_port: int, otelkit_receiver: ReceiverCapture
) -> None:
    trace_id, parent_id = new_ids()
    cases = invalid_trace_headers(trace_id, parent_id)
    paths = {case: f"/probe/{uuid.uuid4().hex}" for case in cases}
    expected = request(plain_port, "GET", "/probe/plain")
    assert expected == (200, "application/json", b'{"ok":true}')
    assert request(port, "GET", "/probe/no-header") == expected
    responses = {case: request(port, "GET", paths[case], cases[case]) for case in cases}
    assert responses == dict.fromkeys(cases, expected)
    spans = server_spans(otelkit_receiver, set(paths.values()))
    seen = {
        case: (spans[path].parent_span_id, spans[path].trace_id == trace_id, spans[path].name)
        for case, path in paths.items()
    }
    assert seen == dict.fromkeys(cases, (None, False, "GET /probe/{token}"))
    assert len({span.trace_id for span in spans.values()}) == len(cases)  # each a trace of its own


def test_errors_keep_their_responses_and_only_5xx_fail_the_span(
    port: int, plain_port: int, otelkit_receiver: ReceiverCapture
) -> None:
    token = uuid.uuid4().hex
    paths = {"fail": f"/fail/{token}", "missing": f"/missing/{token}", "none": f"/none/{token}"}
    responses = {case: request(port, "GET", path) for case, path in paths.items()}
    assert responses == {case: request(plain_port, "GET", path) for case, path in paths.items()}
    assert responses == {
        "fail": (500, "text/plain; charset=utf-8", b"Internal Server Error"),
        "missing": (404, "application/json", b'{"detail":"no such model"}'),
        "none": (404, "application/json", b'{"detail":"Not Found"}'),
    }
    spans = server_spans(otelkit_receiver, set(paths.values()))
    sent = [STARTED, SENT]  # a GET's body is not read: no event for it
    seen = {
        case: (
            spans[path].name,
            spans[path].status_code,
            spans[path].attributes.get(semconv.HTTP_RESPONSE_STATUS_CODE),
            spans[path].attributes.get(semconv.HTTP_ROUTE),
            spans[path].attributes.get(semconv.ERROR_TYPE),
            [event.name for event in spans[path].events],
        )
        for case, path in paths.items()
    }
    assert seen == {
        "fail": (
            "GET /fail/{token}",
            StatusCode.ERROR,
            500,
            "/fail/{token}",
            "RuntimeError",
            [STARTED, SENT, "exception"],
        ),
        "missing": ("GET /missing/{token}", StatusCode.UNSET, 404, "/missing/{token}", None, sent),
        "none": ("GET", StatusCode.UNSET, 404, None, None, sent),  # no route: the method alone
    }


def test_the_server_span_is_cut_where_the_body_arrived_and_the_response_went(
    port: int, otelkit_receiver: ReceiverCapture
) -> None:
    """Three events on the span (the request's body read whole, the response started and its
    body sent) cut it into the breakdown's receive, handler and send, which with the app's
    stage add up to the span: no ``server other``."""
    trace_id, parent_id = new_ids()
    path = f"/scale/{uuid.uuid4().hex}"
    body = json.dumps([0.5] * 50_000).encode()  # more than one read of the socket
    headers = [("traceparent", f"00-{trace_id}-{parent_id}-01")]
    status, _, answer = request(port, "POST", path, headers, body)
    assert status == 200 and json.loads(answer)["outputs"][:2] == [1.0, 1.0]
    otelkit_receiver.wait_for_trace(trace_id, 2)
    spans = otelkit_receiver.trace(trace_id)
    (server,) = [s for s in spans if s.kind is SpanKind.SERVER]
    (stage,) = [s for s in spans if s.kind is SpanKind.INTERNAL]
    at = {event.name: event.time_ns for event in server.events}
    assert list(at) == [RECEIVED, STARTED, SENT]
    assert server.start_ns <= at[RECEIVED] <= stage.start_ns
    assert stage.end_ns <= at[STARTED] <= at[SENT] <= server.end_ns
    # the caller's spans, as the client would have sent them: a root and its call
    root = Span(trace_id, "1" * 16, None, "job", SpanKind.INTERNAL, server.start_ns, server.end_ns)
    times = (server.start_ns, server.end_ns)
    call = Span(trace_id, parent_id, root.span_id, "call", SpanKind.CLIENT, *times)
    traced = build_traces([root, call, *spans])[trace_id]
    found, problems = trace_components(traced, root)
    assert problems == []
    ms = {name: seconds * 1e3 for name, seconds in found.items()}
    assert ms["server receive"] == pytest.approx((at[RECEIVED] - server.start_ns) / 1e6)
    assert ms["server send"] == pytest.approx((at[SENT] - at[STARTED]) / 1e6)
    handler = (at[STARTED] - at[RECEIVED] - stage.duration_ns) / 1e6
    assert ms["server handler"] == pytest.approx(handler)
    assert ms["server scale"] == pytest.approx(stage.duration_ns / 1e6)
    assert ms[SERVER_OTHER] == pytest.approx((server.end_ns - at[SENT]) / 1e6, abs=1e-6)


def duration_counts(telemetry: otelkit.Telemetry) -> dict[tuple[str, str, str], float]:
    assert telemetry.prometheus_url is not None
    found = samples(scrape(telemetry.prometheus_url), DURATION_COUNT)
    return {
        (
            labels[semconv.M_HTTP_METHOD],
            labels.get(semconv.M_HTTP_ROUTE, ""),
            labels[semconv.M_HTTP_STATUS],
        ): count
        for labels, count in ((dict(key), value) for key, value in found.items())
    }


def test_duration_histogram_counts_every_request_by_route_and_status(
    port: int, telemetry: otelkit.Telemetry
) -> None:
    before = duration_counts(telemetry)
    sent = [
        *[("POST", "/v2/models/gnn/infer")] * 3,
        *[("POST", "/v2/models/gnn/infer_sync")] * 2,
        ("POST", "/tenants/acme/v2/models/gnn/infer"),
        *[("GET", "/probe/a"), ("GET", "/probe/b"), ("DELETE", "/probe/c")],
        ("GET", "/fail/x"),
        ("GET", "/missing/x"),
        ("GET", "/none/x"),
    ]
    for method, path in sent:
        request(port, method, path)
    expected = {
        ("POST", INFER, "200"): 3,
        ("POST", INFER_SYNC, "200"): 2,
        ("POST", TENANT + INFER, "200"): 1,
        ("GET", "/probe/{token}", "200"): 2,
        ("DELETE", "/probe/{token}", "405"): 1,
        ("GET", "/fail/{token}", "500"): 1,
        ("GET", "/missing/{token}", "404"): 1,
        ("GET", "", "404"): 1,  # no route matched
    }
    grown: dict[tuple[str, str, str], float] = {}

    def counted_as_sent() -> bool:
        after = duration_counts(telemetry)
        grown.clear()
        grown.update(
            (key, after[key] - before.get(key, 0))
            for key in after
            if after[key] != before.get(key, 0)
        )
        return grown == expected

    # A request is observed once its response is sent, so the client may see it a little first.
    wait_until(counted_as_sent, 5, "a duration per request sent", explain=lambda: grown)


def test_instrument_after_start_once_and_uninstrument_undo_it(
    telemetry: otelkit.Telemetry, otelkit_receiver: ReceiverCapture
) -> None:
    app = make_app(native_telemetry=False)
    tokens = {name: f"/probe/{uuid.uuid4().hex}" for name in ("before", "during", "after")}
    with serving(app) as bound:
        request(bound, "GET", tokens["before"])  # the middleware stack is built by now
        assert otelkit.instrument(app) is app
        assert otelkit.instrument(app) is app  # a second call changes nothing
        request(bound, "GET", tokens["during"])
        assert otelkit.uninstrument(app) is app
        assert otelkit.uninstrument(app) is app
        request(bound, "GET", tokens["after"])
    server_spans(otelkit_receiver, {tokens["during"]})
    otelkit.flush()
    paths = [
        s.attributes.get(semconv.URL_PATH)
        for s in otelkit_receiver.spans()
        if s.scope == SCOPE and s.attributes.get(semconv.URL_PATH) in tokens.values()
    ]
    assert paths == [tokens["during"]]


def contrib_requests(telemetry: otelkit.Telemetry) -> float:
    """Requests OpenTelemetry's ASGI middleware has counted, all routes."""
    assert telemetry.prometheus_url is not None
    return sum(samples(scrape(telemetry.prometheus_url), CONTRIB_COUNT).values())


def trace_of(
    otelkit_receiver: ReceiverCapture, port: int, method: str, path: str
) -> tuple[Response, list[Span]]:
    """One request with a sampled ``traceparent``; its response and its trace's spans (all,
    once the trace's spans have stopped arriving: each middleware ends its own)."""
    trace_id, parent_id = new_ids()
    response = request(port, method, path, [("traceparent", f"00-{trace_id}-{parent_id}-01")])
    otelkit_receiver.wait_for_trace(trace_id, 1)
    otelkit.flush()
    return response, otelkit_receiver.trace(trace_id)


@pytest.mark.parametrize("started", [False, True], ids=["before-start", "after-start"])
def test_opentelemetrys_asgi_middleware_stands_aside_while_otelkit_traces_the_app(
    telemetry: otelkit.Telemetry, otelkit_receiver: ReceiverCapture, plain_port: int, started: bool
) -> None:
    """``opentelemetry-instrument`` makes every FastAPI app OpenTelemetry's instrumented one
    (``opentelemetry-instrumentation-fastapi``, which ``opentelemetry-bootstrap`` installs
    wherever FastAPI is): an app otelkit instruments must still have one span per request, and
    one duration per request in the metrics."""
    app = make_app(native_telemetry=False)
    FastAPIInstrumentor.instrument_app(app)  # what its instrumented FastAPI class does
    infer = ("POST", "/v2/models/gnn/infer")
    try:
        if not started:
            otelkit.instrument(app)
        with serving(app) as bound:
            if started:  # contrib traces alone first (and the stack is built)
                _, spans = trace_of(otelkit_receiver, bound, *infer)
                assert {(s.scope, s.kind) for s in spans} >= {(CONTRIB_SCOPE, SpanKind.SERVER)}
                otelkit.instrument(app)
            counted = contrib_requests(telemetry)
            response, spans = trace_of(otelkit_receiver, bound, *infer)
            assert response == request(plain_port, *infer)
            assert tree(spans) == [
                (0, f"POST {INFER}", "SERVER"),
                (1, "preprocess", "INTERNAL"),
                (2, "embed", "INTERNAL"),
            ]
            assert [s.scope for s in spans if s.kind is SpanKind.SERVER] == [SCOPE]
            failed, spans = trace_of(otelkit_receiver, bound, "GET", "/fail/x")
            assert failed == request(plain_port, "GET", "/fail/x")
            assert [(s.scope, s.status_code) for s in spans] == [(SCOPE, StatusCode.ERROR)]
            assert contrib_requests(telemetry) == counted
            otelkit.uninstrument(app)
            _, spans = trace_of(otelkit_receiver, bound, *infer)
            assert SCOPE not in {s.scope for s in spans}
            assert {(s.scope, s.kind) for s in spans} >= {(CONTRIB_SCOPE, SpanKind.SERVER)}
            # it counts once the response is sent
            wait_until(lambda: contrib_requests(telemetry) != counted, 5, "contrib's count")
            assert contrib_requests(telemetry) == counted + 1
    finally:
        FastAPIInstrumentor.uninstrument_app(app)  # also its patch of every BackgroundTask
