"""The OpenTelemetry Collector file exporter's framings other than plain JSON lines.

The exporter writes (``exporter/fileexporter``, ``file_writer.go``):

- ``format: json`` without compression: one OTLP JSON document a line (read by ``_loader``);
- ``format: proto``, or ``format: json`` with ``compression: zstd``: each message preceded by
  its length, 4 bytes big-endian; with ``zstd``, each message a zstd frame of its own. A proto
  message is a ``TracesData``, whose wire form is ``ExportTraceServiceRequest``'s;
- with its native-compression feature gate, the whole file one zstd stream, holding JSON lines
  (``format: json``) or length-prefixed messages (``format: proto``).

``framing`` tells them apart by their first bytes (a length is never ``{``: that would be a
message of 2 GB), and ``framed_spans`` reads them. A message cut short (a writer killed
mid-write) or that does not parse is named in a warning; the messages before it are kept.
zstd is pyarrow's (``pip install 'otelkit[store]'``).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otelkit.analysis._decode import spans_of_doc, spans_of_line
from otelkit.analysis._spans import Span
from otelkit.analysis._store import StoreError
from otelkit.export._otlp_json import request_to_json

__all__ = ["framed_spans", "framing"]

_log = logging.getLogger("otelkit.analysis")
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"
#: a message longer than this is not one: the file is not framed as the exporter frames
MAX_MESSAGE_BYTES = 1 << 30


def framing(path: Path) -> str:
    """``"lines"`` (JSON lines, plain or gzipped: ``_loader`` reads them), ``"zstd"`` (one
    zstd stream) or ``"framed"`` (length-prefixed messages)."""
    with path.open("rb") as file:
        head = file.read(4)
    if head.startswith(GZIP_MAGIC) or not head or head.lstrip()[:1] in (b"{", b""):
        return "lines"
    return "zstd" if head == ZSTD_MAGIC else "framed"


def _zstd(data: IO[bytes] | bytes) -> IO[bytes]:
    """A reader of the zstd stream ``data``."""
    try:
        import pyarrow
    except ImportError as error:
        raise StoreError(
            "reading the Collector's zstd files needs pyarrow: pip install 'otelkit[store]'"
        ) from error
    source = pyarrow.BufferReader(data) if isinstance(data, bytes) else pyarrow.PythonFile(data)
    return pyarrow.CompressedInputStream(source, "zstd")  # type: ignore[no-any-return]


def framed_spans(path: Path) -> Iterator[Span]:
    """The spans of a file written by the Collector's file exporter in a framing of
    ``framing``'s ``"zstd"`` or ``"framed"``."""
    with path.open("rb") as file:
        if framing(path) == "framed":
            yield from _messages(file, str(path))
            return
        stream = _zstd(file)
        head = stream.read(1)
        if head.lstrip()[:1] == b"{" or head == b"\n":
            text = io.TextIOWrapper(io.BufferedReader(_Prefixed(head, stream)), encoding="utf-8")
            for number, line in enumerate(text, 1):
                yield from spans_of_line(line, f"{path}:{number}")
        else:
            yield from _messages(_Prefixed(head, stream), str(path))


def _messages(stream: Any, where: str) -> Iterator[Span]:
    number = 0
    while True:
        size = stream.read(4)
        if not size:
            return
        number += 1
        length = int.from_bytes(size, "big")
        if len(size) < 4 or length > MAX_MESSAGE_BYTES:
            _log.warning("%s: message %d: not a length prefix; the rest is left out", where, number)
            return
        body = stream.read(length)
        if len(body) < length:
            _log.warning("%s: message %d cut short; the rest is left out", where, number)
            return
        yield from _message(body, f"{where}: message {number}")


def _message(body: bytes, where: str) -> list[Span]:
    if body.startswith(ZSTD_MAGIC):  # the legacy zstd: each message a frame of its own
        try:
            body = _zstd(body).read()
        except OSError as error:
            _log.warning("%s: not a zstd frame (%s); left out", where, error)
            return []
    # a JSON document's first byte, never a message's (a tag of field 15, a group): a
    # message begins with its first field's tag, 10, a blank, and then a length, "{" for 123
    if body[:1] == b"{":
        return spans_of_line(body.decode("utf-8", "replace"), where)
    try:
        request = ExportTraceServiceRequest.FromString(body)
    except DecodeError as error:
        _log.warning("%s: not an OTLP protobuf message (%s); left out", where, error)
        return []
    return spans_of_doc(request_to_json(request))


class _Prefixed(io.RawIOBase):
    """``stream`` with ``head``, read from it already, put back in front."""

    def __init__(self, head: bytes, stream: Any) -> None:
        self._head, self._stream = head, stream

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            head, self._head = self._head, b""
            rest: bytes = self._stream.read()
            return head + rest
        head, self._head = self._head[:size], self._head[size:]
        more: bytes = self._stream.read(size - len(head)) if size > len(head) else b""
        return head + more

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
