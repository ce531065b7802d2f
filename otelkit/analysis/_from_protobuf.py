"""A segment's columns straight from OTLP protobuf requests, without JSON in between.

What the receiver's segments are made of: ``ExportTraceServiceRequest`` messages as they came,
turned into the span store's columns (``_store``) in one pass over the messages, each value
written as ``_store`` writes the ``Span`` that ``_decode`` reads back from the request's OTLP
JSON, so a segment is the same whichever way its spans came. A request of a shape this pass
does not take (an id of the wrong length, a value type newer than this module) goes that other
way, ``request_to_json`` then ``_decode``: exact, and slower.
"""

from __future__ import annotations

import json
import json.encoder
import logging
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

from otelkit.analysis._decode import spans_of_line
from otelkit.analysis._store import _KINDS, _STATUSES, _Resources, _row, _schema, _texts
from otelkit.export._otlp_json import dumps, request_to_json

__all__ = ["segment_table"]

_log = logging.getLogger("otelkit.analysis")


def _encoder() -> Callable[[dict[str, Any]], str]:
    """What ``_store._json`` writes of a dict: ``json.dumps(separators=(",", ":"),
    ensure_ascii=False, default=str)``. ``json.dumps`` builds an encoder a call when given any
    argument, and ``JSONEncoder.encode`` builds its C scanner a call: the scanner is built
    once here, where the C accelerator is there (CPython's; its arguments are those
    ``JSONEncoder.iterencode`` passes), the same text."""
    plain = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str).encode
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return plain
    try:
        scan = make(None, str, json.encoder.encode_basestring, None, ":", ",", False, False, True)
        probe = {"a": [1, 2.5, float("nan"), True, None, b"x"], "é\n": {"k": "v"}}
        if "".join(scan(probe, 0)) != plain(probe):
            return plain
    except (TypeError, ValueError):  # another signature
        return plain

    def encode(value: dict[str, Any]) -> str:
        return "".join(scan(value, 0))

    return encode


_encode = _encoder()
_KIND_NAMES = tuple(_KINDS[kind] for kind in sorted(_KINDS))
_STATUS_NAMES = tuple(_STATUSES[status] for status in sorted(_STATUSES))


class _Other(Exception):
    """A request of a shape the one pass does not take: it goes through OTLP JSON."""


#: the ``AnyValue`` fields read as they are: the Python value ``_decode`` makes of each
_PLAIN = frozenset(("string_value", "int_value", "double_value", "bool_value", "bytes_value"))


def _value(v: Any) -> Any:
    """An ``AnyValue`` as ``_decode`` reads its OTLP JSON (``request_to_json``)."""
    which = v.WhichOneof("value")
    if which in _PLAIN:
        return getattr(v, which)
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return _attributes(v.kvlist_value.values)
    if which is None:
        return None
    raise _Other(which)  # a value type newer than this module


def _attributes(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    plain = _PLAIN
    for kv in kvs:
        v = kv.value
        which = v.WhichOneof("value")
        out[kv.key] = getattr(v, which) if which in plain else _value(v)
    return out


def _text(value: Any) -> str:
    """``_store._texts``'s text of one value: json.dumps, whose text of an int or a finite
    float is its repr, without a call to it for those."""
    kind = type(value)
    if kind is str:
        return value  # type: ignore[no-any-return]
    if kind is int or (kind is float and math.isfinite(value)):
        return repr(value)
    return json.dumps(value, default=str)


def _hex(value: bytes, size: int) -> str:
    if len(value) != size:
        raise _Other(f"an id of {len(value)} bytes")
    return value.hex()


#: a row's scalar columns, in the order ``_Columns`` holds them
_SCALARS = (
    "Timestamp",
    "Duration",
    "TraceId",
    "SpanId",
    "ParentSpanId",
    "SpanName",
    "SpanKind",
    "ServiceName",
    "ScopeName",
    "StatusCode",
    "StatusMessage",
    "SpanAttributesJson",
)


class _Nested:
    """A map or list column: its entries' fields flat, and each row's end offset."""

    def __init__(self, fields: int) -> None:
        self.fields: list[list[Any]] = [[] for _ in range(fields)]
        self.ends = [0]

    def end_row(self) -> None:
        self.ends.append(len(self.fields[0]))

    def truncate(self, rows: int) -> None:
        """Drop the rows from ``rows`` on, and entries after them (a row's not ended)."""
        del self.ends[rows + 1 :]
        for field in self.fields:
            del field[self.ends[-1] :]

    def offsets(self, pa: Any) -> Any:
        return pa.array(self.ends, pa.int32())


class _Columns:
    """The spans added so far: each scalar column a list, each nested one a ``_Nested``. The
    resources are kept once each, a row naming its own by its index."""

    def __init__(self) -> None:
        self.scalars: list[list[Any]] = [[] for _ in _SCALARS]
        self.attributes, self.events, self.links = _Nested(2), _Nested(3), _Nested(3)
        self.resources = _Nested(2)
        self.resource_json: list[str] = []
        self.resource_of: list[int] = []
        self._resource_index: dict[tuple[tuple[str, str], ...], int] = {}

    def __len__(self) -> int:
        return len(self.resource_of)

    def request(self, req: Any) -> None:
        """Add the spans of one request: all of them, or none and ``_Other`` raised."""
        mark = len(self)
        try:
            for rs in req.resource_spans:
                resource = _attributes(rs.resource.attributes)
                service = str(resource.get("service.name", ""))
                index = self._resource(_texts(resource), _encode(resource) if resource else "{}")
                for ss in rs.scope_spans:
                    # the Collector's tail sampling says on the scope which policy kept it
                    kept = {
                        k: v
                        for k, v in _attributes(ss.scope.attributes).items()
                        if k.startswith("tailsampling.")
                    }
                    self._spans(ss, kept, service, index)
        except _Other:
            self.truncate(mark)
            raise

    def _spans(self, ss: Any, kept: dict[str, Any], service: str, resource: int) -> None:
        scope = ss.scope.name
        (
            add_start,
            add_duration,
            add_trace,
            add_span,
            add_parent,
            add_name,
            add_kind,
            add_service,
            add_scope,
            add_status,
            add_message,
            add_json,
        ) = (column.append for column in self.scalars)
        attr_keys, attr_texts = self.attributes.fields
        event_time, event_name, event_json = self.events.fields
        kinds, statuses = _KIND_NAMES, _STATUS_NAMES
        for s in ss.spans:
            trace, span, parent = s.trace_id, s.span_id, s.parent_span_id
            if len(trace) != 16 or len(span) != 8 or (parent and len(parent) != 8):
                raise _Other("an id of another length")
            # each read of a repeated field makes a wrapper: one read each
            found = s.attributes
            attributes = _attributes(found) if found else {}
            if kept:
                attributes = {**kept, **attributes}
            links = s.links
            if links:  # before the row is added: a request is all or nothing
                self._links(links)
            self.links.end_row()
            start, end = s.start_time_unix_nano, s.end_time_unix_nano
            if (start | end) >> 63:  # beyond 2262: no int64 holds it
                raise _Other("a time beyond int64")
            kind = s.kind
            status = s.status
            code = status.code
            if attributes:
                attr_keys.extend(attributes)
                attr_texts.extend([v if type(v) is str else _text(v) for v in attributes.values()])
                attributes_json = _encode(attributes)
            else:
                attributes_json = "{}"
            self.attributes.end_row()
            self.resource_of.append(resource)
            events = s.events
            if events:
                for event in events:
                    if event.time_unix_nano >> 63:
                        raise _Other("a time beyond int64")
                    event_time.append(event.time_unix_nano)
                    event_name.append(event.name)
                    found = event.attributes
                    event_json.append(_encode(_attributes(found)) if found else "{}")
            self.events.end_row()
            add_start(start)
            add_duration(end - start)
            add_trace(trace.hex())
            add_span(span.hex())
            add_parent(parent.hex())
            add_name(s.name)
            add_kind(kinds[kind] if 0 <= kind < len(kinds) else "Unspecified")
            add_service(service)
            add_scope(scope)
            add_status(statuses[code] if 0 <= code < len(statuses) else "Unset")
            add_message(status.message)
            add_json(attributes_json)

    def _resource(self, texts: list[tuple[str, str]], typed: str) -> int:
        """The index of a resource (its attributes' texts and typed JSON) among those added:
        the spans of a request, and of a sender, share one."""
        key = (*texts, ("", typed))  # the typed text too: 1 and "1" differ there
        index = self._resource_index.get(key)
        if index is None:
            index = self._resource_index[key] = len(self.resource_json)
            keys, values = self.resources.fields
            keys.extend(key for key, _ in texts)
            values.extend(text for _, text in texts)
            self.resources.end_row()
            self.resource_json.append(typed)
        return index

    def _links(self, links: Any) -> None:
        trace, span, typed = self.links.fields
        for link in links:
            trace.append(_hex(link.trace_id, 16))
            span.append(_hex(link.span_id, 8))
            found = _attributes(link.attributes) if link.attributes else None
            typed.append(_encode(found) if found else "{}")

    def add_rows(self, rows: list[dict[str, Any]]) -> None:
        """Add rows as ``_store._row`` makes them."""
        for row in rows:
            for column, name in zip(self.scalars, _SCALARS, strict=True):
                column.append(row[name])
            keys, texts = self.attributes.fields
            keys.extend(key for key, _ in row["SpanAttributes"])
            texts.extend(text for _, text in row["SpanAttributes"])
            self.attributes.end_row()
            typed = row["ResourceAttributesJson"]
            self.resource_of.append(self._resource(row["ResourceAttributes"], typed))
            for nested, records, names in (
                (self.events, row["Events"], ("Timestamp", "Name", "AttributesJson")),
                (self.links, row["Links"], ("TraceId", "SpanId", "AttributesJson")),
            ):
                for field, name in zip(nested.fields, names, strict=True):
                    field.extend(record[name] for record in records)
                nested.end_row()

    def truncate(self, rows: int) -> None:
        """Drop the rows from ``rows`` on (the resources added stay, unreferenced)."""
        for column in self.scalars:
            del column[rows:]
        del self.resource_of[rows:]
        for nested in (self.attributes, self.events, self.links):
            nested.truncate(rows)

    def table(self, pa: Any) -> Any:
        schema = _schema(pa)
        types = {field.name: field.type for field in schema}
        string = pa.string()

        def records(nested: _Nested, *fields: tuple[str, Any]) -> Any:
            arrays = [
                pa.array(values, kind)
                for values, (_, kind) in zip(nested.fields, fields, strict=True)
            ]
            named = [pa.field(name, kind) for name, kind in fields]
            struct = pa.StructArray.from_arrays(arrays, fields=named)
            return pa.ListArray.from_arrays(nested.offsets(pa), struct)

        def pairs(nested: _Nested, name: str) -> Any:
            keys, texts = (pa.array(values, string) for values in nested.fields)
            return pa.MapArray.from_arrays(nested.offsets(pa), keys, texts, type=types[name])

        columns = {
            name: pa.array(values, types[name])
            for name, values in zip(_SCALARS, self.scalars, strict=True)
        }
        resource_of = pa.array(self.resource_of, pa.int32())
        typed = ("AttributesJson", string)
        columns |= {
            "SpanAttributes": pairs(self.attributes, "SpanAttributes"),
            "ResourceAttributes": pairs(self.resources, "ResourceAttributes").take(resource_of),
            "ResourceAttributesJson": pa.array(self.resource_json, string).take(resource_of),
            "Events": records(self.events, ("Timestamp", pa.int64()), ("Name", string), typed),
            "Links": records(self.links, ("TraceId", string), ("SpanId", string), typed),
        }
        return pa.Table.from_arrays([columns[field.name] for field in schema], schema=schema)


def _beyond_int64(row: dict[str, Any]) -> bool:
    times = [row["Timestamp"], *(event["Timestamp"] for event in row["Events"])]
    return any(time >> 63 for time in times) or not -(1 << 63) <= row["Duration"] < 1 << 63


#: an escaped UTF-16 surrogate: JSON's way to write a code point beyond the first 65,536,
#: in pairs; one alone (which Python's json reads, and orjson refuses) is no UTF-8 text
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def _utf8(rows: list[dict[str, Any]]) -> bool:
    try:
        json.dumps(rows, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def segment_table(messages: Iterable[bytes], pa: Any, where: str) -> Any:
    """The spans of staged messages, in order, as one table of the segments' schema (``pa``:
    the pyarrow module): each an ``ExportTraceServiceRequest``, serialized, or an OTLP JSON
    document (its first byte ``{``, as the Collector's framing takes one). A message neither
    way reads gives no span, with a warning naming ``where`` and its number, as a trace
    file's line that cannot be read."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    parse = ExportTraceServiceRequest.FromString
    columns = _Columns()
    for number, message in enumerate(messages, 1):
        if message[:1] != b"{":
            req = parse(message)
            try:
                columns.request(req)
                continue
            except _Other:
                message = dumps(request_to_json(req))
        seen: _Resources = {}
        named = f"{where}: message {number}"
        rows = [
            _row(span, seen) for span in spans_of_line(message.decode("utf-8", "replace"), named)
        ]
        if any(map(_beyond_int64, rows)):
            _log.warning("%s: skipped, a time beyond 2262 (int64 nanoseconds)", named)
            continue
        if _SURROGATE.search(message) and not _utf8(rows):  # json.loads takes "\ud800"
            _log.warning("%s: skipped, a lone surrogate escaped in a string (not UTF-8)", named)
            continue
        columns.add_rows(rows)
    return columns.table(pa)
