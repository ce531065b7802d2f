"""otelkit.analysis._sql and ._columns: the breakdown as DuckDB queries over the span store, and
in compiled code over its columns, equals the Python path's, trace for trace, on every trace the
analysis tests build.

Each fixture is written to a segment and broken down both ways: the groups, each component's
value for each trace (in the same order), the components' order, the problems, the incomplete
counts and the server's parts must agree. The fixtures: the committed demo traces; every trace
that tests/analysis/test_breakdown.py builds (recorded as its tests run); the store's shapes
(orphans, duplicate ids, a parent cycle, Envoy, a Ray Serve wait); and shapes the queries meet
only here (an ASGI server's cuts, parallel ensemble steps, a call from a client stage and from
the server, ties in start time, roots of several kinds, typed group values).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

import tests.analysis.test_breakdown as hand
from otelkit import semconv
from otelkit.analysis import Span, SpanKind, build_traces, load_spans
from otelkit.analysis._breakdown import Breakdown, breakdown, format_breakdowns
from otelkit.analysis._columns import breakdown_columns
from otelkit.analysis._sampling import Sampling
from otelkit.analysis._sql import breakdown_store
from otelkit.analysis._store import write_segment
from otelkit.cli import main
from tests.analysis.test_store import DEMO, shapes

MS = 1_000_000


def _same(python: dict[tuple[str, ...], Breakdown], sql: dict[tuple[str, ...], Breakdown]) -> None:
    assert set(python) == set(sql)
    for key, want in python.items():
        got = sql[key]
        assert got.incomplete == want.incomplete, key
        assert got.problems == want.problems, key
        assert got.parts == want.parts, key
        assert list(got.components) == list(want.components), key  # the order a request meets
        for name, values in want.components.items():
            assert list(got.components[name]) == pytest.approx(values, abs=1e-12), (key, name)


def both_ways(
    spans: list[Span], tmp_path: Path, group_by: tuple[str, ...] = (), root: str | None = None
) -> int:
    """Break ``spans`` down by the Python path, the queries and the compiled kernel, assert
    they agree; the traces the queries delegated."""
    segment = tmp_path / "spans-00000.parquet"
    write_segment(spans, segment)
    python = breakdown(build_traces(spans).values(), group_by=group_by, root_name=root)
    sql = breakdown_store([segment], group_by=group_by, root_name=root)
    compiled = breakdown_columns([segment], group_by=group_by, root_name=root)
    said = Sampling().update(spans)
    assert compiled.sampling is not None
    assert (compiled.sampling.roots, compiled.sampling.tail) == (said.roots, said.tail)
    assert compiled.sampling.head == said.head
    for found in (sql, compiled):
        _same(python, found.groups)
        assert format_breakdowns(found.groups, group_by) == format_breakdowns(python, group_by)
        assert found.spans == len({(s.trace_id, s.span_id) for s in spans})
        assert found.traces == len({s.trace_id for s in spans})
    return sql.delegated


def recorded() -> list[tuple[str, list[Span]]]:
    """The span lists test_breakdown's tests build their traces from, recorded as they run."""
    found: list[tuple[str, list[Span]]] = []
    original = hand.build_traces
    name = ""

    def recording(spans: list[Span]) -> object:
        spans = list(spans)
        found.append((name, spans))
        return original(spans)

    hand.build_traces = recording  # type: ignore[assignment]
    try:
        for name in sorted(n for n in dir(hand) if n.startswith("test_")):
            test: Callable[[], None] = getattr(hand, name)
            if test.__code__.co_argcount == 0:
                test()
    finally:
        hand.build_traces = original
    return found


def test_every_trace_test_breakdown_builds_breaks_down_alike(tmp_path: Path) -> None:
    fixtures = recorded()
    assert len(fixtures) >= 12
    for index, (name, spans) in enumerate(fixtures):
        folder = tmp_path / str(index)
        folder.mkdir()
        for group_by in ((), ("option",), (semconv.ANSWERED_BY,)):
            try:
                both_ways(spans, folder, group_by)
            except AssertionError as error:
                raise AssertionError(f"{name}, grouped by {group_by}: {error}") from error


def test_the_demo_traces_break_down_alike_with_no_trace_delegated(tmp_path: Path) -> None:
    spans = load_spans(DEMO)
    assert both_ways(spans, tmp_path, ("gnn_tracking.option", semconv.ANSWERED_BY)) == 0
    assert both_ways(spans, tmp_path, root="reconstruct event") == 0


def test_the_stores_odd_shapes_are_delegated_and_agree(tmp_path: Path) -> None:
    """Orphans, duplicate ids, a parent cycle, Envoy's spans, a Ray Serve wait: the Python path
    reads those traces, and its answer lands in the groups in their place."""
    assert both_ways(shapes() + load_spans(DEMO), tmp_path, ("option",)) == 2  # orphan, cycle


def _span(
    parent: Span | str,
    name: str,
    start: float,
    end: float,
    kind: SpanKind = SpanKind.INTERNAL,
    events: dict[str, float] | None = None,
    **attributes: object,
) -> Span:
    """test_breakdown's ``span``, its events named by any string (Triton's, otelkit's)."""
    return hand.span(
        parent, name, start, end, kind, events=hand.events(**(events or {})), **attributes
    )


_stage = hand.stage


def queries_only() -> list[Span]:
    """Shapes the other fixtures lack."""
    out: list[Span] = []
    # an ASGI server (otelkit's middleware cuts), a stage in its handler, a call out
    root = _span("1" * 32, "event", 0, 40, option=True, tags=["a", "b"])
    call = _span(
        root,
        "POST /predict",
        1,
        30,
        SpanKind.CLIENT,
        **{semconv.SERVER_ADDRESS: "127.0.0.1", semconv.SERVER_PORT: 8000},
    )
    asgi = {
        semconv.HTTP_REQUEST_RECEIVED: 4,
        semconv.HTTP_RESPONSE_STARTED: 20,
        semconv.HTTP_RESPONSE_SENT: 26,
    }
    server = _span(call, "POST /predict", 2, 28, SpanKind.SERVER, asgi)
    work = _stage(server, "infer", 6, 12)
    out_call = _span(server, "GET /features", 13, 17, SpanKind.CLIENT)
    out_server = _span(out_call, "GET /features", 14, 16, SpanKind.SERVER)
    helper = _span(server, "decode", 5, 6)  # a span of its own time
    same = _span(server, "infer", 17, 19)  # named as a stage: told apart
    out += [root, call, server, work, out_call, out_server, helper, same]
    # a call made from inside a client stage, and a second call; ties in start time
    local = _stage(root, "prepare", 30, 35)
    inner = _span(local, "infer", 31, 34, SpanKind.CLIENT)
    out += [local, inner, _span(inner, "InferRequest", 32, 33, SpanKind.SERVER)]
    second = _span(root, "infer", 35, 39, SpanKind.CLIENT, **{semconv.CONNECT_S: 0.0005})
    tied = _span(second, "InferRequest", 36, 38, SpanKind.SERVER)
    out += [second, tied, _span(second, "InferRequest", 36, 38, SpanKind.SERVER)]
    # an ensemble with parallel steps over gRPC, Triton's four compute events on one
    root2 = _span("2" * 32, "event", 0, 50, option=2.5)
    call2 = _span(
        root2,
        "ModelInfer",
        1,
        49,
        SpanKind.CLIENT,
        **{semconv.SERIALIZE_S: 0.001, semconv.DESERIALIZE_S: 0.002, semconv.MODEL_NAME: "chain"},
    )
    request = _span(
        call2,
        "InferRequest",
        4,
        47,
        SpanKind.SERVER,
        {
            "GRPC_WAITREAD_START": 0.5,
            "GRPC_WAITREAD_END": 3.5,
            "GRPC_SEND_START": 45,
            "GRPC_SEND_END": 48,
        },
    )
    ensemble = _span(request, "chain", 5, 44, **{semconv.TRITON_SPAN_MODEL_NAME: "chain"})
    out += [root2, call2, request, ensemble]
    for name, a, b in (("left", 6, 30), ("right", 7.5, 40)):  # queues overlap
        model = _span(
            ensemble,
            name,
            a,
            b,
            events={"QUEUE_START": a + 1},
            **{semconv.TRITON_SPAN_MODEL_NAME: name},
        )
        compute = _span(
            model,
            "compute",
            a + 3,
            b - 1,
            events={
                "COMPUTE_START": a + 3,
                "COMPUTE_INPUT_END": a + 4,
                "COMPUTE_OUTPUT_START": b - 3,
                "COMPUTE_END": b - 1,
            },
        )
        out += [model, compute]
        if name == "left":
            out.append(_stage(compute, "gnn", a + 5, b - 5))
    # through Envoy: a first attempt that reached nothing, a retry that did (the server's
    # receive before its span, within the attempt; the server starting before the proxy)
    root3 = _span("5" * 32, "event", 0, 30, option=3)
    call3 = _span(root3, "infer", 1, 29, SpanKind.CLIENT, **{semconv.SERIALIZE_S: 0.0002})
    proxy = _span(call3, "ingress", 2, 28, SpanKind.SERVER, **{semconv.PROXY_COMPONENT: "proxy"})
    failed = _span(proxy, "router a", 3, 6, SpanKind.CLIENT, upstream_address="10.0.0.1:8000")
    out.append(_span(failed, "InferRequest", 4, 5, SpanKind.SERVER))  # answered, then retried
    retry = _span(proxy, "router b", 7, 27, SpanKind.CLIENT, upstream_address="10.0.0.2:8000")
    behind = {"HTTP_RECV_START": 7.5, "HTTP_RECV_END": 8.5, "HTTP_SEND_START": 25.5}
    answered = _span(
        retry, "InferRequest", 1.5, 26, SpanKind.SERVER, behind | {"HTTP_SEND_END": 26.5}
    )
    out += [root3, call3, proxy, failed, retry, answered]
    # a proxy whose attempts reached no server: left out, counted
    root4 = _span("6" * 32, "event", 0, 10, option=3)
    call4 = _span(root4, "infer", 1, 9, SpanKind.CLIENT)
    proxy4 = _span(call4, "ingress", 2, 8, SpanKind.SERVER, **{semconv.PROXY_COMPONENT: "proxy"})
    out += [root4, call4, proxy4, _span(proxy4, "router a", 3, 7, SpanKind.CLIENT)]
    # Ray Serve: a handle call's wait routed twice (two router spans inside it, one spilling
    # past it), a replica span whose request outlives otelkit's two spans under it
    root5 = _span("7" * 32, "event", 0, 40, option=5)
    call5 = _span(root5, "POST /infer", 1, 39, SpanKind.CLIENT)
    ingress = _span(
        call5, "POST /infer", 2, 38, SpanKind.SERVER, **{semconv.RAY_SERVE_DEPLOYMENT: "In"}
    )
    wait = _span(
        ingress, semconv.RAY_SERVE_QUEUE_SPAN, 3, 15, **{semconv.RAY_SERVE_DEPLOYMENT: "M"}
    )
    first = _span(ingress, "route_to_replica M run", 4, 6, SpanKind.SERVER)
    again = _span(ingress, "route_to_replica M run", 9, 16, SpanKind.SERVER)
    replica = _span(
        again, "replica_handle_request M run", 15.5, 36, SpanKind.SERVER, deployment="M"
    )
    mine = _span(replica, "M.run", 17, 30, SpanKind.SERVER, **{semconv.RAY_SERVE_DEPLOYMENT: "M"})
    late = _span(replica, "M.post", 18, 25, **{semconv.RAY_SERVE_DEPLOYMENT: "M"})
    out += [root5, call5, ingress, wait, first, again, replica, mine, late]
    # a root with no call, one named otherwise, a root that is itself a call
    out.append(_span("3" * 32, "event", 0, 5, option=None))
    out.append(_span("3" * 32, "warm-up", 6, 9))
    lone = _span("4" * 32, "infer", 0, 10, SpanKind.CLIENT, option=7)
    out += [lone, _span(lone, "InferRequest", 1, 9, SpanKind.SERVER)]
    return out


@pytest.mark.parametrize("root", [None, "event"])
def test_shapes_only_the_queries_meet_break_down_alike(root: str | None, tmp_path: Path) -> None:
    spans = queries_only()
    for group_by in (("option",), ("tags", semconv.ANSWERED_BY)):
        assert both_ways(spans, tmp_path, group_by, root) == 0


def test_segments_are_read_in_order_and_the_first_of_duplicate_ids_wins(tmp_path: Path) -> None:
    spans = load_spans(DEMO)
    write_segment(spans[:200], tmp_path / "spans-00000.parquet")
    # the second segment repeats ids with other times: the first arrival must win
    later = [
        Span(s.trace_id, s.span_id, s.parent_span_id, s.name, s.kind, s.start_ns, s.end_ns + MS)
        for s in spans[:50]
    ]
    write_segment(later + spans[200:], tmp_path / "spans-00001.parquet")
    segments = sorted(tmp_path.glob("*.parquet"))
    sql = breakdown_store(segments, group_by=("gnn_tracking.option",))
    python = breakdown(build_traces(spans + later).values(), group_by=("gnn_tracking.option",))
    _same(python, sql.groups)
    _same(python, breakdown_columns(segments, group_by=("gnn_tracking.option",)).groups)


def test_the_cli_breaks_a_store_down_by_duckdb_as_by_python(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "store"
    assert main(["import", str(DEMO), "--out", str(store), "--segment-spans", "150"]) == 0
    capsys.readouterr()
    printed = {}
    for engine in ("compiled", "duckdb", "python", "auto"):
        args = ["breakdown", str(store), "--group-by", "gnn_tracking.option", "--engine", engine]
        assert main(args) == 0
        printed[engine] = capsys.readouterr().out
    assert printed["duckdb"] == printed["python"] and "server queue" in printed["duckdb"]
    assert printed["compiled"] == printed["python"] == printed["auto"]
    # trace files are not segments: the SQL engine says what it reads
    assert main(["breakdown", str(DEMO), "--engine", "duckdb"]) == 2
    assert "segments only" in capsys.readouterr().err
    # a segment cut short (a writer killed before its footer) is named and left out
    first = sorted(store.glob("*.parquet"))[0]
    first.write_bytes(first.read_bytes()[:-64])
    for engine in ("duckdb", "compiled"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="otelkit.analysis"):
            assert main(["breakdown", str(store), "--engine", engine]) == 0
        assert any(
            first.name in r.getMessage() and "left out" in r.getMessage() for r in caplog.records
        )
        assert "traces" in capsys.readouterr().out


def test_ids_that_are_not_hex_take_the_python_path(tmp_path: Path) -> None:
    """The queries join on the integers the ids spell: a trace whose ids are not hex (another
    writer's, or corrupt) is broken down by the Python path, alike."""
    spans = load_spans(DEMO)
    odd = [
        Span(
            "not-hex-" + s.trace_id[8:],
            "span-" + s.span_id[5:],
            None if s.parent_span_id is None else "span-" + s.parent_span_id[5:],
            s.name,
            s.kind,
            s.start_ns,
            s.end_ns,
            s.attributes,
            events=s.events,
        )
        for s in spans[:40]
    ]
    assert both_ways(spans + odd, tmp_path, ("gnn_tracking.option",)) == len(
        {s.trace_id for s in odd}
    )


def test_traces_read_in_chunks_break_down_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``CHUNK_SPANS`` the queries run over parts of the traces, each trace whole in one:
    the answer is the same, the delegated traces' included."""
    import otelkit.analysis._columns as columns
    import otelkit.analysis._sql as sql

    monkeypatch.setattr(sql, "CHUNK_SPANS", 60)  # the fixtures' ~500 spans: about nine parts
    # the compiled kernel reads units of 64 rows: traces cross them, and wait for their last
    monkeypatch.setattr(columns, "_UNIT_ROWS", 64)
    monkeypatch.setattr(columns, "_BATCH_ROWS", 48)
    spans = load_spans(DEMO) + shapes() + queries_only()
    assert both_ways(spans, tmp_path, ("option", semconv.ANSWERED_BY)) == 2
    assert both_ways(spans, tmp_path, ("gnn_tracking.option",), "reconstruct event") == 2
