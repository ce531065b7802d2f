"""otelkit.analysis._store: spans as Parquet segments, read back exactly as from JSON lines.

Every span of the committed demo traces and of hand-built traces with the shapes the breakdown
must survive (orphans, duplicate ids, a parent cycle, a Ray Serve wait, Envoy's proxy spans,
typed attributes, events, links, statuses) round-trips through a segment unchanged, in order,
and gives the same breakdown; a segment cut short, of another shape, or not Parquet at all is
named and left out, the other files still read.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from otelkit import semconv
from otelkit.analysis import (
    Span,
    SpanEvent,
    SpanKind,
    SpanLink,
    StatusCode,
    build_traces,
    load_spans,
)
from otelkit.analysis._breakdown import breakdown
from otelkit.analysis._store import StoreError, read_segment, write_segment
from otelkit.cli import main
from otelkit.receiver import Receiver
from otelkit.testing import wait_until

pytest.importorskip("pyarrow")

DEMO = Path(__file__).resolve().parents[1] / "report" / "data" / "demo-traces.jsonl"
MS = 1_000_000
A, B = "ab" * 16, "cd" * 16


def shapes() -> list[Span]:
    """Traces the breakdown must read alike from any source."""
    root = Span(A, "1" * 16, None, "event", SpanKind.INTERNAL, 0, 20 * MS, {"option": 4})
    call = Span(
        A,
        "2" * 16,
        root.span_id,
        "infer",
        SpanKind.CLIENT,
        1 * MS,
        19 * MS,
        {semconv.SERIALIZE_S: 0.0005, "retries": 2, "ok": True, "shape": [1, 3]},
        {"service.name": "client", "process.pid": 42},
        "otelkit.client",
        status_code=StatusCode.ERROR,
        status_message="<b>refused</b> «quoted»",
    )
    proxy = Span(
        A,
        "3" * 16,
        call.span_id,
        "ingress",
        SpanKind.SERVER,
        2 * MS,
        18 * MS,
        {semconv.PROXY_COMPONENT: semconv.PROXY},
    )
    attempt = Span(A, "4" * 16, proxy.span_id, "router", SpanKind.CLIENT, 3 * MS, 17 * MS)
    server = Span(
        A,
        "5" * 16,
        attempt.span_id,
        "InferRequest",
        SpanKind.SERVER,
        4 * MS,
        16 * MS,
        events=(
            SpanEvent("HTTP_RECV_START", 3 * MS),
            SpanEvent("HTTP_RECV_END", 4 * MS, {"bytes": 64}),
        ),
        links=(SpanLink(B, "9" * 16, {"why": "batch"}),),
    )
    waited = Span(
        A, "6" * 16, server.span_id, semconv.RAY_SERVE_QUEUE_SPAN, SpanKind.INTERNAL, 5 * MS, 6 * MS
    )
    duplicate = Span(A, "6" * 16, server.span_id, "second of its id", SpanKind.INTERNAL, 0, 1)
    orphan = Span(A, "7" * 16, "f" * 16, "orphan", SpanKind.SERVER, 7 * MS, 8 * MS)
    cycle = [
        Span(B, "a" * 16, "b" * 16, "one", SpanKind.INTERNAL, 0, 2 * MS),
        Span(B, "b" * 16, "a" * 16, "two", SpanKind.INTERNAL, 1 * MS, 2 * MS),
    ]
    return [root, call, proxy, attempt, server, waited, duplicate, orphan, *cycle]


def summary(spans: list[Span]) -> dict[tuple[str, ...], tuple[object, ...]]:
    groups = breakdown(build_traces(spans).values(), group_by=("option",))
    return {k: (g.components, g.problems, g.incomplete, g.parts) for k, g in groups.items()}


@pytest.mark.parametrize("source", ["demo", "shapes"])
def test_spans_round_trip_a_segment_unchanged_and_break_down_alike(
    source: str, tmp_path: Path
) -> None:
    spans = load_spans(DEMO) if source == "demo" else shapes()
    path = tmp_path / "spans-00000.parquet"
    assert write_segment(spans, path) == len(spans)
    back = list(read_segment(path))
    assert back == spans  # every field, in the order written: the first of duplicate ids wins
    assert [s.attributes for s in back] == [s.attributes for s in spans]  # types kept
    assert summary(load_spans(tmp_path)) == summary(spans)


def test_import_converts_files_into_segments_the_breakdown_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    assert main(["import", str(DEMO), "--out", str(store), "--segment-spans", "100"]) == 0
    spans = load_spans(DEMO)
    assert f"{len(spans)} spans from 1 files into 4 segments" in capsys.readouterr().out
    assert sorted(p.name for p in store.iterdir()) == [f"spans-0000{i}.parquet" for i in range(4)]
    assert load_spans(store) == spans
    # a second import adds segments after the first's
    assert main(["import", str(DEMO), "--out", str(store), "--segment-spans", "1000"]) == 0
    assert len(load_spans(store)) == 2 * len(spans)


def test_a_segment_that_cannot_be_read_is_named_and_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = tmp_path / "a-good.parquet"
    write_segment(shapes(), good)
    cut = tmp_path / "b-cut.parquet"
    cut.write_bytes(good.read_bytes()[:-100])  # a writer killed before its footer
    (tmp_path / "c-text.parquet").write_text("not parquet")
    with pytest.raises(StoreError, match=r"b-cut\.parquet: not a readable span segment"):
        list(read_segment(cut))
    with caplog.at_level(logging.WARNING, logger="otelkit.analysis"):
        assert load_spans(tmp_path) == shapes()
    named = [r.getMessage() for r in caplog.records]
    assert any("b-cut.parquet" in m and "left out" in m for m in named), named
    assert any("c-text.parquet" in m for m in named), named


def test_a_parquet_file_of_another_shape_is_refused_by_name(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"TraceId": ["ab"], "x": [1]}), other)
    with pytest.raises(
        StoreError, match=r"other\.parquet: not a span segment: no column Timestamp"
    ):
        list(read_segment(other))


def _export(url: str, spans: int, name: str = "infer") -> None:
    """``spans`` spans of one trace sent to ``url`` by OpenTelemetry's own OTLP exporter."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource({"service.name": "tests"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=url)))
    tracer = provider.get_tracer("tests")
    with tracer.start_as_current_span(name) as root:
        root.set_attribute("option", 2)
        for index in range(spans - 1):
            with tracer.start_as_current_span(f"stage-{index}") as stage:
                stage.add_event("COMPUTE_START", {"gpu": index})
    provider.shutdown()


def test_the_receiver_writes_segments_beside_json_lines_and_closes_one_on_flush(
    tmp_path: Path,
) -> None:
    """Both formats hold the same spans; a segment is written when full (by the import's fast
    path, in a thread of its own: soon after) and on ``flush`` (a study's point end: before it
    returns), not before: a reader never sees half of one."""
    out = tmp_path / "traces"
    with Receiver(out, formats=("jsonl", "parquet"), segment_spans=8) as receiver:
        _export(receiver.traces_url, 5)
        assert receiver.wait_for_spans(5, timeout=10)
        assert not list(out.glob("*.parquet"))  # 5 of 8: held, not yet a segment
        receiver.flush()
        assert [p.name for p in out.glob("*.parquet")] == ["spans-00000.parquet"]
        _export(receiver.traces_url, 9)  # a span a request: the eighth fills a segment
        assert receiver.wait_for_spans(14, timeout=10)
        wait_until(lambda: len(list(out.glob("*.parquet"))) == 2, 10, "the full segment")
    # stopping writes the one span held: 5, 8, 1
    segments = sorted(out.glob("*.parquet"))
    assert [p.name for p in segments] == [f"spans-0000{i}.parquet" for i in range(3)]
    assert [len(list(read_segment(p))) for p in segments] == [5, 8, 1]
    from_segments = [s for p in segments for s in read_segment(p)]
    assert from_segments == load_spans(out / "traces.jsonl")
    assert len(from_segments) == 14 and not list(out.glob(".*partial"))
    assert not list(out.glob(".staging-*"))  # each staged line made a segment


def test_the_receiver_writes_segments_alone_and_writes_an_old_one_on_rotate(
    tmp_path: Path,
) -> None:
    out = tmp_path / "traces"
    receiver = Receiver(out, formats=("parquet",), segment_age_s=2.0).start()
    try:
        _export(receiver.traces_url, 3)
        assert receiver.wait_for_spans(3, timeout=10)
        receiver.rotate()  # too young: held (an age well past the export's time on a busy host)
        assert not list(out.glob("*.parquet"))
        # once it has waited its age, a rotation hands it over, and it is written
        wait_until(lambda: [receiver.rotate(), *out.glob("*.parquet")][1:], 10, "the segment")
        assert len(load_spans(out)) == 3
    finally:
        receiver.stop()
    assert not (out / "traces.jsonl").exists()
    with pytest.raises(ValueError, match="formats"):
        Receiver(out, formats=("csv",))


def test_staged_messages_become_segments_of_the_python_paths_rows(tmp_path: Path) -> None:
    """What the receiver writes: its requests staged as they came (a name no reader takes for
    a trace file), made segments in a thread of their own when full and on ``flush``, the
    rows those of the same spans read by the Python path; JSON documents among them."""
    from otelkit.analysis._staged import StagedSegmentWriter

    lines = [line.rstrip(b"\n") for line in DEMO.read_bytes().splitlines() if line.strip()]
    counts = [len(load_spans_of_line(line)) for line in lines]
    writer = StagedSegmentWriter(tmp_path, max_spans=sum(counts) // 2)
    try:
        for number, (line, count) in enumerate(zip(lines, counts, strict=True)):
            writer.add_message(line if number % 2 else protobuf_of_line(line), count)
        assert writer.flush() > 0
        assert writer.spans_written == sum(counts) and writer.segments_written >= 2
        assert not list(tmp_path.glob(".staging-*"))
        segments = sorted(tmp_path.glob("*.parquet"))
        assert [s for p in segments for s in read_segment(p)] == load_spans(DEMO)
    finally:
        writer.close()
    with pytest.raises(ValueError, match="closed"):
        writer.add_message(lines[0], counts[0])


def test_a_staged_file_that_cannot_become_a_segment_is_kept_counted_and_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from otelkit.analysis import _staged, trace_files
    from otelkit.analysis._staged import StagedSegmentWriter

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_staged, "convert", full_disk)
    first, second = [line for line in DEMO.read_bytes().splitlines() if line.strip()][:2]
    count = len(load_spans_of_line(first)) + len(load_spans_of_line(second))
    writer = StagedSegmentWriter(tmp_path)
    with caplog.at_level(logging.ERROR, logger="otelkit.analysis"):
        writer.add_message(protobuf_of_line(first), len(load_spans_of_line(first)))
        writer.add_message(second, len(load_spans_of_line(second)))
        writer.close()  # returns: the spans are staged still, and counted
    (kept,) = tmp_path.glob(".staging-*")
    assert writer.spans_failed == count and writer.spans_written == 0
    assert f"{kept}: {count} spans not made a segment" in caplog.text
    assert "No space left on device" in caplog.text
    assert trace_files(tmp_path) == []  # no reader takes it for a trace file
    # a later writer in the folder names its own staging files apart
    monkeypatch.undo()
    again = StagedSegmentWriter(tmp_path)
    again.add_message(first, len(load_spans_of_line(first)))
    again.close()
    assert kept.exists() and len(list(tmp_path.glob("*.parquet"))) == 1
    # otelkit import reads it (the Collector's proto framing), both of its messages
    assert main(["import", str(kept), "--out", str(tmp_path / "imported")]) == 0
    imported = [
        s for p in sorted((tmp_path / "imported").glob("*.parquet")) for s in read_segment(p)
    ]
    assert imported == [*load_spans_of_line(first), *load_spans_of_line(second)]


def protobuf_of_line(line: bytes) -> bytes:
    """An OTLP JSON line as the protobuf request it encodes."""
    from tests.analysis.test_from_protobuf import protobuf_of

    found = protobuf_of(json.loads(line))
    assert found is not None
    return found


def load_spans_of_line(line: bytes) -> list[object]:
    """The spans of one OTLP JSON line, as the Python path reads them."""
    from otelkit.analysis._decode import spans_of_doc

    return list(spans_of_doc(json.loads(line)))
