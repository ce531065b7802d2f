"""SDK spans straight to OTLP JSON, without the protobuf detour (see ``otlp_json.spans_to_json``).

Mirrors opentelemetry-exporter-otlp-proto-common's ``encode_spans`` followed by
``otlp_json.request_to_json``: the same fields, defaults left out, keys in the same order (so
``dumps`` gives the same bytes), and what protobuf would refuse refused alike.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link, Status
    from opentelemetry.trace.span import TraceState

__all__ = ["Table", "attribute_items", "encode_sdk_spans", "fields", "grouped", "int64",
           "proto_string"]  # fmt: skip

JsonDict = dict[str, Any]
T = TypeVar("T")
# (field, JSON name, conversion): fields written only when set, as protobuf's JSON leaves out
# defaults. Shared with otlp_json's protobuf path.
Table = tuple[tuple[str, str, Any], ...]


def fields(msg: Any, table: Table, out: JsonDict | None = None) -> JsonDict:
    out = {} if out is None else out
    for field, key, convert in table:
        value = getattr(msg, field)
        if value:
            out[key] = convert(value) if convert else value
    return out


def encode_sdk_spans(spans: Sequence[ReadableSpan]) -> JsonDict:
    """One OTLP JSON traces document for ``spans``, grouped as ``encode_spans`` groups them."""
    groups = grouped(spans, _sdk_span)
    if not groups:
        return {}
    return {"resourceSpans": [_sdk_resource_spans(r, scopes) for r, scopes in groups.items()]}


def grouped(
    spans: Sequence[ReadableSpan], encode: Callable[[ReadableSpan], T]
) -> dict[Resource, dict[InstrumentationScope | None, list[T]]]:
    """Each span ``encode``d, grouped as ``encode_spans`` groups them: by equal resource, then
    equal scope, in order of first appearance; of equal resources (or scopes) the first is the
    key."""
    groups: dict[Resource, dict[InstrumentationScope | None, list[T]]] = {}
    # Finding a resource by equality hashes its attributes as JSON: once per object, not per span.
    by_identity: dict[tuple[int, int], tuple[list[T], Resource, Any]] = {}
    for span in spans:
        resource, scope = span.resource, span.instrumentation_scope or None
        known = by_identity.get((id(resource), id(scope)))
        if known is None:  # the objects are kept in the value, so their ids stay theirs
            group = groups.setdefault(resource, {}).setdefault(scope, [])
            known = by_identity[id(resource), id(scope)] = (group, resource, scope)
        known[0].append(encode(span))
    return groups


# SDK spans → OTLP JSON. Mirrors opentelemetry-exporter-otlp-proto-common's encode_spans followed
# by request_to_json: the same fields, defaults left out, keys in request_to_json's order (so
# ``dumps`` gives the same bytes), and what protobuf would refuse refused alike.

_logger = logging.getLogger("otelkit")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_KIND = {kind: kind.value + 1 for kind in SpanKind}  # OTLP counts from SPAN_KIND_UNSPECIFIED
# SpanFlags: encode_spans always says whether the parent (or a link's span) is remote: the
# HAS_IS_REMOTE bit, with IS_REMOTE where it is.
_LOCAL, _REMOTE = 0x100, 0x300


def _sdk_resource_spans(
    resource: Resource, scopes: Mapping[InstrumentationScope | None, list[JsonDict]]
) -> JsonDict:
    attributes = _sdk_attributes(resource.attributes)
    out: JsonDict = {
        "resource": {"attributes": attributes} if attributes else {},
        "scopeSpans": [_sdk_scope_spans(scope, spans) for scope, spans in scopes.items()],
    }
    if resource.schema_url:
        out["schemaUrl"] = resource.schema_url
    return out


def _sdk_scope_spans(scope: InstrumentationScope | None, spans: list[JsonDict]) -> JsonDict:
    out: JsonDict = {"scope": {}, "spans": spans}  # a span without a scope gets an empty one
    if scope is None:
        return out
    if scope.name:
        out["scope"]["name"] = scope.name
    if scope.version:
        out["scope"]["version"] = scope.version
    attributes = _sdk_attributes(scope.attributes)
    if attributes:
        out["scope"]["attributes"] = attributes
    if scope.schema_url:
        out["schemaUrl"] = scope.schema_url
    return out


def _sdk_span(span: ReadableSpan) -> JsonDict:
    # The hot path, written out: one call per span, and one per attribute set.
    context: Any = span.get_span_context()
    out: JsonDict = {
        "traceId": format(context.trace_id, "032x"),
        "spanId": format(context.span_id, "016x"),
    }
    trace_state = context.trace_state
    if trace_state is not None and trace_state is not DEFAULT_TRACE_STATE:
        text = _trace_state(trace_state)
        if text:
            out["traceState"] = text
    parent = span.parent
    if parent:
        out["parentSpanId"] = format(parent.span_id, "016x")
    out["flags"] = _REMOTE if parent and parent.is_remote else _LOCAL
    if span.name:
        out["name"] = span.name
    out["kind"] = _KIND[span.kind]
    start, end = span.start_time, span.end_time
    if start:
        out["startTimeUnixNano"] = str(start)
    if end:
        out["endTimeUnixNano"] = str(end)
    # ReadableSpan.attributes wraps them in a proxy, which would hide them from attribute_items.
    attributes = _sdk_attributes(
        span._attributes if type(span) is ReadableSpan else span.attributes
    )
    if attributes:
        out["attributes"] = attributes
    events, links = span.events, span.links
    if events:
        out["events"] = [_sdk_event(event) for event in events]
    if links:
        out["links"] = [_sdk_link(link) for link in links]
    fields(span, _SDK_DROPPED, out)
    status = span.status
    if status is not None and (status.status_code is not StatusCode.UNSET or status.description):
        out["status"] = _sdk_status(status)
    return out


def _trace_state(trace_state: TraceState) -> str:
    return ",".join([f"{key}={value}" for key, value in trace_state.items()])


_SDK_DROPPED: Table = (
    ("dropped_attributes", "droppedAttributesCount", None),
    ("dropped_events", "droppedEventsCount", None),
    ("dropped_links", "droppedLinksCount", None),
)


def _sdk_status(status: Status) -> JsonDict:
    out: JsonDict = {"message": status.description} if status.description else {}
    if status.status_code.value:
        out["code"] = status.status_code.value
    return out


def _sdk_event(event: Event) -> JsonDict:
    out: JsonDict = {"timeUnixNano": str(event.timestamp)} if event.timestamp else {}
    if event.name:
        out["name"] = event.name
    attributes = _sdk_attributes(event.attributes)
    if attributes:
        out["attributes"] = attributes
    if event.dropped_attributes:
        out["droppedAttributesCount"] = event.dropped_attributes
    return out


def _sdk_link(link: Link) -> JsonDict:
    # encode_spans leaves a link's trace state out.
    context = link.context
    out: JsonDict = {
        "traceId": format(context.trace_id, "032x"),
        "spanId": format(context.span_id, "016x"),
    }
    attributes = _sdk_attributes(link.attributes)
    if attributes:
        out["attributes"] = attributes
    if link.dropped_attributes:
        out["droppedAttributesCount"] = link.dropped_attributes
    out["flags"] = _REMOTE if context.is_remote else _LOCAL
    return out


def _sdk_attributes(attributes: Mapping[Any, Any] | None) -> list[JsonDict]:
    # The common types inline (a call per value costs ~15 %), each guarded by exactly what
    # protobuf would refuse: a lone surrogate is not UTF-8, an int must fit in 64 bits; inf and
    # nan are written as strings. Anything else takes the general path.
    out: list[JsonDict] = []
    for key, value in attribute_items(attributes):
        kind = type(value)
        if type(key) is not str or not key.isascii():
            item = _sdk_key_value(key, value)
        elif kind is str and value.isascii():
            item = {"key": key, "value": {"stringValue": value}}
        elif kind is int and _INT64_MIN <= value <= _INT64_MAX:
            item = {"key": key, "value": {"intValue": str(value)}}
        elif kind is float and value - value == 0.0:
            item = {"key": key, "value": {"doubleValue": value}}
        elif kind is bool:
            item = {"key": key, "value": {"boolValue": value}}
        else:
            item = _sdk_key_value(key, value)
        if item is not None:
            out.append(item)
    return out


def attribute_items(attributes: Mapping[Any, Any] | None) -> Iterable[tuple[Any, Any]]:
    # BoundedAttributes iterates in Python, a generator step and a __getitem__ a pair; its dict
    # holds the same pairs in the same order, and reads at a third of the cost. The dict is
    # private: should the SDK rename it, this falls back to the public way. (Spans are immutable
    # once ended, so nothing changes the dict while it is read.)
    if type(attributes) is BoundedAttributes:
        pairs = getattr(attributes, "_dict", None)
        if type(pairs) is dict:
            return pairs.items()
    return attributes.items() if attributes else ()


def _sdk_key_value(key: object, value: object) -> JsonDict | None:
    try:
        return {"key": proto_string(key), "value": _sdk_any_value(value)}
    except Exception as error:  # as encode_spans does: log, leave the attribute out, go on
        _logger.exception("Failed to encode key %s: %s", key, error)
        return None


def _sdk_any_value(value: object) -> JsonDict:
    # encode_spans' order of checks: bool before int, str and bytes before Sequence.
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, str):
        return {"stringValue": proto_string(value)}
    if isinstance(value, int):
        return {"intValue": str(int64(value))}
    if isinstance(value, float):
        return {"doubleValue": _double(float(value))}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode("ascii")}
    if isinstance(value, Sequence):
        values = [_sdk_any_value(v) for v in value]
        return {"arrayValue": {"values": values} if values else {}}
    if isinstance(value, Mapping):
        kvs = [{"key": proto_string(str(k)), "value": _sdk_any_value(v)} for k, v in value.items()]
        return {"kvlistValue": {"values": kvs} if kvs else {}}
    raise TypeError(f"Invalid type {type(value)} of value {value}")


def proto_string(value: object) -> str:
    """What protobuf stores for a string field given ``value``, or its error."""
    if isinstance(value, str):
        if not value.isascii():
            value.encode()  # UnicodeEncodeError on a lone surrogate, as protobuf raises
        return str.__str__(value)
    if isinstance(value, bytes):
        return value.decode()
    if value is None:
        return ""
    raise TypeError(f"bad argument type for a string field: {type(value)}")


def int64(value: int) -> int:
    """``value`` as protobuf's int64 takes it, or its error."""
    number = int(value)
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise ValueError(f"Value out of range: {number}")
    return number


def _double(value: float) -> float | str:
    # JSON has no inf or nan: protobuf's JSON mapping writes them as these strings.
    if value - value == 0.0:
        return value
    if value != value:
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"
