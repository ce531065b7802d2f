"""Span exporters otelkit adds to the SDK's: OTLP-JSON-lines files, OTLP/HTTP with JSON or
protobuf, and the SDK's OTLP/gRPC exporter with a faster encoder.

The JSON ones write the same OTLP JSON as the embedded receiver and the Collector's file
exporter, so ``otelkit.analysis`` reads any of them; they encode with ``otlp_json_encode``, about a
tenth of the CPU of the protobuf detour. The protobuf ones encode with ``otlp_proto``: the same
request as the SDK's, for about a quarter of its CPU.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.util.re import parse_env_headers

from otelkit.export._jsonl import JsonLinesWriter
from otelkit.export._otlp_json import spans_to_bytes
from otelkit.export._otlp_proto import encode_request
from otelkit.export._sizing import in_halves

__all__ = ["HttpSpanExporter", "JsonLinesSpanExporter", "grpc_span_exporter"]

logger = logging.getLogger("otelkit")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_RETRYABLE = frozenset({429, 502, 503, 504})


class JsonLinesSpanExporter(SpanExporter):
    """Appends each batch as one OTLP-JSON line to ``DIR/traces-<service>-<pid>.jsonl``.

    One file per process: a forked child or a second replica never interleaves with another.
    """

    def __init__(self, directory: str | Path, service_name: str) -> None:
        self.directory = Path(directory)
        self._stem = f"traces-{_UNSAFE.sub('_', service_name)}"
        self._writer: JsonLinesWriter | None = None
        self._pid = -1

    @property
    def path(self) -> Path:
        return self.directory / f"{self._stem}-{os.getpid()}.jsonl"

    def _current_writer(self) -> JsonLinesWriter:
        if self._writer is None or self._pid != os.getpid():
            self.directory.mkdir(parents=True, exist_ok=True)
            self._writer = JsonLinesWriter(self.path)
            self._pid = os.getpid()
        return self._writer

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            self._current_writer().write_line(spans_to_bytes(spans))
        except (OSError, ValueError) as error:
            logger.warning("otelkit: could not write spans to %s: %s", self.path, error)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        if self._writer is not None and self._pid == os.getpid():
            self._writer.close()
        self._writer = None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


class HttpSpanExporter(SpanExporter):
    """OTLP/HTTP with JSON (``http/json``, which the Python SDK does not ship) or protobuf
    (``http/protobuf``) bodies. Protobuf is written by ``otlp_proto``, at about a quarter of
    the CPU of the SDK's exporter, whose environment it honours alike: headers, the CA bundle,
    client certificate and key, and compression (``OTEL_EXPORTER_OTLP_[TRACES_]HEADERS``,
    ``..._CERTIFICATE``, ``..._CLIENT_CERTIFICATE``, ``..._CLIENT_KEY``, ``..._COMPRESSION``:
    gzip, deflate, none).
    """

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        timeout_s: float,
        encoding: str = "json",
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self.url = url
        self._encode = _ENCODINGS[encoding]
        setting = _sdk_environment(environ)
        self._headers = {
            "Content-Type": _CONTENT_TYPES[encoding],
            **parse_env_headers(setting("HEADERS") or "", liberal=True),
            **headers,  # configure()'s own, which win
        }
        self._timeout_s = timeout_s
        self._closed = False
        import requests  # only a process that sends OTLP/HTTP needs it

        self._session = requests.Session()
        self._session.verify = setting("CERTIFICATE") or True
        certificate, key = setting("CLIENT_CERTIFICATE"), setting("CLIENT_KEY")
        if certificate:
            self._session.cert = (certificate, key) if key else certificate
        self.compression = (setting("COMPRESSION") or "none").strip().lower()
        if self.compression not in _COMPRESS:
            logger.warning(
                "otelkit: unknown OTLP compression %r; sending uncompressed", self.compression
            )
            self.compression = "none"
        if self.compression != "none":
            self._headers["Content-Encoding"] = self.compression

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        delivered = self.deliver(spans)
        return SpanExportResult.SUCCESS if delivered == len(spans) else SpanExportResult.FAILURE

    def deliver(self, spans: Sequence[ReadableSpan]) -> int:
        """Send ``spans``; how many of them the backend took. A batch refused as too large
        (HTTP 413: the Collector's ``max_request_body_size``, a proxy's limit) is sent again
        in halves (``in_halves``)."""
        return in_halves(spans, self._send, self.url)

    def _send(self, spans: Sequence[ReadableSpan]) -> int | None:
        try:
            body = _COMPRESS[self.compression](self._encode(spans))
        except Exception:
            logger.exception("otelkit: could not encode a batch of %d spans", len(spans))
            return 0
        status = self._post(body)
        if status is None:
            return None
        return len(body) if status == HTTPStatus.REQUEST_ENTITY_TOO_LARGE else 0

    def _post(self, body: bytes) -> int | None:
        """POST ``body``, retrying what may pass later until the timeout; ``None`` when it was
        taken, else the HTTP status (0: no answer), logged unless it was 413."""
        import requests  # imported by __init__: a lookup in sys.modules

        deadline = time.monotonic() + self._timeout_s
        delay = 0.1
        while True:
            try:
                response = self._session.post(
                    self.url, data=body, headers=self._headers, timeout=self._timeout_s
                )
                if response.ok:
                    return None
                status = response.status_code
                retry, reason = status in _RETRYABLE, f"HTTP {status}"
            except requests.RequestException as error:
                status, retry, reason = 0, True, str(error)
            if status == HTTPStatus.REQUEST_ENTITY_TOO_LARGE:
                return status
            if self._closed:
                # shut down while this export hung: the processor has counted and logged its
                # spans as dropped; a report now would come after that final count
                logger.debug(
                    "otelkit: OTLP/HTTP export to %s ended after shutdown: %s", self.url, reason
                )
                return status
            if not retry or time.monotonic() + delay > deadline:
                logger.warning("otelkit: OTLP/HTTP export to %s failed: %s", self.url, reason)
                return status
            time.sleep(delay)
            delay *= 2

    def shutdown(self) -> None:
        self._closed = True
        self._session.close()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


_ENCODINGS: dict[str, Callable[[Sequence[ReadableSpan]], bytes]] = {
    "json": spans_to_bytes,
    "protobuf": encode_request,
}
_CONTENT_TYPES = {"json": "application/json", "protobuf": "application/x-protobuf"}
_COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "none": lambda body: body,
    "gzip": lambda body: gzip.compress(body, compresslevel=6),
    "deflate": zlib.compress,  # zlib-wrapped, as the SDK and the Collector send it
}


def _sdk_environment(environ: Mapping[str, str]) -> Callable[[str], str | None]:
    """An OTLP exporter setting from the environment: the traces one, else the general one."""

    def setting(name: str) -> str | None:
        return environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or environ.get(
            f"OTEL_EXPORTER_OTLP_{name}"
        )

    return setting


def grpc_span_exporter(
    url: str, insecure: bool, headers: Mapping[str, str], timeout_s: float
) -> SpanExporter:
    """The SDK's OTLP/gRPC span exporter (its channel, credentials, retries and environment),
    with each batch encoded by ``otlp_proto`` instead of protobuf's Python API, and sent in
    parts no larger than the server takes (``deliver``)."""
    from otelkit.export._grpc_exporter import (
        SizedGrpcSpanExporter,  # grpc, imported when first used
    )

    return SizedGrpcSpanExporter(url, insecure=insecure, headers=dict(headers), timeout=timeout_s)
