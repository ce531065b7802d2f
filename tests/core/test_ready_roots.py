"""Sampled root spans take ids and their ``traceparent`` drawn ahead (``spans.ReadyRoots``),
and the headers a call sends are the same whether its ``traceparent`` came ready-made or not."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import baggage, trace
from opentelemetry.context import attach, detach
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

import otelkit
from otelkit import telemetry
from otelkit._core.spans import READY_ROOTS, UNSAMPLED, SpanRecorder
from otelkit._core.switch import SWITCH
from otelkit._core.worker import LATER
from otelkit._propagation import format_traceparent
from otelkit.client._call import with_trace_context

RECORDER = SpanRecorder("tests.ready")


@pytest.fixture
def configured(tmp_path: Path) -> Iterator[None]:
    otelkit.configure(service_name="ready", traces_dir=str(tmp_path))
    yield
    otelkit.shutdown()


def ready() -> list[tuple[SpanContext, str]]:
    """What waits ready now, after a refill (as the worker does every cycle)."""
    READY_ROOTS._wanted = True
    READY_ROOTS.refill()
    return list(READY_ROOTS._ready)


def test_a_sampled_root_span_takes_ready_ids_and_their_header(configured: None) -> None:
    first = ready()[0]
    span = RECORDER.start("call", SpanKind.CLIENT)
    assert (span.context, span.traceparent) == first
    assert span.traceparent == format_traceparent(span.context)
    assert span.context.trace_flags == TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)
    assert span.parent is None  # type: ignore[union-attr]
    with trace.use_span(NonRecordingSpan(span.context)):
        child = RECORDER.start("child", SpanKind.CLIENT)
    assert child.traceparent is None  # a child draws its own span id, in its parent's trace
    assert child.context.trace_id == span.context.trace_id
    assert child.parent == span.context  # type: ignore[union-attr]


def test_ids_are_drawn_at_the_call_when_none_are_ready(configured: None) -> None:
    with LATER._lock:  # no refill of the worker's between these lines
        READY_ROOTS._ready.clear()
        READY_ROOTS._wanted = False
        span = RECORDER.start("call", SpanKind.CLIENT)
    assert span.traceparent is None and span.context.is_valid
    assert READY_ROOTS._wanted  # asked for: the next cycle draws some


def test_samplers_that_decide_by_trace_id_take_none(tmp_path: Path) -> None:
    for sampler in ("traceidratio", "always_off"):
        otelkit.configure(service_name="ready", traces_dir=str(tmp_path), sampler=sampler)
        waiting = len(ready())
        span = RECORDER.start("call", SpanKind.CLIENT)
        assert span.traceparent is None
        assert (span is UNSAMPLED) == (sampler == "always_off")
        assert len(READY_ROOTS._ready) >= waiting  # none taken (the worker may add some)
    otelkit.shutdown()


class Sequential(IdGenerator):
    """An id generator of a user's own, whose ids are not only random."""

    def __init__(self) -> None:
        self.next_id = 0x1000

    def generate_span_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def generate_trace_id(self) -> int:
        self.next_id += 1
        return self.next_id


def test_an_id_generator_of_its_own_is_asked_at_every_call(
    configured: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = telemetry.current()
    assert state is not None
    monkeypatch.setattr(state.tracer_provider, "id_generator", Sequential())
    monkeypatch.setattr(SWITCH, "generation", SWITCH.generation + 1)  # the pipeline is re-read
    ready()
    span = RECORDER.start("call", SpanKind.CLIENT)
    assert (span.context.trace_id, span.context.span_id) == (0x1001, 0x1002)
    assert span.traceparent is None


def test_the_headers_are_the_same_ready_made_or_formatted() -> None:
    context = SpanContext(0xAB, 0xCD, False, TraceFlags(0x03))
    header = format_traceparent(context)
    assert with_trace_context(None, context, header) == with_trace_context(None, context)
    assert with_trace_context(None, context, header) == {"traceparent": header}
    caller = {"X-Run": "7", "TraceParent": "00-stale"}
    assert with_trace_context(caller, context, header) == with_trace_context(caller, context)
    assert header in with_trace_context(caller, context, header).values()
    assert caller == {"X-Run": "7", "TraceParent": "00-stale"}  # the caller's dict, untouched
    token = attach(baggage.set_baggage("run", "42"))
    try:
        with_baggage = with_trace_context(None, context, header)
    finally:
        detach(token)
    assert with_baggage == {"traceparent": header, "baggage": "run=42"}


def _take_in_child(conn: Connection) -> None:
    conn.send(READY_ROOTS.take())


def test_a_forked_child_forgets_the_ready_ids(configured: None) -> None:
    parents = {header for _, header in ready()}
    context = multiprocessing.get_context("fork")
    parent_end, child_end = context.Pipe()
    child = context.Process(target=_take_in_child, args=(child_end,))
    child.start()
    assert parent_end.poll(20)
    taken: Any = parent_end.recv()
    child.join(10)
    assert child.exitcode == 0
    # none left from the parent: nothing, or ids the child's own worker drew since
    assert taken is None or taken[1] not in parents
    assert READY_ROOTS._ready  # the parent keeps its own
