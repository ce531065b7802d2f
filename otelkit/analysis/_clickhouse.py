"""A site's ClickHouse ``otel_traces`` (the Collector's ``clickhouse`` exporter) into the span
store: ``otelkit import clickhouse://user:password@host:8123/database --out span-store``.

The table is read as it is: its columns first (``DESC TABLE``), since exporter versions differ
(span kinds ``Server`` or ``SPAN_KIND_SERVER``, status codes ``Ok`` or ``STATUS_CODE_OK``,
``Duration`` signed or not, ``Timestamp`` to the nanosecond or the second), then the spans of
the traces that have a span in the time window (``since``/``until``: whole traces, not the
window's slice of them) and of the services asked for, in time order, streamed as Arrow and
written as segments. The server does the filtering; the breakdown then runs on the segments
(``otelkit breakdown span-store``). Attributes come as the exporter stored them: strings from
its ``Map`` columns; typed values from ClickHouse's ``JSON`` type (the exporter's ``json``
option), whose paths split a key at its dots (``http.method`` is stored under ``http``, then
``method``) and are joined again here, so that the keys read as the spans had them (a key that
was itself a map's comes back as its dotted paths: the table no longer tells them apart).

``clickhouse-connect`` is imported on first use (``pip install 'otelkit[clickhouse]'``); its
``chdb://`` backend reads an in-process chDB database the same way (how the tests run it).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from otelkit.analysis._store import StoreError, segment_path, segment_schema
from otelkit.analysis._store import _json as _store_json
from otelkit.analysis._store import _texts as _store_texts

__all__ = ["SCHEMES", "import_clickhouse"]

#: the sources ``otelkit import`` hands to this module
SCHEMES = ("clickhouse://", "clickhouses://", "chdb://")
_NEEDED = ("Timestamp", "TraceId", "SpanId", "ParentSpanId", "SpanName", "SpanKind", "Duration")
_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
_STATUSES = ("UNSET", "OK", "ERROR")


def _client(dsn: str) -> Any:
    try:
        import clickhouse_connect
    except ImportError as error:
        raise StoreError(
            "reading ClickHouse needs clickhouse-connect: pip install 'otelkit[clickhouse]'"
        ) from error
    try:
        return clickhouse_connect.get_client(dsn=dsn)
    except Exception as error:  # the driver's own exceptions, connection refused among them
        raise StoreError(f"cannot reach ClickHouse at {_redacted(dsn)}: {error}") from error


def _redacted(dsn: str) -> str:
    """``dsn`` without its password."""
    scheme, _, rest = dsn.partition("://")
    credentials, at, host = rest.rpartition("@")
    return f"{scheme}://{credentials.split(':')[0]}:***@{host}" if at else dsn


def _ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _text(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _renamed(column: str, names: Sequence[str], style: str) -> str:
    """A kind or status column in the store's names (``Server``, ``Ok``) whichever the
    exporter wrote (``Server`` or ``SPAN_KIND_SERVER``)."""
    old = ", ".join(_text(f"{style}{name}") for name in names)
    new = ", ".join(_text(name.capitalize()) for name in names)
    return f"transform(toString({column}), [{old}], [{new}], toString({column}))"


def _nanoseconds(column: str, kind: str) -> str:
    if kind.startswith("DateTime64"):
        return f"toUnixTimestamp64Nano({column})"
    return f"toInt64(toUnixTimestamp({column})) * 1000000000"


def _select(columns: dict[str, str], table: str, where: str) -> str:
    missing = [name for name in _NEEDED if name not in columns]
    if missing:
        raise StoreError(f"{table} is not an otel_traces table: no column {', '.join(missing)}")

    def present(name: str, default: str) -> str:
        return _ident(name) if name in columns else default

    def attributes(name: str) -> tuple[str, str]:
        if name not in columns:
            return "map()", "'{}'"
        if _is_json(columns[name]):  # its map is made from the JSON, once the paths are joined
            # the column by its table's name: the map's alias would shadow it
            return "map()", f"toJSONString({table}.{_ident(name)})"
        return f"CAST({_ident(name)}, 'Map(String, String)')", f"toJSONString({_ident(name)})"

    span_map, span_json = attributes("SpanAttributes")
    resource_map, resource_json = attributes("ResourceAttributes")
    event_time = _nanoseconds("t", columns.get("Events.Timestamp", "DateTime64(9)")[6:-1])
    events = "[]"
    if {"Events.Timestamp", "Events.Name"} <= set(columns):
        attrs = "`Events.Attributes`" if "Events.Attributes" in columns else "[]"
        events = (
            "arrayMap((t, n, a) -> CAST(tuple("
            f"{event_time}, toString(n), toJSONString(a)), "
            "'Tuple(Timestamp Int64, Name String, AttributesJson String)'), "
            f"`Events.Timestamp`, `Events.Name`, {attrs})"
        )
    links = "[]"
    if {"Links.TraceId", "Links.SpanId"} <= set(columns):
        attrs = "`Links.Attributes`" if "Links.Attributes" in columns else "[]"
        links = (
            "arrayMap((t, s, a) -> CAST(tuple(t, s, toJSONString(a)), "
            "'Tuple(TraceId String, SpanId String, AttributesJson String)'), "
            f"`Links.TraceId`, `Links.SpanId`, {attrs})"
        )
    fields = {
        "Timestamp": _nanoseconds("Timestamp", columns["Timestamp"]),
        "TraceId": "lower(TraceId)",
        "SpanId": "lower(SpanId)",
        "ParentSpanId": "lower(ParentSpanId)",
        "SpanName": "toString(SpanName)",
        "SpanKind": _renamed("SpanKind", _KINDS, "SPAN_KIND_"),
        "ServiceName": f"toString({present('ServiceName', chr(39) * 2)})",
        "ScopeName": f"toString({present('ScopeName', chr(39) * 2)})",
        "Duration": "toInt64(Duration)",
        "StatusCode": _renamed(present("StatusCode", "'Unset'"), _STATUSES, "STATUS_CODE_"),
        "StatusMessage": f"toString({present('StatusMessage', chr(39) * 2)})",
        "SpanAttributes": span_map,
        "ResourceAttributes": resource_map,
        "SpanAttributesJson": span_json,
        "ResourceAttributesJson": resource_json,
        "Events": events,
        "Links": links,
    }
    chosen = ",\n  ".join(f"{expression} AS {name}" for name, expression in fields.items())
    return f"SELECT\n  {chosen}\nFROM {table}\n{where}\nORDER BY Timestamp, SpanId"


def _is_json(kind: str) -> bool:
    """Whether a column's type is ClickHouse's ``JSON`` (``Array(JSON)`` in a ``Nested``)."""
    return kind.removeprefix("Array(").startswith("JSON")


def _joined(value: Any, prefix: str = "", out: dict[str, Any] | None = None) -> dict[str, Any]:
    """A JSON column's object with its paths joined at dots again: ``{"http": {"method":
    "GET"}}`` is ``{"http.method": "GET"}``.

    >>> _joined({"http": {"method": "GET", "status_code": 200}, "n": [1, 2], "e": {}})
    {'http.method': 'GET', 'http.status_code': 200, 'n': [1, 2], 'e': {}}
    """
    found: dict[str, Any] = {} if out is None else out
    for key, item in value.items():
        if isinstance(item, dict) and item:
            _joined(item, f"{prefix}{key}.", found)
        else:
            found[f"{prefix}{key}"] = item
    return found


def _joined_of(text: str | None) -> dict[str, Any]:
    return _joined(json.loads(text)) if text and text != "{}" else {}


def _json_typed(table: Any, columns: dict[str, str], pyarrow: Any) -> Any:
    """``table`` (a batch in the store's schema) with the attributes of ``JSON`` columns read:
    their paths joined again, their map (the exporter's strings) made from them."""
    for name in ("SpanAttributes", "ResourceAttributes"):
        if not _is_json(columns.get(name, "")):
            continue
        read = [_joined_of(t) for t in table.column(f"{name}Json").to_pylist()]
        texts = [_store_json(attributes) for attributes in read]
        pairs = [_store_texts(attributes) for attributes in read]
        for column, values in ((f"{name}Json", texts), (name, pairs)):
            at = table.schema.get_field_index(column)
            field = table.schema.field(at)
            table = table.set_column(at, field, pyarrow.array(values, type=field.type))
    for name in ("Events", "Links"):
        if not _is_json(columns.get(f"{name}.Attributes", "")):
            continue
        rows = table.column(name).to_pylist()
        for row in rows:
            for item in row or ():
                item["AttributesJson"] = _store_json(_joined_of(item["AttributesJson"]))
        at = table.schema.get_field_index(name)
        field = table.schema.field(at)
        table = table.set_column(at, field, pyarrow.array(rows, type=field.type))
    return table


def import_clickhouse(
    dsn: str,
    out: str | Path,
    *,
    table: str = "otel_traces",
    since_ns: int | None = None,
    until_ns: int | None = None,
    services: Sequence[str] = (),
    segment_spans: int = 1_000_000,
) -> tuple[int, int]:
    """The spans of ``table`` at ``dsn`` into segments in ``out``: (spans, segments)."""
    import pyarrow
    import pyarrow.parquet

    client = _client(dsn)
    name = ".".join(_ident(part) for part in table.split("."))
    try:
        described = client.query(f"DESC TABLE {name}").result_rows
    except Exception as error:
        raise StoreError(f"{_redacted(dsn)}: cannot read table {table}: {error}") from error
    columns = {str(row[0]): str(row[1]) for row in described}
    window = []
    if since_ns is not None:
        window.append(f"Timestamp >= fromUnixTimestamp64Nano(toInt64({int(since_ns)}))")
    if until_ns is not None:
        window.append(f"Timestamp < fromUnixTimestamp64Nano(toInt64({int(until_ns)}))")
    if services:
        listed = ", ".join(_text(service) for service in services)
        window.append(f"ServiceName IN ({listed})")
    where = ""
    if window:  # whole traces: every span of a trace that has a span in the window
        where = f"WHERE TraceId IN (SELECT TraceId FROM {name} WHERE {' AND '.join(window)})"
    query = _select(columns, name, where)
    schema = segment_schema(pyarrow)
    Path(out).mkdir(parents=True, exist_ok=True)
    spans = segments = held = 0
    writer: Any = None
    target = partial = Path()
    try:
        with client.query_arrow_stream(query) as stream:
            for batch in stream:
                table_ = pyarrow.Table.from_batches([batch]) if hasattr(batch, "schema") else batch
                table_ = _json_typed(table_.cast(schema), columns, pyarrow)
                while table_.num_rows:  # a segment holds ``segment_spans`` at most
                    if writer is None:
                        target = segment_path(out)
                        partial = target.with_name(f".{target.name}.partial")
                        writer = pyarrow.parquet.ParquetWriter(partial, schema, compression="zstd")
                    piece = table_.slice(0, segment_spans - held)
                    table_ = table_.slice(piece.num_rows)
                    writer.write_table(piece)
                    held += piece.num_rows
                    spans += piece.num_rows
                    if held >= segment_spans:
                        writer.close()
                        partial.replace(target)
                        writer, held, segments = None, 0, segments + 1
    except StoreError:
        raise
    except Exception as error:
        raise StoreError(f"{_redacted(dsn)}: reading {table} failed: {error}") from error
    finally:
        if writer is not None:
            writer.close()
            if spans:
                partial.replace(target)
                segments += 1
            else:
                with contextlib.suppress(OSError):
                    partial.unlink()
    return spans, segments
