"""The OTLP JSON encoding of traces, as the OpenTelemetry Collector's file exporter writes it.

One line of an otelkit trace file is one ``ExportTraceServiceRequest`` in OTLP JSON: camelCase
names, ids as lowercase hex, enums as integers, 64-bit integers as decimal strings, default
fields left out. The embedded receiver and otelkit's span exporters all encode through this
module (``dumps`` for the bytes), and ``otelkit.analysis`` reads it back; ``normalize_json``
brings OTLP JSON received from others to the same form.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace import ReadableSpan

from otelkit.export._otlp_json_encode import spans_to_bytes
from otelkit.export._otlp_json_normalize import normalize_json

# The JSON-lines exporter writes spans without protobuf (``otlp_json_encode``); protobuf's
# messages come in only with a protobuf request to convert (the receiver's).
if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

__all__ = [
    "dumps",
    "normalize_json",
    "request_to_json",
    "span_count",
    "spans_to_bytes",
    "spans_to_json",
]

JsonDict = dict[str, Any]

# (field, JSON name, conversion): fields written only when set, as protobuf's JSON leaves out
# defaults.
_Table = tuple[tuple[str, str, Any], ...]

# check_circular=False: the documents are trees built here, so the check would find nothing.
_ENCODER = json.JSONEncoder(separators=(",", ":"), check_circular=False)


def dumps(doc: Mapping[str, Any]) -> bytes:
    """Serialise an OTLP JSON document compactly, as one line of a trace file or an HTTP body.

    >>> dumps({"resourceSpans": []})
    b'{"resourceSpans":[]}'
    """
    return _ENCODER.encode(doc).encode()


def request_to_json(req: ExportTraceServiceRequest) -> JsonDict:
    """Encode an ``ExportTraceServiceRequest`` as OTLP JSON (a dict ready for ``json.dumps``).

    Cheaper than ``google.protobuf.json_format.MessageToDict``, and unlike it writes ids as hex
    and enums as integers, as OTLP JSON requires.

    >>> from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    >>> request_to_json(trace_service_pb2.ExportTraceServiceRequest())
    {}
    """
    resource_spans = [_resource_spans(rs) for rs in req.resource_spans]
    return {"resourceSpans": resource_spans} if resource_spans else {}


def spans_to_json(spans: Sequence[ReadableSpan]) -> JsonDict:
    """``spans_to_bytes(spans)`` as a document of dicts, ``request_to_json(encode_spans(spans))``.

    >>> spans_to_json([])
    {}
    """
    doc: JsonDict = json.loads(spans_to_bytes(spans))
    return doc


def span_count(doc: Mapping[str, Any]) -> int:
    """Number of spans in an OTLP JSON traces document.

    >>> span_count({"resourceSpans": [{"scopeSpans": [{"spans": [{}, {}]}]}]})
    2
    """
    return sum(
        len(ss.get("spans", ()))
        for rs in doc.get("resourceSpans", ())
        for ss in rs.get("scopeSpans", ())
    )


def _fields(msg: Any, table: _Table, out: JsonDict | None = None) -> JsonDict:
    out = {} if out is None else out
    for field, key, convert in table:
        value = getattr(msg, field)
        if value:
            out[key] = convert(value) if convert else value
    return out


def _resource_spans(rs: Any) -> JsonDict:
    out: JsonDict = {}
    if rs.HasField("resource"):
        out["resource"] = res = _fields(rs.resource, _ATTRIBUTED)
        if rs.resource.entity_refs:  # strings only, and rare: the generic converter is exact
            res["entityRefs"] = [_generic(ref) for ref in rs.resource.entity_refs]
    out["scopeSpans"] = [_scope_spans(ss) for ss in rs.scope_spans]
    return _fields(rs, _SCHEMA, out)


def _scope_spans(ss: Any) -> JsonDict:
    out: JsonDict = {"scope": _fields(ss.scope, _SCOPE)} if ss.HasField("scope") else {}
    out["spans"] = [_span(s) for s in ss.spans]
    return _fields(ss, _SCHEMA, out)


def _span(s: Any) -> JsonDict:
    # The hot path, written out: one call per span, default fields left out.
    out: JsonDict = {"traceId": s.trace_id.hex(), "spanId": s.span_id.hex()}
    if s.trace_state:
        out["traceState"] = s.trace_state
    if s.parent_span_id:
        out["parentSpanId"] = s.parent_span_id.hex()
    if s.flags:
        out["flags"] = s.flags
    if s.name:
        out["name"] = s.name
    if s.kind:
        out["kind"] = s.kind
    if s.start_time_unix_nano:
        out["startTimeUnixNano"] = str(s.start_time_unix_nano)
    if s.end_time_unix_nano:
        out["endTimeUnixNano"] = str(s.end_time_unix_nano)
    if s.attributes:
        out["attributes"] = _attributes(s.attributes)
    if s.events:
        out["events"] = [_event(e) for e in s.events]
    if s.links:
        out["links"] = [_fields(link, _LINK) for link in s.links]
    if s.dropped_attributes_count or s.dropped_events_count or s.dropped_links_count:
        _fields(s, _SPAN_DROPPED, out)
    status = s.status
    if status.code or status.message:
        out["status"] = _fields(status, _STATUS)
    return out


def _event(e: Any) -> JsonDict:
    out: JsonDict = {"timeUnixNano": str(e.time_unix_nano)} if e.time_unix_nano else {}
    if e.name:
        out["name"] = e.name
    if e.attributes:
        out["attributes"] = _attributes(e.attributes)
    return _fields(e, _DROPPED, out) if e.dropped_attributes_count else out


# (field, JSON name, conversion) for the messages off the hot path; defaults are left out.
_ATTRS: _Table = (("attributes", "attributes", lambda v: _attributes(v)),)
_DROPPED: _Table = (("dropped_attributes_count", "droppedAttributesCount", None),)
_ATTRIBUTED = _ATTRS + _DROPPED
_SCHEMA: _Table = (("schema_url", "schemaUrl", None),)
_SCOPE: _Table = (("name", "name", None), ("version", "version", None), *_ATTRIBUTED)
_IDS: _Table = (("trace_id", "traceId", bytes.hex), ("span_id", "spanId", bytes.hex))
_LINK: _Table = (*_IDS, ("trace_state", "traceState", None), *_ATTRIBUTED, ("flags", "flags", None))
_STATUS: _Table = (("message", "message", None), ("code", "code", int))
_SPAN_DROPPED: _Table = (
    *_DROPPED,
    ("dropped_events_count", "droppedEventsCount", None),
    ("dropped_links_count", "droppedLinksCount", None),
)


def _attributes(kvs: Any) -> list[JsonDict]:
    # Scalars inline: most attributes are strings, and this runs once per attribute.
    out = []
    for kv in kvs:
        v = kv.value
        which = v.WhichOneof("value")
        if which == "string_value":
            out.append({"key": kv.key, "value": {"stringValue": v.string_value}})
        elif which == "int_value":
            out.append({"key": kv.key, "value": {"intValue": str(v.int_value)}})
        elif which is None and not kv.HasField("value"):
            out.append({"key": kv.key})
        else:
            out.append({"key": kv.key, "value": _any_value(v, which)})
    return out


def _any_value(v: Any, which: str | None = "") -> JsonDict:
    which = v.WhichOneof("value") if which == "" else which
    if which == "string_value":
        return {"stringValue": v.string_value}
    if which == "int_value":
        return {"intValue": str(v.int_value)}
    if which == "double_value":
        d = v.double_value
        # d - d is 0.0 unless d is inf or nan, which JSON can only carry as strings.
        return {"doubleValue": d if d - d == 0.0 else _generic(v)["doubleValue"]}
    if which == "bool_value":
        return {"boolValue": v.bool_value}
    if which in ("array_value", "kvlist_value"):
        values = getattr(v, which).values
        key = "arrayValue" if which == "array_value" else "kvlistValue"
        convert = _attributes if which == "kvlist_value" else lambda vs: list(map(_any_value, vs))
        return {key: {"values": convert(values)} if values else {}}
    if which == "bytes_value":
        return {"bytesValue": base64.b64encode(v.bytes_value).decode("ascii")}
    return {} if which is None else _generic(v)  # a value type newer than this module


def _generic(message: Any) -> JsonDict:
    """protobuf's own JSON mapping of ``message``, for the rare fields converted here with it."""
    from google.protobuf.json_format import MessageToDict  # an import otelkit does not pay

    found: JsonDict = MessageToDict(message)
    return found
