"""``Report``: traces and study results read once, written as one HTML page and as figures.

>>> report = Report.build(traces=["demo-output/traces"], studies=["study.jsonl"],
...                       group_by=["gnn_tracking.option"])  # doctest: +SKIP
>>> report.write_html("report.html")  # doctest: +SKIP
>>> report.write_figures("figures")  # doctest: +SKIP

With neither traces nor studies the page still opens and says so:

>>> report = Report.build()
>>> report.facts.spans, report.charts
(0, [])
"""

from __future__ import annotations

import gc
import importlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from otelkit import semconv
from otelkit.analysis import iter_spans, trace_files
from otelkit.analysis._breakdown import TOTAL, Breakdown
from otelkit.analysis._store import SUFFIX, StoreError
from otelkit.report._charts import Chart, breakdown_chart, sized
from otelkit.report._collect import APART, Facts, Gathered, natural_order
from otelkit.report._page import render_page
from otelkit.report._sections import (
    breakdown_section,
    chart_blocks,
    facts_section,
    heading_section,
    study_section,
    waterfall_section,
)
from otelkit.report._stream import TraceStream

if TYPE_CHECKING:
    from otelkit.study import StudyResults

__all__ = ["PAGE_SIZE", "Report", "swept_keys"]

_log = logging.getLogger("otelkit.report")

PAGE_SIZE = (440, 260)  # a chart's plot area on the page, in pixels


@dataclass
class Report:
    """Everything the page shows; ``build`` reads it, ``write_html`` and ``write_figures`` write."""

    groups: list[tuple[str, Breakdown]] = field(default_factory=list)
    facts: Facts = field(default_factory=Facts)
    traces: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> waterfall form
    views: dict[str, dict[str, str]] = field(default_factory=dict)  # group -> view -> id
    sampled: dict[str, int] = field(default_factory=dict)  # group -> candidates of its views
    studies: list[tuple[str, StudyResults, list[Chart]]] = field(default_factory=list)
    facets: dict[str, tuple[str, str]] = field(default_factory=dict)  # group -> facet, bar
    point_links: dict[str, list[tuple[str, str | None]]] = field(default_factory=dict)
    late_spans: int = 0
    closed_early: int = 0
    title: str = "otelkit report"

    @classmethod
    def build(
        cls,
        traces: Sequence[str | Path] = (),
        studies: Sequence[str | Path] = (),
        group_by: Sequence[str] = (),
        root_name: str | None = None,
        max_spans: int = 8000,
        grace_s: float = 10.0,
        names: Mapping[str, str] | None = None,
        engine: str = "auto",
    ) -> Report:
        """Read ``traces`` (OTLP JSON files, or folders holding them at any depth) in one
        streaming pass and ``studies`` (results files of ``otelkit study``).

        ``names`` gives a grouping value the name the page shows instead (a fleet's server
        addresses, as ``otelkit.semconv.ANSWERED_BY`` records them, by the names the terminal
        prints).

        With studies and no ``traces``, the traces are read where each results file says its
        study wrote them; with studies and no ``group_by``, traces are grouped by the studies'
        swept parameters (``otelkit.study.param.<name>``).

        ``engine``: ``compiled`` reads span store segments as columns (``_columnar``: no
        Python object but for the traces the page draws, each group's views picked from
        every trace); ``python`` streams every span as a Python object; ``auto`` (default)
        is ``compiled`` where every file is a segment and numba is installed."""
        report = cls()
        read = _read_studies(studies)
        if not traces:
            traces = [found for _, results in read for found in _study_traces(results)]
        if not group_by:
            group_by = swept_keys([results for _, results in read])
        gathered = Gathered(group_by, root_name=root_name, max_spans=max_spans, names=names)
        files = trace_files(*traces) if traces else []
        if files and _compiled(files, engine):
            from otelkit.report._columnar import gather_store

            gathered = gather_store(files, group_by, root_name, max_spans, names)
        elif traces:
            stream = TraceStream(grace_s=grace_s)
            # The reader makes millions of small objects, none in a cycle, while up to
            # 100 000 spans stay alive: each pass of the cycle collector walks them all and
            # finds nothing (docs/performance.md). Reference counting still frees everything.
            collecting = gc.isenabled()
            gc.disable()
            try:
                for trace in stream.complete_traces(iter_spans(*traces)):
                    gathered.add(trace)
            finally:
                if collecting:
                    gc.enable()
            report.late_spans, report.closed_early = stream.late_spans, stream.closed_early
        views = gathered.views()
        order = sorted(gathered.groups.items(), key=lambda item: _place(gathered, item[0]))
        report.views = {gathered.label(key): views[key] for key, _ in order if key in views}
        sampled = gathered.sampled
        report.sampled = {gathered.label(k): sampled[k] for k, _ in order if k in sampled}
        report.groups = [(gathered.label(key), g) for key, g in order]
        report.facets = {gathered.label(key): gathered.facet(key) for key, _ in order}
        report.traces, report.facts = gathered.kept, gathered.facts
        linked = gathered.point_traces(views)
        if studies:  # the study package's imports cost half a second: only when needed
            from otelkit.report._study_charts import study_charts
            from otelkit.study import read_results
        for n, path in enumerate(studies):
            results = read_results(path)
            name = Path(path).stem
            prefix = "study" if len(studies) == 1 else f"study-{n + 1}"
            report.studies.append((name, results, study_charts(results, prefix)))
            run = str(results.header.get("run_id", ""))
            points = [(p.label, linked.get((run, p.index))) for p in results.points]
            report.point_links[name] = points
        return report

    @property
    def breakdown(self) -> Chart | None:
        """The stacked bars of every group with complete traces."""
        bars = {
            label: {c: group.mean(c) * 1e3 for c in group.components if c != TOTAL}
            for label, group in self.groups
            if group.traces
        }
        return breakdown_chart(bars, facets=self.facets) if bars else None

    @property
    def charts(self) -> list[Chart]:
        """Every chart, in the page's order: the breakdown, then each study's."""
        first = [self.breakdown] if self.breakdown is not None else []
        return first + [chart for _, _, charts in self.studies for chart in charts]

    def html(self) -> str:
        """The page, as text."""
        placed: list[tuple[str, Chart]] = []

        def place(charts: Sequence[Chart]) -> str:
            start = len(placed)
            placed.extend((f"chart-{start + n}", chart) for n, chart in enumerate(charts))
            return chart_blocks(placed[start:])

        bars = [self.breakdown] if self.breakdown is not None else []
        sections = [
            heading_section(self.title, [name for name, _, _ in self.studies]),
            f'<p class="facts-line">{self.facts.traces} traces, {self.facts.spans} spans, '
            f"{len(self.facts.services)} services</p>",
            breakdown_section(
                self.groups,
                place(bars),
                self.late_spans,
                self.closed_early,
                self.facts.sampling.lines(),
            ),
            waterfall_section(
                len(self.traces), self.facts.traces, next(iter(self.sampled.values()), 0)
            ),
        ]
        for name, results, charts in self.studies:
            verdicts = [f"[{v.curve or 'all'}] {v.kind}: {v.sentence}" for v in results.verdicts]
            points = self.point_links.get(name, [])
            sections.append(study_section(name, results.header, verdicts, place(charts), points))
        headers = [(name, results.header) for name, results, _ in self.studies]
        sections.append(facts_section(self.facts, headers, self.late_spans))
        data = {
            "charts": [{"id": i, "spec": sized(c.spec, *PAGE_SIZE)} for i, c in placed],
            "traces": self.traces,
            "views": self.views,
            "sampled": self.sampled,
            "facts": {"traces": self.facts.traces, "spans": self.facts.spans},
        }
        return render_page(self.title, sections, data)

    def write_html(self, path: str | Path) -> Path:
        """Write the page to ``path`` (folders made as needed); returns the path."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(self.html(), encoding="utf-8")
        return out

    def write_figures(self, folder: str | Path) -> list[Path]:
        """Every chart as PNG and SVG in ``folder``, sized for a paper column."""
        from otelkit.report._figures import write_figures

        return write_figures(self.charts, Path(folder))


def swept_keys(studies: Sequence[StudyResults]) -> list[str]:
    """The root attributes that name a study's point: one per parameter that takes more than
    one value in a sweep (every parameter, where none does), in the sweep's order.

    >>> from otelkit.study import StudyResults
    >>> swept_keys([StudyResults({"sweep": [{"instances": 1, "concurrency": 1},
    ...                                     {"instances": 1, "concurrency": 2}]}, [])])
    ['otelkit.study.param.concurrency']
    """
    names: dict[str, None] = {}
    for results in studies:
        sweep = results.header.get("sweep") or [p.params for p in results.points]
        values: dict[str, set[str]] = {}
        for params in sweep:
            for name, value in params.items():
                values.setdefault(name, set()).add(str(value))
        varied = [name for name, seen in values.items() if len(seen) > 1] or list(values)
        names.update(dict.fromkeys(varied))
    return [f"{semconv.STUDY_PARAM}.{name}" for name in names]


def _read_studies(studies: Sequence[str | Path]) -> list[tuple[str | Path, StudyResults]]:
    if not studies:
        return []
    from otelkit.study import read_results  # the study package's imports cost half a second

    return [(path, read_results(path)) for path in studies]


def _compiled(files: Sequence[Path], engine: str) -> bool:
    """Whether ``engine`` reads ``files`` as columns (StoreError: it cannot)."""
    if engine not in ("auto", "compiled", "python"):
        raise ValueError(f"engine {engine!r}: auto, compiled or python")
    segments = all(path.name.endswith(SUFFIX) for path in files)
    if engine == "python" or (engine == "auto" and not segments):
        return False
    if not segments:
        raise StoreError("the compiled engine reads span store segments only (otelkit import)")
    try:
        importlib.import_module("numba")
    except ImportError as error:
        if engine == "auto":
            return False
        raise StoreError("the compiled engine needs numba: pip install 'otelkit[store]'") from error
    return True


def _study_traces(results: StudyResults) -> list[Path]:
    """Where a results file says its study wrote its traces, if they are there."""
    where = results.header.get("traces")
    if not where or results.path is None:
        return []
    folder = results.path.parent / str(where)
    if not folder.exists():
        _log.warning("%s: the study's traces are not at %s", results.path, folder)
        return []
    return [folder]


def _place(gathered: Gathered, key: tuple[str, ...]) -> tuple[bool, tuple[object, ...]]:
    """Groups in facet order, numbers as numbers; warm-ups and checks last."""
    return gathered.facet(key)[0] == APART, natural_order(key)
