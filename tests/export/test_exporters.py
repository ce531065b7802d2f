"""Each trace protocol of configure() against a real server: OTLP/gRPC, HTTP protobuf, HTTP JSON."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otelkit
from otelkit.analysis import load_spans
from otelkit.export._grpc_exporter import GRPC_MAX_MESSAGE_BYTES
from otelkit.export._span_exporters import HttpSpanExporter, grpc_span_exporter
from otelkit.receiver import Receiver


class GrpcTraceSink(trace_service_pb2_grpc.TraceServiceServicer):
    """A real OTLP/gRPC trace service that keeps what it receives, and the metadata."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.received = threading.Event()

    def Export(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        self.metadata.append(dict(context.invocation_metadata()))
        self.received.set()
        return trace_service_pb2.ExportTraceServiceResponse()

    def span_names(self) -> list[str]:
        return [
            span.name
            for request in self.requests
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]


class _Attempts(grpc.ServerInterceptor):  # type: ignore[misc]
    """Counts the calls a server gets, those it refuses before its handler runs included."""

    def __init__(self) -> None:
        self.count = 0

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        self.count += 1
        return continuation(handler_call_details)


@contextlib.contextmanager
def serving(sink: GrpcTraceSink, *options: tuple[str, int]) -> Iterator[tuple[int, _Attempts]]:
    """A real gRPC server for ``sink`` (with channel ``options``): its port, and its calls."""
    attempts = _Attempts()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2), interceptors=[attempts], options=options
    )
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port, attempts
    finally:
        server.stop(grace=None)


@pytest.fixture
def grpc_sink() -> Iterator[tuple[GrpcTraceSink, int]]:
    sink = GrpcTraceSink()
    with serving(sink) as (port, _):
        yield sink, port


@pytest.fixture(autouse=True)
def _shutdown_after() -> Iterator[None]:
    yield
    otelkit.shutdown()


def make_trace() -> str:
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("request") as root:
        with tracer.start_as_current_span("stage"):
            pass
        return f"{root.get_span_context().trace_id:032x}"


def test_otlp_grpc_with_headers(grpc_sink: tuple[GrpcTraceSink, int]) -> None:
    sink, port = grpc_sink
    otelkit.configure(
        service_name="grpc-client",
        protocol="grpc",
        endpoint=f"http://127.0.0.1:{port}",
        headers={"authorization": "Bearer token-1"},
    )
    make_trace()
    otelkit.shutdown()
    assert sorted(sink.span_names()) == ["request", "stage"]
    assert sink.metadata[0]["authorization"] == "Bearer token-1"


@pytest.mark.parametrize("protocol", ["http/protobuf", "http/json"])
def test_otlp_http_to_the_embedded_receiver(tmp_path: Path, protocol: str) -> None:
    with Receiver(tmp_path) as receiver:
        otelkit.configure(service_name="http-client", protocol=protocol, endpoint=receiver.endpoint)
        trace_id = make_trace()
        otelkit.shutdown()
        assert receiver.wait_for_spans(2, timeout=10)
    spans = load_spans(tmp_path)
    assert sorted((s.name, s.trace_id) for s in spans) == [
        ("request", trace_id),
        ("stage", trace_id),
    ]
    by_name = {s.name: s for s in spans}
    assert by_name["stage"].parent_span_id == by_name["request"].span_id


def two_hundred_spans_and_a_huge_one() -> None:
    """Small spans ``stage-0`` to ``stage-199``, and one with a 20 kB attribute."""
    tracer = trace.get_tracer("tests")
    for index in range(200):
        with tracer.start_as_current_span(f"stage-{index}"):
            pass
    with tracer.start_as_current_span("huge") as huge:
        huge.set_attribute("blob", "x" * 20_000)


@pytest.mark.parametrize("protocol", ["http/protobuf", "http/json"])
def test_a_batch_refused_as_too_large_is_sent_in_halves(tmp_path: Path, protocol: str) -> None:
    """A backend that takes bodies of at most 8 kB (a Collector's ``max_request_body_size``,
    a proxy's limit) answers 413 to the batch of 201 spans: its halves go, down to the one
    span too large on its own, which alone is lost and counted."""
    with Receiver(tmp_path, max_body_bytes=8192) as receiver:
        telemetry = otelkit.configure(
            service_name="http-client", protocol=protocol, traces_endpoint=receiver.traces_url
        )
        two_hundred_spans_and_a_huge_one()
        assert otelkit.flush()
        stats = telemetry.stats()
        assert receiver.wait_for_spans(200, timeout=10)
    assert sorted(s.name for s in load_spans(tmp_path)) == sorted(f"stage-{i}" for i in range(200))
    assert stats == {"exported": 200, "queued": 0, "in_export": 0, "dropped_export_failed": 1}


def test_a_span_too_large_on_its_own_is_logged_once_and_counted_each_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Receiver(tmp_path, max_body_bytes=8192) as receiver:
        telemetry = otelkit.configure(
            service_name="http-client", traces_endpoint=receiver.traces_url
        )
        for _ in range(3):
            with trace.get_tracer("tests").start_as_current_span("huge") as huge:
                huge.set_attribute("blob", "x" * 20_000)
            assert otelkit.flush()
        stats = telemetry.stats()
    told = [r for r in caplog.records if "as too large" in r.getMessage()]
    assert len(told) == 1 and receiver.traces_url in told[0].getMessage()
    assert stats == {"exported": 0, "queued": 0, "in_export": 0, "dropped_export_failed": 3}


@contextlib.contextmanager
def exporting_to(sink: GrpcTraceSink, limit: int) -> Iterator[tuple[otelkit.Telemetry, _Attempts]]:
    """otelkit configured to export over OTLP/gRPC to ``sink``, served with a receive limit of
    ``limit`` bytes; the server's calls."""
    with serving(sink, ("grpc.max_receive_message_length", limit)) as (port, attempts):
        yield (
            otelkit.configure(
                service_name="grpc-client",
                protocol="grpc",
                traces_endpoint=f"http://127.0.0.1:{port}",
            ),
            attempts,
        )


def test_a_grpc_batch_over_the_servers_limit_is_sent_in_parts_under_it() -> None:
    """A gRPC server that takes messages of at most 8 kB refuses the batch of 201 spans once
    (``RESOURCE_EXHAUSTED``); the exporter takes the limit the server stated, does not retry
    those bytes (the SDK's exporter would, until its timeout) and sends the batch in parts under
    the limit, all but the one span too large on its own, which alone is lost and counted."""
    sink = GrpcTraceSink()
    with exporting_to(sink, 8192) as (telemetry, attempts):
        two_hundred_spans_and_a_huge_one()
        started = time.monotonic()
        assert otelkit.flush()
        took = time.monotonic() - started
        stats = telemetry.stats()
    assert sorted(sink.span_names()) == sorted(f"stage-{i}" for i in range(200))
    assert stats == {"exported": 200, "queued": 0, "in_export": 0, "dropped_export_failed": 1}
    assert all(request.ByteSize() <= 8192 for request in sink.requests)
    assert attempts.count == len(sink.requests) + 1  # one refusal, not retried
    assert took < 5  # the SDK's retries of the refused batch would take about 7 s


def test_grpc_messages_stay_under_grpcs_default_limit() -> None:
    """gRPC servers take 4 MiB by default: a batch that encodes larger (spans with large
    attributes, such as the stack traces of a burst of failed calls) leaves in parts under it,
    before any server refuses it, and all of it arrives."""
    sink = GrpcTraceSink()
    with exporting_to(sink, 64 << 20) as (telemetry, attempts):
        tracer = trace.get_tracer("tests")
        for index in range(64):
            with tracer.start_as_current_span(f"failed-{index}") as span:
                span.set_attribute("exception.stacktrace", f"{index}" * 100_000)
        assert otelkit.flush()
        stats = telemetry.stats()
    assert sorted(sink.span_names()) == sorted(f"failed-{i}" for i in range(64))
    assert stats == {"exported": 64, "queued": 0, "in_export": 0}
    sizes = [request.ByteSize() for request in sink.requests]
    assert len(sizes) > 1 and max(sizes) <= GRPC_MAX_MESSAGE_BYTES
    assert attempts.count == len(sink.requests)  # none refused


def finished_spans() -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "encode"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("tests").start_as_current_span("request"):
        pass
    provider.shutdown()
    return list(memory.get_finished_spans())


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
@pytest.mark.parametrize("compression", ["gzip", "deflate", "none"])
def test_otlp_http_compresses_as_the_sdks_environment_says(
    tmp_path: Path, encoding: str, compression: str
) -> None:
    """The receiver inflates what the header says, and refuses a body that does not match it."""
    environ = {"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": compression.upper()}
    with Receiver(tmp_path) as receiver:
        exporter = HttpSpanExporter(receiver.endpoint + "/v1/traces", {}, 5.0, encoding, environ)
        assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS
        assert receiver.wait_for_spans(1, timeout=10)
        exporter.shutdown()
    assert exporter.compression == compression
    assert [span.name for span in load_spans(tmp_path)] == ["request"]


def test_an_unknown_compression_is_logged_and_sent_plain(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    environ = {"OTEL_EXPORTER_OTLP_COMPRESSION": "brotli"}
    with Receiver(tmp_path) as receiver:
        exporter = HttpSpanExporter(receiver.endpoint + "/v1/traces", {}, 5.0, "protobuf", environ)
        assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS
        exporter.shutdown()
    assert exporter.compression == "none"
    assert "unknown OTLP compression 'brotli'" in caplog.text


def test_otlp_http_takes_the_sdks_tls_settings() -> None:
    """The traces setting wins over the general one, as in the SDK's exporter."""
    environ = {
        "OTEL_EXPORTER_OTLP_CERTIFICATE": "/etc/ssl/general.pem",
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": "/etc/ssl/collector-ca.pem",
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "/etc/ssl/client.pem",
        "OTEL_EXPORTER_OTLP_CLIENT_KEY": "/etc/ssl/client.key",
    }
    exporter = HttpSpanExporter("https://collector:4318/v1/traces", {}, 5.0, "protobuf", environ)
    assert exporter._session.verify == "/etc/ssl/collector-ca.pem"
    assert exporter._session.cert == ("/etc/ssl/client.pem", "/etc/ssl/client.key")
    plain = HttpSpanExporter("https://collector:4318/v1/traces", {}, 5.0, "protobuf", {})
    assert plain._session.verify is True and plain._session.cert is None


def test_otlp_http_sends_the_environments_headers_under_configures() -> None:
    environ = {
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "tenant=physics,authorization=Bearer%20env",
        "OTEL_EXPORTER_OTLP_HEADERS": "ignored=yes",
    }
    exporter = HttpSpanExporter(
        "http://collector:4318/v1/traces", {"authorization": "Bearer own"}, 5.0, "json", environ
    )
    assert exporter._headers == {
        "Content-Type": "application/json",
        "tenant": "physics",
        "authorization": "Bearer own",
    }


def test_otlp_grpc_sends_what_the_sdk_would(grpc_sink: tuple[GrpcTraceSink, int]) -> None:
    """The gRPC exporter is the SDK's own, with otelkit's encoder: the request that arrives is
    the one the SDK's encoder makes of the same spans."""
    sink, port = grpc_sink
    spans = finished_spans()
    exporter = grpc_span_exporter(f"http://127.0.0.1:{port}", True, {}, 5.0)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert sink.requests == [encode_spans(spans)]


@pytest.fixture
def contrib_instrumentations() -> Iterator[None]:
    """OpenTelemetry's requests and gRPC client instrumentations, on before otelkit's exporters
    are built, as ``opentelemetry-instrument`` loads them."""
    from opentelemetry.instrumentation.grpc import GrpcInstrumentorClient
    from opentelemetry.instrumentation.requests import RequestsInstrumentor

    instrumentors = [RequestsInstrumentor(), GrpcInstrumentorClient()]
    for instrumentor in instrumentors:
        instrumentor.instrument()
    yield
    for instrumentor in instrumentors:
        instrumentor.uninstrument()


def test_http_exports_are_not_traced_by_opentelemetrys_requests_instrumentation(
    tmp_path: Path, contrib_instrumentations: None
) -> None:
    """Spans and metrics leave with instrumentation suppressed: otherwise each export would make
    a ``POST`` span, exported by the next export, for as long as the program runs. A request
    of the program's own is still traced (the instrumentation is on)."""
    import requests

    with Receiver(tmp_path) as receiver:
        otelkit.configure(
            service_name="http-client",
            endpoint=receiver.endpoint,
            metrics_endpoint=f"{receiver.endpoint}/v1/metrics",  # refused (404), still sent
        )
        make_trace()
        for _ in range(3):
            otelkit.flush()
        requests.get(f"{receiver.endpoint}/own", timeout=10)
        otelkit.shutdown()
        assert receiver.wait_for_spans(3, timeout=10)
    assert sorted(s.name for s in load_spans(tmp_path)) == ["GET", "request", "stage"]


def test_grpc_exports_are_not_traced_by_opentelemetrys_grpc_instrumentation(
    grpc_sink: tuple[GrpcTraceSink, int], contrib_instrumentations: None
) -> None:
    sink, port = grpc_sink
    otelkit.configure(
        service_name="grpc-client", protocol="grpc", endpoint=f"http://127.0.0.1:{port}"
    )
    make_trace()
    for _ in range(3):
        otelkit.flush()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:  # the program's own call
        trace_service_pb2_grpc.TraceServiceStub(channel).Export(
            trace_service_pb2.ExportTraceServiceRequest(), timeout=10
        )
    otelkit.shutdown()
    own = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
    assert sorted(sink.span_names()) == [own, "request", "stage"]
