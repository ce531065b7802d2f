"""What the page needs from the traces, gathered in one pass that keeps little of them.

Each complete trace (from ``TraceStream``) adds its root's breakdown to its group
(``analysis.breakdown``), its spans to the run's facts, and perhaps itself to the traces the
page carries. The page carries, per group, the trace nearest the median duration, the one
nearest the p99 and the slowest — the waterfall's three views — and as many other traces as fit
in ``max_spans``, so that the trace-id box opens them too. Which traces are nearest the median is
known only at the end: a fixed-size random sample of each group (a reservoir of 32) holds the
candidates, and every trace kept in full is a candidate too, so a group of fewer traces than the
budget gets its exact median. The median and p99 views are thus the candidates nearest the
group's median and p99 (the slowest is exact); ``sampled`` counts each group's candidates, and
the page's p99 button says "p99 (nearest of N sampled)".

>>> from otelkit.analysis import Span, SpanKind, build_traces
>>> gathered = Gathered(group_by=())
>>> for n in range(1, 6):
...     root = Span(f"{n:032x}", "01" * 8, None, "event", SpanKind.INTERNAL, 0, n * 10**6)
...     gathered.add(build_traces([root])[root.trace_id])
>>> gathered.views()[("event",)]
{'median': '00000000000000000000000000000003', 'p99': '00000000000000000000000000000005', \
'slowest': '00000000000000000000000000000005'}
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from otelkit import semconv
from otelkit.analysis import Span, Trace
from otelkit.analysis._breakdown import TOTAL, Breakdown, group_key
from otelkit.analysis._sampling import Sampling
from otelkit.report._waterfall import encode_trace, json_value

__all__ = ["APART", "WARMUP", "Facts", "Gathered", "group_label", "natural_order"]

_SAMPLE = 32  # candidates per group for the median and p99 views
_HOST_KEYS = ("host.name", "slurm.node.name", "k8s.node.name")


#: The group of a study's warm-up requests: they are not what a point measures.
WARMUP = ("study warm-up",)
#: The facet of the groups that are not measurements: warm-ups and checks (the demo's runs of
#: each option before it is timed) sit apart, so that they are not compared with the others.
APART = "warm-up and checks"
_APART_VALUES = frozenset({"warmup", "warm-up", "check", WARMUP[0]})


def natural_order(key: tuple[str, ...]) -> tuple[tuple[int, float, str], ...]:
    """Sorts numbers as numbers: ``concurrency=2`` before ``concurrency=10``.

    >>> sorted([("10",), ("2",), ("b",)], key=natural_order)
    [('2',), ('10',), ('b',)]
    """
    out = []
    for value in key:
        try:
            out.append((0, float(value), value))
        except ValueError:
            out.append((1, 0.0, value))
    return tuple(out)


def group_label(key: tuple[str, ...], labels: Sequence[str]) -> str:
    """``option=3 threads=8``: how the page names a group.

    >>> group_label(("3", "8"), ("gnn_tracking.option", "gnn_tracking.threads"))
    'option=3 threads=8'
    """
    if not labels:
        return " ".join(key) or "all traces"
    named = [f"{k.rsplit('.', 1)[-1]}={v}" for k, v in zip(labels, key, strict=False) if v]
    return " ".join(named) or "all traces"


@dataclass
class Facts:
    """The run as the traces tell it: services with their resources, hosts, span counts."""

    spans: int = 0
    traces: int = 0
    first_ns: int | None = None
    last_ns: int = 0
    services: dict[str, dict[str, Any]] = field(default_factory=dict)  # first resource seen
    hosts: set[str] = field(default_factory=set)
    scopes: dict[str, int] = field(default_factory=dict)  # instrumentation scope -> spans
    sampling: Sampling = field(default_factory=Sampling)  # how the traces were chosen

    def add(self, span: Span) -> None:
        self.spans += 1
        self.sampling.add(span)
        if self.first_ns is None or span.start_ns < self.first_ns:
            self.first_ns = span.start_ns
        self.last_ns = max(self.last_ns, span.end_ns)
        service = str(span.resource.get("service.name", "unknown service"))
        if service not in self.services:
            self.services[service] = {k: json_value(v) for k, v in span.resource.items()}
            self.hosts.update(str(span.resource[k]) for k in _HOST_KEYS if k in span.resource)
        self.scopes[span.scope or "(no scope)"] = self.scopes.get(span.scope or "(no scope)", 0) + 1


@dataclass
class _Candidates:
    """A group's traces that may become its median, p99 or slowest view."""

    seen: int = 0
    sample: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    slowest: tuple[float, dict[str, Any]] | None = None


class Gathered:
    """Breakdowns per group, the run's facts and the traces the page carries."""

    def __init__(
        self,
        group_by: Sequence[str],
        root_name: str | None = None,
        max_spans: int = 8000,
        seed: int = 0,
        names: Mapping[str, str] | None = None,
    ) -> None:
        self.group_by = tuple(group_by)
        # a grouping value's readable name (a server's address -> its registered name)
        self.names = dict(names or {})
        self.root_name = root_name
        self.max_spans = max_spans
        self.groups: dict[tuple[str, ...], Breakdown] = {}
        self.facts = Facts()
        self.kept: dict[str, dict[str, Any]] = {}  # trace id -> page form, within max_spans
        self.kept_spans = 0
        self._durations: dict[str, float] = {}  # of the kept traces
        self._candidates: dict[tuple[str, ...], _Candidates] = {}
        self.sampled: dict[tuple[str, ...], int] = {}  # per group, the candidates of its views
        self._random = random.Random(seed)  # a report of the same files is the same page
        # a study's points: (run id, index) -> its first measured trace, kept for the page
        self.points: dict[tuple[str, int], str] = {}
        self._points_of: dict[tuple[str, ...], set[tuple[str, int]]] = {}

    def _root(self, trace: Trace) -> Span | None:
        for root in trace.roots:
            if not trace.is_orphan(root) and self.root_name in (None, root.name):
                return root
        return None

    def _key(self, trace: Trace, root: Span) -> tuple[str, ...]:
        if root.attributes.get(semconv.STUDY_PHASE) == semconv.STUDY_PHASE_WARMUP:
            return WARMUP
        if not self.group_by:
            return (root.name,)
        key = group_key(trace, root, self.group_by)
        return tuple(self.names.get(value, value) for value in key) if self.names else key

    def label(self, key: tuple[str, ...]) -> str:
        if key == WARMUP:
            return WARMUP[0]
        return group_label(key, self.group_by)

    def facet(self, key: tuple[str, ...]) -> tuple[str, str]:
        """Where a group's bar sits in the breakdown: its facet (the first grouping key's value,
        or ``APART``) and its label within it (the other keys' values)."""
        if key == WARMUP or _APART_VALUES & set(key):
            return APART, self.label(key)
        if len(self.group_by) < 2 or len(key) != len(self.group_by):
            return "", self.label(key)
        return group_label(key[:1], self.group_by[:1]), group_label(key[1:], self.group_by[1:])

    def add(self, trace: Trace) -> None:
        """Account for one complete trace."""
        for span in trace.spans.values():
            self.facts.add(span)
        self.facts.traces += 1
        root = self._root(trace)
        key = self._key(trace, root) if root is not None else ("other traces",)
        encoded: dict[str, Any] | None = None
        if self.kept_spans + len(trace.spans) <= self.max_spans:
            encoded = self.kept[trace.trace_id] = encode_trace(trace, self.label(key))
            self.kept_spans += len(trace.spans)
        if root is None:
            return
        group = self.groups.setdefault(key, Breakdown(key))
        if group.add(trace, root) is None:
            return  # incomplete: no median, p99 or slowest view
        duration = root.duration_ns * 1e-9
        if encoded is not None:
            self._durations[trace.trace_id] = duration
        self._offer(key, trace, duration, encoded)
        self._note_point(key, trace, root, encoded)

    def _note_point(
        self, key: tuple[str, ...], trace: Trace, root: Span, encoded: dict[str, Any] | None
    ) -> None:
        """Remember which study point a measured trace belongs to, and keep its first one."""
        index = root.attributes.get(semconv.STUDY_POINT)
        if index is None or key == WARMUP:
            return
        point = (str(root.attributes.get(semconv.STUDY_RUN, "")), int(str(index)))
        self._points_of.setdefault(key, set()).add(point)
        if point not in self.points:
            self.points[point] = trace.trace_id
            if encoded is None:
                self.kept.setdefault(trace.trace_id, encode_trace(trace, self.label(key)))

    def point_traces(
        self, views: dict[tuple[str, ...], dict[str, str]]
    ) -> dict[tuple[str, int], str]:
        """Per study point (run id, index), the trace its waterfall link opens: the median
        view of its group when the group holds that point alone, else its first trace."""
        out = dict(self.points)
        for key, points in self._points_of.items():
            if len(points) == 1 and key in views:
                out[next(iter(points))] = views[key]["median"]
        return out

    def _offer(
        self, key: tuple[str, ...], trace: Trace, duration: float, encoded: dict[str, Any] | None
    ) -> None:
        candidates = self._candidates.setdefault(key, _Candidates())
        candidates.seen += 1

        def page_form() -> dict[str, Any]:
            return encoded if encoded is not None else encode_trace(trace, self.label(key))

        if candidates.slowest is None or duration > candidates.slowest[0]:
            candidates.slowest = (duration, page_form())
        if len(candidates.sample) < _SAMPLE:
            candidates.sample.append((duration, page_form()))
        else:  # reservoir sampling: each trace of the group is in the sample with equal chance
            slot = self._random.randrange(candidates.seen)
            if slot < _SAMPLE:
                candidates.sample[slot] = (duration, page_form())

    def views(self) -> dict[tuple[str, ...], dict[str, str]]:
        """Per group, the trace ids of its median, p99 and slowest views (kept in ``kept``).

        The median and p99 views are the traces nearest the group's median and p99 (from every
        trace's duration) among its candidates: a random sample of up to 32 (``_SAMPLE``), the
        slowest and the traces kept in full; ``sampled`` records how many. The slowest is exact.
        """
        out: dict[tuple[str, ...], dict[str, str]] = {}
        for key, candidates in self._candidates.items():
            if candidates.slowest is None:
                continue
            label = self.label(key)
            pool = {form["id"]: (d, form) for d, form in candidates.sample}
            pool[candidates.slowest[1]["id"]] = candidates.slowest
            for trace_id, form in self.kept.items():
                if form["g"] == label and trace_id in self._durations:
                    pool[trace_id] = (self._durations[trace_id], form)
            self.sampled[key] = len(pool)
            totals = sorted(self.groups[key].components[TOTAL])
            chosen = {}
            for view, q in (("median", 0.5), ("p99", 0.99)):
                target = totals[max(0, math.ceil(q * len(totals)) - 1)]
                chosen[view] = min(pool.values(), key=lambda item: abs(item[0] - target))[1]
            chosen["slowest"] = candidates.slowest[1]
            for form in chosen.values():
                self.kept.setdefault(form["id"], form)
            out[key] = {view: form["id"] for view, form in chosen.items()}
        return out
