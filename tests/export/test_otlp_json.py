"""OTLP JSON: the protobuf converter against golden documents, normalisation, the line writer."""

from __future__ import annotations

import enum
import itertools
import json
import logging
import math
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
    KeyValueList,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as PbResource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Status
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope as SdkScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanKind, StatusCode
from opentelemetry.trace import Status as SdkStatus
from opentelemetry.trace.span import SpanContext, TraceFlags, TraceState

from otelkit.export._jsonl import JsonLinesWriter
from otelkit.export._otlp_json import (
    dumps,
    normalize_json,
    request_to_json,
    span_count,
    spans_to_bytes,
    spans_to_json,
)

TRACE, OTHER = "0af7651916cd43dd8448eb211c80319c", "5b8aa5a2d2c872e8321cf37308d69df2"
SPAN, PARENT = "b7ad6b7169203331", "00f067aa0ba902b7"


def kv(key: str, **value: Any) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(**value))


def every_kind_request() -> ExportTraceServiceRequest:
    attributes = [
        kv("s", string_value="exatrkx"),
        kv("i", int_value=-(2**62)),
        kv("d", double_value=0.75),
        kv("inf", double_value=math.inf),
        kv("b", bool_value=True),
        kv("a", array_value=ArrayValue(values=[AnyValue(string_value="x"), AnyValue(int_value=3)])),
        kv("kv", kvlist_value=KeyValueList(values=[kv("inner", bool_value=False)])),
        kv("bytes", bytes_value=b"\x00\xffgpu"),
        kv("empty-array", array_value=ArrayValue()),
        KeyValue(key="empty", value=AnyValue()),
        KeyValue(key="unset"),
    ]
    span = PbSpan(
        trace_id=bytes.fromhex(TRACE),
        span_id=bytes.fromhex(SPAN),
        parent_span_id=bytes.fromhex(PARENT),
        trace_state="otelkit=1",
        flags=0x301,
        name="frnn",
        kind=PbSpan.SPAN_KIND_SERVER,
        start_time_unix_nano=1_790_000_000_000_000_001,
        end_time_unix_nano=1_790_000_000_004_000_001,
        attributes=attributes,
        dropped_attributes_count=2,
        events=[
            PbSpan.Event(time_unix_nano=1_790_000_000_001_000_000, name="QUEUE_START"),
            PbSpan.Event(
                time_unix_nano=1_790_000_000_002_000_000,
                name="COMPUTE_START",
                attributes=[kv("gpu", int_value=0)],
                dropped_attributes_count=1,
            ),
        ],
        dropped_events_count=3,
        links=[
            PbSpan.Link(
                trace_id=bytes.fromhex(OTHER),
                span_id=bytes.fromhex(SPAN),
                trace_state="a=b",
                attributes=[kv("why", string_value="batched")],
                flags=0x100,
            )
        ],
        status=Status(code=Status.STATUS_CODE_ERROR, message="CUDA out of memory"),
    )
    return ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=PbResource(attributes=[kv("service.name", string_value="triton")]),
                scope_spans=[
                    ScopeSpans(
                        scope=InstrumentationScope(name="otelkit.server", version="0.1.0"),
                        spans=[span, PbSpan(trace_id=bytes.fromhex(TRACE), span_id=b"\1" * 8)],
                        schema_url="https://opentelemetry.io/schemas/1.26.0",
                    )
                ],
            )
        ]
    )


GOLDEN_SPAN = {
    "traceId": TRACE,
    "spanId": SPAN,
    "traceState": "otelkit=1",
    "parentSpanId": PARENT,
    "flags": 769,
    "name": "frnn",
    "kind": 2,
    "startTimeUnixNano": "1790000000000000001",
    "endTimeUnixNano": "1790000000004000001",
    "attributes": [
        {"key": "s", "value": {"stringValue": "exatrkx"}},
        {"key": "i", "value": {"intValue": "-4611686018427387904"}},
        {"key": "d", "value": {"doubleValue": 0.75}},
        {"key": "inf", "value": {"doubleValue": "Infinity"}},
        {"key": "b", "value": {"boolValue": True}},
        {
            "key": "a",
            "value": {"arrayValue": {"values": [{"stringValue": "x"}, {"intValue": "3"}]}},
        },
        {
            "key": "kv",
            "value": {"kvlistValue": {"values": [{"key": "inner", "value": {"boolValue": False}}]}},
        },
        {"key": "bytes", "value": {"bytesValue": "AP9ncHU="}},
        {"key": "empty-array", "value": {"arrayValue": {}}},
        {"key": "empty", "value": {}},
        {"key": "unset"},
    ],
    "droppedAttributesCount": 2,
    "events": [
        {"timeUnixNano": "1790000000001000000", "name": "QUEUE_START"},
        {
            "timeUnixNano": "1790000000002000000",
            "name": "COMPUTE_START",
            "attributes": [{"key": "gpu", "value": {"intValue": "0"}}],
            "droppedAttributesCount": 1,
        },
    ],
    "droppedEventsCount": 3,
    "links": [
        {
            "traceId": OTHER,
            "spanId": SPAN,
            "traceState": "a=b",
            "attributes": [{"key": "why", "value": {"stringValue": "batched"}}],
            "flags": 256,
        }
    ],
    "status": {"message": "CUDA out of memory", "code": 2},
}
GOLDEN = {
    "resourceSpans": [
        {
            "resource": {
                "attributes": [{"key": "service.name", "value": {"stringValue": "triton"}}]
            },
            "scopeSpans": [
                {
                    "scope": {"name": "otelkit.server", "version": "0.1.0"},
                    "spans": [
                        GOLDEN_SPAN,
                        {"traceId": TRACE, "spanId": "0101010101010101"},
                    ],
                    "schemaUrl": "https://opentelemetry.io/schemas/1.26.0",
                }
            ],
        }
    ]
}


def test_request_to_json_matches_the_golden_document() -> None:
    assert request_to_json(every_kind_request()) == GOLDEN
    assert request_to_json(ExportTraceServiceRequest()) == {}


def test_request_to_json_agrees_with_protobufs_generic_mapping() -> None:
    request = every_kind_request()
    generic = normalize_json(MessageToDict(request))  # base64 ids and enum names → OTLP JSON
    assert request_to_json(request) == generic
    assert normalize_json(request_to_json(request)) == GOLDEN  # already normal: unchanged


class FixedIds(IdGenerator):
    def __init__(self) -> None:
        self.span_ids = iter([0x1111, 0x2222, 0x3333])

    def generate_span_id(self) -> int:
        return next(self.span_ids)

    def generate_trace_id(self) -> int:
        return int(TRACE, 16)


def sdk_spans() -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource({"service.name": "client"}), id_generator=FixedIds()
    )
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("otelkit.client", "0.1.0")
    with tracer.start_as_current_span("infer", kind=SpanKind.CLIENT, start_time=1000) as root:
        root.set_attribute("server.port", 8001)
        link = Link(root.get_span_context(), {"reason": "retry"})
        child = tracer.start_span("serialize", start_time=2000, links=[link])
        child.add_event("done", {"bytes": 12}, timestamp=2500)
        child.set_status(StatusCode.ERROR, "too big")
        child.end(end_time=3000)
        root.end(end_time=4000)
    provider.shutdown()
    return list(memory.get_finished_spans())


def test_spans_to_json_encodes_sdk_spans() -> None:
    doc = spans_to_json(sdk_spans())
    assert doc == {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "client"}}]
                },
                "scopeSpans": [
                    {
                        "scope": {"name": "otelkit.client", "version": "0.1.0"},
                        "spans": [
                            {
                                "traceId": TRACE,
                                "spanId": "0000000000002222",
                                "parentSpanId": "0000000000001111",
                                "flags": 256,
                                "name": "serialize",
                                "kind": 1,
                                "startTimeUnixNano": "2000",
                                "endTimeUnixNano": "3000",
                                "events": [
                                    {
                                        "timeUnixNano": "2500",
                                        "name": "done",
                                        "attributes": [
                                            {"key": "bytes", "value": {"intValue": "12"}}
                                        ],
                                    }
                                ],
                                "links": [
                                    {
                                        "traceId": TRACE,
                                        "spanId": "0000000000001111",
                                        "flags": 256,
                                        "attributes": [
                                            {"key": "reason", "value": {"stringValue": "retry"}}
                                        ],
                                    }
                                ],
                                "status": {"message": "too big", "code": 2},
                            },
                            {
                                "traceId": TRACE,
                                "spanId": "0000000000001111",
                                "flags": 256,
                                "name": "infer",
                                "kind": 3,
                                "startTimeUnixNano": "1000",
                                "endTimeUnixNano": "4000",
                                "attributes": [
                                    {"key": "server.port", "value": {"intValue": "8001"}}
                                ],
                            },
                        ],
                    }
                ],
            }
        ]
    }
    assert span_count(doc) == 2


def test_normalize_json_turns_base64_and_enum_names_into_otlp_json() -> None:
    doc = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "CvdlGRbNQ92ESOshHIAxnA==",  # protobuf JSON: base64
                                "spanId": SPAN.upper(),
                                "parentSpanId": "",
                                "kind": "SPAN_KIND_CLIENT",
                                "startTimeUnixNano": 1790000000000000001,
                                "attributes": [{"key": "n", "value": {"intValue": 7}}],
                                "links": [{"traceId": OTHER, "spanId": "APBnqgupArc="}],
                                "status": {"code": "STATUS_CODE_OK"},
                            }
                        ]
                    }
                ]
            }
        ]
    }
    assert normalize_json(doc)["resourceSpans"][0]["scopeSpans"][0]["spans"] == [
        {
            "traceId": TRACE,
            "spanId": SPAN,
            "kind": 3,
            "startTimeUnixNano": "1790000000000000001",
            "attributes": [{"key": "n", "value": {"intValue": "7"}}],
            "links": [{"traceId": OTHER, "spanId": PARENT}],
            "status": {"code": 1},
        }
    ]


def one_span(**fields: Any) -> dict[str, Any]:
    span = {"traceId": TRACE, "spanId": SPAN, **fields}
    return {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "the body is not an object but list"),
        ({"resourceSpans": {}}, "resourceSpans is not a list"),
        ({"resourceSpans": [{"scopeSpans": [{"spans": "x"}]}]}, r"scopeSpans\[0\]\.spans is not"),
        (one_span(spanId="b7ad6b71"), r"spans\[0\]\.spanId = 'b7ad6b71' is not 8 bytes"),
        (one_span(traceId=None), r"traceId = None is not 16 bytes"),
        (one_span(parentSpanId="zz" * 8), "parentSpanId"),
        (one_span(kind="SERVER"), "kind = 'SERVER' is not a valid enum"),
        (one_span(startTimeUnixNano="-5"), "startTimeUnixNano = '-5' is not a uint64"),
        (one_span(attributes=[["k", "v"]]), "not a key-value"),
        (one_span(links=[{"traceId": TRACE}]), r"links\[0\]\.spanId"),
    ],
)
def test_normalize_json_rejects_garbage_saying_where(doc: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        normalize_json(doc)


def read_lines(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_writer_appends_whole_lines_from_many_threads(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    with JsonLinesWriter(path) as writer:
        threads = [
            threading.Thread(
                target=lambda t=t: [writer.write({"t": t, "n": n}) for n in range(200)]
            )
            for t in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert sorted((d["t"], d["n"]) for d in read_lines(path)) == [
        (t, n) for t in range(8) for n in range(200)
    ]
    assert path.read_text().startswith('{"t":')  # compact separators
    with pytest.raises(ValueError, match="closed"):
        writer.write({})


def test_writer_rotates_at_the_size_limit(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    with JsonLinesWriter(path, max_bytes=100) as writer:
        for n in range(10):
            writer.write({"n": n, "pad": "x" * 16})  # 33 bytes a line: 3 lines a file
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == [
        "traces.1.jsonl",
        "traces.2.jsonl",
        "traces.3.jsonl",
        "traces.jsonl",
    ]
    assert [[d["n"] for d in read_lines(f)] for f in files] == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7, 8],
        [9],
    ]


def test_writer_loses_nothing_written_when_the_process_is_killed(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import os, signal, sys
        from otelkit.export._jsonl import JsonLinesWriter
        writer = JsonLinesWriter(sys.argv[1])
        for n in range(3):
            writer.write({"n": n})
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    path = tmp_path / "traces.jsonl"
    process = subprocess.run([sys.executable, "-c", script, str(path)], timeout=60, check=False)
    assert process.returncode == -9
    assert read_lines(path) == [{"n": 0}, {"n": 1}, {"n": 2}]


# -- spans_to_bytes: exactly the protobuf path's document, without protobuf --------------------


def protobuf_path(spans: list[ReadableSpan]) -> dict[str, Any]:
    return request_to_json(encode_spans(spans))


def assert_same_as_protobuf_path(spans: list[ReadableSpan]) -> None:
    expected = protobuf_path(spans)
    assert spans_to_bytes(spans) == dumps(expected)  # the same key order and numbers too
    assert spans_to_json(spans) == expected


def context(trace_id: int, span_id: int, remote: bool = False, **state: str) -> SpanContext:
    trace_state = TraceState(list(state.items())) if state else None
    return SpanContext(trace_id, span_id, remote, TraceFlags(1), trace_state)


class Level(enum.IntEnum):
    HIGH = 3


class Tag(str):
    def __str__(self) -> str:
        return "not what protobuf stores"


class DescribedStatus(SdkStatus):
    """What the SDK's Status refuses to hold: a description without an error."""

    @property
    def description(self) -> str | None:
        return "unset, yet described"


ENCODABLE: dict[Any, Any] = {
    "str": "exatrkx",
    "unicode": "Zürich → 東京 🚀",
    "empty-str": "",
    "int": 42,
    "int-min": -(2**63),
    "int-max": 2**63 - 1,
    "float": 0.75,
    "negative-zero": -0.0,
    "inf": math.inf,
    "-inf": -math.inf,
    "nan": math.nan,
    "true": True,
    "false": False,
    "bytes": b"\x00\xffgpu",
    "empty-bytes": b"",
    "strs": ("a", "ü"),
    "ints": [1, -(2**63)],
    "floats": (1.5, math.nan, -math.inf),
    "bools": (True, False),
    "bytes-array": (b"\x01",),
    "empty-array": (),
    "mixed": ["x", 1, 2.5, None, b"y"],
    "nested": [[1, 2], []],
    "mapping": {"inner": {"deep": 1}, 2: "int key", "none": None},
    "empty-mapping": {},
    "none": None,
    "int-enum": Level.HIGH,
    "str-subclass": Tag("tag"),
    "bytearray": bytearray(b"ab"),  # a Sequence to encode_spans: an array of ints
    "": "empty key",
    b"bytes-key": "protobuf decodes it",
    None: "protobuf's unset string",
}
REFUSED: dict[Any, Any] = {  # by protobuf: encode_spans logs each and leaves it out
    "too-big": 2**63,
    "too-small": -(2**63) - 1,
    "too-big-in-array": [1, 2**64],
    "surrogate": "\ud800",
    "surrogate-in-array": ["ok", "\udfff"],
    "surrogate-mapping-key": {"\ud800": 1},
    "\ud800-key": "value",
    b"\xff-key": "value",
    7: "an int key",
    "object": object(),
    "object-in-array": [object()],
}
EVERY_VALUE = {**ENCODABLE, **REFUSED}


def direct_spans() -> list[ReadableSpan]:
    """ReadableSpans as exporters receive them, built field by field to reach every corner."""
    tid = int(TRACE, 16)
    gpu = Resource({"service.name": "triton", "host.name": "gpu-3"}, "https://schema/1")
    gpu_again = Resource({"host.name": "gpu-3", "service.name": "triton"}, "https://schema/1")
    cpu = Resource({"service.name": "client", "blob": b"\x01", "ports": (8000, 8001)})
    server = SdkScope("otelkit.server", "0.1.0", "https://s/2", {"a": 1})
    server_other_attrs = SdkScope("otelkit.server", "0.1.0", "https://s/2", {"a": 2})
    bare_scope = SdkScope("")
    bounded = BoundedAttributes(maxlen=2, attributes={"x": 1, "y": 2, "z": 3})
    events = [
        Event("plain", timestamp=5),
        Event("with-attributes", {"gpu": 0, "bad": 2**70, "nan": math.nan}, timestamp=6),
        Event("bounded", bounded, timestamp=7),
        Event("", timestamp=0),
    ]
    links = [
        Link(context(tid, 9, remote=True, vendor="x", other="y"), {"why": "batched"}),
        Link(context(0, 0)),
        Link(context(tid, 10), BoundedAttributes(maxlen=1, attributes={"a": 1, "b": 2})),
    ]
    return [
        ReadableSpan(
            "every-value",
            context(tid, 1, acme="1"),
            parent=context(tid, 2, remote=True),
            resource=gpu,
            attributes=EVERY_VALUE,
            events=events,
            links=links,
            kind=SpanKind.SERVER,
            status=SdkStatus(StatusCode.ERROR, "CUDA out of memory"),
            start_time=1_790_000_000_000_000_001,
            end_time=2**64 - 1,
            instrumentation_scope=server,
        ),
        ReadableSpan("no-scope", context(tid, 3), resource=cpu, kind=SpanKind.PRODUCER),
        ReadableSpan(
            "equal-resource",
            context(tid, 4),
            parent=context(tid, 1),
            resource=gpu_again,  # equal to gpu: grouped with it, written as gpu
            attributes=bounded,
            status=SdkStatus(StatusCode.OK),
            instrumentation_scope=server_other_attrs,  # hashes as server, not equal to it
            kind=SpanKind.CONSUMER,
        ),
        ReadableSpan(
            "",
            context(0, 0),
            parent=context(0, 0),
            resource=cpu,
            instrumentation_scope=bare_scope,
            status=DescribedStatus(StatusCode.UNSET),
            start_time=0,
        ),
        ReadableSpan("server-again", context(tid, 5), resource=gpu, instrumentation_scope=server),
        ReadableSpan("no-status", context(tid, 6), resource=cpu, status=None),  # type: ignore[arg-type]
        ReadableSpan("client", context(tid, 7), resource=gpu, kind=SpanKind.CLIENT),
        ReadableSpan("empty-trace-state", context(tid, 8), resource=gpu, kind=SpanKind.INTERNAL),
    ]


def sdk_made_spans() -> list[ReadableSpan]:
    """Spans as a real TracerProvider makes them, with limits that force every dropped count."""
    memory = InMemorySpanExporter()
    limits = SpanLimits(max_span_attributes=3, max_events=2, max_links=1, max_event_attributes=1)
    providers = [
        TracerProvider(resource=Resource({"service.name": name}), span_limits=limits)
        for name in ("client", "server")
    ]
    for provider in providers:
        provider.add_span_processor(SimpleSpanProcessor(memory))
    client, server = (p.get_tracer("otelkit.client", "0.1.0") for p in providers)
    plain = providers[0].get_tracer("plain", schema_url="https://schema/3")
    remote = context(int(OTHER, 16), 0xABC, remote=True, vendor="v1", acme="2")
    with client.start_as_current_span("call", kind=SpanKind.CLIENT, start_time=10) as call:
        call.set_attributes({"a": "x", "b": 2, "c": 3.5, "d": True, "e": ["over", "limit"]})
        for n in range(3):
            call.add_event(f"event-{n}", {"n": n, "m": -n}, timestamp=20 + n)
        with plain.start_as_current_span("inner", links=[Link(remote), Link(remote)]) as inner:
            inner.set_status(StatusCode.OK)
        parent = trace.set_span_in_context(NonRecordingSpan(remote))
        with server.start_as_current_span("handle", parent, kind=SpanKind.SERVER) as handle:
            handle.record_exception(ValueError("bad input"))
            handle.set_status(SdkStatus(StatusCode.ERROR, "bad input"))
        with client.start_as_current_span("stream", kind=SpanKind.PRODUCER):
            pass
    with server.start_as_current_span("root", kind=SpanKind.CONSUMER, attributes={"u": "é"}):
        pass
    for provider in providers:
        provider.shutdown()
    return list(memory.get_finished_spans())


def grouping(doc: dict[str, Any]) -> list[Any]:
    """Resource attribute values → scope names → span names, of an OTLP JSON document."""
    return [
        (
            [a.get("value", {}).get("stringValue") for a in rs["resource"].get("attributes", [])],
            [
                (ss["scope"].get("name"), [s.get("name") for s in ss["spans"]])
                for ss in rs["scopeSpans"]
            ],
        )
        for rs in doc["resourceSpans"]
    ]


def test_spans_to_json_is_the_protobuf_paths_document_for_every_kind_of_span() -> None:
    direct, made = direct_spans(), sdk_made_spans()
    for span in [*direct, *made]:
        assert_same_as_protobuf_path([span])
    interleaved = [s for pair in itertools.zip_longest(direct, made) for s in pair if s is not None]
    for batch in (direct, made, interleaved, [*made, *direct], direct[::-1]):
        assert_same_as_protobuf_path(batch)
    assert_same_as_protobuf_path([])

    # What the equivalence covers: encode_spans' grouping (equal resources are one, equal-hashing
    # scopes with other attributes are two, first appearance first) ...
    doc = spans_to_json(interleaved)
    assert grouping(doc) == [
        (
            ["triton", "gpu-3"],
            [
                ("otelkit.server", ["every-value", "server-again"]),
                ("otelkit.server", ["equal-resource"]),
                (None, ["client", "empty-trace-state"]),
            ],
        ),
        (["client"], [("plain", ["inner"]), ("otelkit.client", ["stream", "call"])]),
        (["client", None, None], [(None, ["no-scope", "no-status"]), (None, [None])]),
        (["server"], [("otelkit.client", ["handle", "root"])]),
    ]
    # ... which attributes protobuf refuses (left out) ...
    every_value = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    keys = ["bytes-key" if k == b"bytes-key" else k or "" for k in ENCODABLE]
    assert [a["key"] for a in every_value["attributes"]] == keys
    # ... and the flags and counts that only some spans have.
    spans = [
        s
        for rs in spans_to_json(made)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
    ]
    assert {"droppedAttributesCount", "droppedEventsCount", "droppedLinksCount"} <= {
        key for span in spans for key in span
    }
    assert {span["flags"] for span in spans} == {0x100, 0x300}


def test_spans_to_json_logs_what_it_leaves_out_as_encode_spans_does(
    caplog: pytest.LogCaptureFixture,
) -> None:
    attributes: dict[str, Any] = {"ok": 1, "too-big": 2**64, "x": object()}
    span = ReadableSpan("s", context(1, 1), attributes=attributes)
    caplog.set_level(logging.ERROR)
    spans_to_json([span])
    ours = [r.getMessage() for r in caplog.records]
    caplog.clear()
    encode_spans([span])
    assert [r.getMessage() for r in caplog.records] == ours
    assert len(ours) == 2
