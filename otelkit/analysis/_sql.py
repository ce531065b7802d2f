"""The breakdown as DuckDB SQL over the span store's columns: no Python object per span.

``breakdown_store`` gives what ``breakdown(build_traces(load_spans(segments)))`` gives (each
root's components, the groups, the problems, the incomplete counts, the server's parts), read
from Parquet segments by DuckDB: the trees are walked by recursive queries, the queue is the
union of Triton's queue intervals, the server's parts come from one sweep over the edges of the
intervals of ``_server_time`` (each instant to the innermost interval holding it).

The queries cover the shapes a site's traces have: a client's roots, its stages and calls
(through a proxy such as Envoy, its retries included); Triton's request, model, ensemble and
compute spans with their events; otelkit's servers (FastAPI's cuts included); Ray Serve's
handle calls, router, replicas and their queues; any other span under a server by its own time.
A trace whose tree is broken (an orphan, a span its own parent, a parent cycle: partial or
corrupt data) is handed whole to the Python path, whose answer is merged in its place, so the
two agree trace for trace. ``SqlBreakdown.delegated`` says how many traces took that path.

DuckDB and pyarrow are imported on first use: ``pip install 'otelkit[store]'``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otelkit import semconv
from otelkit.analysis._breakdown import (
    CLIENT_OTHER,
    CONNECTION,
    LOAD_BALANCER,
    NETWORK,
    NO_SERVER_SPAN,
    SERVER_OTHER,
    SERVER_QUEUE,
    TOTAL,
    Breakdown,
    _components,
    group_key,
)
from otelkit.analysis._loader import build_traces
from otelkit.analysis._sampling import Sampling
from otelkit.analysis._server_time import (
    _KNOWN_SPANS,
    _SERVE_DEPLOYMENT,
    _SERVE_REPLICA,
    _SERVE_SPANS,
    CALLS_OUT,
    COMPUTE_INPUT,
    COMPUTE_OUTPUT,
    ENSEMBLE,
    FRONTEND,
    HANDLER,
    RECEIVE,
    SCHEDULER,
    SEND,
    SERVE_ROUTER,
)
from otelkit.analysis._store import StoreError, spans_of_table, whole_segments

__all__ = [
    "ATTRIBUTES",
    "EVENTS",
    "SqlBreakdown",
    "breakdown_spans",
    "breakdown_store",
    "merged",
    "wanted_by_id",
]

#: what DuckDB may hold in memory before it spills to disk
MEMORY_LIMIT = "1GB"


@dataclass
class SqlBreakdown:
    """The groups, and how the traces were read: ``traces`` in all, ``delegated`` of them by
    the Python path (a shape the queries leave to it), ``spans`` read; ``sampling``: what the
    spans say of it, where the engine read it on the way (None: ``sampling_of_segments``)."""

    groups: dict[tuple[str, ...], Breakdown]
    spans: int
    traces: int
    delegated: int
    sampling: Sampling | None = None


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError as error:
        raise StoreError(
            "the breakdown over the span store needs DuckDB: pip install 'otelkit[store]'"
        ) from error
    return duckdb


def _q(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


_SERVE_HEADS = ", ".join(_q(head) for head in _SERVE_SPANS)
_SERVE_NAMES = " ".join(f"WHEN {_q(head)} THEN {_q(name)}" for head, name in _SERVE_SPANS.items())
_ROUTER = next(head for head, name in _SERVE_SPANS.items() if name == SERVE_ROUTER)


#: the events the queries read, by the column each span's first of them becomes
EVENTS = {
    "q_start": "QUEUE_START",
    "c_start": "COMPUTE_START",
    "c_in": "COMPUTE_INPUT_END",
    "c_out": "COMPUTE_OUTPUT_START",
    "c_end": "COMPUTE_END",
    "hr0": "HTTP_RECV_START",
    "hr1": "HTTP_RECV_END",
    "gr0": "GRPC_WAITREAD_START",
    "gr1": "GRPC_WAITREAD_END",
    "hs0": "HTTP_SEND_START",
    "hs1": "HTTP_SEND_END",
    "gs0": "GRPC_SEND_START",
    "gs1": "GRPC_SEND_END",
    "m_recv": semconv.HTTP_REQUEST_RECEIVED,
    "m_start": semconv.HTTP_RESPONSE_STARTED,
    "m_sent": semconv.HTTP_RESPONSE_SENT,
}
#: the span attributes the queries read (a store that narrows its spans keeps these alone)
ATTRIBUTES = (
    semconv.STAGE_NAME,
    semconv.TRITON_SPAN_MODEL_NAME,
    semconv.PROXY_COMPONENT,
    semconv.PROXY_UPSTREAM_ADDRESS,
    semconv.RAY_SERVE_DEPLOYMENT,
    _SERVE_DEPLOYMENT,
    semconv.SERIALIZE_S,
    semconv.DESERIALIZE_S,
    semconv.CONNECT_S,
    semconv.MODEL_NAME,
    semconv.SERVER_ADDRESS,
    semconv.SERVER_PORT,
)


def _first(event: str) -> str:
    """The time of a span's first event named ``event`` (NULL: none)."""
    return f"times[list_position(names, {_q(event)})]"


def _attr(key: str) -> str:
    # a key read and not listed would be missing from a narrowed store's spans
    assert key in ATTRIBUTES, key
    return f"SpanAttributes[{_q(key)}]"


def _parquet(files: list[str]) -> tuple[str, str]:
    """Segments as the queries' source of spans, and each span's arrival order in them."""
    listed = "[" + ", ".join(_q(f) for f in files) + "]"
    return (
        f"read_parquet({listed}, filename = true, file_row_number = true)",
        f"(list_position({listed}, filename)::BIGINT << 32) + file_row_number",
    )


def _spans_sql(source: tuple[str, str], group_by: Sequence[str]) -> str:
    """One row a span, the first of duplicate ids in arrival order, with what the queries read:
    ``source`` is the relation of the spans (the segments' columns, or those ``ATTRIBUTES``
    and ``EVENTS`` narrow them to) and the expression of a span's arrival order in it."""
    relation, order = source
    picked = ",\n        ".join(f"{_first(name)} AS {column}" for column, name in EVENTS.items())
    keys = (
        ", ".join(
            "NULL::VARCHAR"
            if key == semconv.ANSWERED_BY
            else f"json_extract(SpanAttributesJson, {_q(_path(key))})::VARCHAR"
            for key in group_by
        )
        or "NULL::VARCHAR"
    )
    return f"""
CREATE TEMP TABLE kall AS
WITH raw AS (
SELECT * FROM (
  SELECT
    -- ids as the integers their hex spells: joins and sorts on them are several times
    -- cheaper than on text; an id that is not hex marks its trace for the Python path
    TraceId AS tt, TRY_CAST('0x' || TraceId AS UHUGEINT) AS t,
    TRY_CAST('0x' || SpanId AS UBIGINT) AS id,
    CASE WHEN ParentSpanId <> '' THEN TRY_CAST('0x' || ParentSpanId AS UBIGINT) END AS p,
    TRY_CAST('0x' || TraceId AS UHUGEINT) IS NULL OR TRY_CAST('0x' || SpanId AS UBIGINT) IS NULL
      OR (ParentSpanId <> '' AND TRY_CAST('0x' || ParentSpanId AS UBIGINT) IS NULL) AS badid,
    SpanName AS name,
    SpanKind = 'Client' AS is_client,
    epoch_ns(Timestamp)::BIGINT AS st, epoch_ns(Timestamp)::BIGINT + Duration AS en,
    {_attr(semconv.STAGE_NAME)} AS stage,
    NULLIF({_attr(semconv.TRITON_SPAN_MODEL_NAME)}, '') AS model,
    SpanKind = 'Server' AND {_attr(semconv.PROXY_COMPONENT)} IS NOT DISTINCT FROM
      {_q(semconv.PROXY)} AS is_proxy,
    coalesce({_attr(semconv.PROXY_UPSTREAM_ADDRESS)}, '') AS upstream,
    split_part(SpanName, ' ', 1) AS head,
    SpanName = {_q(semconv.RAY_SERVE_QUEUE_SPAN)} AS queued,
    {_attr(semconv.RAY_SERVE_DEPLOYMENT)} IS NOT NULL AS ours,
    NULLIF({_attr(semconv.RAY_SERVE_DEPLOYMENT)}, '') AS dep,
    NULLIF({_attr(_SERVE_DEPLOYMENT)}, '') AS sdep,
    coalesce(TRY_CAST({_attr(semconv.SERIALIZE_S)} AS DOUBLE), 0) AS ser,
    coalesce(TRY_CAST({_attr(semconv.DESERIALIZE_S)} AS DOUBLE), 0) AS deser,
    coalesce(TRY_CAST({_attr(semconv.CONNECT_S)} AS DOUBLE), 0) AS conn,
    coalesce({_attr(semconv.MODEL_NAME)}, SpanName) AS called,
    coalesce({_attr(semconv.SERVER_ADDRESS)}, '') AS host,
    coalesce({_attr(semconv.SERVER_PORT)}, '') AS port,
    -- a root's group values (JSON), read for roots alone
    CASE WHEN ParentSpanId = '' THEN [{keys}] END AS gvals,
    {picked},
    {order} AS ord
  FROM (
    SELECT *, list_transform(Events, lambda e: e.Name) AS names,
              list_transform(Events, lambda e: e.Timestamp) AS times
    FROM {relation})
) QUALIFY row_number() OVER (PARTITION BY t, id, CASE WHEN badid THEN ord END ORDER BY ord) = 1
)
-- each span's place among its parent's children (start order, arrival breaking ties), its
-- frontend's receive and send (HTTP's, else gRPC's), its ASGI cuts in order
SELECT raw.*,
  row_number() OVER (PARTITION BY t, p ORDER BY st, en, ord) AS pos,
  CASE WHEN hr0 <= hr1 THEN hr0 WHEN gr0 <= gr1 THEN gr0 END AS r0,
  CASE WHEN hr0 <= hr1 THEN hr1 WHEN gr0 <= gr1 THEN gr1 END AS r1,
  CASE WHEN hs0 <= hs1 THEN hs0 WHEN gs0 <= gs1 THEN gs0 END AS s0,
  CASE WHEN hs0 <= hs1 THEN hs1 WHEN gs0 <= gs1 THEN gs1 END AS s1,
  coalesce(m_recv <= m_start AND m_start <= m_sent, false) AS marked
FROM raw;

"""


_TREE = """
-- what the trees' walks read of a span beside its parent: narrow, for their repeated joins
CREATE TEMP TABLE kids AS
SELECT t, p, id, pos, is_client, stage IS NOT NULL AS stg, queued, model FROM k
WHERE p IS NOT NULL;
-- from each root down: the path (child positions), whether the client's own level holds the
-- span (no call and no stage above it), whether no call is above it (``answered_by``)
CREATE TEMP TABLE walk AS
WITH RECURSIVE w(t, id, root, path, lvl, free, cl, stg) AS (
  SELECT t, id, id, []::BIGINT[], true, true, is_client, stage IS NOT NULL FROM k
  WHERE p IS NULL
  UNION ALL
  SELECT c.t, c.id, w.root, list_append(w.path, c.pos),
         w.id = w.root OR (w.lvl AND NOT w.cl AND NOT w.stg),
         w.id = w.root OR (w.free AND NOT w.cl),
         c.is_client, c.stg
  FROM w JOIN kids c ON c.t = w.t AND c.p = w.id
)
SELECT t, id, root, path, lvl, free FROM w;

-- traces left to the Python path: a span its own parent or whose parent is missing (an
-- orphan: partial data, or a hop exported elsewhere), a span no root reaches (a cycle)
CREATE TEMP TABLE odd AS
SELECT tt FROM k WHERE badid OR (p IS NOT NULL AND p = id)
UNION SELECT k.tt FROM k ANTI JOIN k q ON q.t = k.t AND q.id = k.p WHERE k.p IS NOT NULL
UNION SELECT a.tt FROM (SELECT t, any_value(tt) AS tt, count(*) AS n FROM k GROUP BY t) a
  ANTI JOIN (SELECT t, count(*) AS n FROM walk GROUP BY t) b ON a.t = b.t AND a.n = b.n;
"""


def _components_sql(root_name: str | None, literal: Callable[[str], str] = _q) -> str:
    """The components' queries, of the roots named ``root_name`` (all: None), written into
    the queries as ``literal`` writes a string (ClickHouse's escape backslashes too)."""
    named = f"AND r.name = {literal(root_name)}" if root_name is not None else ""
    known = " ".join(f"WHEN {_q(span)} THEN {_q(part)}" for span, part in _KNOWN_SPANS.items())
    return f"""
-- the roots (their order: the trace's first arrival, then start), their group's values
CREATE TEMP TABLE roots AS
SELECT r.t, r.id, r.ord AS root, r.st, r.en, r.name, f.first AS tord, r.gvals
FROM k r JOIN (SELECT t, min(ord) AS first FROM k GROUP BY t) f ON f.t = r.t
WHERE r.p IS NULL AND r.tt NOT IN (SELECT tt FROM odd) {named};

-- the client's calls and stages: reached from a root through spans of neither kind
CREATE TEMP TABLE level AS
SELECT r.root, w.path, k.* FROM walk w JOIN roots r ON r.t = w.t AND r.id = w.root
JOIN k ON k.t = w.t AND k.id = w.id
WHERE w.id <> w.root AND w.lvl AND (k.is_client OR k.stage IS NOT NULL);

-- each call (keyed by its arrival: unique) and what answered it: its first child (``front``)
-- and, where that is a proxy's span (Envoy), the server span under the proxy's last attempt
-- that reached one (``srv``); the call's end within the front's (``upto0``) and the server's
CREATE TEMP TABLE calls AS
WITH c0 AS (
  SELECT c.t, c.tt, c.ord AS call, c.root, c.path AS cpath, c.st AS cst, c.en AS cen, c.ser,
         c.deser, c.conn, c.called, v.id AS fid, v.st AS fst, v.en AS fen,
         v.r0 AS fr0, v.r1 AS fr1, v.s0 AS fs0, v.s1 AS fs1,
         coalesce(v.is_proxy, false) AS proxied
  FROM level c LEFT JOIN k v ON v.t = c.t AND v.p = c.id AND v.pos = 1
  WHERE c.is_client
), tries AS (
  SELECT a.t AS t, a.p AS proxy, arg_max(a.id, a.pos) AS att FROM k a
  SEMI JOIN c0 ON c0.t = a.t AND c0.fid = a.p AND c0.proxied
  SEMI JOIN k x ON x.t = a.t AND x.p = a.id
  WHERE a.is_client GROUP BY a.t, a.p
), tried AS (
  -- each proxy's last attempt that reached a server, and that server's span (one join
  -- apart: ClickHouse names a column of ``c0.*`` by its table where more than one joins it)
  SELECT y.t AS t, y.proxy AS proxy, a.id AS att, a.st AS ast, a.en AS aen,
         a.upstream AS upstream, s.id AS sid
  FROM tries y LEFT JOIN k a ON a.t = y.t AND a.id = y.att
  LEFT JOIN k s ON s.t = y.t AND s.p = y.att AND s.pos = 1
), c1 AS (
  SELECT c0.*, y.att, y.ast, y.aen, y.upstream,
         CASE WHEN c0.proxied THEN y.sid ELSE c0.fid END AS srv
  FROM c0 LEFT JOIN tried y ON c0.proxied AND y.t = c0.t AND y.proxy = c0.fid
)
SELECT c1.*, v.st AS vst, v.en AS ven, v.name AS vname, v.r0, v.r1, v.s0, v.s1,
       least(c1.fen, c1.cen) AS upto0, least(v.en, c1.fen, c1.cen) AS upto,
       round((c1.ser + c1.conn) / 1e-9)::BIGINT AS sent_after,
       c1.fid IS NULL OR c1.srv IS NULL AS missing
FROM c1 LEFT JOIN k v ON v.t = c1.t AND v.id = c1.srv;

-- the first call under each root, no call above it: the server that answered (through a
-- proxy, the address it forwarded to)
CREATE TEMP TABLE answered AS
SELECT r.root, arg_min(
  CASE WHEN c.proxied AND c.srv IS NOT NULL THEN c.upstream
       WHEN k.host <> '' AND k.port NOT IN ('', '0') THEN k.host || ':' || k.port
       ELSE k.host END, w.path) AS address
FROM walk w JOIN roots r ON r.t = w.t AND r.id = w.root JOIN k ON k.t = w.t AND k.id = w.id
LEFT JOIN calls c ON c.call = k.ord
WHERE w.id <> w.root AND w.free AND k.is_client GROUP BY r.root;

-- every span under a server: its depth, whether the parts' walk reaches it (no stage, Ray
-- Serve wait or call between), the Triton model whose span holds it (``ctx``), its path
CREATE TEMP TABLE sub AS
WITH RECURSIVE u(t, call, id, depth, reach, ctx, path, stop, mine) AS (
  SELECT c.t, c.call, v.id, 0, true, NULL::VARCHAR, []::BIGINT[],
         v.is_client OR v.stage IS NOT NULL OR v.queued,
         -- the model a span hands the spans under it: its own, where the parts' walk reads it
         -- as a model's span (not a stage, a call, or the frontend's request span)
         CASE WHEN v.stage IS NULL AND NOT v.is_client AND NOT v.queued AND v.r0 IS NULL
                   AND v.s0 IS NULL AND NOT v.marked THEN v.model END
  FROM calls c JOIN k v ON v.t = c.t AND v.id = c.srv
  UNION ALL
  SELECT c.t, u.call, c.id, u.depth + 1, u.reach AND NOT u.stop,
         coalesce(u.mine, u.ctx), list_append(u.path, c.pos),
         c.is_client OR c.stg OR c.queued,
         CASE WHEN NOT c.stg AND NOT c.is_client AND NOT c.queued THEN c.model END
  FROM u JOIN kids c ON c.t = u.t AND c.p = u.id
)
SELECT u.call, u.depth, u.reach, u.ctx, u.path, k.* FROM u JOIN k ON k.t = u.t AND k.id = u.id;

-- otelkit's spans of a request directly under Ray Serve's replica span (``_ours``)
CREATE TEMP TABLE ours AS
SELECT q.call, q.id, min(c.st) AS first, arg_max(c.en, [c.st, c.en]) AS last
FROM sub q JOIN k c ON c.t = q.t AND c.p = q.id
WHERE q.head = {_q(_SERVE_REPLICA)} AND c.ours GROUP BY q.call, q.id;

-- the waits (``_queue_interval``): a Ray Serve handle call's ``queued`` span, a replica's
-- queue (Serve's span to otelkit's), Triton's QUEUE_START to its first child's COMPUTE_START
CREATE TEMP TABLE waits AS
SELECT call, st AS a, en AS b, true AS routed FROM sub WHERE queued
UNION ALL SELECT q.call, q.st, greatest(q.st, o.first), false FROM sub q
  JOIN ours o ON o.call = q.call AND o.id = q.id WHERE NOT q.queued
UNION ALL SELECT q.call, q.q_start, greatest(q.q_start, arg_min(c.c_start, c.pos)), false
  FROM sub q JOIN k c ON c.t = q.t AND c.p = q.id
  LEFT JOIN (SELECT call AS oc, id AS oid FROM ours) o ON o.oc = q.call AND o.oid = q.id
  WHERE q.q_start IS NOT NULL AND c.c_start IS NOT NULL AND NOT q.queued AND o.oc IS NULL
  GROUP BY q.call, q.id, q.q_start;

-- Serve's router's spans: the part of a handle call's wait that was its choice of a replica
-- and the hand-off, merged where they overlap
CREATE TEMP TABLE routers AS
SELECT call, min(a) AS a, max(b) AS b FROM (
  SELECT *, sum(CASE WHEN a <= top THEN 0 ELSE 1 END)
              OVER (PARTITION BY call ORDER BY a, b ROWS UNBOUNDED PRECEDING) AS island
  FROM (SELECT call, st AS a, en AS b, max(en) OVER (PARTITION BY call ORDER BY st, en
          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS top
        FROM sub WHERE head = {_q(_ROUTER)}))
GROUP BY call, island;

-- the queue's pieces: a handle call's wait less its router's spans, every other wait whole
CREATE TEMP TABLE queued AS
WITH cut AS (
  SELECT w.call, w.a, w.b, r.a AS ra, r.b AS rb FROM waits w
  JOIN routers r ON r.call = w.call AND r.b > w.a AND r.a < w.b WHERE w.routed
), gaps AS (
  SELECT call, a AS wa, b AS wb,
         coalesce(lag(rb) OVER (PARTITION BY call, a, b ORDER BY ra), a) AS a, ra AS b FROM cut
  UNION ALL SELECT call, a, b, max(rb), b FROM cut GROUP BY call, a, b
)
SELECT call, greatest(a, wa) AS a, least(b, wb) AS b FROM gaps
  WHERE least(b, wb) > greatest(a, wa)
UNION ALL SELECT w.call, w.a, w.b FROM waits w
  LEFT JOIN (SELECT DISTINCT call AS rc FROM routers) r ON r.rc = w.call
  WHERE NOT (w.routed AND r.rc IS NOT NULL)
UNION ALL SELECT w.call, w.a, w.b FROM waits w
  JOIN (SELECT DISTINCT call AS rc FROM routers) r ON r.rc = w.call
  LEFT JOIN (SELECT DISTINCT call AS xc, a AS xa, b AS xb FROM cut) x
    ON x.xc = w.call AND x.xa = w.a AND x.xb = w.b
  WHERE w.routed AND x.xc IS NULL;

-- each instant once: the union of the queue's pieces
CREATE TEMP TABLE queue AS
SELECT call, sum(b - a) AS ns FROM (
  SELECT call, min(a) AS a, max(b) AS b FROM (
    SELECT *, sum(CASE WHEN a <= top THEN 0 ELSE 1 END)
                OVER (PARTITION BY call ORDER BY a, b ROWS UNBOUNDED PRECEDING) AS island
    FROM (SELECT *, max(b) OVER (PARTITION BY call ORDER BY a, b
                                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS top
          FROM queued)
  ) GROUP BY call, island
) GROUP BY call;

-- the server's outermost stages
CREATE TEMP TABLE stages AS
SELECT call, 'server ' || stage AS name, st, en, path FROM sub
WHERE depth > 0 AND reach AND stage IS NOT NULL;

-- the parents of compute spans that hold stages (through spans neither calls nor models)
CREATE TEMP TABLE staged AS
WITH RECURSIVE h(t, top, id, go) AS (
  SELECT c.t, c.p, c.id, NOT c.is_client AND c.model IS NULL
  FROM k c SEMI JOIN (SELECT t, p FROM sub WHERE c_start IS NOT NULL AND ctx IS NOT NULL) x
    ON x.t = c.t AND x.p = c.p
  UNION ALL
  SELECT c.t, h.top, c.id, NOT c.is_client AND c.model IS NULL
  FROM h JOIN k c ON c.t = h.t AND c.p = h.id WHERE h.go
)
SELECT DISTINCT h.t, h.top FROM h JOIN k ON k.t = h.t AND k.id = h.id WHERE k.stage IS NOT NULL;

-- what each span the parts' walk reaches is (``_server_time._labelled``'s cases), once: the
-- labels read it in a dozen places (ClickHouse would compute a CTE at each)
CREATE TEMP TABLE kinds AS
WITH x AS (
  -- whether a model's span holds models (an ensemble's steps), whether a compute span's
  -- parent holds stages: joined, not correlated (ClickHouse's own reads drop a column that
  -- only a correlated subquery reads), each set's columns named apart from ``sub``'s
  SELECT sub.*, m.mt IS NOT NULL AS steps, g.gt IS NOT NULL AS has_stages
  FROM sub
  LEFT JOIN (SELECT DISTINCT t AS mt, p AS mp FROM k WHERE model IS NOT NULL) m
    ON m.mt = sub.t AND m.mp = sub.id
  LEFT JOIN (SELECT DISTINCT t AS gt, top AS gtop FROM staged) g
    ON g.gt = sub.t AND g.gtop = sub.p
  WHERE reach AND stage IS NULL AND NOT queued
), kinds AS (
  SELECT *,
    CASE
      WHEN is_client THEN 'call'
      WHEN depth = 0 AND (r0 IS NOT NULL OR s0 IS NOT NULL) THEN 'frontend'
      WHEN depth = 0 AND marked THEN 'asgi'
      WHEN model IS NOT NULL THEN 'model'
      WHEN c_start IS NOT NULL AND ctx IS NOT NULL THEN 'compute'
      WHEN head IN ({_SERVE_HEADS}) THEN 'serve'
      WHEN head = {_q(_SERVE_REPLICA)} AND sdep IS NOT NULL THEN 'replica'
      WHEN dep IS NOT NULL THEN 'deployment'
      WHEN depth > 0 THEN 'span'
    END AS kind,
    'server ' || ctx || CASE WHEN has_stages THEN ' hand-off' ELSE ' compute' END AS infer,
    c_in IS NOT NULL AND c_out IS NOT NULL AND c_end IS NOT NULL AS cut
  FROM x
)
SELECT * FROM kinds;

-- the labelled intervals of the parts (``_server_time._labelled``): name, rank, walk order
CREATE TEMP TABLE labels AS
WITH taken AS (SELECT DISTINCT call, name FROM stages)
SELECT call, a, b, label, r1, r2, path, part FROM (
  SELECT call, st AS a, en AS b, {_q(CALLS_OUT)} AS label, 3 AS r1, depth AS r2, path,
         0 AS part FROM kinds WHERE kind = 'call'
  UNION ALL SELECT call, st, en, {_q(FRONTEND)}, 0, 0, path, 0 FROM kinds
    WHERE kind = 'frontend'
  UNION ALL SELECT call, r0, r1, {_q(RECEIVE)}, 4, 0, path, 1 FROM kinds
    WHERE kind = 'frontend' AND r0 IS NOT NULL
  UNION ALL SELECT call, s0, s1, {_q(SEND)}, 4, 0, path, 2 FROM kinds
    WHERE kind = 'frontend' AND s0 IS NOT NULL
  UNION ALL SELECT call, st, m_recv, {_q(RECEIVE)}, 0, 1, path, 0 FROM kinds WHERE kind = 'asgi'
  UNION ALL SELECT call, m_recv, m_start, {_q(HANDLER)}, 0, 1, path, 1 FROM kinds
    WHERE kind = 'asgi'
  UNION ALL SELECT call, m_start, m_sent, {_q(SEND)}, 0, 1, path, 2 FROM kinds
    WHERE kind = 'asgi'
  UNION ALL SELECT call, st, en, CASE WHEN steps THEN {_q(ENSEMBLE)} ELSE {_q(SCHEDULER)} END,
    1, depth, path, 0 FROM kinds WHERE kind = 'model'
  UNION ALL SELECT call, st, en, infer, 2, depth, path, 0 FROM kinds
    WHERE kind = 'compute' AND NOT cut
  UNION ALL SELECT call, c_start, c_in, {_q(COMPUTE_INPUT)}, 2, depth, path, 0 FROM kinds
    WHERE kind = 'compute' AND cut
  UNION ALL SELECT call, c_in, c_out, infer, 2, depth, path, 1 FROM kinds
    WHERE kind = 'compute' AND cut
  UNION ALL SELECT call, c_out, c_end, {_q(COMPUTE_OUTPUT)}, 2, depth, path, 2 FROM kinds
    WHERE kind = 'compute' AND cut
  UNION ALL SELECT call, st, en, CASE head {_SERVE_NAMES} END, 3, depth, path, 0 FROM kinds
    WHERE kind = 'serve'
  UNION ALL SELECT s.call, st, coalesce(o.last, en), 'server ' || sdep || ' replica', 3, depth,
    path, 0 FROM kinds s LEFT JOIN ours o ON o.call = s.call AND o.id = s.id
    WHERE kind = 'replica'
  UNION ALL SELECT call, st, en, 'server ' || dep || ' replica', 3, depth, path, 0 FROM kinds
    WHERE kind = 'deployment'
  UNION ALL SELECT s.call, st, en,
    CASE WHEN taken.name IS NOT NULL THEN own || ' (span)' ELSE own END, 3, depth, path, 0
  FROM (SELECT *, CASE name {known} ELSE 'server ' || name END AS own FROM kinds
        WHERE kind = 'span') s
  LEFT JOIN taken ON taken.call = s.call AND taken.name = s.own
) WHERE b > a;

-- what the stages and the queue hold: no part counts there
CREATE TEMP TABLE held AS
SELECT call, st AS a, en AS b FROM stages WHERE en > st
UNION ALL SELECT call, a, b FROM queued WHERE b > a;

-- the same as islands: each instant held once, the islands apart
CREATE TEMP TABLE islands AS
SELECT call, min(a) AS a, max(b) AS b FROM (
  SELECT *, sum(CASE WHEN a <= top THEN 0 ELSE 1 END)
              OVER (PARTITION BY call ORDER BY a, b ROWS UNBOUNDED PRECEDING) AS island
  FROM (SELECT *, max(b) OVER (PARTITION BY call ORDER BY a, b
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS top
        FROM held))
GROUP BY call, island;

-- the sweep: between consecutive edges, the innermost part open (the highest rank, then the
-- first opened), unless the stages or the queue hold that time (an ASOF join finds the island
-- at or before a piece); within the server's span, up to the call's end
CREATE TEMP TABLE pieces AS
WITH edges AS (
  SELECT DISTINCT call, e FROM (
    SELECT call, a AS e FROM labels UNION ALL SELECT call, b FROM labels
    UNION ALL SELECT call, a FROM islands UNION ALL SELECT call, b FROM islands)
), segs AS (
  SELECT g.call, g.a, g.b, greatest(g.a, c.vst) AS lo, least(g.b, c.upto) AS hi
  FROM (SELECT call, e AS a, lead(e) OVER (PARTITION BY call ORDER BY e) AS b FROM edges) g
  JOIN calls c ON c.call = g.call WHERE g.b IS NOT NULL
), free AS (
  SELECT g.* FROM segs g ASOF LEFT JOIN islands h ON h.call = g.call AND g.a >= h.a
  WHERE g.hi > g.lo AND (h.b IS NULL OR h.b < g.b)
), ordered AS (
  SELECT *, row_number() OVER (PARTITION BY call ORDER BY path, part) AS idx FROM labels
)
SELECT g.call, g.a, arg_max(l.label, [l.r1, l.r2, -l.a, -l.idx]) AS label, g.hi - g.lo AS ns
FROM free g JOIN ordered l ON l.call = g.call AND l.a <= g.a AND l.b >= g.b
GROUP BY g.call, g.a, g.lo, g.hi;

-- the server's receive, frontend and send outside its span (``_server_time.around``): the
-- front's within the call (``n`` 0-2), the answering server's within the proxy's attempt (3-5)
CREATE TEMP TABLE outside AS
WITH o AS (
  SELECT call, fst AS vst, fen AS ven, cst AS bst, cen AS ben, cst + sent_after AS sent,
         fr0 AS r0, fr1 AS r1, fs0 AS s0, fs1 AS s1, 0 AS n
  FROM calls WHERE NOT missing
  UNION ALL SELECT call, vst, ven, ast, aen, ast, r0, r1, s0, s1, 3 FROM calls
  WHERE NOT missing AND proxied
), p AS (SELECT *, least(r1, vst) AS rend FROM o)
SELECT call, {_q(RECEIVE)} AS name, rend - greatest(r0, sent) AS ns, n FROM p
  WHERE r0 < vst AND rend > greatest(r0, sent)
UNION ALL SELECT call, {_q(FRONTEND)}, vst - greatest(rend, sent), n + 1 FROM p
  WHERE r0 < vst AND vst > greatest(rend, sent)
UNION ALL SELECT call, {_q(SEND)}, least(s1, ben) - greatest(s0, ven), n + 2 FROM p
  WHERE s1 > ven AND least(s1, ben) > greatest(s0, ven);

-- each root's components: (name, seconds, where in the root it first comes, a part or not)
CREATE TEMP TABLE comp AS
WITH per_call AS (
  SELECT c.*, coalesce(q.qns, 0) * 1e-9 AS queue_s, coalesce(o.ans, 0) * 1e-9 AS around_s,
    coalesce(o.bns, 0) * 1e-9 AS behind_s, coalesce(g.gs, 0) AS staged_s,
    coalesce(p.pns, 0) * 1e-9 AS parts_s
  FROM calls c LEFT JOIN (SELECT call AS qc, ns AS qns FROM queue) q ON q.qc = c.call
  LEFT JOIN (SELECT call AS oc, sum(CASE WHEN n < 3 THEN ns ELSE 0 END) AS ans,
                    sum(CASE WHEN n >= 3 THEN ns ELSE 0 END) AS bns
             FROM outside GROUP BY call) o ON o.oc = c.call
  LEFT JOIN (SELECT call AS gc, sum((en - st) * 1e-9) AS gs FROM stages GROUP BY call) g
    ON g.gc = c.call
  LEFT JOIN (SELECT call AS pc, sum(ns) AS pns FROM pieces GROUP BY call) p ON p.pc = c.call
  WHERE NOT c.missing
)
SELECT root, 'client serialize' AS name, ser AS s, cpath AS path, 0 AS seq, 0 AS sub,
  false AS part FROM calls
UNION ALL SELECT root, 'client deserialize', deser, cpath, 1, 0, false FROM calls
UNION ALL SELECT root, {_q(CONNECTION)}, conn, cpath, 2, 0, false FROM calls
  WHERE fid IS NOT NULL AND conn <> 0
UNION ALL SELECT c.root, o.name, o.ns * 1e-9, c.cpath, CASE WHEN o.n < 3 THEN 3 ELSE 5 END,
  o.n, true FROM outside o JOIN calls c ON c.call = o.call
UNION ALL SELECT root, {_q(NETWORK)},
  ((cen - cst) - (upto0 - fst)) * 1e-9 - ser - deser - conn - around_s, cpath, 4, 0, false
  FROM per_call
UNION ALL SELECT root, {_q(LOAD_BALANCER)},
  (upto0 - fst - (least(ven, upto0) - vst)) * 1e-9 - behind_s, cpath, 6, 0, false
  FROM per_call WHERE proxied
UNION ALL SELECT root, {_q(SERVER_QUEUE)}, queue_s, cpath, 7, 0, false FROM per_call
UNION ALL SELECT c.root, g.name, (g.en - g.st) * 1e-9, c.cpath, 8, row_number() OVER
  (PARTITION BY c.call ORDER BY g.path), false FROM stages g JOIN calls c ON c.call = g.call
UNION ALL SELECT c.root, p.label, sum(p.ns) * 1e-9, c.cpath, 9, min(p.a), true
  FROM pieces p JOIN calls c ON c.call = p.call GROUP BY c.root, c.call, c.cpath, p.label
UNION ALL SELECT root, {_q(SERVER_OTHER)},
  (upto - vst) * 1e-9 - queue_s - staged_s - parts_s, cpath, 10, 0, false FROM per_call
UNION ALL SELECT root, 'client ' || stage, (en - st) * 1e-9, path, 0, 0, false FROM level
  WHERE NOT is_client
UNION ALL SELECT r.root, {_q(CLIENT_OTHER)},
  (r.en - r.st) * 1e-9 - coalesce(l.ls, 0), [9223372036854775807], 0, 0, false
  FROM roots r
  LEFT JOIN (SELECT root AS lr, sum((en - st) * 1e-9) AS ls FROM level GROUP BY root) l
    ON l.lr = r.root
UNION ALL SELECT root, {_q(TOTAL)}, (en - st) * 1e-9, [9223372036854775807], 1, 0, false
  FROM roots;

-- the nesting problems, in each root's order
CREATE TEMP TABLE problems AS
SELECT root, cpath AS path, 0 AS n,
  vname || ': server span starts before the proxy''s (' || tt || ')' AS text
FROM calls WHERE NOT missing AND proxied AND vst < fst
UNION ALL SELECT root, cpath, 1,
  called || ': server span starts before its client span (' || tt || ')'
FROM calls WHERE NOT missing AND vst < cst
UNION ALL SELECT c.root, c.cpath, 2,
  c.called || ': stages + queue exceed the server span (' || c.tt || ')'
FROM calls c LEFT JOIN (SELECT call AS qc, ns AS qns FROM queue) q ON q.qc = c.call
LEFT JOIN (SELECT call AS gc, sum((en - st) * 1e-9) AS gs FROM stages GROUP BY call) g
  ON g.gc = c.call
WHERE NOT c.missing AND coalesce(g.gs, 0) + coalesce(q.qns, 0) * 1e-9
      > (c.ven - c.vst) * 1e-9 * (1 + 1e-6);
"""


def _path(key: str) -> str:
    """A JSON path naming one top-level key, whatever it holds (dots, quotes)."""
    return '$."' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


_ROWS = """
-- the roots' places, their group values, whether a call lost its server
CREATE TEMP TABLE rk AS
SELECT r.root, r.t, r.tord,
  row_number() OVER (PARTITION BY r.t ORDER BY r.st, r.en, r.root) AS idx,
  r.gvals, coalesce(a.address, '') AS address, c.cr IS NOT NULL AS bad
FROM roots r LEFT JOIN answered a ON a.root = r.root
LEFT JOIN (SELECT DISTINCT root AS cr FROM calls WHERE missing) c ON c.cr = r.root;

-- each root's components once, in the order the Python path adds them
CREATE TEMP TABLE percomp AS
SELECT root, name, s, row_number() OVER (PARTITION BY root ORDER BY place) AS pos, part FROM (
  SELECT root, name, sum(s) AS s, min({'path': path, 'seq': seq, 'sub': sub}) AS place,
         bool_or(part) AS part
  FROM comp GROUP BY root, name);
"""

#: what a chunk of traces leaves for the merge (the rest of its tables are dropped)
_KEPT = ("rk", "percomp", "problems", "odd")
#: traces a chunk holds about this many spans: DuckDB's recursive walks and windows hold a
#: chunk's tables in memory at once
CHUNK_SPANS = 1_000_000

# The traces the Python path broke down join the queries' here, as rows of the same tables.
_MERGE = """
CREATE TEMP TABLE allroots AS
SELECT r.root, g.gid, r.tord, r.idx, r.bad FROM rk r JOIN gids g ON g.combo = r.combo
UNION ALL SELECT root, gid, tord, idx, bad FROM droots;

CREATE TEMP TABLE allcomp AS
SELECT root, name, s, pos, part FROM percomp
UNION ALL SELECT root, name, s, pos, part FROM dcomp;

-- each group's components (first seen: the first root holding them, their place in it),
-- and their values for each complete root in order, 0 where a root lacks one
CREATE TEMP TABLE cells AS
WITH good AS (SELECT * FROM allroots WHERE NOT bad),
held AS (SELECT c.*, g.gid, g.tord, g.idx FROM allcomp c JOIN good g ON g.root = c.root),
names AS (SELECT gid, name, min([tord, idx, pos]) AS first, bool_or(part) AS part
          FROM held GROUP BY gid, name)
SELECT n.gid, n.name, n.first, n.part,
       list(coalesce(h.s, 0.0) ORDER BY g.tord, g.idx) AS vals
FROM names n JOIN good g ON g.gid = n.gid
LEFT JOIN held h ON h.root = g.root AND h.name = n.name
GROUP BY n.gid, n.name, n.first, n.part;

CREATE TEMP TABLE said AS
SELECT g.gid, list(p.text ORDER BY g.tord, g.idx, p.n) AS texts
FROM (SELECT root, row_number() OVER (PARTITION BY root ORDER BY path, n) AS n, text
      FROM problems
      UNION ALL SELECT root, n, text FROM dproblems) p
JOIN allroots g ON g.root = p.root WHERE NOT g.bad GROUP BY g.gid;
"""


def breakdown_store(
    files: Sequence[str | Path], group_by: Sequence[str] = (), root_name: str | None = None
) -> SqlBreakdown:
    """``breakdown`` of the spans in the segments ``files`` (in arrival order), by DuckDB."""
    names = whole_segments(files)
    if not names:
        return SqlBreakdown({}, 0, 0, 0)
    source = _parquet(names)

    def whole(con: Any) -> Any:  # the wanted traces' spans, as the Python path reads them
        return con.sql(
            f"SELECT * EXCLUDE (filename, file_row_number, SpanAttributes, ResourceAttributes)"
            f" FROM {source[0]} SEMI JOIN wanted w ON w.t = TraceId ORDER BY {source[1]}"
        ).to_arrow_table()

    with connected() as con:
        try:
            con.execute(_spans_sql(source, group_by))
        except _duckdb().Error as error:
            raise StoreError(f"the span store could not be read: {error}") from error
        return breakdown_spans(con, group_by, root_name, whole)


@contextlib.contextmanager
def connected() -> Iterator[Any]:
    """A DuckDB connection whose memory is bounded: past the limit it spills its tables to a
    temporary folder of its own, removed with it."""
    duckdb = _duckdb()
    spill = tempfile.mkdtemp(prefix="otelkit-duckdb-")
    con = duckdb.connect(config={"memory_limit": MEMORY_LIMIT, "temp_directory": spill})
    try:
        yield con
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)


def breakdown_spans(
    con: Any,
    group_by: Sequence[str],
    root_name: str | None,
    whole: Callable[[Any], Any],
) -> SqlBreakdown:
    """The breakdown of the spans in ``con``'s table ``kall`` (``_spans_sql``); ``whole(con)``
    gives, as an Arrow table of the segments' columns (less the attribute maps) in arrival
    order, every span of the traces in ``con``'s table ``wanted`` (column ``t``: trace ids),
    for those the queries leave to the Python path."""
    spans, traces = con.execute("SELECT count(*), count(DISTINCT tt) FROM kall").fetchone()
    _chunks(con, root_name, max(1, -(-spans // CHUNK_SPANS)))
    return merged(con, group_by, root_name, whole, spans, traces)


def merged(
    con: Any,
    group_by: Sequence[str],
    root_name: str | None,
    whole: Callable[[Any], Any],
    spans: int,
    traces: int,
) -> SqlBreakdown:
    """The breakdown from the queries' results in ``con`` (the tables of ``_KEPT``, ``kall``'s
    arrival order of the traces in ``odd``), the traces in ``odd`` broken down by the Python
    path (``whole``: as ``breakdown_spans``'s) and merged in their place."""
    con.execute(
        "CREATE OR REPLACE TEMP TABLE rk AS SELECT *, "
        "dense_rank() OVER (ORDER BY gvals, address) AS combo FROM rk"
    )
    # each combination of group values as the Python path writes it: one group each
    keys: dict[tuple[str, ...], int] = {}
    combos, gids = [], []
    for combo, values, address in con.execute(
        "SELECT DISTINCT combo, gvals, address FROM rk"
    ).fetchall():
        key = tuple(
            address if name == semconv.ANSWERED_BY else _text(value)
            for name, value in zip(group_by, values, strict=False)
        )
        combos.append(combo)
        gids.append(keys.setdefault(key, len(keys)))
    con.execute(
        "CREATE TEMP TABLE gids AS SELECT unnest(?::BIGINT[]) AS combo, unnest(?::BIGINT[]) AS gid",
        [combos, gids],
    )
    odd = [t for (t,) in con.execute("SELECT tt FROM odd").fetchall()]
    _delegate(con, whole, odd, group_by, root_name, keys)
    con.execute(_MERGE)
    groups = {key: Breakdown(key) for key in keys}
    by_gid = {gid: groups[key] for key, gid in keys.items()}
    for gid, count in con.execute(
        "SELECT gid, count(*) FILTER (bad) FROM allroots GROUP BY gid"
    ).fetchall():
        by_gid[gid].incomplete = count
    for gid, name, part, values in con.execute(
        "SELECT gid, name, part, vals FROM cells ORDER BY gid, first"
    ).fetchall():
        by_gid[gid].components[name] = values
        if part:
            by_gid[gid].parts.add(name)
    for gid, texts in con.execute("SELECT gid, texts FROM said").fetchall():
        by_gid[gid].problems = texts
    return SqlBreakdown(groups, spans, traces, len(odd))


def wanted_by_id(fetch: Callable[[list[str]], Any]) -> Callable[[Any], Any]:
    """``breakdown_spans``'s ``whole`` from ``fetch(ids)`` (the spans of those traces as an
    Arrow table of the store's columns): the traces of ``con``'s table ``wanted``, less the
    attribute maps."""

    def whole(con: Any) -> Any:
        ids = [t for (t,) in con.execute("SELECT t FROM wanted").fetchall()]
        return fetch(ids).drop_columns(["SpanAttributes", "ResourceAttributes"])

    return whole


def _chunks(con: Any, root_name: str | None, chunks: int) -> None:
    """The queries over the traces in ``chunks`` parts (by their id's hash: each trace whole
    in one), each part's results kept in ``_KEPT``'s tables."""
    script = (_TREE + _components_sql(root_name) + _ROWS).replace(
        "CREATE TEMP TABLE", "CREATE OR REPLACE TEMP TABLE"
    )
    for table in _KEPT:
        con.execute(f"DROP TABLE IF EXISTS all_{table}")
    for chunk in range(chunks):
        con.execute(
            "CREATE OR REPLACE TEMP TABLE k AS SELECT * FROM kall"
            + (f" WHERE hash(tt) % {chunks} = {chunk}" if chunks > 1 else "")
        )
        con.execute(script)
        for table in _KEPT:
            if chunk == 0:
                con.execute(f"CREATE TEMP TABLE all_{table} AS SELECT * FROM {table}")
            else:
                con.execute(f"INSERT INTO all_{table} SELECT * FROM {table}")
    for table in _KEPT:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS SELECT * FROM all_{table}")
        con.execute(f"DROP TABLE all_{table}")


def _text(value: str | None) -> str:
    """A group's value as the Python path writes it (``str`` of the attribute's value)."""
    if value is None:
        return ""
    return str(json.loads(value))


def _delegate(
    con: Any,
    whole: Callable[[Any], Any],
    odd: list[str],
    group_by: Sequence[str],
    root_name: str | None,
    keys: dict[tuple[str, ...], int],
) -> None:
    """Break down the traces ``odd`` by the Python path, into the tables ``droots``,
    ``dcomp`` and ``dproblems`` (a root keyed by a negative number), new groups into ``keys``."""
    roots: dict[str, list[Any]] = {"root": [], "gid": [], "tord": [], "idx": [], "bad": []}
    comps: dict[str, list[Any]] = {"root": [], "name": [], "s": [], "pos": [], "part": []}
    said: dict[str, list[Any]] = {"root": [], "n": [], "text": []}
    if odd:
        con.execute("CREATE TEMP TABLE wanted AS SELECT unnest(?::VARCHAR[]) AS t", [odd])
        table = whole(con)
        first = dict(
            con.execute(
                "SELECT tt, min(ord) FROM kall SEMI JOIN wanted w ON w.t = kall.tt GROUP BY tt"
            ).fetchall()
        )
        spans = spans_of_table(table)
        for trace_id, trace in build_traces(spans).items():
            index = 0
            for root in trace.roots:
                if trace.is_orphan(root) or (root_name is not None and root.name != root_name):
                    continue
                index += 1
                key = -len(roots["root"]) - 1
                components, problems, named = _components(trace, root)
                gid = keys.setdefault(group_key(trace, root, group_by), len(keys))
                for column, value in zip(
                    roots,
                    (key, gid, first[trace_id], index, NO_SERVER_SPAN in components),
                    strict=True,
                ):
                    roots[column].append(value)
                for pos, (name, seconds) in enumerate(components.items(), 1):
                    for column, value in zip(
                        comps, (key, name, seconds, pos, name in named), strict=True
                    ):
                        comps[column].append(value)
                for n, text in enumerate(problems, 1):
                    for column, value in zip(said, (key, n, text), strict=True):
                        said[column].append(value)
    types = {"root": "BIGINT", "gid": "BIGINT", "tord": "BIGINT", "idx": "BIGINT"}
    types |= {"bad": "BOOLEAN", "name": "VARCHAR", "s": "DOUBLE", "pos": "BIGINT"}
    types |= {"part": "BOOLEAN", "n": "BIGINT", "text": "VARCHAR"}
    for table_name, columns in (("droots", roots), ("dcomp", comps), ("dproblems", said)):
        select = ", ".join(f"unnest(?::{types[c]}[]) AS {c}" for c in columns)
        con.execute(f"CREATE TEMP TABLE {table_name} AS SELECT {select}", list(columns.values()))
