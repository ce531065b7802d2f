"""Span exporters otelkit adds to the SDK's: OTLP-JSON-lines files and OTLP/HTTP with JSON.

Both write the same OTLP JSON as the embedded receiver and the Collector's file exporter, so
``otelkit.analysis`` reads any of them.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import requests
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otelkit._jsonl import JsonLinesWriter
from otelkit.otlp_json import dumps, spans_to_json

__all__ = ["JsonHttpSpanExporter", "JsonLinesSpanExporter"]

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
            self._current_writer().write(spans_to_json(spans))
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


class JsonHttpSpanExporter(SpanExporter):
    """OTLP/HTTP with JSON bodies (``http/json``), which the Python SDK does not ship."""

    def __init__(self, url: str, headers: Mapping[str, str], timeout_s: float) -> None:
        self.url = url
        self._headers = {"Content-Type": "application/json", **headers}
        self._timeout_s = timeout_s
        self._session = requests.Session()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        body = dumps(spans_to_json(spans))
        deadline = time.monotonic() + self._timeout_s
        delay = 0.1
        while True:
            try:
                response = self._session.post(
                    self.url, data=body, headers=self._headers, timeout=self._timeout_s
                )
                if response.ok:
                    return SpanExportResult.SUCCESS
                retry = response.status_code in _RETRYABLE
                reason = f"HTTP {response.status_code}"
            except requests.RequestException as error:
                retry, reason = True, str(error)
            if not retry or time.monotonic() + delay > deadline:
                logger.warning("otelkit: OTLP/JSON export to %s failed: %s", self.url, reason)
                return SpanExportResult.FAILURE
            time.sleep(delay)
            delay *= 2

    def shutdown(self) -> None:
        self._session.close()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True
