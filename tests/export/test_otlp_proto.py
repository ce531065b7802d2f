"""``otlp_proto.encode_request`` writes what ``encode_spans(...).SerializeToString()`` writes.

Spans of every shape the SDK makes (and a few only a hand-built ``ReadableSpan`` can hold) are
encoded both ways; parsed back, the two requests are the same message.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from otelkit.export._otlp_proto import encode_request

ATTRIBUTES: dict[str, Any] = {
    "text": "grpc",
    "empty": "",
    "unicode": "Übergang → π",
    "zero": 0,
    "negative": -7,
    "large": 2**63 - 1,
    "smallest": -(2**63),
    "ratio": 0.75,
    "negative zero": -0.0,
    "infinite": math.inf,
    "flag": True,
    "off": False,
    "names": ("a", "b"),
    "numbers": [1, -2, 3],
    "floats": [0.5, 1.5],
    "flags": [True, False],
}


def sdk_spans(limits: SpanLimits | None = None) -> list[ReadableSpan]:
    """Spans as the SDK ends them: root, child, remote parent, events, links, statuses."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource({"service.name": "encode", "host.name": "node-1", "process.pid": 4}),
        span_limits=limits,
    )
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("otelkit.client", "1.2.3", schema_url="https://schema/1")
    other = provider.get_tracer("otelkit.server")
    remote = SpanContext(
        0x4BF92F3577B34DA6A3CE929D0E0E4736,
        0x00F067AA0BA902B7,
        True,
        TraceFlags(1),
        TraceState([("vendor", "v1"), ("other", "x")]),
    )
    parent = trace.set_span_in_context(trace.NonRecordingSpan(remote))
    with tracer.start_as_current_span("root", kind=SpanKind.CLIENT, attributes=ATTRIBUTES):
        with other.start_as_current_span("child", kind=SpanKind.SERVER) as child:
            child.add_event("stage", {"stage": "embed", "items": 3})
            child.add_event("bare")
            child.set_status(Status(StatusCode.ERROR, "model failed"))
        span = tracer.start_span(
            "linked",
            links=[Link(remote, {"why": "batch"}), Link(child.get_span_context())],
        )
        span.set_status(Status(StatusCode.OK))
        span.end()
    with tracer.start_as_current_span("remote child", context=parent):
        pass
    try:
        with tracer.start_as_current_span("failed"):
            raise ValueError("bad input")
    except ValueError:
        pass
    provider.shutdown()
    return list(memory.get_finished_spans())


def same_request(spans: list[ReadableSpan]) -> None:
    ours = ExportTraceServiceRequest.FromString(encode_request(spans))
    theirs = encode_spans(spans)
    assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(
        deterministic=True
    )


def test_sdk_spans_encode_as_the_sdk_encodes_them() -> None:
    spans = sdk_spans()
    assert len(spans) == 5
    same_request(spans)
    request = ExportTraceServiceRequest.FromString(encode_request(spans))
    scopes = request.resource_spans[0].scope_spans
    assert [scope.scope.name for scope in scopes] == ["otelkit.server", "otelkit.client"]  # ended
    names = [span.name for scope in scopes for span in scope.spans]
    assert sorted(names) == ["child", "failed", "linked", "remote child", "root"]


def test_dropped_attributes_events_and_links_are_counted_alike() -> None:
    limits = SpanLimits(
        max_span_attributes=3,
        max_events=1,
        max_links=1,
        max_event_attributes=1,
        max_link_attributes=0,
    )
    same_request(sdk_spans(limits))
    wide = SpanLimits(max_events=2, max_links=2, max_event_attributes=1, max_link_attributes=0)
    spans = sdk_spans(wide)
    same_request(spans)
    child, linked = (next(s for s in spans if s.name == name) for name in ("child", "linked"))
    assert child.events[0].dropped_attributes == 1 and linked.links[0].dropped_attributes == 1


def test_spans_of_several_resources_and_no_scope() -> None:
    spans = sdk_spans()
    other = Resource({"service.name": "second", "ratio": 0.5}, schema_url="https://schema/2")
    bare = ReadableSpan(
        name="no scope",
        context=spans[0].context,
        resource=other,
        attributes={"k": "v"},
        events=[Event("e", {"n": 1}, timestamp=12)],
        start_time=10,
        end_time=20,
        instrumentation_scope=None,
    )
    scoped = InstrumentationScope("scope", None, None, {"scope.attribute": "yes"})
    with_scope = ReadableSpan(
        name="", context=spans[1].context, resource=other, instrumentation_scope=scoped
    )
    same_request([*spans[:2], bare, spans[2], with_scope, *spans[2:]])
    request = ExportTraceServiceRequest.FromString(encode_request([bare, with_scope]))
    assert [r.resource.attributes[0].value.string_value for r in request.resource_spans] == [
        "second"
    ]


def test_values_only_a_readable_span_can_hold() -> None:
    """Nested values, bytes, None and mappings; and what protobuf refuses (an int beyond 64
    bits, a lone surrogate) is left out by both, each logged."""
    context = sdk_spans()[0].context
    span = ReadableSpan(
        name="odd values",
        context=context,
        attributes={
            "bytes": b"\x00\xff",
            "none": None,
            "mapping": {"a": 1, "b": [1.5, "x"], 3: {"deep": True}},
            "mixed": ["a", 1, None, b"z", (2, 3)],
            "empty": (),
            "huge": 2**64,
            "surrogate": "\ud800",
            "nan": math.nan,
        },
        resource=Resource({}),
    )
    same_request([span])
    names = [
        kv.key
        for kv in ExportTraceServiceRequest.FromString(encode_request([span]))
        .resource_spans[0]
        .scope_spans[0]
        .spans[0]
        .attributes
    ]
    assert names == ["bytes", "none", "mapping", "mixed", "empty", "nan"]


def test_a_span_protobuf_cannot_encode_fails_as_it_does() -> None:
    context = sdk_spans()[0].context
    span = ReadableSpan(name="\udc00", context=context, resource=Resource({}))
    with pytest.raises(UnicodeEncodeError):
        encode_request([span])
    with pytest.raises(Exception):  # noqa: B017 - protobuf's own error type varies by runtime
        encode_spans([span]).SerializeToString()


def test_no_spans_is_an_empty_request() -> None:
    assert encode_request([]) == b"" == encode_spans([]).SerializeToString()
