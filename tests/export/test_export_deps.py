"""otelkit's exporters where OpenTelemetry's SDK and OTLP gRPC exporter lack a private name
they read or override (``otelkit._core.deps.otel``, ``otelkit._core.deps.otlp_grpc``), as a
newer release could: the spans are still exported, the same request, and one log line says
what otelkit does instead."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.exporter import OTLPExporterMixin
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from otelkit._core import deps
from otelkit._core.deps import otel
from otelkit.export._otlp_json_encode import spans_to_bytes
from otelkit.export._otlp_proto import encode_request
from otelkit.export._span_exporters import grpc_span_exporter
from tests.export.test_exporters import GrpcTraceSink, finished_spans, grpc_sink
from tests.support import otelkit_lines

__all__ = ["grpc_sink"]  # the fixture, shared

SDK = f"otelkit: opentelemetry-sdk {deps.version_of('opentelemetry-sdk')} has no "
API = f"otelkit: opentelemetry-api {deps.version_of('opentelemetry-api')} has no "
PARTS = ("attributes", "events", "links")


def test_spans_whose_fields_are_kept_elsewhere_are_read_through_their_properties(
    fresh_warnings: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spans = finished_spans()
    proto, json = encode_request(spans), spans_to_bytes(spans)
    for part in PARTS:  # a newer ReadableSpan: its parts under other names
        dropped = f"dropped_{part}"
        for span in spans:
            span.__dict__[f"_{dropped}_kept"] = getattr(span, dropped)
            span.__dict__[f"_{part}_kept"] = span.__dict__.pop(f"_{part}")
        for name in (part, dropped):
            kept = property(lambda self, name=name: self.__dict__[f"_{name}_kept"])
            monkeypatch.setattr(ReadableSpan, name, kept)
    with caplog.at_level(logging.WARNING, logger="otelkit"):
        assert (encode_request(spans), spans_to_bytes(spans)) == (proto, json)
    assert otelkit_lines(caplog) == [
        f"{SDK}ReadableSpan._attributes, _events and _links; otelkit reads spans through their "
        "properties (copies: slower)"
    ]


def test_attributes_kept_elsewhere_are_read_through_the_mapping(
    fresh_warnings: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    attributes = BoundedAttributes(attributes={"a": 1, "b": "two"})
    assert list(otel.attribute_items(attributes)) == [("a", 1), ("b", "two")]
    attributes.__dict__["_kept"] = attributes.__dict__.pop("_dict")  # a newer BoundedAttributes
    monkeypatch.setattr(BoundedAttributes, "__getitem__", lambda self, key: self._kept[key])
    monkeypatch.setattr(BoundedAttributes, "__iter__", lambda self: iter(self._kept))
    monkeypatch.setattr(BoundedAttributes, "__len__", lambda self: len(self._kept))
    with caplog.at_level(logging.WARNING, logger="otelkit"):
        assert list(otel.attribute_items(attributes)) == [("a", 1), ("b", "two")]
    assert otelkit_lines(caplog) == [
        f"{API}BoundedAttributes._dict; otelkit reads attributes through the mapping (slower)"
    ]


def test_an_exporter_that_makes_its_stub_another_way_still_exports(
    fresh_warnings: None,
    grpc_sink: tuple[GrpcTraceSink, int],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The SDK's exporter as a release that makes its channel and stub in another method
    would: otelkit's override is never called, the stub goes unmeasured, the spans go."""
    make = OTLPExporterMixin._initialize_channel_and_stub
    own_init = OTLPExporterMixin.__init__

    def newer_init(self: Any, *args: Any, **kwargs: Any) -> None:
        self._initialize_channel_and_stub = lambda: make(self)  # its own, under another name
        own_init(self, *args, **kwargs)
        del self._initialize_channel_and_stub

    monkeypatch.setattr(OTLPExporterMixin, "__init__", newer_init)
    sink, port = grpc_sink
    spans = finished_spans()
    with caplog.at_level(logging.WARNING, logger="otelkit"):
        exporter: Any = grpc_span_exporter(f"http://127.0.0.1:{port}", True, {}, 5.0)
        assert exporter.deliver(spans) == len(spans)
        exporter.shutdown()
    assert sink.requests == [encode_spans(spans)]
    (line,) = otelkit_lines(caplog)
    assert line.startswith(
        f"otelkit: opentelemetry-exporter-otlp-proto-grpc "
        f"{deps.version_of('opentelemetry-exporter-otlp-proto-grpc')} has no "
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter.OTLPSpanExporter."
        "_initialize_channel_and_stub; otelkit sends through the SDK's stub"
    )


def test_an_exporter_that_keeps_its_stub_elsewhere_still_exports(
    fresh_warnings: None,
    grpc_sink: tuple[GrpcTraceSink, int],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    make = OTLPExporterMixin._initialize_channel_and_stub

    def newer_make(self: Any) -> None:  # the stub under another name
        make(self)
        self._stub_kept = self.__dict__.pop("_client")

    def newer_export(self: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        self._client = self._stub_kept
        return own_export(self, data, *args, **kwargs)

    own_export = OTLPExporterMixin._export
    monkeypatch.setattr(OTLPExporterMixin, "_initialize_channel_and_stub", newer_make)
    monkeypatch.setattr(OTLPExporterMixin, "_export", newer_export)
    sink, port = grpc_sink
    spans = finished_spans()
    with caplog.at_level(logging.WARNING, logger="otelkit"):
        exporter: Any = grpc_span_exporter(f"http://127.0.0.1:{port}", True, {}, 5.0)
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        exporter.shutdown()
    assert sink.requests == [encode_spans(spans)]
    (line,) = otelkit_lines(caplog)
    assert "has no OTLPSpanExporter._client; otelkit sends through the SDK's stub" in line
