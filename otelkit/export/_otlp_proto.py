"""SDK spans straight to OTLP protobuf bytes, without building protobuf objects.

The OTLP exporters encode a batch with ``encode_spans(spans).SerializeToString()``, which
builds a protobuf object per span, attribute and value through protobuf's Python API. That
CPU is spent in the export thread, but taken through the GIL from the threads the spans
describe. ``encode_request`` writes the same ``ExportTraceServiceRequest`` in protobuf's wire
format directly, at a fraction of the cost (docs/performance.md, ``bench_encode``).

It mirrors ``encode_spans`` field by field: the same grouping (``sdk_fields.grouped``), the
same fields set (a span's status and a resource are always present, a scope even when the span
has none), the same flags, and what protobuf would refuse refused alike (an attribute it cannot
encode is logged and left out; a span it cannot encode fails the batch). Parsed, the bytes equal
``encode_spans``' message (the tests check that on spans of every shape).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from otelkit._propagation import format_tracestate
from otelkit.export._sdk_fields import (
    INT64_MAX,
    attribute_items,
    contents,
    grouped,
    int64,
    proto_string,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import Event
    from opentelemetry.trace import Link, Status

__all__ = ["encode_request"]

_logger = logging.getLogger("otelkit")
_FIXED64 = struct.Struct("<Q").pack
_DOUBLE = struct.Struct("<d").pack
_FIXED32 = struct.Struct("<I").pack
_SMALL = [bytes((n,)) for n in range(0x80)]
_KIND = {kind: _SMALL[kind.value + 1] for kind in SpanKind}  # OTLP counts from UNSPECIFIED
# SpanFlags: HAS_IS_REMOTE always, IS_REMOTE where the parent (or a link's span) is remote
_LOCAL, _REMOTE = b"\x85\x01" + _FIXED32(0x100), b"\x85\x01" + _FIXED32(0x300)
_LINK_LOCAL, _LINK_REMOTE = b"\x35" + _FIXED32(0x100), b"\x35" + _FIXED32(0x300)
_TRUE, _FALSE = b"\x10\x01", b"\x10\x00"
_KEYS: dict[str, bytes] = {}  # attribute key -> its KeyValue.key field, for the usual keys
_KEYS_KEPT = 4096


def _varint(number: int) -> bytes:
    """A non-negative integer as a protobuf varint."""
    if number < 0x80:
        return _SMALL[number]
    out = bytearray()
    while number > 0x7F:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


def _field(tag: bytes, body: bytes) -> bytes:
    """A length-delimited field: a string, bytes or a small message."""
    return tag + _varint(len(body)) + body


def _text(tag: bytes, value: object) -> bytes:
    """A string field, as protobuf stores ``value`` (or raises as it would)."""
    return _field(tag, proto_string(value).encode())


def encode_request(spans: Sequence[ReadableSpan]) -> bytes:
    """``encode_spans(spans).SerializeToString()``, written directly."""
    out: list[bytes] = []
    for resource, scopes in grouped(spans, _span).items():
        parts = [b"\x0a", *_message(_attributes(b"\x0a", resource.attributes))]
        for scope, encoded in scopes.items():
            scope_parts = [b"\x0a", *_message(_scope(scope))]
            for span in encoded:
                scope_parts += (b"\x12", _varint(len(span)), span)
            if scope is not None and scope.schema_url:
                scope_parts.append(_text(b"\x1a", scope.schema_url))
            parts += (b"\x12", *_message(b"".join(scope_parts)))
        if resource.schema_url:
            parts.append(_text(b"\x1a", resource.schema_url))
        out += (b"\x0a", *_message(b"".join(parts)))
    return b"".join(out)


def _message(body: bytes) -> tuple[bytes, bytes]:
    """A length-delimited field's length and body (its tag goes before them)."""
    return _varint(len(body)), body


def _scope(scope: Any) -> bytes:
    if scope is None:
        return b""
    parts = []
    if scope.name:
        parts.append(_text(b"\x0a", scope.name))
    if scope.version:
        parts.append(_text(b"\x12", scope.version))
    parts.append(_attributes(b"\x1a", scope.attributes))
    return b"".join(parts)


def _span(span: ReadableSpan) -> bytes:
    context: Any = span.get_span_context()
    parts = [
        b"\x0a\x10",
        context.trace_id.to_bytes(16, "big"),
        b"\x12\x08",
        context.span_id.to_bytes(8, "big"),
    ]
    trace_state = context.trace_state
    if trace_state:
        parts.append(_text(b"\x1a", format_tracestate(trace_state)))
    parent = span.parent
    if parent:
        parts += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
    if span.name:
        parts.append(_text(b"\x2a", span.name))
    parts += (b"\x30", _KIND[span.kind])
    if span.start_time:
        parts += (b"\x39", _FIXED64(span.start_time))
    if span.end_time:
        parts += (b"\x41", _FIXED64(span.end_time))
    attributes, events, links = contents(span)
    parts.append(_attributes(b"\x4a", attributes))
    if span.dropped_attributes:
        parts += (b"\x50", _varint(span.dropped_attributes))
    for event in events:
        parts += (b"\x5a", *_message(_event(event)))
    if span.dropped_events:
        parts += (b"\x60", _varint(span.dropped_events))
    for link in links:
        parts += (b"\x6a", *_message(_link(link)))
    if span.dropped_links:
        parts += (b"\x70", _varint(span.dropped_links))
    if span.status is not None:
        parts += (b"\x7a", *_message(_status(span.status)))
    parts.append(_REMOTE if parent and parent.is_remote else _LOCAL)
    return b"".join(parts)


def _status(status: Status) -> bytes:
    parts = []
    if status.description:
        parts.append(_text(b"\x12", status.description))
    code = status.status_code.value
    if code:
        parts += (b"\x18", _varint(code))
    return b"".join(parts)


def _event(event: Event) -> bytes:
    parts = [b"\x09", _FIXED64(event.timestamp)] if event.timestamp else []
    if event.name:
        parts.append(_text(b"\x12", event.name))
    parts.append(_attributes(b"\x1a", event.attributes))
    if event.dropped_attributes:
        parts += (b"\x20", _varint(event.dropped_attributes))
    return b"".join(parts)


def _link(link: Link) -> bytes:
    context = link.context  # encode_spans leaves a link's trace state out
    parts = [
        b"\x0a\x10",
        context.trace_id.to_bytes(16, "big"),
        b"\x12\x08",
        context.span_id.to_bytes(8, "big"),
        _attributes(b"\x22", link.attributes),
    ]
    if link.dropped_attributes:
        parts += (b"\x28", _varint(link.dropped_attributes))
    parts.append(_LINK_REMOTE if context.is_remote else _LINK_LOCAL)
    return b"".join(parts)


def _attributes(tag: bytes, attributes: Mapping[Any, Any] | None) -> bytes:
    """Each attribute as a ``KeyValue`` field with ``tag``. The common kinds inline; an
    attribute protobuf would refuse is logged and left out, as ``encode_spans`` does."""
    parts: list[bytes] = []
    for key, value in attribute_items(attributes):
        name = _KEYS.get(key) if type(key) is str else None
        if name is None:
            try:
                name = _text(b"\x0a", key)
            except Exception as error:
                _logger.exception("Failed to encode key %s: %s", key, error)
                continue
            if type(key) is str and len(_KEYS) < _KEYS_KEPT:
                _KEYS[key] = name
        kind = type(value)
        if kind is str and value.isascii():
            raw = value.encode()
            any_value = b"\x0a" + _varint(len(raw)) + raw
        elif kind is int and 0 <= value <= INT64_MAX:
            any_value = b"\x18" + _varint(value)
        elif kind is float:
            any_value = b"\x21" + _DOUBLE(value)
        else:
            try:
                any_value = _any_value(value)
            except Exception as error:
                _logger.exception("Failed to encode key %s: %s", key, error)
                continue
        pair = name + b"\x12" + _varint(len(any_value)) + any_value
        parts += (tag, _varint(len(pair)), pair)
    return b"".join(parts)


def _any_value(value: object) -> bytes:
    # encode_spans' order of checks: bool before int, str and bytes before Sequence.
    if value is None:
        return b""
    if isinstance(value, bool):
        return _TRUE if value else _FALSE
    if isinstance(value, str):
        return _text(b"\x0a", value)
    if isinstance(value, int):  # two's complement, as int64 is written
        return b"\x18" + _varint(int64(value) % 2**64)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(item)) for item in value))
    if isinstance(value, Mapping):
        pairs = [
            _field(b"\x0a", _text(b"\x0a", str(key)) + _field(b"\x12", _any_value(item)))
            for key, item in value.items()
        ]
        return _field(b"\x32", b"".join(pairs))
    raise TypeError(f"Invalid type {type(value)} of value {value}")
