"""One line of a trace file to its spans: OTLP JSON as receivers and the Collector write it.

Most lines are in the form otelkit's receiver and the Collector's file exporter write (hex ids,
integer enums), and are read directly; any other line (base64 ids from protobuf's JSON mapping,
enum names) is validated and normalised by ``normalize_json`` first, which also rejects garbage.
Lines holding metrics or logs give no spans; a line that cannot be read gives none, with a
warning.

>>> line = ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "' + "ab" * 16 +
...         '", "spanId": "' + "cd" * 8 + '", "name": "infer", "kind": "SPAN_KIND_CLIENT"}]}]}]}')
>>> [(span.name, span.kind.name) for span in spans_of_line(line, "example:1")]
[('infer', 'CLIENT')]
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from enum import IntEnum
from typing import Any

from otelkit.analysis._spans import Attributes, Span, SpanEvent, SpanKind, SpanLink, StatusCode
from otelkit.export._otlp_json_normalize import normalize_json

__all__ = ["spans_of_doc", "spans_of_line"]

_log = logging.getLogger("otelkit.analysis")

_loads: Callable[[str], Any] = json.loads  # without orjson: the same documents, slower
with contextlib.suppress(ImportError):  # orjson (the report extra) parses them faster
    from orjson import loads as _loads


class _NotCanonical(Exception):
    """A document not in the form otelkit's receiver writes: validate and normalise it first."""


def spans_of_line(line: str, where: str) -> list[Span]:
    """The spans of one line. Most lines are in the form the receiver and the Collector write
    (hex ids, integer enums), read directly; any other goes through ``normalize_json`` first,
    which also rejects garbage. Validating every line would double the cost of reading."""
    if not line.strip():
        return []
    try:
        doc = _loads(line)
        if not isinstance(doc, dict) or "resourceSpans" not in doc:
            return []  # metrics or logs from the Collector's file exporter
        try:
            return list(_spans(doc))
        except (_NotCanonical, KeyError, TypeError, ValueError, AttributeError):
            return list(_spans(normalize_json(doc)))
    except (ValueError, RecursionError, _NotCanonical) as exc:
        _log.warning("%s: skipped, not an OTLP JSON document: %s", where, exc)
        return []


def spans_of_doc(doc: dict[str, Any]) -> list[Span]:
    """The spans of one OTLP JSON document as the receiver writes it (``request_to_json``)."""
    try:
        return list(_spans(doc))
    except (_NotCanonical, KeyError, TypeError, ValueError, AttributeError):
        return list(_spans(normalize_json(doc)))


def _hex(value: Any, size: int) -> str:
    if type(value) is not str or len(value) != 2 * size:
        raise _NotCanonical(f"id {value!r}")  # base64 (protobuf's JSON mapping), or garbage
    return value.lower()


def _number(value: Any) -> int:
    if type(value) is not int:
        raise _NotCanonical(f"enum {value!r}")  # a name, such as SPAN_KIND_SERVER
    return value


def _time(value: Any) -> int:
    if type(value) is str and value.isdecimal():
        return int(value)
    if type(value) is int and value >= 0:
        return value
    raise _NotCanonical(f"time {value!r}")


def _text(value: Any) -> str:
    if type(value) is not str:
        raise _NotCanonical(f"name {value!r}")
    return value


def _spans(doc: dict[str, Any]) -> Iterator[Span]:
    for rs in doc.get("resourceSpans", ()):
        resource = _attributes(rs.get("resource", {}).get("attributes", ()))
        for ss in rs.get("scopeSpans", ()):
            scope = ss.get("scope", {}).get("name", "")
            # the Collector's tail sampling says on the scope which policy kept the trace
            kept = _sampling(ss.get("scope", {}).get("attributes", ()))
            for s in ss.get("spans", ()):
                status = s.get("status", {})
                parent = s.get("parentSpanId")
                attributes = _attributes(s.get("attributes", ()))
                if kept:
                    attributes = {**kept, **attributes}
                yield Span(
                    trace_id=_hex(s["traceId"], 16),
                    span_id=_hex(s["spanId"], 8),
                    parent_span_id=_hex(parent, 8) if parent else None,
                    name=_text(s.get("name", "")),
                    kind=_enum(SpanKind, _number(s.get("kind", 0))),
                    start_ns=_time(s.get("startTimeUnixNano", 0)),
                    end_ns=_time(s.get("endTimeUnixNano", 0)),
                    attributes=attributes,
                    resource=resource,
                    scope=scope,
                    events=tuple(_event(e) for e in s.get("events", ())),
                    links=tuple(_link(link) for link in s.get("links", ())),
                    status_code=_enum(StatusCode, _number(status.get("code", 0))),
                    status_message=status.get("message", ""),
                )


def _sampling(kvs: Iterable[dict[str, Any]]) -> Attributes:
    """A scope's tail sampling attributes (``tailsampling.policy`` and its kin)."""
    return {k: v for k, v in _attributes(kvs).items() if k.startswith("tailsampling.")}


def _event(e: dict[str, Any]) -> SpanEvent:
    attributes = _attributes(e.get("attributes", ()))
    return SpanEvent(_text(e.get("name", "")), _time(e.get("timeUnixNano", 0)), attributes)


def _link(link: dict[str, Any]) -> SpanLink:
    trace_id, span_id = _hex(link["traceId"], 16), _hex(link["spanId"], 8)
    return SpanLink(trace_id, span_id, _attributes(link.get("attributes", ())))


# An enum's constructor costs microseconds a call; a tuple lookup a tenth of that.
_MEMBERS: dict[type[IntEnum], tuple[IntEnum, ...]] = {SpanKind: tuple(SpanKind)}
_MEMBERS[StatusCode] = tuple(StatusCode)


def _enum(kind: type[SpanKind] | type[StatusCode], value: int) -> Any:
    members = _MEMBERS[kind]
    if type(value) is int and 0 <= value < len(members):
        return members[value]
    return kind(0)  # a value newer than this module: keep the span, lose the detail


def _attributes(kvs: Iterable[dict[str, Any]]) -> Attributes:
    out = {}
    for kv in kvs:
        value = kv.get("value", {})
        # most values are strings: read them without a call
        out[kv["key"]] = value["stringValue"] if "stringValue" in value else _value(value)
    return out


def _value(v: dict[str, Any]) -> Any:
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])  # also reads "NaN" and "Infinity"
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", ())]
    if "kvlistValue" in v:
        return _attributes(v["kvlistValue"].get("values", ()))
    if "bytesValue" in v:
        return base64.b64decode(v["bytesValue"])
    return None
