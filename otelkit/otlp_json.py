"""The OTLP JSON encoding of traces, as the OpenTelemetry Collector's file exporter writes it.

One line of an otelkit trace file is one ``ExportTraceServiceRequest`` in OTLP JSON: camelCase
names, ids as lowercase hex, enums as integers, 64-bit integers as decimal strings, default
fields left out. The embedded receiver and otelkit's JSON-lines span exporter both write it
through this module, and ``otelkit.analysis`` reads it back.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

__all__ = ["JsonLinesWriter", "normalize_json", "request_to_json", "span_count", "spans_to_json"]

JsonDict = dict[str, Any]

# check_circular=False: the documents are trees built here, and the check costs ~20 %.
_ENCODER = json.JSONEncoder(separators=(",", ":"), check_circular=False)


def request_to_json(req: ExportTraceServiceRequest) -> JsonDict:
    """Encode an ``ExportTraceServiceRequest`` as OTLP JSON (a dict ready for ``json.dumps``).

    About three times faster than ``google.protobuf.json_format.MessageToDict``, and unlike it
    writes ids as hex and enums as integers, as OTLP JSON requires.

    >>> request_to_json(ExportTraceServiceRequest())
    {}
    """
    resource_spans = [_resource_spans(rs) for rs in req.resource_spans]
    return {"resourceSpans": resource_spans} if resource_spans else {}


def spans_to_json(spans: Sequence[ReadableSpan]) -> JsonDict:
    """Encode OpenTelemetry SDK spans as one OTLP JSON request, as an OTLP exporter would send.

    >>> spans_to_json([])
    {}
    """
    return request_to_json(encode_spans(spans))


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


def _resource_spans(rs: Any) -> JsonDict:
    out: JsonDict = {}
    if rs.HasField("resource"):
        out["resource"] = res = _fields(rs.resource, _ATTRIBUTED)
        if rs.resource.entity_refs:  # strings only, and rare: the generic converter is exact
            res["entityRefs"] = [MessageToDict(ref) for ref in rs.resource.entity_refs]
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
_Table = tuple[tuple[str, str, Any], ...]
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


def _fields(msg: Any, table: _Table, out: JsonDict | None = None) -> JsonDict:
    out = {} if out is None else out
    for field, key, convert in table:
        value = getattr(msg, field)
        if value:
            out[key] = convert(value) if convert else value
    return out


def _attributes(kvs: Any) -> list[JsonDict]:
    # Scalars inline (most attributes are strings): a function call per value costs ~15 %.
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
        return {"doubleValue": d if d - d == 0.0 else MessageToDict(v)["doubleValue"]}
    if which == "bool_value":
        return {"boolValue": v.bool_value}
    if which in ("array_value", "kvlist_value"):
        values = getattr(v, which).values
        key = "arrayValue" if which == "array_value" else "kvlistValue"
        convert = _attributes if which == "kvlist_value" else lambda vs: list(map(_any_value, vs))
        return {key: {"values": convert(values)} if values else {}}
    if which == "bytes_value":
        return {"bytesValue": base64.b64encode(v.bytes_value).decode("ascii")}
    return {} if which is None else MessageToDict(v)  # a value type newer than this module


_SPAN_KINDS = {
    f"SPAN_KIND_{k}": i
    for i, k in enumerate(("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER"))
}
_STATUS_CODES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
_FLOAT_NAMES = ("NaN", "Infinity", "-Infinity")


def normalize_json(doc: object) -> JsonDict:
    """Validate an OTLP JSON traces body and bring it to the form ``request_to_json`` writes.

    Ids may be hex (OTLP JSON: Triton, the Collector) or base64 (protobuf's JSON mapping);
    they become lowercase hex. Enum names become integers, 64-bit integers strings, and an
    empty ``parentSpanId`` or ``status`` is dropped; other fields are kept as sent. The
    document is changed in place and returned; garbage raises ``ValueError`` saying where.

    >>> normalize_json({"resourceSpans": [{"scopeSpans": [{"spans": [
    ...     {"traceId": "AAECAwQFBgcICQoLDA0ODw==", "spanId": "0001020304050607",
    ...      "kind": "SPAN_KIND_SERVER"}]}]}]})["resourceSpans"][0]["scopeSpans"][0]["spans"]
    [{'traceId': '000102030405060708090a0b0c0d0e0f', 'spanId': '0001020304050607', 'kind': 2}]
    """
    for i, rs in enumerate(_list(_object(doc, "the body"), "resourceSpans", "")):
        rs = _object(rs, where := f"resourceSpans[{i}]")
        _attributes_in(_object(rs.get("resource", {}), f"{where}.resource"), f"{where}.resource")
        for j, ss in enumerate(_list(rs, "scopeSpans", where)):
            ss = _object(ss, here := f"{where}.scopeSpans[{j}]")
            _attributes_in(_object(ss.get("scope", {}), f"{here}.scope"), f"{here}.scope")
            for k, span in enumerate(_list(ss, "spans", here)):
                _normalize_span(_object(span, f"{here}.spans[{k}]"), f"{here}.spans[{k}]")
    return doc  # type: ignore[return-value]  # _object checked it


def _normalize_span(span: JsonDict, where: str) -> None:
    _ids(span, where)
    if span.get("parentSpanId"):
        span["parentSpanId"] = _hex_id(span["parentSpanId"], 8, f"{where}.parentSpanId")
    else:
        span.pop("parentSpanId", None)
    _enum(span, "kind", _SPAN_KINDS, where)
    _uint64(span, "startTimeUnixNano", where)
    _uint64(span, "endTimeUnixNano", where)
    if not isinstance(span.get("name", ""), str):
        raise ValueError(f"OTLP JSON: {where}.name is not a string")
    _attributes_in(span, where)
    for n, event in enumerate(_list(span, "events", where)):
        _uint64(_object(event, f"{where}.events[{n}]"), "timeUnixNano", f"{where}.events[{n}]")
        _attributes_in(event, f"{where}.events[{n}]")
    for n, link in enumerate(_list(span, "links", where)):
        _ids(_object(link, f"{where}.links[{n}]"), f"{where}.links[{n}]")
        _attributes_in(link, f"{where}.links[{n}]")
    if status := _object(span.get("status", {}), f"{where}.status"):
        _enum(status, "code", _STATUS_CODES, f"{where}.status")
    else:
        span.pop("status", None)


def _ids(parent: JsonDict, where: str) -> None:
    parent["traceId"] = _hex_id(parent.get("traceId"), 16, f"{where}.traceId")
    parent["spanId"] = _hex_id(parent.get("spanId"), 8, f"{where}.spanId")


def _hex_id(value: object, size: int, where: str) -> str:
    if isinstance(value, str):
        try:
            if len(value) == 2 * size and len(bytes.fromhex(value)) == size:
                return value.lower()
            raw = base64.b64decode(value.replace("-", "+").replace("_", "/"), validate=True)
            if len(raw) == size:
                return raw.hex()
        except (ValueError, binascii.Error):
            pass
    raise ValueError(f"OTLP JSON: {where} = {_short(value)} is not {size} bytes in hex or base64")


def _short(value: object) -> str:
    text = repr(value)  # garbage can be huge: keep error messages and logs readable
    return text if len(text) <= 60 else text[:57] + "..."


def _object(value: object, where: str) -> JsonDict:
    if not isinstance(value, dict):
        raise ValueError(f"OTLP JSON: {where} is not an object but {type(value).__name__}")
    return value


def _list(parent: JsonDict, key: str, where: str) -> list[Any]:
    value = parent.get(key, [])
    if not isinstance(value, list):
        raise ValueError(f"OTLP JSON: {where}{'.' if where else ''}{key} is not a list")
    return value


def _enum(parent: JsonDict, key: str, names: Mapping[str, int], where: str) -> None:
    value = parent.get(key, 0)
    if isinstance(value, str) and value in names:
        parent[key] = names[value]
    elif not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"OTLP JSON: {where}.{key} = {_short(value)} is not a valid enum value")


def _uint64(parent: JsonDict, key: str, where: str, signed: bool = False) -> None:
    if key not in parent:
        return
    value = parent[key]
    if isinstance(value, int) and not isinstance(value, bool) and (signed or value >= 0):
        parent[key] = str(value)
    elif not (
        isinstance(value, str) and (value[1:] if signed and value[:1] == "-" else value).isdecimal()
    ):
        kind = "an int64" if signed else "a uint64"
        raise ValueError(f"OTLP JSON: {where}.{key} = {_short(value)} is not {kind}")


def _attributes_in(parent: JsonDict, where: str, key: str = "attributes") -> None:
    for kv in _list(parent, key, where):
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise ValueError(f"OTLP JSON: {where}.{key} holds {_short(kv)}, not a key-value")
        _any_value_in(kv.get("value", {}), f"{where}.{key}[{_short(kv['key'])}]")


def _any_value_in(value: object, where: str) -> None:
    value = _object(value, where)
    if "intValue" in value:
        _uint64(value, "intValue", where, signed=True)
    elif "arrayValue" in value:
        for item in _list(_object(value["arrayValue"], where), "values", where):
            _any_value_in(item, where)
    elif "kvlistValue" in value:
        _attributes_in(_object(value["kvlistValue"], where), where, key="values")
    elif not _valid_scalar(value):
        raise ValueError(f"OTLP JSON: {where} = {_short(value)} is not a valid AnyValue")


def _valid_scalar(value: JsonDict) -> bool:
    if "stringValue" in value:
        return isinstance(value["stringValue"], str)
    if "boolValue" in value or isinstance(value.get("doubleValue"), bool):
        return isinstance(value.get("boolValue"), bool)
    try:
        if "doubleValue" in value:
            float(value["doubleValue"])  # a number, or a string such as "NaN" or "1.5"
        if "bytesValue" in value:
            base64.b64decode(value["bytesValue"], validate=True)
    except (TypeError, ValueError, OverflowError):  # binascii.Error is a ValueError
        return False
    return True  # empty, or a value type newer than this module


class JsonLinesWriter:
    """Append JSON documents to a file, one compact line each, safely from many threads.

    Each line is flushed to the operating system as it is written, so a killed process loses
    nothing already written. With ``max_bytes`` the file is renamed to ``<stem>.<n><suffix>``
    before it would grow past that size, and a new one is started.

    >>> import tempfile; path = Path(tempfile.mkdtemp()) / "traces.jsonl"
    >>> with JsonLinesWriter(path) as writer:
    ...     writer.write({"resourceSpans": []})
    21
    """

    def __init__(self, path: str | Path, *, max_bytes: int | None = None) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._file = open(self.path, "ab")  # noqa: SIM115 - lives as long as the writer
        self._size = self._file.tell()

    def write(self, doc: Mapping[str, Any]) -> int:
        """Append ``doc`` as one line; returns the bytes written. ``ValueError`` once closed."""
        line = (_ENCODER.encode(doc) + "\n").encode()
        with self._lock:
            if self._file.closed:
                raise ValueError(f"{self.path}: the writer is closed")
            if self.max_bytes and self._size and self._size + len(line) > self.max_bytes:
                self._rotate()
            self._file.write(line)
            self._file.flush()
            self._size += len(line)
        return len(line)

    def _rotate(self) -> None:
        self._file.close()
        n = 1
        while (target := self.path.with_name(f"{self.path.stem}.{n}{self.path.suffix}")).exists():
            n += 1
        self.path.rename(target)
        self._file = open(self.path, "ab")  # noqa: SIM115
        self._size = 0

    def close(self) -> None:
        """Flush and close the file; later writes raise ``ValueError``."""
        with self._lock:
            self._file.close()

    def __enter__(self) -> JsonLinesWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
