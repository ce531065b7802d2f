"""otelkit.analysis._collector: the Collector file exporter's framings read span for span.

Each file is written as the exporter writes it (``exporter/fileexporter/file_writer.go``): its
messages are the OTLP request OpenTelemetry's own encoder makes of real SDK spans, framed with
a 4-byte big-endian length where the exporter frames them, and compressed by Debian's zstd (the
reference encoder, an implementation other than the reader's) where it compresses them: each
message a frame of its own (the legacy ``compression: zstd``) or the whole file one stream
(the native-compression feature gate). Every framing must give the spans the JSON lines give.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToJson
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from otelkit.analysis import load_spans
from otelkit.analysis._collector import framing
from otelkit.cli import main

ZSTD = shutil.which("zstd")
pytestmark = pytest.mark.skipif(ZSTD is None, reason="Debian's zstd is not installed")


def batches() -> list[list[ReadableSpan]]:
    """Three export batches of a traced request: a client span, its stages, their events."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "collector-test"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("tests")
    for event in range(3):
        with tracer.start_as_current_span("infer", kind=SpanKind.CLIENT) as root:
            root.set_attribute("event", event)
            for stage in range(3):
                with tracer.start_as_current_span(f"stage-{stage}") as span:
                    span.add_event("COMPUTE_START", {"gpu": stage})
    provider.shutdown()
    spans = list(memory.get_finished_spans())
    return [spans[i : i + 4] for i in range(0, len(spans), 4)]


def _zstd(data: bytes) -> bytes:
    assert ZSTD is not None
    done = subprocess.run([ZSTD, "-q", "-c"], input=data, capture_output=True, check=True)
    return done.stdout


def _framed(messages: list[bytes]) -> bytes:
    return b"".join(len(m).to_bytes(4, "big") + m for m in messages)


def _files(tmp_path: Path) -> dict[str, Path]:
    """The same batches in each of the exporter's framings."""
    requests = [encode_spans(batch) for batch in batches()]
    protos = [request.SerializeToString() for request in requests]
    jsons = [json.dumps(json.loads(MessageToJson(request))).encode() for request in requests]
    contents = {
        "lines.json": b"\n".join(jsons) + b"\n",  # format: json
        "proto.pb": _framed(protos),  # format: proto
        "json-zstd": _framed([_zstd(m) for m in jsons]),  # json + zstd (legacy)
        "proto-zstd": _framed([_zstd(m) for m in protos]),  # proto + zstd (legacy)
        "json-stream.zst": _zstd(b"\n".join(jsons) + b"\n"),  # native compression, json
        "proto-stream.zst": _zstd(_framed(protos)),  # native compression, proto
    }
    out = {}
    for name, data in contents.items():
        out[name] = tmp_path / name
        out[name].write_bytes(data)
    return out


def test_every_framing_gives_the_spans_of_the_json_lines(tmp_path: Path) -> None:
    files = _files(tmp_path)
    expected = load_spans(files["lines.json"])
    assert len(expected) == 12 and {s.events[0].name for s in expected if s.events}
    kinds = {name: framing(path) for name, path in files.items()}
    assert kinds == {
        "lines.json": "lines",
        "proto.pb": "framed",
        "json-zstd": "framed",
        "proto-zstd": "framed",
        "json-stream.zst": "zstd",
        "proto-stream.zst": "zstd",
    }
    for name, path in files.items():
        assert load_spans(path) == expected, name


def test_a_message_cut_short_is_named_and_the_ones_before_it_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = _files(tmp_path)
    expected = load_spans(files["lines.json"])
    cut = tmp_path / "cut.pb"
    cut.write_bytes(files["proto.pb"].read_bytes()[:-20])  # a writer killed mid-message
    garbage = tmp_path / "garbage.pb"
    garbage.write_bytes(_framed([b"\xff\xff\xff not protobuf"]))
    with caplog.at_level(logging.WARNING, logger="otelkit.analysis"):
        assert load_spans(cut) == expected[:8]  # the first two batches
        assert load_spans(garbage) == []
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "cut.pb: message 3 cut short" in said
    assert "garbage.pb: message 1: not an OTLP protobuf message" in said


def test_rotated_files_import_in_their_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The exporter renames a full file ``name-<time>.ext`` and starts ``name.ext`` again: the
    names sort older first."""
    files = _files(tmp_path)
    older = tmp_path / "traces-2026-11-29T08-00-00.000.pb"
    newer = tmp_path / "traces.pb"
    older.write_bytes(files["proto-zstd"].read_bytes())
    newer.write_bytes(files["proto.pb"].read_bytes())
    store = tmp_path / "store"
    assert main(["import", str(newer), str(older), "--out", str(store)]) == 0
    assert "24 spans from 2 files" in capsys.readouterr().out
    lines = load_spans(files["lines.json"])
    assert load_spans(store) == lines + lines


def test_a_proto_message_whose_bytes_begin_as_json_does_after_blanks_is_read_as_proto(
    tmp_path: Path,
) -> None:
    """A message's first byte is its first field's tag (10, a newline), and its second that
    field's length: 123, ``{``, when the first ``ResourceSpans`` is 123 bytes long. Only a
    message whose first byte is ``{`` is a JSON document."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = b"\x0a" * 16, b"\x0b" * 8, "x"
    span.name = "x" * (1 + 123 - len(request.resource_spans[0].SerializeToString()))
    message = request.SerializeToString()
    assert message[:2] == b"\n{"
    path = tmp_path / "proto.pb"
    path.write_bytes(_framed([message]))
    (found,) = load_spans(path)
    assert found.name == span.name and found.span_id == "0b" * 8
