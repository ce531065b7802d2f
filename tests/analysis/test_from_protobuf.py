"""otelkit.analysis._from_protobuf: a segment's columns straight from protobuf requests.

What the receiver's segments are made of. On every trace fixture of the tests and every odd
value, escape and empty part the import's tests know, the columns made from the protobuf
request equal the rows the Python path makes of the JSON line the receiver writes of it; a
request the one pass does not take (an id of another length) goes that way, and a JSON body
is read as its line. Through a real receiver, protobuf and JSON bodies in turns make segments
holding what its JSON lines hold, in order.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from otelkit.analysis._decode import spans_of_line
from otelkit.analysis._store import _row, segment_schema
from otelkit.export._otlp_json import dumps, request_to_json, span_count
from otelkit.export._otlp_json_normalize import normalize_json
from otelkit.receiver import Receiver
from tests.analysis.test_fast_import import (
    S1,
    T1,
    document,
    fixtures,
    kv,
    odd_documents,
    span,
    tail_sampled_documents,
    value,
)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
)

from otelkit.analysis import _from_protobuf  # noqa: E402
from otelkit.analysis._from_protobuf import segment_table  # noqa: E402


def documents() -> list[dict[str, Any]]:
    """Every document of the trace fixtures, of every odd value, of tail sampling."""
    docs = [json.loads(line) for path in fixtures() for line in path.read_text().splitlines()]
    docs += [d for d in odd_documents() if isinstance(d, dict)]
    return [*docs, *tail_sampled_documents()]


def protobuf_of(doc: dict[str, Any]) -> bytes | None:
    """``doc`` as the protobuf request an exporter sends (protobuf's JSON mapping: base64
    ids); None where protobuf cannot hold it (an int beyond 64 bits, a value of two kinds)."""
    from google.protobuf.json_format import ParseDict, ParseError

    mapped = normalize_json(json.loads(json.dumps(doc)))  # its parts shared, apart

    def base64_ids(item: dict[str, Any]) -> None:
        for key in ("traceId", "spanId", "parentSpanId"):
            if key in item:
                item[key] = base64.b64encode(bytes.fromhex(item[key])).decode()

    for rs in mapped.get("resourceSpans", ()):
        for ss in rs.get("scopeSpans", ()):
            for item in ss.get("spans", ()):
                base64_ids(item)
                for link in item.get("links", ()):
                    base64_ids(link)
    try:
        request = ParseDict(mapped, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except ParseError:
        return None
    return bytes(request.SerializeToString())


def line_of(message: bytes) -> bytes:
    """The JSON line the receiver writes of a protobuf request."""
    return dumps(request_to_json(ExportTraceServiceRequest.FromString(message)))


def python_rows(lines: list[bytes]) -> Any:
    """The rows the Python path makes of JSON lines, as a table of the segments' schema."""
    spans = [s for n, line in enumerate(lines) for s in spans_of_line(line.decode(), f"l:{n}")]
    return pa.Table.from_pylist([_row(s) for s in spans], schema=segment_schema(pa))


def assert_same(table: Any, expected: Any) -> None:
    assert table.schema.equals(expected.schema, check_metadata=True)
    for column in expected.column_names:  # a column named where they differ
        assert table[column].to_pylist() == expected[column].to_pylist(), column
    assert table.equals(expected)


def test_every_fixture_and_odd_value_makes_the_python_paths_rows() -> None:
    docs = documents()
    messages = [m for m in map(protobuf_of, docs) if m is not None]
    assert len(messages) >= len(docs) - 2  # all but an int beyond 64 bits, a value of two kinds
    for message in messages:  # each alone: a resource of its own
        assert_same(segment_table([message], pa, "m"), python_rows([line_of(message)]))
        # the one pass took it, the JSON way not asked
        _from_protobuf._Columns().request(ExportTraceServiceRequest.FromString(message))
    # all in one table: resources shared across requests, rows in order
    everything = segment_table(messages, pa, "all")
    assert everything.num_rows > 300
    assert_same(everything, python_rows([line_of(m) for m in messages]))
    # the same documents as JSON bodies: read as their lines, those protobuf cannot hold too
    lines = [dumps(normalize_json(json.loads(json.dumps(d)))) for d in docs]
    assert_same(segment_table(lines, pa, "json"), python_rows(lines))


def test_a_request_the_one_pass_does_not_take_goes_the_json_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ids of another length than OTLP's (no exporter sends them) go by the request's JSON
    line, as the loader reads the receiver's: here, a span left out with a warning naming
    its message; a link's too; a time beyond what an int64 holds, the request left out with
    a warning, not the segment lost. Enumerations beyond today's are read as the Python path
    reads them (the first member), in the one pass."""
    good = protobuf_of(document(span(S1, kind=9, status={"code": 7}), span("2" * 16)))
    assert good is not None
    request = ExportTraceServiceRequest.FromString(good)
    short = ExportTraceServiceRequest()
    short.CopyFrom(request)
    short.resource_spans[0].scope_spans[0].spans[0].trace_id = b"\x01" * 15
    linked = ExportTraceServiceRequest()
    linked.CopyFrom(request)
    link = linked.resource_spans[0].scope_spans[0].spans[1].links.add()
    link.trace_id, link.span_id = bytes.fromhex(T1), b"\x02" * 7
    late = []  # a time no int64 holds (beyond 2262): the Python path cannot write it either
    for where in ("start", "event"):
        odd = ExportTraceServiceRequest()
        odd.CopyFrom(request)
        beyond = odd.resource_spans[0].scope_spans[0].spans[1]
        if where == "start":
            beyond.start_time_unix_nano = beyond.end_time_unix_nano = (1 << 64) - 1
        else:
            beyond.events.add().time_unix_nano = 1 << 63
        late.append(odd.SerializeToString())
    messages = [good, short.SerializeToString(), linked.SerializeToString(), *late, good]
    with caplog.at_level(logging.WARNING, logger="otelkit.analysis"):
        table = segment_table(messages, pa, "staged")
    readable = [m for m in messages if m not in late]
    assert_same(table, python_rows([line_of(m) for m in readable]))
    assert table.num_rows == 2 + 0 + 0 + 0 + 0 + 2  # the odd requests: left out whole
    assert "staged: message 2: skipped" in caplog.text
    assert "staged: message 3: skipped" in caplog.text
    for number in (4, 5):
        assert f"staged: message {number}: skipped, a time beyond 2262" in caplog.text
    assert table["SpanKind"].to_pylist()[:2] == ["Unspecified", "Client"]
    assert table["StatusCode"].to_pylist()[0] == "Unset"
    with pytest.raises(_from_protobuf._Other):  # the one pass refused it, all or nothing
        columns = _from_protobuf._Columns()
        columns.request(linked)
    assert len(columns) == 0 and columns.links.fields[0] == columns.attributes.fields[0] == []


def post(receiver: Receiver, body: bytes, content_type: str) -> int:
    connection = http.client.HTTPConnection(receiver.host, receiver.port, timeout=30)
    try:
        connection.request("POST", "/v1/traces", body, {"Content-Type": content_type})
        response = connection.getresponse()
        response.read()
        return int(response.status)
    finally:
        connection.close()


def test_the_receivers_segments_of_protobuf_and_json_bodies_hold_its_json_lines(
    tmp_path: Path,
) -> None:
    """Bodies of both encodings in turns, a protobuf body beginning with ``{`` (an unknown
    group field: a staged message beginning so would be read as JSON), segments cut small:
    the segments hold, in order, the rows the Python path makes of the receiver's lines; a
    request no way reads is counted."""
    docs = documents()
    out = tmp_path / "traces"
    with Receiver(out, formats=("jsonl", "parquet"), segment_spans=100) as receiver:
        for number, doc in enumerate(docs):
            message = protobuf_of(doc)
            if message is None or number % 3 == 0:
                status = post(receiver, json.dumps(doc).encode(), "application/json")
            else:
                if number % 3 == 1:
                    message = b"\x7b\x7c" + message  # field 15, an empty group: unknown
                status = post(receiver, message, "application/x-protobuf")
            assert status == 200, number
        # ids of another length than OTLP's: stored as a line, in no segment, counted
        short = ExportTraceServiceRequest.FromString(protobuf_of(docs[-1]) or b"")
        short.resource_spans[0].scope_spans[0].spans[0].trace_id = b"\x01" * 15
        assert post(receiver, short.SerializeToString(), "application/x-protobuf") == 200
        assert receiver.spans_unsegmented == 0  # not made a segment yet
    assert receiver.spans_unsegmented == span_count(docs[-1]) > 0
    segments = sorted(out.glob("*.parquet"))
    assert len(segments) >= 4 and not list(out.glob(".staging-*"))
    lines = [line for line in (out / "traces.jsonl").read_bytes().splitlines() if line]
    assert len(lines) == sum(span_count(d) > 0 for d in docs) + 1  # a line a body with spans
    table = pa.concat_tables(pq.read_table(path) for path in segments)
    pq.write_table(python_rows(lines), tmp_path / "expected.parquet")  # Parquet's own names
    assert_same(table, pq.read_table(tmp_path / "expected.parquet"))


def test_a_value_type_newer_than_the_module_goes_the_json_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A oneof member this module does not know (none exists in today's protobuf): the
    request is read by its JSON line, whole."""
    message = protobuf_of(
        document(span(S1, attributes=[kv("n", value("intValue", "3"))]), span("2" * 16))
    )
    assert message is not None
    monkeypatch.setattr(_from_protobuf, "_PLAIN", frozenset({"string_value"}))
    real = _from_protobuf._value

    def newer(v: Any) -> Any:
        if v.WhichOneof("value") == "int_value":
            raise _from_protobuf._Other("int_value")
        return real(v)

    monkeypatch.setattr(_from_protobuf, "_value", newer)
    read: list[str] = []

    def json_way(line: str, where: str) -> Any:
        read.append(where)
        return spans_of_line(line, where)

    monkeypatch.setattr(_from_protobuf, "spans_of_line", json_way)
    assert_same(segment_table([message], pa, "m"), python_rows([line_of(message)]))
    assert read == ["m: message 1"]


def test_a_json_body_with_a_lone_surrogate_is_left_out_not_its_segment(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Python's json reads an escaped surrogate alone (orjson refuses it), which no UTF-8
    column holds: its message is left out with a warning, the others make the segment."""
    from otelkit.analysis import _decode

    monkeypatch.setattr(_decode, "_loads", json.loads)  # without orjson
    lone = document(span(S1, name="a\ud800b"))
    pair = document(span(S1, name="a\U0001f600b"))  # escaped as a pair: one code point
    lines = [json.dumps(doc).encode() for doc in (pair, lone, pair)]
    assert b"\\ud800" in lines[1] and b"\\ud83d\\ude00" in lines[0]
    with caplog.at_level(logging.WARNING, logger="otelkit.analysis"):
        table = segment_table(lines, pa, "staged")
    assert table["SpanName"].to_pylist() == ["a\U0001f600b"] * 2
    assert "staged: message 2: skipped, a lone surrogate" in caplog.text
