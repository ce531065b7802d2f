"""Each trace protocol of configure() against a real server: OTLP/gRPC, HTTP protobuf, HTTP JSON."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

import otelkit
from otelkit.analysis import load_spans
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


@pytest.fixture
def grpc_sink() -> Iterator[tuple[GrpcTraceSink, int]]:
    sink = GrpcTraceSink()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield sink, port
    server.stop(grace=None)


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
