"""The breakdown's queries run inside a site's ClickHouse: only each root's components leave it.

``_sql``'s queries (the trees' walks, the calls, the server's parts, the queue) are written once,
in DuckDB's dialect; ``DIALECT`` rewrites what ClickHouse spells otherwise, each rewrite
asserted to apply, so a query changed in ``_sql`` that a rewrite no longer matches fails here
at once instead of reading wrong. ClickHouse then runs them in a session of their own, over
its own ``otel_traces`` (temporary tables: ``readonly = 2`` suffices), with SQL's NULLs
(``join_use_nulls``); what crosses the network is each root's components, problems and group
values, and the ids of the traces the queries leave to the Python path, which are then fetched
whole as before and merged here by DuckDB (``_sql.merged``).

The queries need correlated subqueries and recursive CTEs: ClickHouse 25.8 or newer
(``MINIMUM``); an older server is read by the engines that walk the trees here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from otelkit import semconv
from otelkit.analysis import _sql
from otelkit.analysis._server_time import _SERVE_DEPLOYMENT
from otelkit.analysis._sql import ATTRIBUTES, EVENTS, SqlBreakdown
from otelkit.analysis._store import StoreError

__all__ = ["DIALECT", "MINIMUM", "breakdown_pushed", "supported"]

#: the oldest ClickHouse whose defaults run the queries (correlated subqueries)
MINIMUM = (25, 8)
#: what each query runs with: SQL's NULL for a row an outer join did not match; a bare UNION
#: without duplicates, as DuckDB's; a flag of a low-cardinality column's kept as made
SETTINGS = {
    "join_use_nulls": 1,
    "union_default_mode": "DISTINCT",
    "allow_suspicious_low_cardinality_types": 1,
    "use_variant_as_common_type": 0,
}

_NON_EMPTY = r"ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING"
#: DuckDB's spelling, ClickHouse's: (pattern, replacement), each a regular expression that
#: must match the queries at least once
DIALECT: tuple[tuple[str, str], ...] = (
    (r"CREATE TEMP TABLE (\w+) AS", r"CREATE TEMPORARY TABLE \1 ENGINE = Memory AS"),
    # paths of child positions: signed, as the positions (row numbers) are made
    (r"\[\]::BIGINT\[\]", "CAST([] AS Array(Int64))"),
    (r"\[9223372036854775807\]", "CAST([9223372036854775807] AS Array(Int64))"),
    (r"row_number\(\) OVER\s*\(([^()]*)\)", r"toInt64(row_number() OVER (\1))"),
    (r"SELECT c\.t, c\.call, v\.id, 0,", "SELECT c.t, c.call, v.id, toInt64(0),"),
    (r"NULL::VARCHAR", "CAST(NULL AS Nullable(String))"),
    (r"round\(([^()]*\([^()]*\)[^()]*)\)::BIGINT", r"toInt64(round(\1))"),
    (r"list_append\(", "arrayPushBack("),
    (r"\bANTI JOIN\b", "LEFT ANTI JOIN"),
    (r"\bSEMI JOIN\b", "LEFT SEMI JOIN"),
    (r"\bany_value\(", "any("),
    (r"\bbool_or\(", "max("),
    (r"\barg_max\(", "argMax("),
    (r"\barg_min\(", "argMin("),
    # orderings compared whole: tuples (a list's items must share one type)
    (r"\[c\.st, c\.en\]", "(c.st, c.en)"),
    (r"\[l\.r1, l\.r2, -l\.a, -l\.idx\]", "(l.r1, l.r2, -l.a, -l.idx)"),
    (r"\{'path': path, 'seq': seq, 'sub': sub\}", "(path, seq, sub)"),
    (r"\bUNION SELECT\b", "UNION DISTINCT SELECT"),
    # an empty frame's, or no row's, value is NULL, as DuckDB's (ClickHouse's default: 0)
    (
        r"max\((\w+)\) OVER \((PARTITION BY call ORDER BY [\w, ]+)\s+" + _NON_EMPTY + r"\)",
        r"max(toNullable(\1)) OVER (\2 " + _NON_EMPTY + ")",
    ),
    (
        r"\blag\((\w+)\) OVER \(([^()]*)\)",
        r"lagInFrame(toNullable(\1)) OVER (\2 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)",
    ),
    (
        r"\blead\((\w+)\) OVER \(([^()]*)\)",
        r"leadInFrame(toNullable(\1)) OVER (\2 ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING)",
    ),
)


def _q(text: str) -> str:
    """``text`` as a ClickHouse string literal (a backslash escapes there)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def in_clickhouse(script: str) -> list[str]:
    """``script`` (``_sql``'s queries) in ClickHouse's dialect, one statement each."""
    for pattern, replacement in DIALECT:
        script, count = re.subn(pattern, replacement, script)
        assert count, f"the rewrite {pattern!r} matches none of the queries"
    statements = [s.strip() for s in script.split(";\n")]
    return [s for s in statements if s and not all(line.startswith("--") for line in s.split("\n"))]


def supported(version: str) -> bool:
    """Whether a ClickHouse of ``version`` (``SELECT version()``) runs the queries."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return found is not None and (int(found[1]), int(found[2])) >= MINIMUM


def _attribute(key: str, json: bool) -> str:
    """A span's attribute ``key`` as text, NULL where the span has none: from the narrowed
    ``SpanAttributes`` map, or from the JSON text of a table whose attributes are ``JSON``
    (its paths split at the key's dots)."""
    assert key in ATTRIBUTES, key
    if not json:
        return f"if(mapContains(SpanAttributes, {_q(key)}), SpanAttributes[{_q(key)}], NULL)"
    path = ", ".join(_q(part) for part in key.split("."))
    held = f"SpanAttributesJson, {path}"
    return (
        f"if(JSONHas({held}), if(JSONType({held}) = 'String', JSONExtractString({held}), "
        f"JSONExtractRaw({held})), NULL)"
    )


def _group_value(key: str, json: bool) -> str:
    """A root's value of the grouping key ``key`` as JSON text (NULL: none), as DuckDB reads
    it from the store's ``SpanAttributesJson``."""
    if key == semconv.ANSWERED_BY:
        return "CAST(NULL AS Nullable(String))"
    parts = key.split(".") if json else [key]
    held = "SpanAttributesJson, " + ", ".join(_q(part) for part in parts)
    return f"if(JSONHas({held}), JSONExtractRaw({held}), NULL)"


def spans_sql(selected: str, group_by: Sequence[str], json: bool) -> str:
    """``_sql._spans_sql``'s table ``k`` in ClickHouse: one row a span of ``selected`` (the
    narrowed spans, ``_clickhouse._select``'s columns), the first of duplicate ids in the
    order ``_clickhouse.ORDER`` reads them."""

    def attr(key: str) -> str:
        return _attribute(key, json)

    def first(event: str) -> str:
        at = f"indexOf(arrayMap(e -> e.2, Events), {_q(event)})"
        return f"if({at} > 0, Events[{at}].1, NULL)"

    picked = ",\n    ".join(f"{first(name)} AS {column}" for column, name in EVENTS.items())
    keys = ", ".join(_group_value(key, json) for key in group_by) or "NULL"
    hex_id = "'^[0-9a-f]{1,16}$'"
    return f"""
CREATE TEMPORARY TABLE k ENGINE = Memory AS
WITH raw AS (
SELECT * FROM (
  SELECT
    -- ids as the integers their hex spells (joins on them are cheaper than on text); an id
    -- that is not hex marks its trace for the Python path
    TraceId AS tt, reinterpretAsUInt128(reverse(unhex(TraceId))) AS t,
    reinterpretAsUInt64(reverse(unhex(SpanId))) AS id,
    if(ParentSpanId = '', NULL, reinterpretAsUInt64(reverse(unhex(ParentSpanId)))) AS p,
    NOT match(TraceId, '^[0-9a-f]{{1,32}}$') OR NOT match(SpanId, {hex_id})
      OR (ParentSpanId <> '' AND NOT match(ParentSpanId, {hex_id})) AS badid,
    SpanName AS name,
    SpanKind = 'Client' AS is_client,
    Timestamp AS st, Timestamp + Duration AS en,
    {attr(semconv.STAGE_NAME)} AS stage,
    nullIf({attr(semconv.TRITON_SPAN_MODEL_NAME)}, '') AS model,
    SpanKind = 'Server' AND {attr(semconv.PROXY_COMPONENT)} IS NOT DISTINCT FROM
      {_q(semconv.PROXY)} AS is_proxy,
    coalesce({attr(semconv.PROXY_UPSTREAM_ADDRESS)}, '') AS upstream,
    splitByChar(' ', SpanName)[1] AS head,
    SpanName = {_q(semconv.RAY_SERVE_QUEUE_SPAN)} AS queued,
    {attr(semconv.RAY_SERVE_DEPLOYMENT)} IS NOT NULL AS ours,
    nullIf({attr(semconv.RAY_SERVE_DEPLOYMENT)}, '') AS dep,
    nullIf({attr(_SERVE_DEPLOYMENT)}, '') AS sdep,
    coalesce(toFloat64OrNull({attr(semconv.SERIALIZE_S)}), 0) AS ser,
    coalesce(toFloat64OrNull({attr(semconv.DESERIALIZE_S)}), 0) AS deser,
    coalesce(toFloat64OrNull({attr(semconv.CONNECT_S)}), 0) AS conn,
    coalesce({attr(semconv.MODEL_NAME)}, SpanName) AS called,
    coalesce({attr(semconv.SERVER_ADDRESS)}, '') AS host,
    coalesce({attr(semconv.SERVER_PORT)}, '') AS port,
    -- a root's group values (JSON), read for roots alone
    if(ParentSpanId = '', [{keys}], CAST([] AS Array(Nullable(String)))) AS gvals,
    {picked},
    toInt64(row_number() OVER (ORDER BY Timestamp, TraceId, SpanId, Duration, SpanName,
                                        ParentSpanId)) AS ord
  FROM ({selected})
) QUALIFY row_number() OVER (PARTITION BY t, id, if(badid, ord, NULL) ORDER BY ord) = 1
)
SELECT raw.*,
  toInt64(row_number() OVER (PARTITION BY t, p ORDER BY st, en, ord)) AS pos,
  CASE WHEN hr0 <= hr1 THEN hr0 WHEN gr0 <= gr1 THEN gr0 END AS r0,
  CASE WHEN hr0 <= hr1 THEN hr1 WHEN gr0 <= gr1 THEN gr1 END AS r1,
  CASE WHEN hs0 <= hs1 THEN hs0 WHEN gs0 <= gs1 THEN gs0 END AS s0,
  CASE WHEN hs0 <= hs1 THEN hs1 WHEN gs0 <= gs1 THEN gs1 END AS s1,
  coalesce(m_recv <= m_start AND m_start <= m_sent, false) AS marked
FROM raw
"""


#: the queries' results that leave ClickHouse, by the columns ``_sql.merged`` reads
_RESULTS = {
    "rk": "root, tord, idx, gvals, address, bad",
    "percomp": "root, toString(name) AS name, s, pos, part",
    "problems": "root, path, n, text",
    "odd": "tt",
}


_CREATE = re.compile(r"(CREATE TEMPORARY TABLE \w+ ENGINE = Memory AS\s)(.*)", re.S)


def _named(client: Any, statement: str) -> str:
    """``statement`` with its table's columns named as DuckDB names them: ClickHouse names a
    column of ``k.*`` ``k.t`` where another table of the join has a ``t``."""
    made = _CREATE.search(statement)
    if made is None:
        return statement
    query = made[2]
    names = [str(row[0]) for row in client.query(f"DESCRIBE ({query})").result_rows]
    if not any("." in name for name in names):
        return statement
    columns = ", ".join(f"`{n}` AS {n.rsplit('.', 1)[-1]}" for n in names)
    return f"{statement[: made.start(2)]}SELECT {columns} FROM ({query})"


def breakdown_pushed(
    client: Any,
    selected: str,
    group_by: Sequence[str],
    root_name: str | None,
    json: bool,
    whole: Callable[[list[str]], Any],
) -> SqlBreakdown:
    """The breakdown of the spans ``selected`` (a query of ``client``'s ClickHouse: the
    narrowed spans) by ``_sql``'s queries run there, over the traces in parts of about
    ``_sql.CHUNK_SPANS`` spans (by their id's hash: each trace whole in one), as DuckDB's run:
    the walks' tables of one part at a time in the server's memory. ``whole(ids)``: the spans
    of those traces, whole (the store's columns), for those the queries leave to the Python
    path. Raises what the driver raises: the caller says it as the store's error."""
    script = in_clickhouse(_sql._TREE + _sql._components_sql(root_name, _q) + _sql._ROWS)
    walks = [m[1] for s in script if (m := re.search(r"CREATE TEMPORARY TABLE (\w+)", s))]
    made = ["kall", "k", *(f"all_{table}" for table in _RESULTS), *walks]

    def run(statement: str) -> None:
        client.command(statement, settings=SETTINGS)

    try:
        for table in made:
            run(f"DROP TEMPORARY TABLE IF EXISTS {table}")
        run(spans_sql(selected, group_by, json))
        spans, traces = client.query("SELECT count(), uniqExact(tt) FROM k").result_rows[0]
        chunks = max(1, -(-int(spans) // _sql.CHUNK_SPANS))
        spans_table = "k"
        if chunks > 1:  # the spans kept apart, each part's taken from them
            spans_table = "kall"
            run("CREATE TEMPORARY TABLE kall ENGINE = Memory AS SELECT * FROM k")
        for chunk in range(chunks):
            for table in walks:
                run(f"DROP TEMPORARY TABLE IF EXISTS {table}")
            if chunks > 1:
                run("DROP TEMPORARY TABLE k")
                run(
                    "CREATE TEMPORARY TABLE k ENGINE = Memory AS SELECT * FROM kall "
                    f"WHERE cityHash64(tt) % {chunks} = {chunk}"
                )
            for at, statement in enumerate(script):
                if chunk == 0:  # named once (it asks ClickHouse): each part runs the same
                    script[at] = statement = _named(client, statement)
                run(statement)
            for table in _RESULTS:
                into = f"INSERT INTO all_{table}"
                if chunk == 0:
                    into = f"CREATE TEMPORARY TABLE all_{table} ENGINE = Memory AS"
                run(f"{into} SELECT * FROM {table}")
        fetched = {
            table: client.query_arrow(f"SELECT {columns} FROM all_{table}", settings=SETTINGS)
            for table, columns in _RESULTS.items()
        }
        fetched["kall"] = client.query_arrow(
            f"SELECT tt, min(ord) AS ord FROM {spans_table} WHERE tt IN (SELECT tt FROM all_odd) "
            "GROUP BY tt",
            settings=SETTINGS,
        )
    finally:
        for table in made:
            try:
                client.command(f"DROP TEMPORARY TABLE IF EXISTS {table}")
            except Exception:  # a session's temporary tables end with it
                break

    with _sql.connected() as con:
        for table, arrow in fetched.items():
            con.register(f"{table}_arrow", arrow)
            con.execute(f"CREATE TEMP TABLE {table} AS SELECT * FROM {table}_arrow")
            con.unregister(f"{table}_arrow")
        return _sql.merged(
            con, group_by, root_name, _sql.wanted_by_id(whole), int(spans), int(traces)
        )


def unsupported(version: str) -> StoreError:
    return StoreError(
        f"the breakdown in ClickHouse needs ClickHouse {MINIMUM[0]}.{MINIMUM[1]} or newer "
        f"(correlated subqueries), this server is {version}: --walk here"
    )
