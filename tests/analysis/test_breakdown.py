"""otelkit.analysis._breakdown: a trace split into client, network, queue and stage time.

Hand-built traces with known durations: the components must add up to the root, land in the
right place (client stage vs server stage), and a broken nesting must be reported.
"""

from __future__ import annotations

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


def one_event(option: int = 1, trace_id: str = TRACE) -> list[Span]:
    """root 0..20 ms: a local stage (2 ms), a call (10 ms) whose server span is 6 ms with 1 ms
    queue and a 3 ms stage holding a nested stage, then glue."""
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
    server = span(call, "InferRequest", 6, 12, SpanKind.SERVER)
    model = span(server, "gnn", 6, 12, events=(SpanEvent("QUEUE_START", 6 * MS),))
    compute = span(model, "compute", 7, 11, events=(SpanEvent("COMPUTE_START", 7 * MS),))
    outer = stage(compute, "gnn", 7.5, 10.5)
    inner = stage(outer, "message_passing", 8, 10)
    return [root, local, call, server, model, compute, outer, inner]


def test_components_add_up_and_land_where_they_ran() -> None:
    trace = build_traces(one_event())[TRACE]
    components, problems = trace_components(trace, trace.roots[0])
    assert problems == []
    ms = {name: round(seconds * 1e3, 6) for name, seconds in components.items()}
    assert ms["client build_graph"] == 2
    assert ms["client serialize"] == 0.5 and ms["client deserialize"] == 0.25
    assert ms[NETWORK] == 10 - 6 - 0.75
    assert ms[SERVER_QUEUE] == 1
    assert ms["server gnn"] == 3  # the outermost stage only: the nested one is inside it
    assert "server message_passing" not in ms
    assert ms[SERVER_OTHER] == 6 - 1 - 3
    assert ms[CLIENT_OTHER] == 20 - 2 - 10
    assert ms[TOTAL] == 20
    parts = sum(v for k, v in ms.items() if k != TOTAL)
    assert parts == pytest.approx(ms[TOTAL])


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
    assert slowest == ("server gnn", pytest.approx(0.003), pytest.approx(0.15))
    text = format_breakdowns(groups, labels=("option",))
    assert "option=2: 1 traces (1 left out: server spans missing)" in text
    assert "  slowest stage: server gnn, 3.00 ms per trace, 15 % of the time" in text
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
