"""SDK spans straight to OTLP JSON text, without building a document of dicts first.

What an otelkit trace file (the embedded default) and ``http/json`` carry is
``dumps(request_to_json(encode_spans(spans)))``: one ``ExportTraceServiceRequest`` in OTLP
JSON, compact, keys in protobuf's field order, defaults left out. Building it as dicts and
then serialising them costs CPU in the export thread, taken through the GIL from the threads
the spans describe; ``spans_to_bytes`` writes the same bytes directly, each string escaped by
the JSON encoder's own C function (docs/performance.md, ``bench_encode``).

It mirrors ``encode_spans`` as ``otlp_proto`` does: the same grouping (``sdk_fields.grouped``),
the same fields, the same flags, and an attribute protobuf would refuse logged and left out
(the tests check the bytes on spans of every shape).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping, Sequence
from json.encoder import encode_basestring_ascii as _quote  # the C function
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from otelkit._propagation import format_tracestate
from otelkit.export._sdk_fields import (
    INT64_MAX,
    INT64_MIN,
    attribute_items,
    contents,
    grouped,
    int64,
    proto_string,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import Event
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link, Status

__all__ = ["spans_to_bytes"]

_logger = logging.getLogger("otelkit")
_KIND = {kind: f',"kind":{kind.value + 1}' for kind in SpanKind}  # OTLP counts from UNSPECIFIED
# SpanFlags: HAS_IS_REMOTE always, IS_REMOTE where the parent (or a link's span) is remote
_LOCAL, _REMOTE = ',"flags":256', ',"flags":768'
_KEYS: dict[str, str] = {}  # attribute key -> the start of its KeyValue, for the usual keys
_KEYS_KEPT = 4096


def spans_to_bytes(spans: Sequence[ReadableSpan]) -> bytes:
    """Encode OpenTelemetry SDK spans as one OTLP JSON request, serialised as ``dumps`` would.

    The bytes are exactly ``dumps(request_to_json(encode_spans(spans)))``, written straight from
    the spans: neither the protobuf detour nor dicts to serialise, whose CPU the exporter's
    thread would take (through the GIL) from the threads the spans describe. Spans are grouped
    as ``encode_spans`` groups them: by equal resource, then equal scope, in order of first
    appearance; of equal resources (or scopes) the first is the one written. otelkit's JSON
    span exporters write these bytes.

    >>> spans_to_bytes([])
    b'{}'
    """
    resources = []
    for resource, scopes in grouped(spans, _span).items():
        text = '{"resource":{' + _attributes(resource.attributes) + "}"
        text += ',"scopeSpans":[' + ",".join(
            [_scope_spans(scope, encoded) for scope, encoded in scopes.items()]
        )
        text += "]" if not resource.schema_url else '],"schemaUrl":' + _quote(resource.schema_url)
        resources.append(text + "}")
    if not resources:
        return b"{}"
    return ('{"resourceSpans":[' + ",".join(resources) + "]}").encode()


def _scope_spans(scope: InstrumentationScope | None, spans: list[str]) -> str:
    text = '{"scope":' + _scope(scope) + ',"spans":[' + ",".join(spans) + "]"
    if scope is not None and scope.schema_url:
        text += ',"schemaUrl":' + _quote(scope.schema_url)
    return text + "}"


def _scope(scope: InstrumentationScope | None) -> str:
    if scope is None:  # a span without a scope gets an empty one
        return "{}"
    parts = []
    if scope.name:
        parts.append('"name":' + _quote(scope.name))
    if scope.version:
        parts.append('"version":' + _quote(scope.version))
    attributes = _attributes(scope.attributes)
    if attributes:
        parts.append(attributes)
    return "{" + ",".join(parts) + "}"


def _span(span: ReadableSpan) -> str:
    # The hot path, written out: one call per span, and one per attribute set.
    context: Any = span.get_span_context()
    text = f'{{"traceId":"{context.trace_id:032x}","spanId":"{context.span_id:016x}"'
    trace_state = context.trace_state
    if trace_state is not None and trace_state is not DEFAULT_TRACE_STATE:
        state = format_tracestate(trace_state)
        if state:
            text += ',"traceState":' + _quote(state)
    parent = span.parent
    if parent:
        text += f',"parentSpanId":"{parent.span_id:016x}"'
        text += _REMOTE if parent.is_remote else _LOCAL
    else:
        text += _LOCAL
    if span.name:
        text += ',"name":' + _quote(span.name)
    text += _KIND[span.kind]
    if span.start_time:
        text += f',"startTimeUnixNano":"{span.start_time}"'
    if span.end_time:
        text += f',"endTimeUnixNano":"{span.end_time}"'
    attributes, events, links = contents(span)
    encoded = _attributes(attributes)
    if encoded:
        text += "," + encoded
    if events:
        text += ',"events":[' + ",".join([_event(event) for event in events]) + "]"
    if links:
        text += ',"links":[' + ",".join([_link(link) for link in links]) + "]"
    if span.dropped_attributes:
        text += f',"droppedAttributesCount":{span.dropped_attributes}'
    if span.dropped_events:
        text += f',"droppedEventsCount":{span.dropped_events}'
    if span.dropped_links:
        text += f',"droppedLinksCount":{span.dropped_links}'
    status = span.status
    if status is not None and (status.status_code is not StatusCode.UNSET or status.description):
        text += ',"status":' + _status(status)
    return text + "}"


def _status(status: Status) -> str:
    parts = ['"message":' + _quote(status.description)] if status.description else []
    if status.status_code.value:
        parts.append(f'"code":{status.status_code.value}')
    return "{" + ",".join(parts) + "}"


def _event(event: Event) -> str:
    parts = [f'"timeUnixNano":"{event.timestamp}"'] if event.timestamp else []
    if event.name:
        parts.append('"name":' + _quote(event.name))
    attributes = _attributes(event.attributes)
    if attributes:
        parts.append(attributes)
    if event.dropped_attributes:
        parts.append(f'"droppedAttributesCount":{event.dropped_attributes}')
    return "{" + ",".join(parts) + "}"


def _link(link: Link) -> str:
    context = link.context  # encode_spans leaves a link's trace state out
    text = f'{{"traceId":"{context.trace_id:032x}","spanId":"{context.span_id:016x}"'
    attributes = _attributes(link.attributes)
    if attributes:
        text += "," + attributes
    if link.dropped_attributes:
        text += f',"droppedAttributesCount":{link.dropped_attributes}'
    return text + (_REMOTE if context.is_remote else _LOCAL) + "}"


def _attributes(attributes: Mapping[Any, Any] | None) -> str:
    """The ``"attributes"`` field, each attribute a ``KeyValue`` object; ``""`` when none is
    written (protobuf's JSON leaves an empty list out). The common kinds inline, each guarded
    by exactly what protobuf would refuse (an ASCII string is UTF-8; an int must fit in 64
    bits; inf and nan take the general path, which writes them as strings); an attribute
    protobuf would refuse is logged and left out, as ``encode_spans`` does."""
    parts: list[str] = []
    for key, value in attribute_items(attributes):
        head = _KEYS.get(key) if type(key) is str else None
        if head is None:
            if type(key) is not str or not key.isascii():
                item = _key_value(key, value)
                if item is not None:
                    parts.append(item)
                continue
            head = '{"key":' + _quote(key) + ',"value":'
            if len(_KEYS) < _KEYS_KEPT:
                _KEYS[key] = head
        kind = type(value)
        if kind is str and value.isascii():
            parts.append(f'{head}{{"stringValue":{_quote(value)}}}}}')
        elif kind is int and INT64_MIN <= value <= INT64_MAX:
            parts.append(f'{head}{{"intValue":"{value}"}}}}')
        elif kind is float and value - value == 0.0:
            parts.append(f'{head}{{"doubleValue":{value!r}}}}}')
        elif kind is bool:
            parts.append(head + ('{"boolValue":true}}' if value else '{"boolValue":false}}'))
        else:
            item = _key_value(key, value)
            if item is not None:
                parts.append(item)
    return '"attributes":[' + ",".join(parts) + "]" if parts else ""


def _key_value(key: object, value: object) -> str | None:
    try:
        return '{"key":' + _quote(proto_string(key)) + ',"value":' + _any_value(value) + "}"
    except Exception as error:  # as encode_spans does: log, leave the attribute out, go on
        _logger.exception("Failed to encode key %s: %s", key, error)
        return None


def _any_value(value: object) -> str:
    # encode_spans' order of checks: bool before int, str and bytes before Sequence.
    if value is None:
        return "{}"
    if isinstance(value, bool):
        return '{"boolValue":true}' if value else '{"boolValue":false}'
    if isinstance(value, str):
        return '{"stringValue":' + _quote(proto_string(value)) + "}"
    if isinstance(value, int):
        return f'{{"intValue":"{int64(value)}"}}'
    if isinstance(value, float):
        return '{"doubleValue":' + _double(float(value)) + "}"
    if isinstance(value, bytes):
        return '{"bytesValue":"' + base64.b64encode(value).decode("ascii") + '"}'
    if isinstance(value, Sequence):
        values = ",".join([_any_value(item) for item in value])
        return '{"arrayValue":{"values":[' + values + "]}}" if values else '{"arrayValue":{}}'
    if isinstance(value, Mapping):
        pairs = ",".join(
            [
                '{"key":' + _quote(proto_string(str(key))) + ',"value":' + _any_value(item) + "}"
                for key, item in value.items()
            ]
        )
        return '{"kvlistValue":{"values":[' + pairs + "]}}" if pairs else '{"kvlistValue":{}}'
    raise TypeError(f"Invalid type {type(value)} of value {value}")


def _double(value: float) -> str:
    # JSON has no inf or nan: protobuf's JSON mapping writes them as these strings.
    if value - value == 0.0:
        return repr(value)
    if value != value:
        return '"NaN"'
    return '"Infinity"' if value > 0 else '"-Infinity"'
