"""The report read from a span store as columns (``--engine compiled``) against the streaming
pass over the same spans (``--engine python``): the same groups, breakdowns, facts and links on
every fixture; the views of a large group picked from every trace; the traces carried within
``max_spans``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from otelkit import semconv
from otelkit.analysis import Span, SpanKind, iter_spans, load_spans
from otelkit.analysis._breakdown import TOTAL
from otelkit.analysis._store import StoreError, write_segment
from otelkit.cli import main
from otelkit.report import Report
from otelkit.report._collect import WARMUP, Gathered
from otelkit.report._columnar import gather_store
from otelkit.report._stream import TraceStream
from tests.analysis.test_store import DEMO, shapes

MS = 1_000_000
GROUP_BY = ("gnn_tracking.server", "gnn_tracking.option", "gnn_tracking.threads")


def _study_trace(n: int, point: int, phase: str, ms: float, run: str = "r1") -> list[Span]:
    """A study's request: its root (phase, run, point, the swept value), the call and the
    server span; without a server span when ``ms`` is 0 (incomplete)."""
    trace = f"{n + 1:032x}"
    start = n * 100 * MS
    attributes = {
        semconv.STUDY_PHASE: phase,
        semconv.STUDY_RUN: run,
        semconv.STUDY_POINT: point,
        f"{semconv.STUDY_PARAM}.concurrency": point + 1,
    }
    end = start + int((ms or 5) * MS) + 2 * MS
    root = Span(
        trace, "1" * 16, None, semconv.STUDY_SPAN, SpanKind.INTERNAL, start, end, attributes
    )
    call = Span(trace, "2" * 16, root.span_id, "infer", SpanKind.CLIENT, start + MS, end - MS)
    spans = [root, call]
    if ms:
        server = Span(trace, "3" * 16, call.span_id, "infer", SpanKind.SERVER, start + MS, end - MS)
        spans.append(server)
    return spans


def _study() -> list[Span]:
    spans = []
    for n in range(40):
        point = n // 20
        phase = semconv.STUDY_PHASE_WARMUP if n % 20 < 3 else semconv.STUDY_PHASE_MEASURE
        spans += _study_trace(n, point, phase, 0 if n == 7 else 3 + (n * 7919) % 17)
    return spans


def _both(
    spans: list[Span], tmp_path: Path, max_spans: int = 8000, **options: object
) -> tuple[Report, Report]:
    segment = tmp_path / "spans-00000.parquet"
    write_segment(spans, segment)
    python = Report.build([segment], engine="python", max_spans=max_spans, **options)  # type: ignore[arg-type]
    compiled = Report.build([segment], engine="compiled", max_spans=max_spans, **options)  # type: ignore[arg-type]
    return python, compiled


def _same(python: Report, compiled: Report, duplicates: int = 0) -> None:
    """The page's figures alike: what only the order of traces may change is compared as
    sets (the streaming pass takes traces as they complete, the columns by first arrival).
    ``duplicates``: spans whose id another span of their trace has, each counted in its scope
    by the columns, and left out (the first of an id wins) by the streaming pass."""
    assert [label for label, _ in compiled.groups] == [label for label, _ in python.groups]
    for (label, a), (_, b) in zip(python.groups, compiled.groups, strict=True):
        assert set(b.components) == set(a.components), label
        for name, values in a.components.items():
            assert sorted(b.components[name]) == sorted(values), (label, name)
        assert (b.incomplete, sorted(b.problems), b.parts) == (
            a.incomplete,
            sorted(a.problems),
            a.parts,
        ), label
    assert compiled.facets == python.facets
    assert compiled.point_links == python.point_links
    one, other = python.facts, compiled.facts
    assert (other.spans, other.traces) == (one.spans, one.traces)
    assert (other.first_ns, other.last_ns) == (one.first_ns, one.last_ns)
    assert set(other.services) == set(one.services) and other.hosts == one.hosts
    assert sum(other.scopes.values()) == sum(one.scopes.values()) + duplicates
    if not duplicates:
        assert other.scopes == one.scopes
    assert other.sampling.lines() == one.sampling.lines()
    assert (compiled.late_spans, compiled.closed_early) == (0, 0)


def test_the_demos_traces_give_the_same_page_figures(tmp_path: Path) -> None:
    python, compiled = _both(load_spans(DEMO), tmp_path, group_by=GROUP_BY)
    _same(python, compiled)
    assert len(compiled.groups) > 3
    # groups of at most 32 traces, every trace carried: both pick the views of all traces
    assert compiled.views == python.views and compiled.sampled == python.sampled
    assert set(compiled.traces) == set(python.traces)


def test_broken_shapes_and_proxies_take_the_python_path_alike(tmp_path: Path) -> None:
    """Orphans, a parent cycle, duplicate ids, a proxy's spans: the traces the kernel leaves
    to the Python path land in the same groups, counted the same."""
    spans = load_spans(DEMO) + shapes()
    for root in (None, "reconstruct event"):
        python, compiled = _both(spans, tmp_path, group_by=("option",), root_name=root)
        _same(python, compiled, duplicates=1)
        assert set(compiled.traces) == set(python.traces)


def test_a_studys_warmups_points_and_incomplete_traces(tmp_path: Path) -> None:
    swept = (f"{semconv.STUDY_PARAM}.concurrency",)
    python, compiled = _both(_study(), tmp_path, group_by=swept)
    _same(python, compiled)
    labels = [label for label, _ in compiled.groups]
    assert labels == ["concurrency=1", "concurrency=2", WARMUP[0]]
    assert compiled.groups[0][1].incomplete == 1  # trace 8 has no server span
    assert compiled.views == python.views
    # each point's first measured, complete trace, which a study's row links to
    segment = tmp_path / "spans-00000.parquet"
    streamed = Gathered(swept)
    for trace in TraceStream().complete_traces(iter_spans(segment)):
        streamed.add(trace)
    columns = gather_store([segment], swept)
    links = columns.point_traces(columns.views())
    assert links == streamed.point_traces(streamed.views())
    # a group of one point links its median view; the point's first trace is kept beside it
    views = columns.views()
    assert links == {("r1", 0): views[("1",)]["median"], ("r1", 1): views[("2",)]["median"]}
    assert columns.points == {("r1", 0): f"{4:032x}", ("r1", 1): f"{24:032x}"}
    assert set(columns.points.values()) <= set(columns.kept)
    # without grouping keys, a trace groups by its root's name
    python, compiled = _both(_study(), tmp_path)
    _same(python, compiled)
    assert [label for label, _ in compiled.groups] == [semconv.STUDY_SPAN, WARMUP[0]]


def test_a_large_groups_views_are_the_nearest_of_every_trace(tmp_path: Path) -> None:
    """400 traces in one group, 3 spans each, 300 spans carried: the streaming pass picks its
    median and p99 among a sample; the columns pick them among all 400, and carry the traces
    that fit the budget in arrival order."""
    spans = [s for n in range(400) for s in _study_trace(n, 5, "measure", 1 + (n * 7919) % 97)]
    python, compiled = _both(spans, tmp_path, max_spans=300)
    _same(python, compiled)
    ((label, group),) = compiled.groups
    assert compiled.sampled[label] == 400 > python.sampled[label]
    totals = sorted(group.components[TOTAL])
    durations = {form["id"]: form["d"] * 1e-6 for form in compiled.traces.values()}
    for view, q in (("median", 0.5), ("p99", 0.99)):
        target = totals[max(0, math.ceil(q * len(totals)) - 1)]
        chosen = compiled.views[label][view]
        assert abs(durations[chosen] - target) == pytest.approx(
            min(abs(d - target) for d in totals), abs=1e-6
        )
    assert durations[compiled.views[label]["slowest"]] == pytest.approx(totals[-1])
    carried = list(compiled.traces)
    first = [f"{n + 1:032x}" for n in range(100)]  # 100 traces of 3 spans: the budget's
    assert carried[:100] == first
    assert sum(len(compiled.traces[t]["spans"]) for t in first) == 300


def test_the_engines_say_what_they_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(StoreError, match="segments only"):
        Report.build([DEMO], engine="compiled")
    code = main(["report", str(DEMO), "--engine", "compiled", "--out", str(tmp_path / "r.html")])
    assert code == 2 and "segments only" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()
    write_segment(load_spans(DEMO), tmp_path / "spans-00000.parquet")
    out = tmp_path / "page.html"
    assert main(["report", str(tmp_path), "--group-by", GROUP_BY[1], "--out", str(out)]) == 0
    assert "option=4" in out.read_text()
