"""What caps throughput along a curve: the resource the operational laws name, and what to do.

A verdict is decided as a structure (``Verdict``: the kind, the resource, its evidence, the
plateau measured and the one predicted) and written as a sentence in one place (``_sentence``).

The method (docs/study.md): at the point where throughput peaks, every resource's utilisation is
weighed with the demand it had at the lowest point, U* = X_peak . D_low / m. A demand that grows
with load is a wait for something else, so the low-load demand is the resource's own: the
resource whose U* is nearest 1 is the one that stops throughput, and the bottleneck law predicts
the plateau from the lowest point alone, m / D_low. Where throughput stopped (a plateau, a fall
past its peak) and nothing is at its limit by U* there, the resources are read at the highest
point by the utilisation law itself, U = X . D of that point: a run whose highest point fell and
one whose peak held then name the same limit. Along instances (or servers) the resources they
share are always read so, at the most instances' point: the fewest instances' demand is not
theirs. A resource is at its limit where its U* (or U) reaches 0.8 within its noise: its
windows' t-interval, their scatter pooled over the study's points (``pooled_noise``).

- **saturated**: a model's instances (or a GPU) are busy all the time with their demand flat:
  add instances or batch; or the load balancer in front of a fleet (its worker threads' CPU):
  more workers or balancers, not more servers;
- **contended**: a demand grows with load because another resource is at its limit, named:
  a stage that serves one request at a time (a lock or the GIL: its hold time, the low-load
  stage time, explains the plateau as 1 / hold), or the host's cores (more busy instances than
  cores); more instances will not help. When no measured resource is at its limit, the stage
  (or model) whose demand grew most is named and the resource it waits for is unknown;
- **client**: the client process's CPU (one core under Python's GIL) is the limit: more
  threads will not help, more client processes will (a Python server's own process under its
  GIL is named as a contended ``gil``: more worker processes will help);
- **network**: the link the study was told of (``Study(link_gbps=...)``) carries the busier
  direction of each request's tensors all the time: smaller payloads or a faster link;
  when no link rate is given and moving the tensors (the client's (de)serialising, network +
  offload) grows most while no measured resource is at its limit, the resource is
  ``transfer`` and no plateau is predicted;
- **batching**: at light load, requests wait within a dynamic batcher's configured delay: the
  latency is the batcher's, and throughput rises as batches fill;
- **rising**: nothing is at its limit within the sweep; the nearest limit is said, predicted;
- **underloaded** (along instances, or servers): more do not pay and none is busy: the load
  does not keep them busy;
- **unknown**: throughput stops while no measured resource is at its limit and no demand grew;
- **overload**: the server refused requests past its capacity (``_overload``): the capacity,
  where refusals start, and whether goodput holds or collapses past it;
- **failed**: the curve holds points that failed or erred: no verdict on it.

>>> from otelkit.study._point import Point
>>> low = Point(0, {"concurrency": 1}, requests=400, seconds=4.0, cpu_s=3.6)
>>> high = Point(1, {"concurrency": 4}, requests=420, seconds=4.0, cpu_s=3.9)
>>> verdict = judge([low, high], "concurrency")
>>> verdict.kind, verdict.limit, round(verdict.predicted_per_s or 0)
('client', "the client's CPU", 111)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from otelkit.analysis._breakdown import NETWORK, RENAMED, SERVER_QUEUE
from otelkit.study._capacity import Noise, Spread, pooled_noise, resources, separation, spread
from otelkit.study._derived import LOAD_AXES, along, knee
from otelkit.study._falsify import least_demands, revise
from otelkit.study._overload import overload
from otelkit.study._point import Point

__all__ = ["Evidence", "Kind", "Verdict", "judge", "verdicts"]

Kind = Literal[
    "saturated",
    "contended",
    "client",
    "batching",
    "network",
    "rising",
    "underloaded",
    "unknown",
    "undecided",
    "overload",
    "failed",
]
_Make = Callable[..., "Verdict"]  # (kind, resource evidence, sentence, change)
#: resources inferred from a wait rather than measured: one at a time, k at a time
_HYPOTHESES = ("lock", "pool")
_AXIS_WORDS = {
    "concurrency": "threads",
    "rate": "requests/s",
    "instances": "instances",
    "servers": "servers",
}
#: a demand at the peak below this share of the lowest point's fell with load; above, the two
#: differ by no more than a point's windows do at a steady load (docs/study.md)
_FALLS = 0.95
#: a demand's relative spread where a point's windows do not carry their own (a stage's from
#: the traces, a results file from before windows were read): what they gave a steady
#: instance's demand on this 2-core host, ±4-6 % (tests/study/test_windows.py)
_DEMAND_SPREAD = 0.05
#: the axes along which more of the deployment serves the same load: the question is why the
#: most of it does not pay, read where there is the most of it
_SCALE_AXES = ("instances", "servers")


@dataclass(frozen=True)
class Evidence:
    """One resource along a curve: its demand at the lowest point and where throughput peaks.

    ``kind`` is the resource's (``capacity.ResourceKind``), or ``lock`` for a stage that the
    figures show serving one request at a time."""

    key: str
    kind: str
    name: str
    servers: float | None
    low_ms: float
    peak_ms: float
    utilisation: float | None  # measured at the peak: X . D_peak / m, or read directly
    peak_per_s: float  # the throughput where it peaks
    model: str | None = None
    # the least demand the study measured at this m, where the curve's own demand quotes a
    # capacity below a throughput measured (``_falsify.least_demands``), and that point's label
    least_ms: float | None = None
    least_at: str | None = None

    @property
    def growth(self) -> float:
        return self.peak_ms / self.low_ms if self.low_ms > 0 else float("inf")

    @property
    def falls(self) -> bool:
        """The demand fell with load (overhead a request amortised, batches that fill): the
        resource's own demand is the one at the peak, where the utilisation law reads it."""
        return 0 < self.peak_ms < _FALLS * self.low_ms

    @property
    def demand_ms(self) -> float:
        """The resource's own demand a request: the lowest point's, where nothing waits, or the
        peak's where it fell with load (a demand that grew is a wait for something else)."""
        own = self.peak_ms if self.falls else self.low_ms
        return min(own, self.least_ms) if self.least_ms is not None else own

    @property
    def load(self) -> float | None:
        """U* = X_peak . D / m: the utilisation the resource's own demand gives at the peak."""
        if not self.servers:
            return None
        return self.peak_per_s * self.demand_ms / 1e3 / self.servers

    @property
    def limit_per_s(self) -> float | None:
        """The bottleneck law: m / D, D the resource's own demand (``demand_ms``)."""
        demand = self.demand_ms
        return self.servers / (demand / 1e3) if self.servers and demand > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "kind": self.kind,
            "name": self.name,
            "servers": self.servers,
            "low_ms": self.low_ms,
            "peak_ms": self.peak_ms,
            "utilisation": self.utilisation,
            "peak_per_s": self.peak_per_s,
            "model": self.model,
            "least_ms": self.least_ms,
            "least_at": self.least_at,
            "load": self.load,
            "demand_ms": self.demand_ms,
            "limit_per_s": self.limit_per_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Evidence:
        return cls(
            data["key"],
            data["kind"],
            RENAMED.get(data["name"], data["name"]),
            data.get("servers"),
            float(data["low_ms"]),
            float(data["peak_ms"]),
            data.get("utilisation"),
            float(data["peak_per_s"]),
            data.get("model"),
            data.get("least_ms"),
            data.get("least_at"),
        )


@dataclass(frozen=True)
class Verdict:
    """What caps throughput along one curve: the structure, and its sentence."""

    curve: str
    axis: str
    kind: Kind
    limit: str | None  # the resource's name: a model, a stage, "the host's 2 cores"
    sentence: str
    resource: str | None = None  # the limiting resource's kind (Evidence.kind)
    plateau_per_s: float | None = None  # measured: the highest throughput, when it stopped
    predicted_per_s: float | None = None  # derived: m / D_low of the limiting resource
    change: str = ""  # what to change
    evidence: tuple[Evidence, ...] = field(default_factory=tuple)  # by U*, highest first

    def to_dict(self) -> dict[str, Any]:
        return {
            "record": "verdict",
            "curve": self.curve,
            "axis": self.axis,
            "kind": self.kind,
            "limit": self.limit,
            "resource": self.resource,
            "sentence": self.sentence,
            "plateau_per_s": self.plateau_per_s,
            "predicted_per_s": self.predicted_per_s,
            "change": self.change,
            "evidence": [e.to_dict() for e in self.evidence],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        return cls(
            data["curve"],
            data["axis"],
            data["kind"],
            RENAMED.get(data.get("limit") or "", data.get("limit")),
            data["sentence"],
            data.get("resource"),
            data.get("plateau_per_s"),
            data.get("predicted_per_s"),
            data.get("change", ""),
            tuple(Evidence.from_dict(e) for e in data.get("evidence", [])),
        )


@dataclass(frozen=True)
class _Curve:
    """The facts of one curve that every verdict's sentence draws on."""

    axis: str
    unit: str
    tolerance: float
    low: Point
    peak: Point
    high: Point
    stopped: bool  # throughput stopped rising (the knee's plateau, an open loop falling behind)
    # resources measured busier than their parallelism: the hypothesis of their m is wrong
    refuted: Sequence[Evidence] = ()
    # each resource's windows' noise, pooled over the study's points (``pooled_noise``)
    noise: Noise = field(default_factory=lambda: Noise({}))
    _spreads: dict[int, dict[str, Spread]] = field(default_factory=dict, compare=False)

    def spreads(self, point: Point) -> dict[str, Spread]:
        """Each resource of ``point`` over its windows, read once a point."""
        if id(point) not in self._spreads:
            self._spreads[id(point)] = spread(point)
        return self._spreads[id(point)]

    def span(self) -> str:
        words = _AXIS_WORDS.get(self.axis, self.axis)
        return f"from {self.low.params[self.axis]} to {self.high.params[self.axis]} {words}"

    def per_s(self, value: float) -> str:
        return f"{value:.0f} {self.unit}s/s"

    def throughput(self) -> str:
        """How throughput went along the curve, the curve's span said with it."""
        top = self.per_s(self.peak.throughput)
        if self.high.throughput < (1 - self.tolerance) * self.peak.throughput:
            where = f"{self.peak.params[self.axis]} {_AXIS_WORDS.get(self.axis, self.axis)}"
            return (
                f"throughput peaks at {top} ({where}) and falls to "
                f"{self.high.throughput:.0f} at {self.high.params[self.axis]}"
            )
        offered = self.high.params.get("rate")
        if offered and self.high.throughput < (1 - self.tolerance) * float(offered):
            return (
                f"{self.span()} offered, at most {top} are served: at "
                f"{float(offered):.0f}/s the rest wait in the client's backlog"
            )
        if self.stopped:
            return f"throughput plateaus at {top} {self.span()}"
        return f"throughput reaches {top} {self.span()}, still rising"


def _evidence(low: Point, peak: Point) -> list[Evidence]:
    at_low, at_peak = resources(low), resources(peak)
    rows = []
    for key, top in at_peak.items():
        first = at_low.get(key)
        if first is None:
            continue
        rows.append(
            Evidence(
                key,
                top.kind,
                top.name,
                top.servers,
                first.demand_ms,
                top.demand_ms,
                top.utilisation,
                peak.throughput,
                top.model,
            )
        )
    return rows


def _at_least(rows: list[Evidence], study: Sequence[Point]) -> list[Evidence]:
    """Each resource whose capacity from this curve's demand lies below a throughput the study
    measured at the same m, with the least demand it measured there: the bottleneck law holds at
    every point, so that is the nearer to its own. No noise margin: a capacity quoted a few
    percent below the throughput printed beside it reads as a contradiction, and the least
    demand measured never quotes less than the demand it replaces."""
    if not study:
        return rows
    least = least_demands(study)
    measured = [(p, set(resources(p))) for p in study if p.status == "ok"]
    out = []
    for row in rows:
        found = least.get((row.key, round(row.servers or 0, 1)))
        limit = row.limit_per_s
        if found is not None and limit is not None and found[0] < row.demand_ms:
            demand, where = found
            beaten = [p for p, keys in measured if row.key in keys and p.throughput > limit]
            if beaten:
                row = replace(row, least_ms=demand, least_at=where.label)
        out.append(row)
    return out


def _held(rows: Sequence[Evidence], tolerance: float, floor_ms: float) -> list[Evidence]:
    """A stage whose demand grew is, as a hypothesis, waiting for something that serves k
    requests at a time (a lock or the GIL at k = 1; a GPU semaphore, a connection pool,
    licences at k > 1): its low-load time is the hold, and X_peak . hold / k its utilisation.
    Untraced (no stage of it in the traces), a model whose compute grew is read the same way,
    its whole time the hold.

    k is X_peak . hold rounded: a pool is only claimed where that figure lies within the
    tolerance of a whole k below the model's instances (each instance serves one: k of them
    or more could not make a request wait); at k = 1 any figure up to 1 is a lock's, which a
    stage may share with other models, except in a model of one instance, which serves one
    request at a time already: the lock would be the instance, named as such."""
    found = []
    traced = {row.model for row in rows if row.kind == "stage"}
    for row in rows:
        grew = row.peak_ms - row.low_ms
        if row.kind not in ("stage", "instances") or row.growth <= 1 + tolerance:
            continue
        if row.kind == "instances" and row.name in traced:
            continue  # its stages say which part of it waits, and their holds
        if grew <= floor_ms:
            continue
        busy = row.peak_per_s * row.low_ms / 1e3
        k = max(1, round(busy))
        if k == 1 and busy > 1 + tolerance:
            continue  # nothing that serves one at a time can do that
        if k > 1 and abs(busy - k) > tolerance * k:
            continue
        if row.servers and k >= row.servers:  # a stage's servers: its model's instances
            continue
        kind = "lock" if k == 1 else "pool"
        model = row.model if row.kind == "stage" else row.name
        found.append(
            Evidence(
                f"{kind} {row.name}",
                kind,
                row.name,
                k,
                row.low_ms,
                row.peak_ms,
                None,
                row.peak_per_s,
                model,
            )
        )
    return found


def _batching(curve: _Curve) -> tuple[str, float, float] | None:
    """(model, its queue, its configured delay) when the lowest point's requests wait within
    a dynamic batcher's delay for most of the time the server has them."""
    for model, figures in curve.low.triton.items():
        delay = figures.batch_delay_ms
        if not delay or figures.queue_ms < 0.5 * delay or figures.queue_ms > 1.5 * delay:
            continue
        if figures.queue_ms >= 0.3 * (figures.queue_ms + figures.compute_ms):
            return model, figures.queue_ms, delay
    return None


def judge(
    points: Sequence[Point],
    axis: str,
    curve: str = "",
    *,
    unit: str = "request",
    tolerance: float = 0.1,
    study: Sequence[Point] = (),
    noise: Noise | None = None,
) -> Verdict:
    """The verdict on one curve: ``points`` along ``axis``, at least two of them; ``study``:
    every point of the study, against which each resource's capacity is checked; ``noise``:
    ``pooled_noise`` of the study's points (of ``study``, or of ``points``, when not given)."""
    ordered = sorted(points, key=lambda p: p.params[axis])
    bad = [p for p in ordered if p.status != "ok"]
    if bad:
        named = ", ".join(f"{p.label} ({p.status}: {p.error or 'errors'})" for p in bad[:3])
        return Verdict(
            curve,
            axis,
            "failed",
            None,
            f"no verdict: {len(bad)} of {len(ordered)} points did not measure cleanly: {named}",
        )
    shed = overload(ordered, axis, unit=unit, tolerance=tolerance)
    if shed is not None:
        return Verdict(
            curve,
            axis,
            "overload",
            shed.model,
            shed.sentence,
            "queue",
            shed.capacity_per_s,
            change=shed.change,
        )
    found = knee([(p.params[axis], p.throughput) for p in ordered], tolerance)
    assert found is not None
    peak = max(ordered, key=lambda p: p.throughput)
    high = ordered[-1]
    offered = high.params.get("rate")
    behind = offered is not None and high.throughput < (1 - tolerance) * float(offered)
    low = ordered[0]
    # along instances the question is why the most instances do not pay: read them there
    rows = _at_least(_evidence(low, high if axis in _SCALE_AXES else peak), study)
    floor = tolerance * low.histogram.mean_s * 1e3
    rows += _held(rows, tolerance, floor)
    # a resource measured busier than its parallelism is not what the model takes it for (a
    # client whose work leaves the GIL is not one core): it is not named
    refuted = [
        r
        for r in rows
        if r.kind != "stage" and r.utilisation is not None and r.utilisation > 1 + tolerance
    ]
    candidates = sorted(
        (r for r in rows if r.load is not None and r.kind != "stage" and r not in refuted),
        key=lambda r: r.load or 0.0,
        reverse=True,
    )
    busy = 1 - 2 * tolerance
    if any((c.load or 0.0) >= busy for c in candidates if c.kind not in _HYPOTHESES):
        # a pool is inferred from a wait; a measured resource at its limit explains the wait
        candidates = [c for c in candidates if c.kind != "pool"]
    ranked = tuple(candidates + [r for r in rows if r not in candidates])
    top = candidates[0] if candidates else None
    if noise is None:
        noise = pooled_noise(study or ordered)
    facts = _Curve(axis, unit, tolerance, low, peak, high, found.plateau or behind, refuted, noise)
    # at its limit within its noise: a GIL's holder, handing it over, reads 0.8-0.86 busy here
    at_limit = top is not None and _at_its_limit(top, facts, busy)

    def verdict(
        kind: Kind,
        top: Evidence | None,
        sentence: str,
        change: str = "",
        *,
        predicted: bool = True,
        resource: str | None = None,
        named: str | None = None,
    ) -> Verdict:
        """``predicted``: the bottleneck law's plateau from ``top``'s demand holds."""
        # a resource at its limit stops throughput whatever the curve's shape says yet
        plateau = peak.throughput if facts.stopped or at_limit else None
        limit = top.limit_per_s if top is not None and predicted else None
        kind_of = resource or (top.kind if top else None)
        return Verdict(
            curve,
            axis,
            kind,
            named or (top.name if top else None),
            sentence + "".join(_refuted_words(r) for r in facts.refuted),
            kind_of,
            plateau,
            limit,
            change,
            ranked,
        )

    if axis in _SCALE_AXES:
        # along servers a model's instances grow with them: they are not what every one shares.
        # The shared ones are read at the most instances' point by the utilisation law there:
        # the fewest instances' demand is not theirs (a second instance costs the host's cores
        # CPU of its own at the same load), and U* weighed with it named the client's CPU alone
        # at a point where the curve along load through it named the client's CPU or the cores
        there, measured = _measured(facts, high, busy)
        measured = [c for c in measured if c.kind != "instances"]
        return _instances(facts, _rivals(measured, there, busy), verdict, there)
    batcher = _batching(facts)
    if batcher is not None and not (facts.stopped or at_limit):
        model, queue, delay = batcher
        return verdict(
            "batching",
            None,
            (
                f"{model}'s requests wait {queue:.1f} ms in its dynamic batcher, within its "
                f"{delay:.0f} ms max_queue_delay, at {facts.low.label}: the latency is the "
                f"batcher's, not load's; {facts.throughput()} as batches fill"
            ),
            "lower max_queue_delay for latency at light load; keep it for throughput",
        )
    if (top is None or not at_limit) and (fallen := _fallen_on(facts, busy)) is not None:
        return fallen(verdict)
    if top is None or not at_limit:
        # in a closed loop, a time per request that grows is a wait for something
        waits = axis == "concurrency" and (
            high.histogram.mean_s > (1 + 2 * tolerance) * low.histogram.mean_s
        )
        if facts.stopped or waits:
            return _unexplained(facts, rows, top, verdict)
        nearest = ""
        if top is not None and top.limit_per_s is not None:
            nearest = (
                f"; the nearest limit is {_resource_words(top)} at "
                f"{facts.per_s(top.limit_per_s)} (predicted, U* {top.load:.2f} at "
                f"{facts.peak.label})"
            )
        return verdict(
            "rising", top, (f"{facts.throughput()} and no resource is at its limit{nearest}")
        )
    rivals = _rivals(candidates, facts, busy)
    if len(rivals) > 1:
        return _undecided(facts, rivals, verdict)
    return _at_limit(facts, top, verdict)


def _measured(facts: _Curve, point: Point, busy: float) -> tuple[_Curve, list[Evidence]]:
    """The resources at ``point`` as the utilisation law measures them there (U = X . D of
    that point, not U* from the lowest point's demand), busiest first, those at their limit
    within the point's noise only; with the facts their noise is read from."""
    there = replace(facts, low=point, peak=point, stopped=True)
    rows = [
        r
        for r in _evidence(point, point)
        if r.load is not None
        and r.kind not in ("stage", *_HYPOTHESES)
        and (r.utilisation is None or r.utilisation <= 1 + facts.tolerance)
        and _at_its_limit(r, there, busy)
    ]
    rows.sort(key=lambda r: r.load or 0.0, reverse=True)
    return there, rows


def _fallen_on(facts: _Curve, busy: float) -> Callable[[_Make], Verdict] | None:
    """Where throughput stopped along a load axis (a plateau, or a fall past its peak) with
    nothing at its limit by U* at the peak: what is at its limit at the highest load, as the
    utilisation law measures it there, as the peak's verdict would name it: one resource, or
    those the point's noise cannot separate. A study whose highest point fell in one run and
    held in the next then says the same of both (docs/study.md's example: the client's CPU
    and the host's cores, U 0.78 and 0.75 where it fell, U* 0.79 and 0.79 at a held peak).
    None where throughput still rises, or nothing is at its limit there either."""
    low, peak, high = facts.low, facts.peak, facts.high
    if facts.axis in _SCALE_AXES or high is peak:
        return None
    fell = high.throughput < (1 - facts.tolerance) * peak.throughput
    if not (fell or facts.stopped):
        return None
    there, rows = _measured(facts, high, busy)
    if not rows:
        return None
    rivals = _rivals(rows, there, busy)
    where = "fell" if fell else "stopped"
    words = f"{facts.throughput()}; measured at {high.label}, where it {where}"

    def judged(verdict: _Make) -> Verdict:
        return _named_where_measured(there, rivals, verdict, words, low)

    return judged


def _named_where_measured(
    there: _Curve,
    rivals: Sequence[Evidence],
    verdict: _Make,
    words: str,
    low: Point | None = None,
    change: str = "",
) -> Verdict:
    """``rivals``, at their limit at ``there``'s one point by the U measured there: undecided
    between them, or the one contended; ``words``: how throughput went along the curve;
    ``low``: where the resource's demand is quoted from beside; ``change``: added advice."""
    if len(rivals) > 1:
        return _undecided(there, rivals, verdict, words=words, measured=True)
    (top,) = rivals
    first = resources(low).get(top.key) if low is not None else None
    before = f", {first.demand_ms:.2f} at {low.label}" if first and low is not None else ""
    return verdict(
        "contended",
        top,
        (
            f"{_resource_words(top)} is at its limit at {there.high.label}: U {top.load:.2f} ± "
            f"{_spread(top, there):.2f} ({top.peak_ms:.2f} ms a {there.unit}{before}); {words}"
        ),
        f"lift {_resource_words(top)} alone: {_what_if(top) or 'more of it'}{change}",
        predicted=False,
    )


def _demand_point(row: Evidence, facts: _Curve) -> Point | None:
    """The point whose windows measured the demand ``row`` weighs (None: another curve's)."""
    if row.least_ms is not None and row.least_ms <= row.demand_ms:
        return None
    return facts.peak if row.falls else facts.low


def _windows_of(row: Evidence, facts: _Curve) -> Spread | None:
    point = _demand_point(row, facts)
    if point is None:
        return None
    found = facts.spreads(point).get(row.key)
    return found if found is not None and found.demand_ms is not None else None


def _spread(row: Evidence, facts: _Curve) -> float:
    """The half-width of a resource's U* over its demand point's windows (the t-interval of
    their batch means), their scatter pooled over the study's points where the study holds
    it; a demand no windows carry (a stage's, from the traces; a file from before windows were
    read) is given ``_DEMAND_SPREAD`` of its U*."""
    found = _windows_of(row, facts)
    summary = found.load(facts.peak.throughput) if found is not None else None
    if summary is not None and math.isfinite(summary.half_width):
        pooled = facts.noise.half_width(row.key, row.load or 0.0, summary.windows)
        return summary.half_width if pooled is None else pooled
    return (row.load or 0.0) * _DEMAND_SPREAD


def _separable(a: Evidence, b: Evidence, facts: _Curve) -> bool:
    """Whether ``a``'s U* and ``b``'s differ beyond their noise: paired window by window where
    one point's windows measured both demands (they share its throughput's ups and downs),
    their scatter and its covariance pooled over the study's points; else each one's interval
    on its own. A difference within ``_DEMAND_SPREAD`` of the larger is none, however steady:
    ten windows can hold 0.79 apart from 0.78, and the two resources are then equally at their
    limit."""
    load_a, load_b = a.load or 0.0, b.load or 0.0
    if abs(load_a - load_b) <= max(load_a, load_b) * _DEMAND_SPREAD:
        return False
    first, second = _windows_of(a, facts), _windows_of(b, facts)
    if (
        first is not None
        and second is not None
        and _demand_point(a, facts) is _demand_point(b, facts)
    ):
        paired = separation(first, second, peak_per_s=facts.peak.throughput)
        half = facts.noise.difference_half_width(a.key, load_a, b.key, load_b, paired.windows)
        if half is None:
            return paired.separable
        return abs(load_a - load_b) > half
    return abs(load_a - load_b) > _spread(a, facts) + _spread(b, facts)


def _rivals(candidates: Sequence[Evidence], facts: _Curve, busy: float) -> list[Evidence]:
    """The resources at their limit within their noise (as the busiest one is judged) that
    the figures cannot tell from the busiest one."""
    if not candidates:
        return []
    top = candidates[0]
    return [top] + [
        c for c in candidates[1:] if _at_its_limit(c, facts, busy) and not _separable(top, c, facts)
    ]


def _at_its_limit(row: Evidence, facts: _Curve, busy: float) -> bool:
    """Whether ``row``'s U* reaches ``busy`` within its windows' noise: the one test of a
    resource at its limit, for the busiest one and its rivals alike."""
    return (row.load or 0.0) + _spread(row, facts) >= busy


def _what_if(row: Evidence) -> str:
    """The change that lifts ``row`` alone, as ``otelkit study predict`` takes it."""
    more = round(row.servers or 1) + 1
    if row.kind == "instances":
        return f"--set {row.name}.instances={more} --confirm"
    if row.kind == "cores":
        return f"--set host.cores={more}"
    if row.kind == "client":
        return f"--set client.processes={more}"
    if row.kind == "balancer":
        return f"--set balancer.workers={more}"
    if row.kind in _HYPOTHESES:
        return f"--set {row.name}.parallelism={more}"
    return ""


def _undecided(
    facts: _Curve,
    rivals: Sequence[Evidence],
    verdict: _Make,
    *,
    words: str | None = None,
    measured: bool = False,
) -> Verdict:
    """Two resources or more at their limit, within their noise of each other; ``words``:
    how throughput went (the curve's, where ``facts`` are one point's); ``measured``: their
    U is the point's own (X . D there), not U*."""
    u = "U" if measured else "U*"
    named = " and ".join(
        f"{_resource_words(r)} ({u} {r.load:.2f} ± {_spread(r, facts):.2f}, "
        f"at most {facts.per_s(r.limit_per_s or 0.0)})"
        for r in rivals
    )
    changes = [f"otelkit study predict STUDY {w}" for w in map(_what_if, rivals) if w]
    separate = f"; what would separate them: {'; or '.join(changes)}" if changes else ""
    first = min(rivals, key=lambda r: r.limit_per_s or float("inf"))
    return verdict(
        "undecided",
        first,
        (
            f"cannot separate {named} at {facts.peak.label}: each is at its limit within the "
            f"point's noise; {words or facts.throughput()}{separate}"
        ),
        "measure the change that lifts one of them alone: "
        + ", ".join(_what_if(r) or _resource_words(r) for r in rivals),
        resource="undecided",
        named=" or ".join(r.name for r in rivals),
    )


def _refuted_words(row: Evidence) -> str:
    """Why a resource measured beyond its parallelism is not named."""
    if row.kind in ("client", "gil"):
        why = "its work runs outside Python's GIL (native code, its own threads)"
    elif row.kind == "network":
        why = "says the link carried more than the rate the study was told"
    else:
        why = "it serves more at a time than the study takes it to"
    return (
        f"; {row.name} is not named: it measured U {row.utilisation:.2f} of its "
        f"{_m(row.servers)} at {row.peak_per_s:.0f}/s, which {why}"
    )


def _resource_words(row: Evidence) -> str:
    if row.kind == "instances":
        return f"{row.name}'s {_m(row.servers)} instance{'s' if row.servers != 1 else ''}"
    if row.kind == "lock":
        return f"{row.name} (one at a time)"
    if row.kind == "pool":
        return f"what {row.name} waits for ({_m(row.servers)} at a time)"
    return row.name


_TRANSFER = (NETWORK, "client serialize", "client deserialize")
_COPY_BYTES_PER_S = 1e9


def _transfer_growth(facts: _Curve) -> tuple[str, float] | None:
    """Where a request's bytes are moved (the client's (de)serialising, the network and the
    offload), how each grew from the lowest point to the peak, and by how much in all; only
    for requests whose payload is known."""
    low, peak = facts.low, facts.peak
    if low.payload_bytes is None or low.traces is None or peak.traces is None:
        return None
    grew = []
    for name in _TRANSFER:
        before, after = low.component_ms(name), peak.component_ms(name)
        if before and after and after > (1 + facts.tolerance) * before:
            grew.append((name, before, after))
    if not grew:
        return None
    added = sum(b - a for _, a, b in grew)
    # the copies can only be what waits if moving the bytes takes a share of the time they
    # added: at 1 GB/s (slower than a copy or loopback TCP here), a tenth of it at least;
    # 64 bytes a request cannot make network + client wait grow 1.7 ms (a wait for a core can)
    if sum(low.payload_bytes) / _COPY_BYTES_PER_S * 1e3 < 0.1 * added:
        return None
    words = ", ".join(f"{n} {a:.1f} → {b:.1f} ms" for n, a, b in grew)
    return words, added


def _payload(point: Point) -> str:
    sent, received = point.payload_bytes or (0, 0)
    return f"{sent / 1e6:.1f} MB sent and {received / 1e6:.1f} MB received"


def _m(servers: float | None) -> str:
    """A parallelism as a sentence says it: 4, or 1.7 cores left by other processes."""
    return f"{round(servers or 0.0, 1):g}"


def _is_plural(name: str) -> bool:
    """Whether a resource's name is plural, for the verb that follows it: its last word is
    (``client threads``, ``the host's 2 cores``), or it is a list (``a and b``).

    >>> [_is_plural(n) for n in ("server queue", "the host's 2 cores", "network + client wait",
    ...                         "client threads", "server gnn_process", "a and b", "Envoy's")]
    [False, True, False, True, False, True, False]
    """
    words = name.split()
    if " and " in f" {name} " or not words:
        return " and " in f" {name} "
    last = words[-1].lower()
    return last.endswith("s") and not last.endswith(("ss", "us", "is", "'s")) and len(last) > 2


def _says(name: str, singular: str, plural: str) -> str:
    """``name`` and its verb, agreeing in number: ``client threads are``."""
    return f"{name} {plural if _is_plural(name) else singular}"


def _figures(row: Evidence, unit: str) -> str:
    """X, D, m and U of a resource at the peak, and how its demand changed with load."""
    used = f"U {row.utilisation:.2f}, " if row.utilisation is not None else ""
    return (
        f"[{used}U* {row.load:.2f}; D {row.low_ms:.2f} → {row.peak_ms:.2f} ms per {unit} "
        f"(×{row.growth:.1f}); m {_m(row.servers)}; X {row.peak_per_s:.0f}/s]"
    )


def _law(row: Evidence, facts: _Curve, servers: str, what: str = "") -> str:
    """The bottleneck law's bound, said as a prediction with the demand it used."""
    limit = row.limit_per_s or 0.0
    demand = row.demand_ms
    which = ""
    if row.least_ms is not None and row.least_ms <= demand:
        which = (
            f", the least it measured at this m, at {row.least_at}: this curve's "
            f"{row.peak_ms if row.falls else row.low_ms:.1f} ms would allow less than the "
            "study measured there"
        )
    elif row.falls:
        which = f", the demand at the peak: it fell from {row.low_ms:.1f} ms with load"
    return (
        f"{demand:.1f} ms{what} per {facts.unit} allows at most {facts.per_s(limit)} "
        f"(predicted: {servers} / {demand:.1f} ms{which})"
    )


def _at_limit(facts: _Curve, top: Evidence, verdict: _Make) -> Verdict:
    unit = facts.unit
    seen = f"{facts.throughput()} {_figures(top, unit)}"
    if top.kind == "lock":
        limit = facts.per_s(top.limit_per_s or 0.0)
        return verdict(
            "contended",
            top,
            (
                f"{_says(top.name, 'serves', 'serve')} one {unit} at a time (a lock or the "
                "GIL): held "
                f"{top.low_ms:.1f} ms per {unit}, it allows at most {limit} (predicted: 1 / "
                f"{top.low_ms:.1f} ms); {seen}, while {top.name}'s time grows to "
                f"{top.peak_ms:.1f} ms waiting for it"
            ),
            f"shorten or split what {top.name} holds; more instances will not help",
        )
    if top.kind == "pool":
        k = _m(top.servers)
        where = f" in {top.model}" if top.model and top.model != top.name else ""
        held = top.model != top.name  # a stage: its time is the hold
        capacity = facts.per_s(top.limit_per_s or 0.0)
        allows = (
            f"held {top.low_ms:.1f} ms per {unit}, {k} allow at most {capacity} (predicted: "
            f"{k} / {top.low_ms:.1f} ms)"
            if held
            else f"held at most {top.low_ms:.1f} ms per {unit} (the model's whole time: its "
            f"stages are not traced), {k} allow at least {capacity}"
        )
        return verdict(
            "contended",
            top,
            (
                f"{top.name}{where} waits for something that serves {k} {unit}s at a time "
                f"(a GPU semaphore, a connection pool, licences): {allows}; {seen}, while "
                f"{top.name}'s time grows to {top.peak_ms:.1f} ms waiting for it"
            ),
            f"more of what {top.name} holds (predict with --set {top.name}.parallelism=N), "
            f"or a shorter hold; more instances will not help",
            predicted=held,
        )
    if top.kind == "cores":
        return verdict(
            "contended",
            top,
            (
                f"{_says(top.name, 'is', 'are')} busy: "
                f"{_law(top, facts, f'{_m(top.servers)} cores', ' of CPU')}; {seen}, "
                "while what runs on them waits for a core"
            ),
            "fewer busy instances than cores, less CPU per request, or more hosts; more "
            "instances will not help",
        )
    if top.kind == "network":
        sent = _payload(facts.low)
        return verdict(
            "network",
            top,
            (
                f"{_says(top.name, 'is', 'are')} busy: {sent} a {unit}, "
                f"{_law(top, facts, '1 link', ' on the wire')}; {seen}"
            ),
            "smaller payloads (compression, fewer bytes per event, batching server-side "
            "inputs), or a faster link; more instances will not help",
        )
    if top.kind == "gil":
        return verdict(
            "contended",
            top,
            (
                f"{top.name} {'are' if (top.servers or 1) > 1 else 'is'} busy: under one GIL "
                f"a process, {_law(top, facts, _m(top.servers), ' of CPU')}; {seen}, while "
                "every request's Python waits for it"
            ),
            "more server processes (workers), or less Python per request; more threads and "
            "more instances in one process will not help",
        )
    if top.kind == "balancer":
        workers = f"{_m(top.servers)} worker{'s' if top.servers != 1 else ''}"
        return verdict(
            "saturated",
            top,
            (
                f"{_says(top.name, 'is', 'are')} busy all the time: "
                f"{_law(top, facts, workers, ' of CPU')}; "
                f"{seen}, while the servers behind it wait for requests"
            ),
            "more worker threads for the load balancer (Envoy's --concurrency, up to its "
            "host's cores), less work per request in its filters, or more load balancers; "
            "more servers will not help",
        )
    if top.kind == "client":
        return verdict(
            "client",
            top,
            (
                f"{_says(top.name, 'is', 'are')} the limit: in one process (Python's GIL: one "
                "core at a time) "
                f"{_law(top, facts, _m(top.servers), ' of CPU')}; {seen}"
            ),
            "more client processes, or less Python work per request; more threads and more "
            "server instances will not help",
        )
    servers = f"{_m(top.servers)} instance{'s' if top.servers != 1 else ''}"
    grew = "" if top.growth <= 1 + facts.tolerance else ", and its demand grew with load"
    if top.kind == "instances":
        return verdict(
            "saturated",
            top,
            (
                f"{top.name}'s {servers} {'is' if top.servers == 1 else 'are'} busy all the "
                f"time{grew}: {_law(top, facts, servers)}; {seen}"
            ),
            f"more instances of {top.name}, or batching",
        )
    return verdict(
        "saturated",
        top,
        (
            f"{_says(top.name, 'is', 'are')} busy all the time{grew}: "
            f"{_law(top, facts, '1')}; {seen}"
        ),
        "a faster GPU, more GPUs, or less GPU work per request",
    )


def _unexplained(
    facts: _Curve, rows: Sequence[Evidence], top: Evidence | None, verdict: _Make
) -> Verdict:
    """Throughput stopped while no measured resource is at its limit."""
    unit = facts.unit
    busiest = (
        f"; the busiest measured is {_resource_words(top)} at U* {top.load:.2f}"
        if top is not None
        else ""
    )
    grown = sorted(
        (r for r in rows if r.kind in ("stage", "instances") and r.growth > 1 + facts.tolerance),
        key=lambda r: r.peak_ms - r.low_ms,
        reverse=True,
    )
    moving = _transfer_growth(facts)
    if moving is not None and (not grown or moving[1] > grown[0].peak_ms - grown[0].low_ms):
        parts, added = moving
        return verdict(
            "network",
            None,
            (
                f"moving each {unit}'s tensors ({_payload(facts.low)}) grows with load: "
                f"{parts} ({added:.1f} ms more per {unit}); {facts.throughput()}, while no "
                f"measured resource is at its limit{busiest}: the copies wait (memory "
                "bandwidth, the kernel's socket buffers, a link the study was not told of)"
            ),
            "fewer bytes per request (smaller dtypes, compression; shared memory when client "
            "and server share a host), or tell the study the link's rate (link_gbps)",
            predicted=False,
            resource="transfer",
        )
    if grown:
        row = grown[0]
        where = f" in {row.model}" if row.model and row.model != row.name else ""
        return verdict(
            "contended",
            row,
            (
                f"{row.name}{where}: {row.low_ms:.1f} → {row.peak_ms:.1f} ms per {unit} "
                f"(×{row.growth:.1f}); {facts.throughput()}, because "
                f"{_says(row.name, 'waits', 'wait')} for a "
                f"resource the study does not measure (a lock, the GIL, memory bandwidth, a "
                f"device){busiest}"
            ),
            f"trace {row.name}'s stages to find what it waits for; more instances will not help",
            predicted=False,
            resource="unmeasured",
        )
    return verdict(
        "unknown",
        None,
        (
            f"{facts.throughput()} while no measured resource is at its limit and "
            f"no demand grows{busiest}: the limit lies outside what the study measures (the "
            "network, a proxy, the client's host)"
        ),
    )


def _instances(facts: _Curve, shared: Sequence[Evidence], verdict: _Make, there: _Curve) -> Verdict:
    """More instances (or servers) at the same load: they pay while ε stays near 1, unless
    ``shared``, resources every instance shares, are at their limit at ``there``, the most
    instances' point, by the U measured there (more than one: the figures cannot tell
    which)."""
    low, high, unit, axis = facts.low, facts.high, facts.unit, facts.axis
    n_low, n_high = low.params[axis], high.params[axis]
    what = "servers" if axis == "servers" else "instances"
    epsilon = (high.throughput / n_high) / (low.throughput / n_low) if low.throughput else 0.0
    trend = (
        f"throughput {low.throughput:.0f} → {high.throughput:.0f} {unit}s/s "
        f"{facts.span()} (ε = {epsilon:.2f})"
    )
    if epsilon >= 1 - facts.tolerance:
        return verdict("rising", None, f"{trend}: more {what} pay")
    if shared:
        found = _named_where_measured(
            there, shared, verdict, facts.throughput(), change=f"; more {what} will not help"
        )
        return replace(found, sentence=f"{trend}: {found.sentence}")
    concurrency = high.params.get("concurrency")
    load = f" ({concurrency} in flight)" if concurrency else ""
    queue = high.component_ms(SERVER_QUEUE)
    waits = f"; requests still queue {queue:.1f} ms" if queue else ""
    return verdict(
        "underloaded",
        None,
        (f"{trend}: the load{load} does not keep more {what} busy{waits}"),
        f"more load (threads, client processes) before more {what}",
    )


def verdicts(
    points: Iterable[Point], *, unit: str = "request", tolerance: float = 0.1
) -> list[Verdict]:
    """One verdict per curve along concurrency, rate, instances and servers, failed points
    included."""
    points = list(points)
    noise = pooled_noise(points)
    found = []
    for axis in LOAD_AXES:
        for curve, members in along(points, axis).items():
            if len(members) > 1 and sum(p.status == "ok" for p in members) > 0:
                found.append(
                    judge(
                        members,
                        axis,
                        curve,
                        unit=unit,
                        tolerance=tolerance,
                        study=points,
                        noise=noise,
                    )
                )
    return revise(found, points, tolerance)
