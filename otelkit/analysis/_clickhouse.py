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
import importlib.util
import json
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from otelkit import semconv
from otelkit.analysis import _pushdown
from otelkit.analysis._sampling import _JAEGER_PARAM, _JAEGER_TYPE, Sampling
from otelkit.analysis._store import SUFFIX, StoreError, segment_path, segment_schema
from otelkit.analysis._store import _json as _store_json
from otelkit.analysis._store import _texts as _store_texts

if TYPE_CHECKING:
    from otelkit.analysis._sql import SqlBreakdown

__all__ = ["ORDER", "SCHEMES", "breakdown_clickhouse", "import_clickhouse"]

_log = logging.getLogger("otelkit.analysis")

#: where ``breakdown_clickhouse`` walks the trees: in ClickHouse (``clickhouse``: the
#: breakdown's queries run there), or here over the narrowed spans (``compiled``, ``duckdb``;
#: ``here``: compiled where numba is installed, else duckdb); ``auto``: in ClickHouse where
#: the server runs the queries (``_pushdown.MINIMUM``), else here
ENGINES = ("auto", "clickhouse", "here", "compiled", "duckdb")
#: the sources ``otelkit import`` hands to this module
SCHEMES = ("clickhouse://", "clickhouses://", "chdb://")
_NEEDED = ("Timestamp", "TraceId", "SpanId", "ParentSpanId", "SpanName", "SpanKind", "Duration")
_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
_STATUSES = ("UNSET", "OK", "ERROR")
#: the columns the breakdown's queries do not read, left empty in a narrowed span
_UNREAD = ("ServiceName", "ScopeName", "StatusMessage", "StatusCode")
#: a table keeps no arrival order: its spans are read in this one (by the columns as read),
#: whose first of duplicate ids is the one that counts, whichever way the table is read
ORDER = "ORDER BY Timestamp, TraceId, SpanId, Duration, SpanName, ParentSpanId"


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


def _listed(values: Sequence[str]) -> str:
    return ", ".join(_text(value) for value in values)


def _select(
    columns: dict[str, str],
    table: str,
    where: str,
    narrow: Sequence[str] | None = None,
    *,
    ordered: bool = True,
) -> str:
    """The spans of ``table`` as the store's columns; ``narrow``: only what the breakdown's
    queries read (the attributes ``ATTRIBUTES``, the events ``EVENTS``; in the JSON column,
    the grouping keys ``narrow`` alone), the other columns empty."""
    missing = [name for name in _NEEDED if name not in columns]
    if missing:
        raise StoreError(f"{table} is not an otel_traces table: no column {', '.join(missing)}")
    if narrow is not None:
        from otelkit.analysis._sql import ATTRIBUTES, EVENTS

    def present(name: str, default: str) -> str:
        if narrow is not None and name in _UNREAD:
            return default
        return _ident(name) if name in columns else default

    def attributes(name: str, read: Sequence[str], grouped: Sequence[str]) -> tuple[str, str]:
        if name not in columns or (narrow is not None and not read):
            return "map()", "'{}'"
        if _is_json(columns[name]):  # its map is made from the JSON, once the paths are joined
            # the column by its table's name: the map's alias would shadow it
            return "map()", f"toJSONString({table}.{_ident(name)})"
        whole = f"CAST({_ident(name)}, 'Map(String, String)')"
        if narrow is None:
            return whole, f"toJSONString({_ident(name)})"
        kept = f"mapFilter((k, v) -> k IN ({_listed(read)}), {whole})"
        grouping = (
            f"toJSONString(mapFilter((k, v) -> k IN ({_listed(grouped)}), {whole}))"
            if grouped
            else "'{}'"
        )
        return kept, grouping

    read: Sequence[str] = () if narrow is None else (*ATTRIBUTES, *narrow)
    span_map, span_json = attributes("SpanAttributes", read, narrow or ())
    resource_map, resource_json = attributes("ResourceAttributes", (), ())
    event_time = _nanoseconds("t", columns.get("Events.Timestamp", "DateTime64(9)")[6:-1])
    events = "[]"
    if {"Events.Timestamp", "Events.Name"} <= set(columns):
        attrs = "`Events.Attributes`" if "Events.Attributes" in columns else "[]"
        if narrow is not None:  # the events the queries read, without their attributes
            attrs = "arrayMap(t -> map(), `Events.Timestamp`)"
        events = (
            "arrayMap((t, n, a) -> CAST(tuple("
            f"{event_time}, toString(n), toJSONString(a)), "
            "'Tuple(Timestamp Int64, Name String, AttributesJson String)'), "
            f"`Events.Timestamp`, `Events.Name`, {attrs})"
        )
        if narrow is not None:
            events = f"arrayFilter(e -> e.2 IN ({_listed(list(EVENTS.values()))}), {events})"
    links = "[]"
    if narrow is None and {"Links.TraceId", "Links.SpanId"} <= set(columns):
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
    return f"SELECT\n  {chosen}\nFROM {table}\n{where}\n{ORDER if ordered else ''}"


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


def _described(client: Any, dsn: str, table: str) -> tuple[str, dict[str, str]]:
    """``table`` as a query names it, and its columns' types (``DESC TABLE``)."""
    name = ".".join(_ident(part) for part in table.split("."))
    try:
        described = client.query(f"DESC TABLE {name}").result_rows
    except Exception as error:
        raise StoreError(f"{_redacted(dsn)}: cannot read table {table}: {error}") from error
    return name, {str(row[0]): str(row[1]) for row in described}


def _where(name: str, since_ns: int | None, until_ns: int | None, services: Sequence[str]) -> str:
    """Whole traces: every span of a trace that has a span in the window, of the services."""
    window = []
    if since_ns is not None:
        window.append(f"Timestamp >= fromUnixTimestamp64Nano(toInt64({int(since_ns)}))")
    if until_ns is not None:
        window.append(f"Timestamp < fromUnixTimestamp64Nano(toInt64({int(until_ns)}))")
    if services:
        window.append(f"ServiceName IN ({_listed(services)})")
    if not window:
        return ""
    return f"WHERE TraceId IN (SELECT TraceId FROM {name} WHERE {' AND '.join(window)})"


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
    name, columns = _described(client, dsn, table)
    where = _where(name, since_ns, until_ns, services)
    query = _select(columns, name, where)
    schema = segment_schema(pyarrow)
    Path(out).mkdir(parents=True, exist_ok=True)
    spans = segments = held = 0
    writer: Any = None
    target = partial = Path()
    try:
        for table_ in _tables(client, query, columns, pyarrow):
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


#: the scratch segment's row groups: the store's
_ROW_GROUP = 65_536
#: trace ids a query asks for by name
_IDS_A_QUERY = 2_000
#: what the breakdown's queries read of a span, of the store's columns
_NARROW = (
    "Timestamp",
    "TraceId",
    "SpanId",
    "ParentSpanId",
    "SpanName",
    "SpanKind",
    "Duration",
    "SpanAttributes",
    "SpanAttributesJson",
    "Events",
)


def _tables(client: Any, query: str, columns: dict[str, str], pyarrow: Any) -> Iterator[Any]:
    """The answer to ``query`` (the store's columns), a batch at a time, attributes read."""
    schema = segment_schema(pyarrow)
    with client.query_arrow_stream(query) as stream:
        for batch in stream:
            table = pyarrow.Table.from_batches([batch]) if hasattr(batch, "schema") else batch
            yield _json_typed(table.cast(schema), columns, pyarrow)


def breakdown_clickhouse(
    dsn: str,
    *,
    table: str = "otel_traces",
    since_ns: int | None = None,
    until_ns: int | None = None,
    services: Sequence[str] = (),
    group_by: Sequence[str] = (),
    root_name: str | None = None,
    engine: str = "auto",
) -> SqlBreakdown:
    """``breakdown`` of the traces of ``table`` at ``dsn`` (those with a span in the window,
    of the services: whole), with no copy kept. ClickHouse selects the traces and narrows each
    span to what the breakdown reads (ids, times, kind, name, the attributes and events it
    reads, the grouping keys), in ``ORDER``. ``engine`` (``ENGINES``) says where the trees are
    walked: in ClickHouse by the breakdown's queries (``clickhouse``: only each root's
    components come back; ``auto`` where the server runs them), or here, by the compiled
    engine (``compiled``, over a scratch segment of the narrowed spans, removed after) or by
    DuckDB's queries (``duckdb``, over the stream). The traces left to the Python path are
    fetched whole by id. The sampling statement is ClickHouse's own count."""
    import pyarrow

    if engine not in ENGINES:
        raise ValueError(f"engine is one of {', '.join(ENGINES)}, not {engine!r}")
    client = _client(dsn)
    name, columns = _described(client, dsn, table)
    if engine in ("auto", "clickhouse"):
        version = _read(dsn, table, _version, client)
        if engine == "clickhouse" and not _pushdown.supported(version):
            raise _pushdown.unsupported(version)
        engine = "clickhouse" if _pushdown.supported(version) else "here"
    if engine == "here":
        engine = "compiled" if importlib.util.find_spec("numba") is not None else "duckdb"
    where = _where(name, since_ns, until_ns, services)
    grouped = [key for key in group_by if key != semconv.ANSWERED_BY]
    selected = _select(columns, name, where, narrow=grouped, ordered=engine != "clickhouse")

    def whole(wanted: list[str]) -> Any:
        parts: list[Any] = []
        # a few ids a query: a query's text is bounded (max_query_size, 256 KiB by default)
        for start in range(0, len(wanted), _IDS_A_QUERY):
            listed = _listed(wanted[start : start + _IDS_A_QUERY])
            query = _select(columns, name, f"WHERE TraceId IN ({listed})")
            parts += _read(dsn, table, _all, client, query, columns, pyarrow)
        return pyarrow.concat_tables(parts) if parts else segment_schema(pyarrow).empty_table()

    found: SqlBreakdown
    if engine == "clickhouse":
        json = _is_json(columns.get("SpanAttributes", ""))
        found = _read(
            dsn,
            table,
            _pushdown.breakdown_pushed,
            client,
            selected,
            group_by,
            root_name,
            json,
            whole,
        )
    else:
        narrowed = _tables(client, selected, columns, pyarrow)
        if engine == "compiled":
            found = _compiled(dsn, table, narrowed, group_by, root_name, whole)
        else:
            found = _duckdb(dsn, table, narrowed, group_by, root_name, whole)
    found.sampling = _sampling(client, dsn, name, columns, where)
    return found


def _version(client: Any) -> str:
    return str(client.query("SELECT version()").result_rows[0][0])


def _all(client: Any, query: str, columns: dict[str, str], pyarrow: Any) -> list[Any]:
    return list(_tables(client, query, columns, pyarrow))


def _read(dsn: str, table: str, read: Callable[..., Any], *args: Any) -> Any:
    """What ``read(*args)`` reads of ``table``, its failure said as the store's."""
    try:
        return read(*args)
    except StoreError:
        raise
    except Exception as error:  # the driver's own, a lost connection among them
        raise StoreError(f"{_redacted(dsn)}: reading {table} failed: {error}") from error


def _compiled(
    dsn: str,
    table: str,
    narrowed: Iterator[Any],
    group_by: Sequence[str],
    root_name: str | None,
    whole: Callable[[list[str]], Any],
) -> SqlBreakdown:
    """The compiled engine over the narrowed spans, written to a scratch segment (lz4: it is
    read once, at once) that is removed after."""
    import pyarrow
    import pyarrow.parquet

    from otelkit.analysis._columns import breakdown_columns

    scratch = Path(tempfile.mkdtemp(prefix="otelkit-clickhouse-"))
    try:
        target = scratch / f"spans-00000{SUFFIX}"
        schema = segment_schema(pyarrow)

        def write() -> None:
            with pyarrow.parquet.ParquetWriter(target, schema, compression="lz4") as writer:
                for part in narrowed:
                    writer.write_table(part, row_group_size=_ROW_GROUP)

        _read(dsn, table, write)
        return breakdown_columns([target], group_by, root_name, whole)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _duckdb(
    dsn: str,
    table: str,
    narrowed: Iterator[Any],
    group_by: Sequence[str],
    root_name: str | None,
    whole: Callable[[list[str]], Any],
) -> SqlBreakdown:
    """DuckDB's queries over the narrowed spans, as they arrive."""
    import pyarrow

    from otelkit.analysis import _sql

    schema = segment_schema(pyarrow)
    # nanoseconds: DuckDB reads an Arrow timestamp with a zone as microseconds
    narrow = pyarrow.schema(
        [
            pyarrow.field(n, pyarrow.timestamp("ns")) if n == "Timestamp" else schema.field(n)
            for n in _NARROW
        ]
    )

    with _sql.connected() as con:
        # the spans' table made empty, each batch then added with its arrival order
        con.register("batch", narrow.append(pyarrow.field("ord", pyarrow.int64())).empty_table())
        con.execute("CREATE TEMP TABLE chspans AS SELECT * FROM batch")
        con.unregister("batch")

        def insert() -> None:
            held = 0
            for part in narrowed:
                part = part.select(list(_NARROW)).cast(narrow)
                order = pyarrow.array(range(held, held + part.num_rows), pyarrow.int64())
                con.register("batch", part.append_column("ord", order))
                con.execute("INSERT INTO chspans SELECT * FROM batch")
                con.unregister("batch")
                held += part.num_rows

        _read(dsn, table, insert)
        con.execute(_sql._spans_sql(("chspans", "ord"), group_by))
        return _sql.breakdown_spans(con, group_by, root_name, _sql.wanted_by_id(whole))


def _value(columns: dict[str, str], table: str, column: str, key: str) -> tuple[str, str]:
    """Whether a span's ``column`` holds ``key``, and its value as text (a Map's or JSON's)."""
    kind = columns.get(column)
    if kind is None:
        return "0", "''"
    if not _is_json(kind):
        held = f"CAST({_ident(column)}, 'Map(String, String)')"
        return f"mapContains({held}, {_text(key)})", f"{held}[{_text(key)}]"
    path = f"toJSONString({table}.{_ident(column)}), {_listed(key.split('.'))}"
    return (
        f"JSONHas({path})",
        f"if(JSONType({path}) = 'String', JSONExtractString({path}), JSONExtractRaw({path}))",
    )


def _sampling(client: Any, dsn: str, name: str, columns: dict[str, str], where: str) -> Sampling:
    """What the selected spans say of their traces' sampling (``Sampling``), counted by
    ClickHouse."""
    found = Sampling()
    has_sampler, sampler = _value(columns, name, "ResourceAttributes", semconv.OTELKIT_SAMPLER)
    has_type, kind = _value(columns, name, "SpanAttributes", _JAEGER_TYPE)
    _, param = _value(columns, name, "SpanAttributes", _JAEGER_PARAM)
    has_policy, policy = _value(columns, name, "SpanAttributes", semconv.TAIL_SAMPLING_POLICY)
    service = "toString(ServiceName)" if "ServiceName" in columns else "''"
    also = "AND" if where else "WHERE"
    try:
        for said, by in client.query(
            f"SELECT DISTINCT if({has_sampler}, {sampler}, concat({kind}, ' ', {param})), "
            f"{service} FROM {name} {where} {also} ({has_sampler} OR {has_type})"
        ).result_rows:
            found.head.setdefault(str(said).strip(), set()).add(by or "unknown service")
        for value, count in client.query(
            f"SELECT if({has_policy}, {policy}, NULL) AS policy, count() FROM {name} "
            f"{where} {also} ParentSpanId = '' GROUP BY policy"
        ).result_rows:
            found.roots += int(count)
            if value is not None:
                found.tail[str(value)] = int(count)
    except Exception as error:  # the statement is lost, not the breakdown beside it
        _log.warning(
            "otelkit: %s: the traces' sampling could not be read: %s", _redacted(dsn), error
        )
        return Sampling()
    return found
