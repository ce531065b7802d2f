"""Spans as columns: zstd Parquet segments, one flat row a span.

A segment holds spans in their order of arrival (the first of duplicate ids wins when traces are
built, as from JSON lines). Its columns are named as the OpenTelemetry Collector's ClickHouse
exporter names ``otel_traces``'s, so one query reads either, plus what that table leaves out
and otelkit reads back exactly:

- ``Timestamp`` (start, ns since the epoch, UTC), ``Duration`` (ns), ``TraceId``, ``SpanId``,
  ``ParentSpanId`` (lowercase hex; ``""`` for a root), ``SpanName``, ``SpanKind`` (the
  exporter's ``Server``, ``Client``...), ``ServiceName``, ``ScopeName``, ``StatusCode``
  (``Unset``, ``Ok``, ``Error``), ``StatusMessage``;
- ``SpanAttributes`` and ``ResourceAttributes``: maps of strings, as the exporter writes them;
- ``SpanAttributesJson``, ``ResourceAttributesJson``: the same with their types (a number stays
  a number), which otelkit reads;
- ``Events``: a list of (``Timestamp``, ``Name``, ``AttributesJson``); ``Links``: a list of
  (``TraceId``, ``SpanId``, ``AttributesJson``).

pyarrow is imported on first use (``import otelkit`` stays cheap): ``pip install
otelkit[store]``.

>>> write_segment(load_spans("otelkit-traces"), "store/segment-0.parquet")  # doctest: +SKIP
1200
>>> next(read_segment("store/segment-0.parquet")).name  # doctest: +SKIP
'reconstruct event'
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from otelkit.analysis._spans import Span, SpanEvent, SpanKind, SpanLink, StatusCode

__all__ = [
    "SUFFIX",
    "SegmentWriter",
    "StoreError",
    "check_segment",
    "read_segment",
    "segment_path",
    "segment_schema",
    "spans_of_table",
    "whole_segments",
    "write_segment",
    "write_table",
]

SUFFIX = ".parquet"
_log = logging.getLogger("otelkit.analysis")
_KINDS = {
    SpanKind.UNSPECIFIED: "Unspecified",
    SpanKind.INTERNAL: "Internal",
    SpanKind.SERVER: "Server",
    SpanKind.CLIENT: "Client",
    SpanKind.PRODUCER: "Producer",
    SpanKind.CONSUMER: "Consumer",
}
_KIND_OF = {name: kind for kind, name in _KINDS.items()}
_STATUSES = {StatusCode.UNSET: "Unset", StatusCode.OK: "Ok", StatusCode.ERROR: "Error"}
_STATUS_OF = {name: status for status, name in _STATUSES.items()}
_parse: Callable[[str], Any] = json.loads  # without orjson: the same values, slower
with contextlib.suppress(ImportError):  # orjson (the report extra) reads them faster
    from orjson import loads as _parse
_ROWS_PER_GROUP = 65_536  # a row group's spans: what a reader holds at once


class StoreError(Exception):
    """A segment that cannot be read: not Parquet, cut short (no footer), or of an unknown
    shape; the message names the file and what is wrong."""


def _arrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as error:  # the extra is not installed
        raise StoreError(
            "otelkit's span store needs pyarrow: pip install 'otelkit[store]'"
        ) from error
    return pyarrow


def _records(pa: Any, *fields: tuple[str, Any]) -> Any:
    """A list of structs of ``fields`` and their typed attributes (``AttributesJson``)."""
    return pa.list_(pa.struct([*fields, ("AttributesJson", pa.string())]))


def _schema(pa: Any) -> Any:
    strings = pa.map_(pa.string(), pa.string())
    return pa.schema(
        [
            ("Timestamp", pa.timestamp("ns", tz="UTC")),
            ("TraceId", pa.string()),
            ("SpanId", pa.string()),
            ("ParentSpanId", pa.string()),
            ("SpanName", pa.string()),
            ("SpanKind", pa.string()),
            ("ServiceName", pa.string()),
            ("ScopeName", pa.string()),
            ("Duration", pa.int64()),
            ("StatusCode", pa.string()),
            ("StatusMessage", pa.string()),
            ("SpanAttributes", strings),
            ("ResourceAttributes", strings),
            ("SpanAttributesJson", pa.string()),
            ("ResourceAttributesJson", pa.string()),
            ("Events", _records(pa, ("Timestamp", pa.int64()), ("Name", pa.string()))),
            ("Links", _records(pa, ("TraceId", pa.string()), ("SpanId", pa.string()))),
        ]
    )


def segment_schema(pa: Any) -> Any:
    """The segments' Arrow schema (``pa``: the pyarrow module), for writers of other sources."""
    return _schema(pa)


def _json(attributes: dict[str, Any]) -> str:
    if not attributes:  # most events carry none
        return "{}"
    return json.dumps(attributes, separators=(",", ":"), ensure_ascii=False, default=str)


def _texts(attributes: dict[str, Any]) -> list[tuple[str, str]]:
    """Attribute values as the ClickHouse exporter writes them: strings (lists as JSON)."""
    return [
        (key, value if isinstance(value, str) else json.dumps(value, default=str))
        for key, value in attributes.items()
    ]


#: a resource's columns, by the identity of its attributes' dict: the spans of one export
#: share it, and encoding it once a batch instead of once a span halves an import's work
_Resources = dict[int, tuple[dict[str, Any], str, list[tuple[str, str]], str]]


def _resource(span: Span, seen: _Resources) -> tuple[str, list[tuple[str, str]], str]:
    found = seen.get(id(span.resource))
    if found is None or found[0] is not span.resource:
        resource = span.resource
        found = seen[id(resource)] = (
            resource,
            str(resource.get("service.name", "")),
            _texts(resource),
            _json(resource),
        )
    return found[1], found[2], found[3]


def _row(span: Span, seen: _Resources | None = None) -> dict[str, Any]:
    service, resource_texts, resource_json = _resource(span, {} if seen is None else seen)
    return {
        "Timestamp": span.start_ns,
        "TraceId": span.trace_id,
        "SpanId": span.span_id,
        "ParentSpanId": span.parent_span_id or "",
        "SpanName": span.name,
        "SpanKind": _KINDS.get(span.kind, "Unspecified"),
        "ServiceName": service,
        "ScopeName": span.scope,
        "Duration": span.end_ns - span.start_ns,
        "StatusCode": _STATUSES.get(span.status_code, "Unset"),
        "StatusMessage": span.status_message,
        "SpanAttributes": _texts(span.attributes),
        "ResourceAttributes": resource_texts,
        "SpanAttributesJson": _json(span.attributes),
        "ResourceAttributesJson": resource_json,
        "Events": [
            {"Timestamp": e.time_ns, "Name": e.name, "AttributesJson": _json(e.attributes)}
            for e in span.events
        ],
        "Links": [
            {"TraceId": k.trace_id, "SpanId": k.span_id, "AttributesJson": _json(k.attributes)}
            for k in span.links
        ],
    }


def segment_path(folder: str | Path, first: int = 0) -> Path:
    """The next segment's name in ``folder``: ``spans-NNNNN.parquet``, after those there (the
    loader reads segments in name order, which is their order of arrival)."""
    taken = sorted(Path(folder).glob(f"spans-*{SUFFIX}"))
    number = first
    if taken:
        with contextlib.suppress(ValueError):
            number = max(number, int(taken[-1].name[6 : -len(SUFFIX)]) + 1)
    return Path(folder) / f"spans-{number:05d}{SUFFIX}"


class SegmentWriter:
    """Spans as they arrive into a folder of segments: each ``add`` turns its spans into
    columns at once (a span held costs its bytes, not a Python object), and a segment is
    written whole when it holds ``max_spans``, when its first span has waited ``max_age_s``
    (checked as spans arrive), and at ``flush`` and ``close``: a segment has no footer until
    it is written, so a reader sees every span only once its segment is closed. Thread-safe.

    >>> writer = SegmentWriter("span-store")  # doctest: +SKIP
    >>> writer.add(spans); writer.flush()  # doctest: +SKIP
    """

    def __init__(
        self, folder: str | Path, *, max_spans: int = 100_000, max_age_s: float = 60.0
    ) -> None:
        self.folder = Path(folder)
        self.max_spans, self.max_age_s = max_spans, max_age_s
        self._lock = threading.Lock()
        self._tables: list[Any] = []
        self._held = 0
        self._since = 0.0
        self.spans_written = 0
        self.segments_written = 0

    def add(self, spans: Iterable[Span]) -> None:
        """Hold ``spans`` for the next segment; write it if it is full or old enough."""
        pa = _arrow()
        seen: _Resources = {}
        rows = [_row(span, seen) for span in spans]
        if not rows:
            return
        table = pa.Table.from_pylist(rows, schema=_schema(pa))
        with self._lock:
            if not self._tables:
                self._since = time.monotonic()
            self._tables.append(table)
            self._held += len(rows)
            if self._held >= self.max_spans or time.monotonic() - self._since >= self.max_age_s:
                self._write()

    def rotate(self) -> int:
        """Write the spans held if the first of them has waited ``max_age_s``; the count."""
        with self._lock:
            if self._tables and time.monotonic() - self._since >= self.max_age_s:
                return self._write()
            return 0

    def flush(self) -> int:
        """Write the spans held as one segment (none: nothing); the count written."""
        with self._lock:
            return self._write()

    def close(self) -> None:
        self.flush()

    def _write(self) -> int:
        if not self._tables:
            return 0
        write_table(_arrow().concat_tables(self._tables), self.folder)
        self._tables, held, self._held = [], self._held, 0
        self.spans_written += held
        self.segments_written += 1
        return held


def write_table(table: Any, folder: str | Path) -> Path:
    """Write ``table``, of the segments' schema, as the next segment of ``folder`` (under a
    temporary name, then renamed: a reader never sees half a segment); its path."""
    pa = _arrow()
    Path(folder).mkdir(parents=True, exist_ok=True)
    target = segment_path(folder)
    partial = target.with_name(f".{target.name}.partial")
    pa.parquet.write_table(table, partial, compression="zstd", row_group_size=_ROWS_PER_GROUP)
    partial.replace(target)
    return target


def write_segment(spans: Iterable[Span], path: str | Path) -> int:
    """Write ``spans`` to one zstd Parquet segment at ``path`` (written whole under a
    temporary name, then renamed: a reader never sees half a segment); the count written."""
    pa = _arrow()
    schema = _schema(pa)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    written = 0
    with pa.parquet.ParquetWriter(partial, schema, compression="zstd") as writer:
        rows: list[dict[str, Any]] = []
        seen: _Resources = {}
        for span in spans:
            rows.append(_row(span, seen))
            if len(rows) == _ROWS_PER_GROUP:
                writer.write_table(pa.Table.from_pylist(rows, schema=schema))
                written += len(rows)
                rows, seen = [], {}
        if rows or not written:
            writer.write_table(pa.Table.from_pylist(rows, schema=schema))
            written += len(rows)
    partial.replace(target)
    return written


_NEEDED = ("Timestamp", "TraceId", "SpanId", "ParentSpanId", "SpanName", "SpanKind", "Duration")
#: what the SQL breakdown reads besides
_QUERIED = ("ScopeName", "SpanAttributes", "SpanAttributesJson", "Events")


def check_segment(path: str | Path) -> None:
    """Raise ``StoreError`` unless ``path`` is a whole segment (its footer written, the
    columns otelkit needs there): what the SQL breakdown checks before it reads a file."""
    pa = _arrow()
    try:
        names = set(pa.parquet.ParquetFile(path).schema_arrow.names)
    except (OSError, pa.ArrowException) as error:
        raise StoreError(f"{path}: not a readable span segment ({error})") from error
    missing = [name for name in (*_NEEDED, *_QUERIED) if name not in names]
    if missing:
        raise StoreError(f"{path}: not a span segment: no column {', '.join(missing)}")


def whole_segments(files: Iterable[str | Path]) -> list[str]:
    """The files that are whole segments (``check_segment``), in order; each other one named
    in a warning and left out, as ``load_spans`` does, so that the rest are read."""
    whole = []
    for path in files:
        try:
            check_segment(path)
            whole.append(str(path))
        except StoreError as error:
            _log.warning("otelkit: %s; left out", error)
    return whole


def read_segment(path: str | Path) -> Iterator[Span]:
    """The spans of one segment, in the order they were written, a row group at a time.

    Raises ``StoreError`` for a file that is not a readable segment (cut short, not Parquet,
    lacking a column otelkit needs), naming it."""
    pa = _arrow()
    try:
        segment = pa.parquet.ParquetFile(path)
    except (OSError, pa.ArrowException) as error:
        raise StoreError(f"{path}: not a readable span segment ({error})") from error
    names = set(segment.schema_arrow.names)
    missing = [name for name in _NEEDED if name not in names]
    if missing:
        raise StoreError(f"{path}: not a span segment: no column {', '.join(missing)}")
    # the typed attributes where the segment has them: its string maps are for other engines
    typed = {"SpanAttributesJson", "ResourceAttributesJson"} <= names
    skipped = {"SpanAttributes", "ResourceAttributes"} if typed else set()
    columns = [name for name in segment.schema_arrow.names if name not in skipped]
    for group in range(segment.num_row_groups):
        try:
            table = segment.read_row_group(group, columns=columns)
        except (OSError, pa.ArrowException) as error:
            raise StoreError(f"{path}: row group {group} unreadable ({error})") from error
        yield from spans_of_table(table)


def spans_of_table(table: Any) -> Iterator[Span]:
    """The spans of an Arrow table of the segments' columns (a row group, a query's answer),
    in its order."""
    pa = _arrow()
    # as integers: a timestamp read as Python's datetime would lose its nanoseconds
    column = table.schema.get_field_index("Timestamp")
    table = table.set_column(column, "Timestamp", table["Timestamp"].cast(pa.int64()))
    # column by column: a list per column is several times cheaper than a dict per row
    values = {name: table.column(name).to_pylist() for name in table.column_names}
    for index in range(table.num_rows):
        yield _span({name: found[index] for name, found in values.items()})


def _loads(text: str | None) -> dict[str, Any]:
    if not text or text == "{}":
        return {}
    found = _parse(text)
    return found if isinstance(found, dict) else {}


def _span(row: dict[str, Any]) -> Span:
    start_ns = int(row["Timestamp"])
    attributes = row.get("SpanAttributesJson")
    resource = row.get("ResourceAttributesJson")
    return Span(
        row["TraceId"],
        row["SpanId"],
        row["ParentSpanId"] or None,
        row["SpanName"],
        _KIND_OF.get(row["SpanKind"], SpanKind.UNSPECIFIED),
        start_ns,
        start_ns + int(row["Duration"]),
        _loads(attributes) if attributes is not None else dict(row.get("SpanAttributes") or ()),
        _loads(resource) if resource is not None else dict(row.get("ResourceAttributes") or ()),
        row.get("ScopeName") or "",
        tuple(
            SpanEvent(e["Name"], int(e["Timestamp"]), _loads(e.get("AttributesJson")))
            for e in row.get("Events") or ()
        ),
        tuple(
            SpanLink(k["TraceId"], k["SpanId"], _loads(k.get("AttributesJson")))
            for k in row.get("Links") or ()
        ),
        _STATUS_OF.get(row.get("StatusCode") or "Unset", StatusCode.UNSET),
        row.get("StatusMessage") or "",
    )
