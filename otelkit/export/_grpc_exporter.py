"""The SDK's OTLP/gRPC span exporter, with otelkit's encoder and messages the server takes.

Encoding: ``otlp_proto`` writes the request's bytes, which protobuf parses in C, for about a
quarter of the CPU of building it with protobuf's Python API.

Size: a gRPC server refuses a message over its receive limit (4 MiB by default, which the
Collector's, Jaeger's and Tempo's OTLP receivers keep) with ``RESOURCE_EXHAUSTED``, which the
SDK retries, the same bytes each time, until its export timeout, and then drops the batch: a
burst of failed calls, each span with its exception's stack trace, is enough. This exporter
sends no message over the limit (halving a batch down to single spans, ``sizing.in_halves``)
and, when a server refuses one, takes the limit the server states as its own from then on and
tells the SDK not to retry those bytes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import grpc
from google.rpc.error_details_pb2 import RetryInfo
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from otelkit._core.deps import otlp_grpc
from otelkit.export._otlp_proto import encode_request
from otelkit.export._sizing import in_halves

__all__ = ["GRPC_MAX_MESSAGE_BYTES", "SizedGrpcSpanExporter", "stated_limit"]

logger = logging.getLogger("otelkit")

# gRPC's default limit on a received message, which the Collector's, Jaeger's and Tempo's OTLP
# receivers keep unless told otherwise.
GRPC_MAX_MESSAGE_BYTES = 4 << 20
_STATED_LIMIT = re.compile(r"larger than max \((\d+) vs\. (\d+)\)")
_GIVE_UP = RetryInfo(retry_delay={"seconds": 86_400}).SerializeToString()


def stated_limit(error: grpc.RpcError) -> int | None:
    """The largest message a server takes, when ``error`` is its refusal of a larger one
    (``RESOURCE_EXHAUSTED``, "received message larger than max (N vs. LIMIT)", as grpc's C
    core and grpc-go word it); else ``None``."""
    if error.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    found = _STATED_LIMIT.search(error.details() or "")
    return int(found.group(2)) if found else None


class _Refused(grpc.RpcError):  # type: ignore[misc]
    """A server's refusal of a message too large, re-raised so that the SDK's exporter does not
    send the same bytes again until its timeout: its trailing metadata asks for a retry after a
    day (``google.rpc.RetryInfo``), which no export deadline reaches."""

    def __init__(self, error: grpc.RpcError) -> None:
        self._error = error

    def code(self) -> grpc.StatusCode:
        return self._error.code()

    def details(self) -> str | None:
        details: str | None = self._error.details()
        return details

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        return (("google.rpc.retryinfo-bin", _GIVE_UP),)


class _Measured:
    """A trace service stub that tells its exporter the size limit a server states when it
    refuses a message (``stated_limit``)."""

    def __init__(self, stub: Any, exporter: Any) -> None:
        self._stub = stub
        self._exporter = exporter

    def Export(self, *args: Any, **kwargs: Any) -> Any:  # the stub's method, by its name
        try:
            return self._stub.Export(*args, **kwargs)
        except grpc.RpcError as error:
            limit = stated_limit(error)
            if limit is None:
                raise
            self._exporter.max_bytes = min(self._exporter.max_bytes, limit)
            raise _Refused(error) from error


class SizedGrpcSpanExporter(OTLPSpanExporter):
    """Encodes with ``otlp_proto``; sends no message larger than ``max_bytes``, gRPC's
    default limit, or the smaller one a server stated when it refused a message."""

    max_bytes = GRPC_MAX_MESSAGE_BYTES
    _encoded: tuple[Sequence[ReadableSpan], bytes] | None = None
    _stub_made = False  # by the SDK's _initialize_channel_and_stub, so measured

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        otlp_grpc.check_overrides(OTLPSpanExporter, self._stub_made)

    def _initialize_channel_and_stub(self) -> None:
        """The SDK's, with the stub it made measured (``deps.otlp_grpc``)."""
        super()._initialize_channel_and_stub()  # type: ignore[no-untyped-call]
        self._stub_made = True
        otlp_grpc.wrap_stub(self, lambda stub: _Measured(stub, self))

    def _translate_data(self, data: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
        encoded = self._encoded
        body = encoded[1] if encoded is not None and encoded[0] is data else None
        request: ExportTraceServiceRequest = ExportTraceServiceRequest.FromString(
            encode_request(data) if body is None else body
        )  # parsed in C: a small share of the cost of building it in Python
        return request

    def deliver(self, spans: Sequence[ReadableSpan]) -> int:
        """Send ``spans``; how many the server took. A batch over the limit is sent in
        halves (``in_halves``), as is one the server refuses as too large."""
        return in_halves(spans, self._send, otlp_grpc.endpoint(self))

    def _send(self, spans: Sequence[ReadableSpan]) -> int | None:
        try:
            body = encode_request(spans)
        except Exception:
            logger.exception("otelkit: could not encode a batch of %d spans", len(spans))
            return 0
        if len(body) > self.max_bytes:
            return len(body)  # what the server would refuse: not sent
        self._encoded = (spans, body)
        try:
            taken = self.export(spans) is SpanExportResult.SUCCESS
        finally:
            self._encoded = None
        if taken:
            return None
        return len(body) if len(body) > self.max_bytes else 0  # refused: a limit learned
