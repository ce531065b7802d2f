"""What the page needs from a span store, read as columns: the report at a site's volume.

``gather_store`` fills a ``Gathered`` as the streaming pass does (``_collect``), from the
segments' columns: each trace's breakdown by the compiled engine (``analysis._columns``,
grouped as the page groups, by each trace's first root), the run's facts from the columns, and
Python objects only for the traces the page carries (those within ``max_spans``, in arrival
order; each group's views; each study point's first trace). Where the streaming pass picks
each group's median and p99 views among a sample of 32, this knows every trace's duration: the
views are the traces nearest the group's median and p99 of all (``sampled`` counts them all).

Every trace is read whole, wherever its spans lie in the store: there is no grace period, no
span comes late and none is handed on early.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from otelkit import semconv
from otelkit.analysis._breakdown import TOTAL
from otelkit.report._collect import _HOST_KEYS, WARMUP, Facts, Gathered
from otelkit.report._waterfall import encode_trace, json_value

__all__ = ["StoreGathered", "gather_store"]

_NO_ROOT = ("other traces",)


class StoreGathered(Gathered):
    """A ``Gathered`` whose views were chosen from every trace's duration."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.chosen: dict[tuple[str, ...], dict[str, str]] = {}

    def views(self) -> dict[tuple[str, ...], dict[str, str]]:
        return dict(self.chosen)


def gather_store(
    files: Sequence[str | Path],
    group_by: Sequence[str],
    root_name: str | None = None,
    max_spans: int = 8000,
    names: Mapping[str, str] | None = None,
) -> StoreGathered:
    """The page's breakdowns, facts and traces from the span store segments ``files``."""
    import numpy as np

    from otelkit.analysis._columns import ReportMode, report_columns

    gathered = StoreGathered(group_by, root_name=root_name, max_spans=max_spans, names=names)
    n = len(gathered.group_by)

    def key(values: tuple[str, ...]) -> tuple[str, ...]:
        # the groups' values, then the root's study phase, run and point, then its name
        if values[n] == semconv.STUDY_PHASE_WARMUP:
            return WARMUP
        if not n:
            return (values[n + 3],)
        return tuple(gathered.names.get(v, v) for v in values[:n])

    mode = ReportMode(key, gathered._key)
    found = report_columns(files, gathered.group_by, root_name, mode)
    gathered.groups = found.groups
    gathered.facts = _facts(mode, found.spans, found.traces, found.sampling)
    keys = list(found.groups)  # a group's key by its id
    roots = mode.roots
    complete = ~roots["incomplete"].astype(bool)
    seconds = roots["duration_ns"] * 1e-9

    # the traces within max_spans, in arrival order (a trace too large is passed over)
    sizes = mode.spans_of
    total = np.cumsum(sizes)
    fit = int(np.searchsorted(total, max_spans, side="right"))
    kept = list(range(fit))
    used = int(total[fit - 1]) if fit else 0
    for code in (fit + np.nonzero(sizes[fit:] <= max_spans - used)[0]).tolist():
        if used + int(sizes[code]) <= max_spans:
            kept.append(code)
            used += int(sizes[code])
    gathered.kept_spans = used

    # per group, the traces nearest its median and p99 (of all its complete traces) and the
    # slowest, as the streaming pass's ``views`` picks among its candidates
    chosen: dict[tuple[str, ...], dict[str, int]] = {}
    rows = np.nonzero(complete)[0]
    rows = rows[np.argsort(roots["group"][rows], kind="stable")]  # by group, in trace order
    bounds = np.nonzero(np.diff(roots["group"][rows]))[0] + 1
    for mine in np.split(rows, bounds) if len(rows) else []:
        group_key = keys[int(roots["group"][mine[0]])]
        durations = seconds[mine]
        totals = sorted(gathered.groups[group_key].components[TOTAL])
        views = {}
        for view, q in (("median", 0.5), ("p99", 0.99)):
            target = totals[max(0, math.ceil(q * len(totals)) - 1)]
            views[view] = int(roots["trace"][mine[np.argmin(np.abs(durations - target))]])
        views["slowest"] = int(roots["trace"][mine[np.argmax(durations)]])
        chosen[group_key] = views
        gathered.sampled[group_key] = len(mine)

    # each study point's first measured trace (and the points each group holds)
    points: dict[tuple[str, int], int] = {}
    strings = mode.strings
    measured = np.nonzero(complete & (roots["point"] >= 0))[0]
    # each (run, point, group) once, at its first trace, in trace order
    triples = np.stack([roots[k][measured] for k in ("run", "point", "group")], axis=1)
    unique, firsts = np.unique(triples.reshape(-1, 3), axis=0, return_index=True)
    for (run_code, point_code, gid), at in sorted(
        zip(unique.tolist(), firsts.tolist(), strict=True), key=lambda item: item[1]
    ):
        row = int(measured[at])
        group_key = keys[gid]
        try:
            point = (strings[run_code] if run_code >= 0 else "", int(strings[point_code]))
        except ValueError:
            continue  # a point that is not a number names no point of a study
        if group_key == WARMUP:
            continue
        gathered._points_of.setdefault(group_key, set()).add(point)
        points.setdefault(point, int(roots["trace"][row]))

    wanted = [*kept, *points.values(), *(c for v in chosen.values() for c in v.values())]
    traces = mode.traces(wanted)
    trace_ids = mode.trace_ids

    def label_of(code: int) -> str:
        row = int(np.searchsorted(roots["trace"], code))
        if row < len(roots["trace"]) and roots["trace"][row] == code:
            return gathered.label(keys[int(roots["group"][row])])
        return gathered.label(_NO_ROOT)

    for code in dict.fromkeys(wanted):
        trace = traces.get(code)
        if trace is not None:
            gathered.kept[trace.trace_id] = encode_trace(trace, label_of(code))
    gathered.points = {point: trace_ids[code].as_py() for point, code in points.items()}
    gathered.chosen = {
        group_key: {view: trace_ids[code].as_py() for view, code in views.items()}
        for group_key, views in chosen.items()
    }
    return gathered


def _facts(mode: Any, spans: int, traces: int, sampling: Any) -> Facts:
    """The run's facts; ``spans`` those of the traces (the first of a duplicated id alone),
    while the scopes count every span read, a duplicate in its own."""
    seen = mode.facts
    facts = Facts(spans=spans, traces=traces, first_ns=seen.first_ns, last_ns=seen.last_ns)
    facts.sampling = sampling
    for service, resource in seen.resources.items():
        facts.services[service] = {k: json_value(v) for k, v in resource.items()}
        facts.hosts.update(str(resource[k]) for k in _HOST_KEYS if k in resource)
    facts.scopes = dict(seen.scopes)
    return facts
