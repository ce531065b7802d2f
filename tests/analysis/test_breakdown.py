"""otelkit.analysis._breakdown: a trace split into client, network, queue and stage time.

Hand-built traces with known durations: the components must add up to the root, land in the
right place (client stage vs server stage), and a broken nesting must be reported.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from otelkit import semconv
from otelkit.analysis import Span, SpanEvent, SpanKind, build_traces
from otelkit.analysis._breakdown import (
    CLIENT_OTHER,
    NETWORK,
    SERVER_OTHER,
    SERVER_QUEUE,
    TOTAL,
    breakdown,
    format_breakdowns,
    trace_components,
)

TRACE = "ab" * 16
_ids = (f"{i:016x}" for i in itertools.count(1))
MS = 1_000_000


def span(
    parent: Span | str,
    name: str,
    start_ms: float,
    end_ms: float,
    kind: SpanKind = SpanKind.INTERNAL,
    **attributes: object,
) -> Span:
    """A span under ``parent``, or a root of the trace ``parent`` names."""
    events = attributes.pop("events", ())
    trace_id, parent_id = (
        (parent, None) if isinstance(parent, str) else (parent.trace_id, parent.span_id)
    )
    return Span(
        trace_id,
        next(_ids),
        parent_id,
        name,
        kind,
        int(start_ms * MS),
        int(end_ms * MS),
        dict(attributes),
        events=tuple(events),  # type: ignore[arg-type]
    )


def stage(parent: Span, name: str, start_ms: float, end_ms: float) -> Span:
    return span(parent, name, start_ms, end_ms, **{semconv.STAGE_NAME: name})


def events(**at_ms: float) -> tuple[SpanEvent, ...]:
    return tuple(SpanEvent(name, int(ms * MS)) for name, ms in at_ms.items())


def one_event(option: int = 1, trace_id: str = TRACE) -> list[Span]:
    """root 0..20 ms: a local stage (2 ms), a call (10 ms) to Triton whose request span is
    6 ms (its receive before it, its send inside), its model's 1 ms queue and a 3 ms stage
    of its Python model holding a nested stage, then glue."""
    root = span(trace_id, "reconstruct event", 0, 20, option=option)
    local = stage(root, "build_graph", 1, 3)
    call = span(
        root,
        "infer",
        4,
        14,
        SpanKind.CLIENT,
        **{semconv.MODEL_NAME: "gnn", semconv.SERIALIZE_S: 0.0005, semconv.DESERIALIZE_S: 0.00025},
    )
    received = events(HTTP_RECV_START=5.5, HTTP_RECV_END=5.75, HTTP_SEND_START=11.5)
    server = span(
        call, "InferRequest", 6, 12, SpanKind.SERVER, events=received + events(HTTP_SEND_END=11.75)
    )
    model = span(
        server,
        "gnn",
        6.25,
        11.25,
        events=events(REQUEST_START=6.25, QUEUE_START=6.5, REQUEST_END=11.25),
        **{semconv.TRITON_SPAN_MODEL_NAME: "gnn"},
    )
    compute = span(
        model,
        "compute",
        7.5,
        11,
        events=events(
            COMPUTE_START=7.5, COMPUTE_INPUT_END=7.75, COMPUTE_OUTPUT_START=10.75, COMPUTE_END=11
        ),
    )
    outer = stage(model, "gnn", 8, 10)
    inner = stage(outer, "message_passing", 8.5, 9.5)
    return [root, local, call, server, model, compute, outer, inner]


def test_components_add_up_and_land_where_they_ran() -> None:
    """Every millisecond of the call lands between two timestamps that bound it: the server's
    receive before its span (taken from the network), Triton's frontend, scheduler, queue and
    compute events, the Python model's hand-off around its stage, the send."""
    trace = build_traces(one_event())[TRACE]
    components, problems = trace_components(trace, trace.roots[0])
    assert problems == []
    ms = {name: round(seconds * 1e3, 6) for name, seconds in components.items()}
    assert ms["client build_graph"] == 2
    assert ms["client serialize"] == 0.5 and ms["client deserialize"] == 0.25
    assert ms["server receive"] == 0.25  # 5.5 to 5.75, before the span: not the network's
    assert ms[NETWORK] == 10 - 6 - 0.75 - 0.5  # less the receive and the frontend before 6
    # 5.75-6 (before the span), 6-6.25, 11.25-11.5 and 11.75-12 (around its model and send)
    assert ms["server frontend"] == 1
    assert (
        ms["server scheduler"] == 0.25 + 0.25
    )  # REQUEST_START-QUEUE_START, COMPUTE_END-REQUEST_END
    assert ms[SERVER_QUEUE] == 1  # QUEUE_START 6.5 to COMPUTE_START 7.5
    assert ms["server compute input"] == 0.25 and ms["server compute output"] == 0.25
    assert ms["server gnn hand-off"] == 0.25 + 0.75  # 7.75-8 and 10-10.75: around the stage
    assert ms["server gnn"] == 2  # the outermost stage only: the nested one is inside it
    assert "server message_passing" not in ms
    assert ms["server send"] == 0.25
    assert ms[SERVER_OTHER] == 0  # every instant of the span between two of its timestamps
    assert ms[CLIENT_OTHER] == 20 - 2 - 10
    assert ms[TOTAL] == 20
    parts = sum(v for k, v in ms.items() if k != TOTAL)
    assert parts == pytest.approx(ms[TOTAL])


def _server(trace: list[Span]) -> Span:
    return next(s for s in trace if s.kind == SpanKind.SERVER)


def _components_ms(spans: list[Span]) -> dict[str, float]:
    trace = build_traces(spans)[TRACE]
    components, problems = trace_components(trace, trace.roots[0])
    assert problems == []
    assert sum(v for k, v in components.items() if k != TOTAL) == pytest.approx(components[TOTAL])
    return {name: round(seconds * 1e3, 6) for name, seconds in components.items()}


def test_an_ensembles_own_time_is_its_span_less_the_union_of_its_overlapping_steps() -> None:
    """Steps overlap (the next one starts as the last releases its outputs): the ensemble
    scheduler's time is what no step covers, not the sum of the gaps between them."""
    root = span(TRACE, "event", 0, 30)
    call = span(root, "infer", 0, 30, SpanKind.CLIENT)
    server = span(
        call,
        "InferRequest",
        1,
        29,
        SpanKind.SERVER,
        events=events(HTTP_SEND_START=28, HTTP_SEND_END=28.5),
    )
    ensemble = span(server, "tracking", 2, 27, **{semconv.TRITON_SPAN_MODEL_NAME: "tracking"})
    steps = []
    for name, start, end in (("embed", 3, 12), ("gnn", 10, 25)):  # 10-12: both
        model = span(ensemble, name, start, end, **{semconv.TRITON_SPAN_MODEL_NAME: name})
        steps += [model, span(model, "compute", start, end, events=events(COMPUTE_START=start))]
    ms = _components_ms([root, call, server, ensemble, *steps])
    assert ms["server ensemble"] == (27 - 2) - (25 - 3)  # 2-3 and 25-27
    assert (
        ms["server embed compute"] == 9 and ms["server gnn compute"] == 15 - 2
    )  # no events: whole
    assert ms["server frontend"] == 1 + 1 + 0.5 and ms["server send"] == 0.5
    assert ms[SERVER_OTHER] == 0


def test_a_stub_process_spans_get_their_own_time_and_never_join_a_stage() -> None:
    """PyTriton: its proxy's spans between Triton's compute and the stages. Each span's own
    time is a part; one named as a stage is told apart from it; neither is a stage."""
    spans = one_event()
    model, outer = spans[4], spans[6]
    execute = span(model, "python_backend_execute", 7.9, 10.6)
    proxy = span(execute, "gnn", 7.95, 10.2)  # a span with a stage's name
    moved = Span(
        *[getattr(outer, f) for f in ("trace_id", "span_id")],
        proxy.span_id,
        outer.name,
        outer.kind,
        outer.start_ns,
        outer.end_ns,
        outer.attributes,
    )
    ms = _components_ms([*spans[:6], execute, proxy, moved, spans[7]])
    assert ms["server gnn hand-off"] == pytest.approx((7.9 - 7.75) + (10.75 - 10.6))
    assert ms["server proxy hand-off"] == pytest.approx((7.95 - 7.9) + (10.6 - 10.2))
    assert ms["server gnn (span)"] == pytest.approx((8 - 7.95) + (10.2 - 10))
    assert ms["server gnn"] == 2
    group = breakdown(build_traces([*spans[:6], execute, proxy, moved, spans[7]]).values())
    slowest = group[()].slowest_stage()
    assert slowest is not None and slowest.name == "server gnn"


def test_grpc_receive_counts_from_the_end_of_the_clients_serialising() -> None:
    """Triton's gRPC frontend waits for a read before the request exists: its
    ``GRPC_WAITREAD_START`` may precede the call, and only the wait after the client's
    serialising is the server's receive."""
    root = span(TRACE, "event", 0, 10)
    call = span(root, "ModelInfer", 1, 9, SpanKind.CLIENT, **{semconv.SERIALIZE_S: 0.001})
    waits = events(GRPC_WAITREAD_START=0.5, GRPC_WAITREAD_END=2.5, GRPC_SEND_START=8)
    server = span(
        call, "InferRequest", 3, 8.5, SpanKind.SERVER, events=waits + events(GRPC_SEND_END=8.75)
    )
    ms = _components_ms([root, call, server])
    assert ms["server receive"] == 2.5 - 2  # serialising ends at 2
    assert ms["server frontend"] == (3 - 2.5) + (8 - 3)  # before the span, then the span itself
    assert ms["server send"] == 0.5 + 0.25  # in the span, then past its end
    assert ms[NETWORK] == 8 - 1 - 0.5 - 0.5 - 5.5 - 0.25  # the call less all of the above


def test_groups_by_root_attribute_and_leaves_out_traces_missing_server_spans() -> None:
    spans = []
    for index, option in enumerate((1, 1, 2)):
        spans += one_event(option, f"{index + 1:032x}")
    spans += one_event(2, f"{9:032x}")[:3]  # a call that lost its server spans
    groups = breakdown(build_traces(spans).values(), group_by=("option",))
    assert set(groups) == {("1",), ("2",)}
    assert groups[("1",)].traces == 2 and groups[("2",)].traces == 1
    assert groups[("2",)].incomplete == 1
    # the stage's share of the time, and no capacity from a time measured at load
    slowest = groups[("1",)].slowest_stage()
    assert slowest == ("server gnn", pytest.approx(0.002), pytest.approx(0.10))
    text = format_breakdowns(groups, labels=("option",))
    assert "option=2: 1 traces (1 left out: server spans missing)" in text
    assert "  slowest stage: server gnn, 2.00 ms per trace, 10 % of the time" in text
    assert "/s" not in text and "at most" not in text


def test_a_server_span_starting_before_its_client_span_is_reported() -> None:
    spans = one_event()
    call, server = spans[2], spans[3]
    spans[3] = Span(
        server.trace_id,
        server.span_id,
        call.span_id,
        server.name,
        server.kind,
        call.start_ns - MS,
        server.end_ns,
    )
    trace = build_traces(spans)[TRACE]
    _, problems = trace_components(trace, trace.roots[0])
    assert problems == [f"gnn: server span starts before its client span ({TRACE})"]


def test_stages_overflowing_their_server_span_are_reported() -> None:
    spans = one_event()
    outer = spans[6]
    spans[6] = Span(
        outer.trace_id,
        outer.span_id,
        outer.parent_span_id,
        outer.name,
        outer.kind,
        outer.start_ns,
        outer.start_ns + 9 * MS,
        outer.attributes,
    )
    trace = build_traces(spans)[TRACE]
    _, problems = trace_components(trace, trace.roots[0])
    assert problems == [f"gnn: stages + queue exceed the server span ({TRACE})"]


def test_root_name_filters_roots() -> None:
    groups = breakdown(build_traces(one_event()).values(), root_name="something else")
    assert groups == {}


def test_a_new_connections_set_up_is_taken_out_of_the_network() -> None:
    root = span(TRACE, "event", 0, 10)
    call = span(root, "infer", 1, 9, SpanKind.CLIENT, **{semconv.CONNECT_S: 0.002})
    server = span(call, "POST /infer", 4, 8, SpanKind.SERVER)
    ms = _components_ms([root, call, server])
    assert ms["connection set-up"] == 2
    assert ms[NETWORK] == 8 - 4 - 2


def test_a_server_span_that_outlasts_its_call_counts_within_the_call_only() -> None:
    """Triton ends its request span after it sent the answer, sometimes after the client has
    it: the overhang is the server's time outside the call, not a negative network."""
    root = span(TRACE, "event", 0, 10)
    call = span(root, "infer", 1, 8, SpanKind.CLIENT)
    sending = events(HTTP_RECV_START=2, HTTP_RECV_END=2.5, HTTP_SEND_START=6, HTTP_SEND_END=6.5)
    server = span(call, "InferRequest", 3, 9, SpanKind.SERVER, events=sending)
    ms = _components_ms([root, call, server])
    assert ms[NETWORK] == 2 - 1  # before the receive; after the send, the span still runs
    assert ms["server frontend"] == 0.5 + 3 + 1.5  # 2.5-3, 3-6, 6.5-8: up to the call's end
    assert ms["server receive"] == 0.5 and ms["server send"] == 0.5


def test_a_receive_marked_while_the_client_connected_counts_once() -> None:
    """Triton may mark its receive as it accepts a connection the client is still opening:
    that time is the connection's, and the receive counts from its end."""
    root = span(TRACE, "event", 0, 10)
    attributes = {semconv.SERIALIZE_S: 0.001, semconv.CONNECT_S: 0.002}
    call = span(root, "infer", 1, 9, SpanKind.CLIENT, **attributes)
    received = events(HTTP_RECV_START=3, HTTP_RECV_END=4.5, HTTP_SEND_START=7, HTTP_SEND_END=7.5)
    server = span(call, "InferRequest", 5, 8, SpanKind.SERVER, events=received)
    ms = _components_ms([root, call, server])
    assert ms["connection set-up"] == 2  # 2 to 4, serialised from 1 to 2
    assert ms["server receive"] == 0.5  # 4 to 4.5: not 3 to 4, the connection's
    assert ms[NETWORK] == 9 - 1 - 1 - 2 - 0.5 - 0.5 - 3  # 8 to 9 only: no instant twice


SERVE_NAMES = ("proxy_http_request", "route_to_replica", "replica_handle_request")


def serve_request() -> list[Span]:
    """A request through Ray Serve with Serve's own tracing on (its proxy, router and replica
    spans, as Ray 2.60 names them), otelkit's spans of the request nested in Serve's, and a
    handle call to a second deployment; Serve's replica spans end after their callers have
    the answer, as they do."""
    root = span(TRACE, "event", 0, 30)
    call = span(root, "v2/models/infer tracking", 1, 29, SpanKind.CLIENT)
    proxy = span(call, "proxy_http_request Ingress POST /infer", 2, 30, SpanKind.SERVER)
    route = span(proxy, "route_to_replica Ingress __call__", 3, 7, SpanKind.SERVER)
    serve_ingress = span(
        route,
        "replica_handle_request Ingress __call__",
        6,
        28,
        SpanKind.SERVER,
        deployment="Ingress",
    )
    ingress = span(
        serve_ingress,
        "POST /infer",
        8,
        25,
        SpanKind.SERVER,
        **{semconv.RAY_SERVE_DEPLOYMENT: "Ingress"},
    )
    waited = span(
        ingress, semconv.RAY_SERVE_QUEUE_SPAN, 9, 13, **{semconv.RAY_SERVE_DEPLOYMENT: "Model"}
    )
    route_model = span(ingress, "route_to_replica Model run", 10, 13, SpanKind.SERVER)
    serve_model = span(
        route_model, "replica_handle_request Model run", 12, 27, SpanKind.SERVER, deployment="Model"
    )
    model = span(
        serve_model, "Model.run", 14, 21, SpanKind.SERVER, **{semconv.RAY_SERVE_DEPLOYMENT: "Model"}
    )
    return [
        root,
        call,
        proxy,
        route,
        serve_ingress,
        ingress,
        waited,
        route_model,
        serve_model,
        model,
        stage(model, "gnn", 15, 20),
    ]


def test_ray_serves_own_spans_name_its_proxy_router_replicas_and_their_queues() -> None:
    ms = _components_ms(serve_request())
    assert ms["server Serve proxy"] == 1 + (29 - 25)  # to the router, and after the ingress
    # the router until each replica took the request (3-6 and 10-12); the handle call's wait
    # before the router started (9-10) is the queue's
    assert ms["server Serve router"] == 3 + 2
    # each replica's queue: Serve's span to otelkit's (6-8, 12-14), and 9-10
    assert ms[SERVER_QUEUE] == 2 + 2 + 1
    # each replica's own time: the ingress around its call (8-9, 21-25), the model around its
    # stage (14-15, 20-21); Serve's spans past otelkit's count for their callers
    assert ms["server Ingress replica"] == 1 + 4
    assert ms["server Model replica"] == 1 + 1
    assert ms["server gnn"] == 5
    assert ms[SERVER_OTHER] == 0
    assert ms[NETWORK] == 1  # 1-2: the proxy's span ends after the call, which counts to 29
    assert sum(v for k, v in ms.items() if k != TOTAL) == pytest.approx(ms[TOTAL])


def test_a_call_whose_first_hop_went_elsewhere_joins_the_earliest_orphan_server_in_it() -> None:
    """Ray Serve's proxy may export to another collector than its replicas: the replica's
    span, whose parent is missing, is the call's server, said as a problem; its hop's time is
    the network's."""
    serve = "ray.serve._private.tracing_utils"  # the scope of Serve's own spans
    spans = [
        dataclasses.replace(s, scope=serve) if s.name.split(" ")[0] in SERVE_NAMES else s
        for s in serve_request()
    ]
    kept = [s for s in spans if not s.name.startswith(("proxy_", "route_to_replica Ingress"))]
    traces = build_traces(kept)
    (trace,) = traces.values()
    components, problems = trace_components(trace, trace.spans[kept[0].span_id])
    # before the replica's span, and after it within the call
    assert components[NETWORK] == pytest.approx((6 - 1 + 29 - 28) * 1e-3)
    # the replica's span past otelkit's: its caller's, which is missing
    assert components[SERVER_OTHER] == pytest.approx((28 - 25) * 1e-3)
    assert components["server Ingress replica"] == pytest.approx(5e-3)
    assert any("parent span is missing" in p and "replica_handle_request" in p for p in problems)
    # an orphan of anything else (a proxy's lost span says nothing of who answered): left out
    unscoped = [dataclasses.replace(s, scope="") for s in kept]
    group = breakdown(build_traces(unscoped).values())[()]
    assert (group.traces, group.incomplete) == (0, 1)


def test_results_naming_the_network_as_earlier_releases_did_read_with_its_name() -> None:
    from otelkit.study._traces import PointTraces

    old = {"traces": 1, "components": {"network + offload": {"mean_ms": 2.0, "p99_ms": 3.0}}}
    assert set(PointTraces.from_dict(old).components) == {NETWORK}
