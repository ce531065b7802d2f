"""The trace loader: receiver output and Collector file-exporter output into spans and trees."""

from __future__ import annotations

import copy
import gzip
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from otelkit.analysis import Span, SpanEvent, SpanLink, Trace, build_traces, load_spans
from otelkit.analysis import SpanKind as Kind
from otelkit.analysis import StatusCode as Status
from otelkit.receiver import Receiver

T1, T2 = "5b8efff798038103d269b633813fc60c", "0af7651916cd43dd8448eb211c80319c"
Shape = tuple[str, list[Any]]


def shape(trace: Trace) -> list[Shape]:
    """The tree as (name, [children]) in start order: compared whole."""

    def node(span: Span) -> Shape:
        return (span.name, [node(child) for child in trace.children(span)])

    return [node(root) for root in trace.roots]


def traced_requests(provider: TracerProvider) -> None:
    """Two client calls, each with Triton's spans below it and a pipeline of stages."""
    tracer = provider.get_tracer("otelkit.client", "0.1.0")
    for model in ("exatrkx", "embed"):
        with tracer.start_as_current_span(f"infer {model}", kind=SpanKind.CLIENT) as call:
            call.set_attribute("server.port", 8001)
            with (
                tracer.start_as_current_span("InferRequest", kind=SpanKind.SERVER),
                tracer.start_as_current_span(model) as span,
            ):
                span.add_event("QUEUE_START", {"queue": 1})
                for stage in ("frnn", "filter", "gnn"):
                    with tracer.start_as_current_span(stage):
                        pass
                span.set_status(StatusCode.ERROR, "boom")


@pytest.fixture
def receiver_output(tmp_path: Path) -> Iterator[tuple[Path, InMemorySpanExporter]]:
    memory = InMemorySpanExporter()
    with Receiver(tmp_path) as receiver:
        provider = TracerProvider(resource=Resource({"service.name": "client"}))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        exporter = OTLPSpanExporter(endpoint=receiver.traces_url)
        provider.add_span_processor(BatchSpanProcessor(exporter))
        traced_requests(provider)
        provider.shutdown()
        assert receiver.wait_for_spans(12, timeout=10)
    yield tmp_path, memory


def test_receiver_output_rebuilds_each_tree(
    receiver_output: tuple[Path, InMemorySpanExporter],
) -> None:
    directory, memory = receiver_output
    traces = build_traces(load_spans(directory))
    pipeline: list[Shape] = [("frnn", []), ("filter", []), ("gnn", [])]
    assert sorted(shape(t) for t in traces.values()) == [
        [("infer embed", [("InferRequest", [("embed", pipeline)])])],
        [("infer exatrkx", [("InferRequest", [("exatrkx", pipeline)])])],
    ]
    sent = {f"{s.context.span_id:016x}": s for s in memory.get_finished_spans()}
    assert set(traces) == {f"{s.context.trace_id:032x}" for s in sent.values()}
    assert all(not trace.orphans for trace in traces.values())


def test_a_loaded_span_carries_everything_the_sdk_recorded(
    receiver_output: tuple[Path, InMemorySpanExporter],
) -> None:
    directory, memory = receiver_output
    sdk = next(s for s in memory.get_finished_spans() if s.name == "exatrkx")
    span = next(s for s in load_spans(directory) if s.name == "exatrkx")
    assert sdk.parent is not None and sdk.start_time and sdk.end_time
    assert span == Span(
        trace_id=f"{sdk.context.trace_id:032x}",
        span_id=f"{sdk.context.span_id:016x}",
        parent_span_id=f"{sdk.parent.span_id:016x}",
        name="exatrkx",
        kind=Kind.INTERNAL,
        start_ns=sdk.start_time,
        end_ns=sdk.end_time,
        attributes={},
        resource={"service.name": "client"},
        scope="otelkit.client",
        events=(SpanEvent("QUEUE_START", sdk.events[0].timestamp, {"queue": 1}),),
        links=(),
        status_code=Status.ERROR,
        status_message="boom",
    )
    assert span.duration_ns == sdk.end_time - sdk.start_time > 0


def collector_span(
    span_id: str, parent: str | None, name: str, start: int, **extra: Any
) -> dict[str, Any]:
    """A span as the Collector's file exporter writes it."""
    span = {"traceId": T1, "spanId": span_id, "name": name, "kind": 2}
    span |= {"startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 100), **extra}
    return {**span, "parentSpanId": parent} if parent else span


def collector_line(*spans: dict[str, Any], service: str = "triton") -> str:
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]}
    scope = {"scope": {"name": "triton"}, "spans": list(spans)}
    doc = {"resourceSpans": [{"resource": resource, "scopeSpans": [scope], "schemaUrl": ""}]}
    return json.dumps(doc, separators=(",", ":"))


COUNTER = {"name": "nv_inference_count", "sum": {"dataPoints": [{"asInt": "3"}]}}
METRICS_LINE = json.dumps({"resourceMetrics": [{"scopeMetrics": [{"metrics": [COUNTER]}]}]})
LOG = {"body": {"stringValue": "model loaded"}}
LOGS_LINE = json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [LOG]}]}]})


def test_collector_file_with_metrics_and_logs_lines_and_a_gz_file(tmp_path: Path) -> None:
    attrs = [
        {"key": "triton.model_name", "value": {"stringValue": "exatrkx"}},
        {"key": "batch", "value": {"intValue": "4"}},
        {
            "key": "shape",
            "value": {"arrayValue": {"values": [{"intValue": "314"}, {"doubleValue": 0.5}]}},
        },
        {
            "key": "cfg",
            "value": {"kvlistValue": {"values": [{"key": "gpu", "value": {"boolValue": True}}]}},
        },
        {"key": "raw", "value": {"bytesValue": "AAE="}},
        {"key": "ratio", "value": {"doubleValue": "NaN"}},
    ]
    root = collector_span("eee19b7ec3c1b173", None, "InferRequest", 1000, status={})
    model = collector_span(
        "eee19b7ec3c1b174", "eee19b7ec3c1b173", "exatrkx", 1100, attributes=attrs
    )
    (tmp_path / "collector.jsonl").write_text(
        "\n".join([METRICS_LINE, collector_line(root), "", LOGS_LINE, collector_line(model)]) + "\n"
    )
    compute = collector_span(
        "7uGbfsPBsXU=",  # protobuf's base64 mapping of eee19b7ec3c1b175
        "eee19b7ec3c1b174",
        "compute",
        1200,
        events=[{"timeUnixNano": "1250", "name": "COMPUTE_START"}],
        links=[{"traceId": T2, "spanId": "00f067aa0ba902b7"}],
    )
    with gzip.open(tmp_path / "older.jsonl.gz", "wt") as gz:
        gz.write(METRICS_LINE + "\n" + collector_line(compute) + "\n")
    (tmp_path / "notes.txt").write_text("not a trace file")

    spans = load_spans(tmp_path)
    assert [s.name for s in spans] == ["InferRequest", "exatrkx", "compute"]
    by_name = {s.name: s for s in spans}
    assert by_name["exatrkx"].attributes == {
        "triton.model_name": "exatrkx",
        "batch": 4,
        "shape": [314, 0.5],
        "cfg": {"gpu": True},
        "raw": b"\x00\x01",
        "ratio": pytest.approx(float("nan"), nan_ok=True),
    }
    assert by_name["compute"].span_id == "eee19b7ec3c1b175"
    assert by_name["compute"].events == (SpanEvent("COMPUTE_START", 1250, {}),)
    assert by_name["compute"].links == (SpanLink(T2, "00f067aa0ba902b7", {}),)
    assert by_name["InferRequest"].status_code is Status.UNSET
    assert shape(build_traces(spans)[T1]) == [("InferRequest", [("exatrkx", [("compute", [])])])]
    assert load_spans(tmp_path / "older.jsonl.gz") == [by_name["compute"]]


def test_missing_parents_make_orphan_roots_and_duplicates_count_once() -> None:
    spans = [
        Span(T1, "0000000000000003", "00000000000000ff", "late-child", Kind.INTERNAL, 30, 40),
        Span(T1, "0000000000000001", None, "root", Kind.SERVER, 10, 90),
        Span(T1, "0000000000000002", "0000000000000001", "child", Kind.INTERNAL, 20, 30),
        Span(T1, "0000000000000002", "0000000000000001", "child", Kind.INTERNAL, 20, 30),
        Span(T1, "0000000000000004", "0000000000000003", "grandchild", Kind.INTERNAL, 31, 35),
    ]
    trace = build_traces(spans)[T1]
    assert shape(trace) == [("root", [("child", [])]), ("late-child", [("grandchild", [])])]
    assert trace.orphans == frozenset({"0000000000000003"})
    assert trace.is_orphan("0000000000000003") and not trace.is_orphan(spans[1])
    assert [(depth, s.name) for depth, s in trace.walk()] == [
        (0, "root"),
        (1, "child"),
        (0, "late-child"),
        (1, "grandchild"),
    ]
    assert len(trace.spans) == 4


def test_a_parent_cycle_is_cut_instead_of_losing_spans() -> None:
    spans = [
        Span(T1, "000000000000000a", "000000000000000b", "a", Kind.INTERNAL, 1, 5),
        Span(T1, "000000000000000b", "000000000000000a", "b", Kind.INTERNAL, 2, 4),
        Span(T1, "000000000000000c", "000000000000000c", "self", Kind.INTERNAL, 3, 4),
    ]
    trace = build_traces(spans)[T1]
    assert shape(trace) == [("a", [("b", [])]), ("self", [])]
    assert trace.orphans == frozenset({"000000000000000a", "000000000000000c"})


def test_unreadable_lines_are_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = collector_line(collector_span("eee19b7ec3c1b173", None, "ok", 1))
    bad_id = collector_line(collector_span("eee19b", None, "bad", 1))
    path = tmp_path / "traces.jsonl"
    path.write_text(good + "\n" + bad_id + "\n" + good[: len(good) // 2])  # killed mid-write
    with caplog.at_level(logging.WARNING, logger="otelkit.analysis"):
        assert [s.name for s in load_spans(path)] == ["ok"]
    assert [r.getMessage().split(": skipped")[0] for r in caplog.records] == [
        f"{path}:2",
        f"{path}:3",
    ]


def mutations(doc: Any) -> Iterator[Any]:
    """The document with each value in turn replaced by something of the wrong shape."""
    stack: list[tuple[Any, ...]] = [()]
    while stack:
        path = stack.pop()
        node = doc
        for key in path:
            node = node[key]
        keys = node.keys() if isinstance(node, dict) else range(len(node))
        for key in keys:
            for wrong in (None, -1, 1.5, "zz", [], {}, [1], {"x": 1}, True):
                mutated = copy.deepcopy(doc)
                target = mutated
                for step in path:
                    target = target[step]
                target[key] = wrong
                yield mutated
            if isinstance(node[key], dict | list):
                stack.append((*path, key))


def test_garbage_anywhere_is_skipped_never_a_crash(tmp_path: Path) -> None:
    kvlist = {"kvlistValue": {"values": [{"key": "b", "value": {"bytesValue": "AA=="}}]}}
    attrs = [{"key": "k", "value": {"arrayValue": {"values": [kvlist]}}}]
    span = collector_span(
        "eee19b7ec3c1b173",
        "eee19b7ec3c1b172",
        "s",
        1,
        attributes=attrs,
        events=[{"timeUnixNano": "2", "name": "e", "attributes": attrs}],
        links=[{"traceId": T2, "spanId": "eee19b7ec3c1b171", "attributes": attrs}],
        status={"code": 2, "message": "m"},
    )
    doc = json.loads(collector_line(span))
    variants = list(mutations(doc))
    path = tmp_path / "garbage.jsonl"
    path.write_text("".join(json.dumps(v) + "\n" for v in variants))
    spans = load_spans(path)  # must not raise: each line loads or is skipped
    assert len(variants) > 500
    assert 0 < len(spans) < len(variants)
    assert all(isinstance(s.name, str) and isinstance(s.start_ns, int) for s in spans)


def test_a_missing_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no trace file or directory"):
        load_spans(tmp_path / "nowhere")
