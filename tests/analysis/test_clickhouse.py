"""otelkit.analysis._clickhouse: a site's ``otel_traces`` into the span store, on chDB.

chDB is ClickHouse's engine in process; clickhouse-connect's ``chdb://`` backend talks to it as
to a server. The table is made with the Collector ClickHouse exporter's own DDL
(``exporter/clickhouseexporter/internal/sqltemplates/traces_table.sql``) and filled with the
committed demo traces as the exporter writes them (attributes as strings; kinds and statuses in
the names of its current and of its earlier releases). Imported and broken down, they must give
what the same spans give from their JSON lines, and so must a table of the exporter's ``json``
option (``traces_json_table.sql``: ClickHouse's JSON type, values typed, keys split at their
dots); a window must bring whole traces; a table of another shape and a server that is not there
must each say so.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from otelkit import semconv
from otelkit.analysis import Span, _clickhouse, _pushdown, _sql, breakdown, build_traces, load_spans
from otelkit.analysis._clickhouse import breakdown_clickhouse, import_clickhouse
from otelkit.analysis._sampling import Sampling
from otelkit.analysis._sql import SqlBreakdown
from otelkit.analysis._store import StoreError
from otelkit.cli import main
from tests.analysis.summaries import assert_breaks_down_as, summary
from tests.analysis.test_sql import recorded
from tests.analysis.test_store import DEMO, shapes

clickhouse_connect = pytest.importorskip("clickhouse_connect")
pytest.importorskip("chdb")

#: the exporter's DDL, its template filled as a single-node MergeTree table
DDL = """
CREATE TABLE IF NOT EXISTS {table} (
    Timestamp DateTime64(9) CODEC(Delta(8), ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)),
    TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)),
    SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)),
    ScopeVersion String CODEC(ZSTD(1)),
    SpanAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    Duration {duration} CODEC(T64, ZSTD(1)),
    StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (
        Timestamp DateTime64(9),
        Name LowCardinality(String),
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    Links Nested (
        TraceId String,
        SpanId String,
        TraceState String,
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1
) ENGINE = MergeTree
PARTITION BY toDate(Timestamp)
PRIMARY KEY (ServiceName, SpanName, toDateTime(Timestamp))
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp), Timestamp)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1
"""
KINDS = ["Unspecified", "Internal", "Server", "Client", "Producer", "Consumer"]
STATUSES = ["Unset", "Ok", "Error"]


@pytest.fixture(scope="module")
def chdb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    """One chDB engine for the module (chDB allows one a process, at one path)."""
    dsn = f"chdb://{tmp_path_factory.mktemp('chdb')}"
    client = clickhouse_connect.get_client(dsn=dsn)
    yield dsn, client
    client.close()


def _text(value: Any) -> str:
    """An attribute's value as the exporter stores it: a string."""
    return value if isinstance(value, str) else json.dumps(value)


def _json_ddl(table: str) -> str:
    """The exporter's DDL with its ``json`` option: every attribute column ClickHouse's JSON."""
    ddl = DDL.format(table=table, duration="UInt64").replace(
        "Map(LowCardinality(String), String)", "JSON"
    )
    return "\n".join(line for line in ddl.splitlines() if "idx_trace_id" not in line)


def _fill(client: Any, table: str, spans: list[Span], *, legacy: bool, typed: bool = False) -> None:
    """``spans`` into a table of the exporter's DDL: its Map attributes of strings, or
    (``typed``) its JSON ones, which keep the values' types."""
    duration = "Int64" if legacy else "UInt64"
    client.command(_json_ddl(table) if typed else DDL.format(table=table, duration=duration))
    attributes: Any = (
        (lambda a: json.dumps(a)) if typed else (lambda a: {k: _text(v) for k, v in a.items()})
    )
    rows = []
    for s in spans:
        kind = f"SPAN_KIND_{KINDS[s.kind].upper()}" if legacy else KINDS[s.kind]
        status = (
            f"STATUS_CODE_{STATUSES[s.status_code].upper()}" if legacy else STATUSES[s.status_code]
        )
        rows.append(
            [
                s.start_ns,
                s.trace_id,
                s.span_id,
                s.parent_span_id or "",
                s.name,
                kind,
                str(s.resource.get("service.name", "")),
                attributes(s.resource),
                s.scope,
                attributes(s.attributes),
                s.end_ns - s.start_ns,
                status,
                s.status_message,
                [e.time_ns for e in s.events],
                [e.name for e in s.events],
                [attributes(e.attributes) for e in s.events],
            ]
        )
    columns = [
        "Timestamp", "TraceId", "SpanId", "ParentSpanId", "SpanName", "SpanKind", "ServiceName",
        "ResourceAttributes", "ScopeName", "SpanAttributes", "Duration", "StatusCode",
        "StatusMessage", "Events.Timestamp", "Events.Name", "Events.Attributes",
    ]  # fmt: skip
    client.insert(table, rows, column_names=columns)


@pytest.mark.parametrize("legacy", [False, True], ids=["current", "earlier-names"])
def test_otel_traces_imports_and_breaks_down_as_its_json_lines(
    chdb: tuple[str, Any], legacy: bool, tmp_path: Path
) -> None:
    dsn, client = chdb
    spans = load_spans(DEMO)
    table = f"otel_traces_{'legacy' if legacy else 'current'}"
    _fill(client, table, spans, legacy=legacy)
    count, segments = import_clickhouse(dsn, tmp_path / "store", table=table, segment_spans=150)
    assert (count, segments) == (len(spans), 3)
    back = load_spans(tmp_path / "store")
    assert {(s.trace_id, s.span_id) for s in back} == {(s.trace_id, s.span_id) for s in spans}
    by_id = {s.span_id: s for s in spans}
    for span in back:  # every field as the table holds it: attributes as strings
        original = by_id[span.span_id]
        assert (span.kind, span.status_code, span.start_ns, span.end_ns) == (
            original.kind,
            original.status_code,
            original.start_ns,
            original.end_ns,
        )
        assert [(e.name, e.time_ns) for e in span.events] == [
            (e.name, e.time_ns) for e in original.events
        ]
        assert span.attributes == {k: _text(v) for k, v in original.attributes.items()}
    assert_breaks_down_as(tmp_path / "store", load_spans(DEMO), tmp_path / "files")


def test_json_typed_attributes_read_back_with_their_keys_and_types(
    chdb: tuple[str, Any], tmp_path: Path
) -> None:
    """The exporter's ``json`` option: ClickHouse's JSON type splits each key at its dots
    (``http.method`` under ``http``); read back, the keys are the spans' own again, the values
    keep their types, and the breakdown is the spans' own."""
    dsn, client = chdb
    spans = load_spans(DEMO)
    _fill(client, "otel_traces_json", spans, legacy=False, typed=True)
    described = {row[0]: row[1] for row in client.query("DESC TABLE otel_traces_json").result_rows}
    assert described["SpanAttributes"] == "JSON"
    assert described["Events.Attributes"] == "Array(JSON)"
    count, _ = import_clickhouse(dsn, tmp_path / "store", table="otel_traces_json")
    assert count == len(spans)
    by_id = {s.span_id: s for s in spans}
    back = load_spans(tmp_path / "store")
    dotted = 0
    for span in back:
        original = by_id[span.span_id]
        assert span.attributes == original.attributes, span.name
        assert span.resource == original.resource
        assert [(e.name, e.attributes) for e in span.events] == [
            (e.name, e.attributes) for e in original.events
        ]
        dotted += any("." in key for key in span.attributes)
    assert dotted > len(spans) / 2  # most keys have dots: the joining was tested
    assert any(
        isinstance(v, int) and not isinstance(v, bool) for s in back for v in s.attributes.values()
    )
    assert_breaks_down_as(tmp_path / "store", spans, tmp_path / "files")


def test_a_window_brings_whole_traces(chdb: tuple[str, Any], tmp_path: Path) -> None:
    dsn, client = chdb
    spans = load_spans(DEMO)
    _fill(client, "otel_traces_window", spans, legacy=False)
    starts = sorted(
        {min(s.start_ns for s in spans if s.trace_id == t) for t in {s.trace_id for s in spans}}
    )
    since, until = starts[2], starts[6]  # the traces starting there, and any span inside
    wanted = {s.trace_id for s in spans if since <= s.start_ns < until}
    count, _ = import_clickhouse(
        dsn, tmp_path, table="otel_traces_window", since_ns=since, until_ns=until
    )
    back = load_spans(tmp_path)
    assert {s.trace_id for s in back} == wanted and len(wanted) >= 4
    assert count == len([s for s in spans if s.trace_id in wanted])  # whole: none cut


def test_tables_it_cannot_read_say_why(chdb: tuple[str, Any], tmp_path: Path) -> None:
    dsn, client = chdb
    client.command("CREATE TABLE IF NOT EXISTS not_spans (x Int64) ENGINE = MergeTree ORDER BY x")
    with pytest.raises(StoreError, match="not an otel_traces table: no column Timestamp"):
        import_clickhouse(dsn, tmp_path, table="not_spans")
    with pytest.raises(StoreError, match="cannot read table missing"):
        import_clickhouse(dsn, tmp_path, table="missing")
    assert not list(tmp_path.glob("*.parquet"))


def test_a_server_that_is_not_there_is_named_without_its_password(tmp_path: Path) -> None:
    dsn = "clickhouse://reader:s3cret@127.0.0.1:9/otel"  # the discard port: refused at once
    with pytest.raises(StoreError) as refused:
        import_clickhouse(dsn, tmp_path)
    assert "127.0.0.1:9" in str(refused.value) and "s3cret" not in str(refused.value)


def test_breakdown_and_report_read_a_store_through_the_source_seam(
    chdb: tuple[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--source`` with a window: the store's traces become cached segments, which breakdown
    (by DuckDB) and report read as they read the same spans' JSON lines; a window that has
    ended is read from the cache, even once the table is gone, and ``--refresh`` goes back."""
    dsn, client = chdb
    spans = load_spans(DEMO)
    _fill(client, "otel_traces_source", spans, legacy=False)
    since = min(s.start_ns for s in spans) / 1e9
    until = max(s.end_ns for s in spans) / 1e9 + 1
    cache = tmp_path / "cache"
    store = ["--source", dsn, "--table", "otel_traces_source", "--cache", str(cache)]
    store += ["--since", f"{since:.3f}", "--until", f"{until:.3f}"]
    group = ["--group-by", "gnn_tracking.option"]
    assert main(["breakdown", *store, *group]) == 0
    from_store = capsys.readouterr().out
    assert main(["breakdown", str(DEMO), *group, "--engine", "python"]) == 0
    assert from_store == capsys.readouterr().out and "server gnn" in from_store
    (manifest,) = cache.glob("*/source.json")
    assert "otel_traces_source" in manifest.read_text()
    page = tmp_path / "report.html"
    assert main(["report", *store, *group, "--out", str(page)]) == 0
    from_store = capsys.readouterr().out
    assert main(["report", str(DEMO), *group, "--out", str(tmp_path / "files.html")]) == 0
    from_files = capsys.readouterr().out
    counted = from_store.split(" MB, ", 1)[1].split(" spans", 1)[0]
    assert counted == from_files.split(" MB, ", 1)[1].split(" spans", 1)[0]
    assert f"{len({s.trace_id for s in spans})} traces, {len(spans)}" in counted
    client.command("DROP TABLE otel_traces_source")
    assert main(["breakdown", *store, *group]) == 0  # the cache holds the ended window
    assert main(["breakdown", *store, *group, "--refresh"]) == 2
    assert "cannot read table otel_traces_source" in capsys.readouterr().err


def in_clickhouse_order(spans: list[Span]) -> list[Span]:
    """``spans`` in the order the breakdown reads a table in (``_clickhouse.ORDER``): a table
    keeps no arrival order, and the first of duplicate ids is the first in this one."""
    return sorted(
        spans,
        key=lambda s: (
            s.start_ns,
            s.trace_id,
            s.span_id,
            s.end_ns - s.start_ns,
            s.name,
            s.parent_span_id or "",
        ),
    )


def assert_pushed_down(
    dsn: str, table: str, spans: list[Span], group_by: Sequence[str] = (), root: str | None = None
) -> SqlBreakdown:
    """The breakdown read in ClickHouse, walked there and by both engines here, equals the
    Python path's over the same spans, in the order the table is read; the compiled engine's."""
    ordered = build_traces(in_clickhouse_order(spans)).values()
    python = breakdown(ordered, group_by=group_by, root_name=root)
    found = {}
    for engine in ("clickhouse", "duckdb", "compiled"):
        found[engine] = breakdown_clickhouse(
            dsn, table=table, group_by=group_by, root_name=root, engine=engine
        )
        assert summary(found[engine].groups) == summary(python), engine
        assert found[engine].spans == len({(s.trace_id, s.span_id) for s in spans})
        assert found[engine].traces == len({s.trace_id for s in spans})
    return found["compiled"]  # its delegated traces: Envoy's and Ray Serve's too


@pytest.mark.parametrize("legacy", [False, True], ids=["current", "earlier-names"])
def test_the_breakdown_read_in_clickhouse_is_the_python_paths(
    chdb: tuple[str, Any], legacy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No copy of the table: ClickHouse selects and narrows, DuckDB walks the trees here."""
    dsn, client = chdb
    table = f"otel_traces_in_place_{'earlier' if legacy else 'current'}"
    spans = load_spans(DEMO)
    _fill(client, table, spans, legacy=legacy)
    grouped = ("gnn_tracking.option", semconv.ANSWERED_BY)
    found = assert_pushed_down(dsn, table, spans, grouped)
    roots = sum(s.parent_span_id is None for s in spans)  # each a complete trace of the demo
    assert found.delegated == 0 and sum(g.traces for g in found.groups.values()) == roots
    assert assert_pushed_down(dsn, table, spans, root="reconstruct event").delegated == 0
    # a key and a root's name that SQL's literals must escape, whichever dialect writes them
    assert assert_pushed_down(dsn, table, spans, ("it's \\ odd",)).groups.keys() == {("",)}
    assert assert_pushed_down(dsn, table, spans, root="it's \\").groups == {}
    # Orphans, duplicate ids, a parent cycle, Envoy's spans, a Ray Serve wait: the traces the
    # queries leave to the Python path are fetched whole, and land in their place
    odd = f"{table}_odd"
    _fill(client, odd, shapes() + spans, legacy=legacy)
    # orphan, cycle; asked for one a query; the queries over parts of the traces (about nine)
    monkeypatch.setattr(_clickhouse, "_IDS_A_QUERY", 1)
    monkeypatch.setattr(_sql, "CHUNK_SPANS", 60)
    assert assert_pushed_down(dsn, odd, shapes() + spans, ("option",)).delegated == 2


def test_every_trace_test_breakdown_builds_is_read_alike_in_clickhouse(
    chdb: tuple[str, Any],
) -> None:
    dsn, client = chdb
    fixtures = recorded()
    assert len(fixtures) >= 12
    for index, (name, spans) in enumerate(fixtures):
        table = f"shape_{index}"
        _fill(client, table, spans, legacy=False)
        for group_by in ((), ("option",), (semconv.ANSWERED_BY,)):
            try:
                assert_pushed_down(dsn, table, spans, group_by)
            except AssertionError as error:
                raise AssertionError(f"{name}, grouped by {group_by}: {error}") from error


def test_a_json_typed_table_and_a_window_are_read_in_clickhouse(chdb: tuple[str, Any]) -> None:
    dsn, client = chdb
    spans = load_spans(DEMO)
    _fill(client, "otel_traces_in_place_json", spans, legacy=False, typed=True)
    grouped = ("gnn_tracking.option",)
    assert assert_pushed_down(dsn, "otel_traces_in_place_json", spans, grouped).delegated == 0
    # a window: the traces with a span in it, whole
    first = min(spans, key=lambda s: s.start_ns)
    found = breakdown_clickhouse(
        dsn, table="otel_traces_in_place_json", since_ns=first.start_ns, until_ns=first.start_ns + 1
    )
    assert found.spans == sum(s.trace_id == first.trace_id for s in spans)
    assert found.traces == 1


@pytest.mark.parametrize("typed", [False, True], ids=["map", "json"])
def test_the_sampling_is_counted_in_clickhouse(chdb: tuple[str, Any], typed: bool) -> None:
    dsn, client = chdb
    spans = load_spans(DEMO)
    roots = [s for s in spans if s.parent_span_id is None]
    said = {roots[0].span_id: "slow", roots[1].span_id: "errors", roots[2].span_id: "slow"}
    marked = [
        replace(
            s,
            resource={**s.resource, semconv.OTELKIT_SAMPLER: "parentbased_ratelimiting 10/s"},
            attributes={**s.attributes, semconv.TAIL_SAMPLING_POLICY: said[s.span_id]}
            if s.span_id in said
            else s.attributes,
        )
        for s in spans[: len(spans) // 2]
    ]
    legacy = replace(
        spans[-1],
        attributes={
            **spans[-1].attributes,
            "sampler.type": "probabilistic",
            "sampler.param": 0.001,
        },
        resource={"service.name": "legacy"},
    )
    changed = [*marked, *spans[len(spans) // 2 : -1], legacy]
    table = f"otel_traces_sampling_{'json' if typed else 'map'}"
    _fill(client, table, changed, legacy=False, typed=typed)
    found = breakdown_clickhouse(dsn, table=table).sampling
    expected = Sampling().update(changed)
    assert found is not None and expected.tail and len(expected.head) == 2
    assert (found.roots, found.tail, found.head) == (expected.roots, expected.tail, expected.head)
    assert found.lines() == expected.lines()


def test_the_breakdown_runs_in_clickhouse_and_only_the_roots_come_back(
    chdb: tuple[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Walked in ClickHouse, no span is streamed here: the narrowed spans' reader (which the
    engines here read through) refuses, and the breakdown is still the Python path's. A server
    older than the queries need is walked here by ``auto``, and refused by ``clickhouse``."""
    dsn, client = chdb
    table = "otel_traces_pushed"
    spans = load_spans(DEMO)
    _fill(client, table, spans, legacy=False)
    grouped = ("gnn_tracking.option", semconv.ANSWERED_BY)
    python = breakdown(build_traces(in_clickhouse_order(spans)).values(), group_by=grouped)

    def streamed(*args: Any) -> Iterator[Any]:
        raise AssertionError("spans streamed out of ClickHouse")

    with monkeypatch.context() as patched:
        patched.setattr(_clickhouse, "_tables", streamed)
        found = breakdown_clickhouse(dsn, table=table, group_by=grouped, engine="clickhouse")
    assert summary(found.groups) == summary(python) and found.delegated == 0
    assert found.spans == len(spans)

    def refused(*args: Any) -> SqlBreakdown:
        raise AssertionError("walked in a ClickHouse too old for the queries")

    monkeypatch.setattr(_clickhouse, "_version", lambda client: "25.7.3.1")
    monkeypatch.setattr(_pushdown, "breakdown_pushed", refused)
    found = breakdown_clickhouse(dsn, table=table, group_by=grouped)  # auto
    assert summary(found.groups) == summary(python)
    with pytest.raises(StoreError, match=r"needs ClickHouse 25\.8 or newer.*is 25\.7\.3\.1"):
        breakdown_clickhouse(dsn, table=table, engine="clickhouse")


@pytest.mark.parametrize(
    ("version", "runs"),
    [("25.8.1.5", True), ("26.9.2.1", True), ("25.7.9.1", False), ("24.12.1", False), ("", False)],
)
def test_the_queries_run_on_clickhouse_25_8_and_newer(version: str, runs: bool) -> None:
    assert _pushdown.supported(version) is runs


def test_each_rewrite_into_clickhouses_dialect_applies() -> None:
    """A query of ``_sql`` changed so that a rewrite no longer matches fails here, not in a
    site's ClickHouse; what the rewrites leave holds nothing DuckDB alone spells."""
    statements = _pushdown.in_clickhouse(_sql._TREE + _sql._components_sql("x") + _sql._ROWS)
    text = "\n".join(statements)
    for duckdb_only in ("::", "list_", "arg_max(", "arg_min(", "any_value(", "bool_or(", " lag("):
        assert duckdb_only not in text, duckdb_only
    changed = _sql._TREE.replace("any_value(", "first(")
    with pytest.raises(AssertionError, match="any_value"):
        _pushdown.in_clickhouse(changed + _sql._components_sql("x") + _sql._ROWS)


def test_the_breakdown_command_reads_clickhouse_in_place(
    chdb: tuple[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    dsn, client = chdb
    _fill(client, "otel_traces_command", load_spans(DEMO), legacy=False)
    group = ["--group-by", "gnn_tracking.option"]
    store = ["--source", dsn, "--table", "otel_traces_command", "--engine", "clickhouse"]
    assert main(["breakdown", *store, *group]) == 0
    in_place = capsys.readouterr().out
    assert main(["breakdown", str(DEMO), *group, "--engine", "python"]) == 0
    assert in_place == capsys.readouterr().out and "server gnn" in in_place
    for walk in ("clickhouse", "here"):
        assert main(["breakdown", *store, *group, "--walk", walk]) == 0
        assert capsys.readouterr().out == in_place, walk
    # what it cannot read, said
    assert main(["breakdown", str(DEMO), "--walk", "here"]) == 2
    assert "--walk is for --engine clickhouse" in capsys.readouterr().err
    for cached in (["--cache", "somewhere"], ["--refresh"]):
        assert main(["breakdown", *store, *cached]) == 2
        assert "with no copy: --cache and --refresh" in capsys.readouterr().err
    assert main(["breakdown", str(DEMO), *store]) == 2
    assert "reads one --source clickhouse://" in capsys.readouterr().err
    assert main(["breakdown", "--source", dsn, "--table", "missing", "--engine", "clickhouse"]) == 2
    assert "cannot read table missing" in capsys.readouterr().err
