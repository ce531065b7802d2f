"""Validation of received OTLP JSON traces, normalised to the form ``otlp_json`` writes.

The receiver takes JSON bodies from anything that speaks OTLP/HTTP (Triton, the Collector, an
SDK using protobuf's JSON mapping) and the loader reads files others wrote: both pass them
through ``normalize_json`` so that every stored document has hex ids, integer enums and
decimal-string 64-bit integers, and garbage fails with a message saying where it is.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

__all__ = ["normalize_json"]

JsonDict = dict[str, Any]

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
