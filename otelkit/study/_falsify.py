"""Falsification before printing: each claim a verdict makes, checked against every point.

A verdict is a set of claims: a resource's capacity (m / D), "throughput plateaus", "more
instances will not help", a resource at U ≈ 1 with its parallelism m. Each is checked against
every point of the study, not only the curve it was read from, and the verdicts are revised
where a point refutes one (``revise``): a capacity is quoted from the least demand the resource
measured at its m, a "will not help" that more instances refuted is dropped and the gain said,
and two curves that name different limits for one point each say what the other names.
``contradictions`` lists what the data still refutes: none, after ``revise`` (its tests hold
recorded studies that produced each kind before).

Noise is the point's own: the 95 % interval of its throughput from its windows (batch means),
never below what a point's start and end add to its count.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from otelkit.study._capacity import resources
from otelkit.study._derived import along, knee
from otelkit.study._point import Point
from otelkit.study._stats import mean_interval

if TYPE_CHECKING:  # _verdicts reads the least demands and the noise from here
    from otelkit.study._verdicts import Evidence, Verdict

__all__ = ["Contradiction", "contradictions", "least_demands", "noise", "revise"]

#: claims that more of something would not raise throughput, by the axis that tests them
_WILL_NOT_HELP = {
    "instances": re.compile(
        r"(; |, )?(more threads and )?more (server )?instances( in one process)? will not help"
    ),
}


@dataclass(frozen=True)
class Contradiction:
    """A claim of a verdict that a measured point refutes."""

    curve: str
    axis: str
    claim: str  # capacity, plateau, parallelism, will-not-help, one-point
    point: str  # the refuting point's label
    detail: str

    def __str__(self) -> str:
        return f"[{self.curve or 'all'}] {self.claim}: {self.detail} (at {self.point})"


def noise(point: Point, floor: float = 0.02) -> float:
    """The relative half-width of the 95 % interval of ``point``'s throughput, from the spread
    of its windows' throughputs (batch means); ``floor`` where it has fewer than two."""
    values = [w.throughput for w in point.windows]
    if len(values) < 2 or not point.throughput:
        return floor
    mean = statistics.fmean(values)
    if mean <= 0:
        return floor
    low, high = mean_interval(values)
    return max(floor, (high - low) / 2 / mean)


def least_demands(points: Sequence[Point]) -> dict[tuple[str, float], tuple[float, Point]]:
    """For each resource and parallelism m, the least demand any measured point gave it, and
    where: the demand its capacity m / D must not fall below throughput measured at that m."""
    found: dict[tuple[str, float], tuple[float, Point]] = {}
    for point in points:
        if point.status != "ok":
            continue
        for key, resource in resources(point).items():
            if not resource.servers or resource.kind == "stage":
                continue
            at = (key, round(resource.servers, 1))
            if at not in found or resource.demand_ms < found[at][0]:
                found[at] = (resource.demand_ms, point)
    return found


def _named(verdict: Verdict) -> Evidence | None:
    return next(
        (e for e in verdict.evidence if e.name == verdict.limit and e.kind == verdict.resource),
        None,
    )


def _read_at(verdict: Verdict, points: Sequence[Point]) -> Point | None:
    """The point a verdict reads its resources at: the peak along load, the most along
    instances or servers."""
    members = [p for p in along(points, verdict.axis).get(verdict.curve, []) if p.status == "ok"]
    if not members:
        return None
    if verdict.axis in ("instances", "servers"):
        return members[-1]
    return max(members, key=lambda p: p.throughput)


def _more_instances(point: Point, points: Sequence[Point]) -> list[Point]:
    """The measured points alike but for more instances."""
    mine = point.params.get("instances")
    if mine is None:
        return []
    same = {k: v for k, v in point.params.items() if k != "instances"}
    return [
        p
        for p in points
        if p.status == "ok"
        and p.params.get("instances", 0) > mine
        and {k: v for k, v in p.params.items() if k != "instances"} == same
    ]


def _gain(
    verdict: Verdict, points: Sequence[Point], tolerance: float
) -> tuple[Point, Point] | None:
    """A point of the curve and one alike with more instances that served more, beyond the
    tolerance and both points' noise."""
    members = [p for p in along(points, verdict.axis).get(verdict.curve, []) if p.status == "ok"]
    best: tuple[float, Point, Point] | None = None
    for mine in members:
        for more in _more_instances(mine, points):
            margin = 1 + tolerance + noise(mine) + noise(more)
            if mine.throughput and more.throughput > margin * mine.throughput:
                gain = more.throughput / mine.throughput
                if best is None or gain > best[0]:
                    best = (gain, mine, more)
    return (best[1], best[2]) if best else None


def contradictions(
    verdicts: Sequence[Verdict], points: Sequence[Point], tolerance: float = 0.1
) -> list[Contradiction]:
    """Every claim of ``verdicts`` that a point of ``points`` refutes beyond its noise."""
    found = []
    ok = [p for p in points if p.status == "ok"]
    for verdict in verdicts:
        if verdict.kind == "failed":
            continue

        def say(claim: str, point: Point, detail: str, v: Verdict = verdict) -> None:
            found.append(Contradiction(v.curve, v.axis, claim, point.label, detail))

        named = _named(verdict)
        capacity = verdict.predicted_per_s
        if capacity and named is not None and named.kind not in ("lock", "pool"):
            for point in ok:
                resource = resources(point).get(named.key)
                if resource is None or round(resource.servers or 0, 1) != round(
                    named.servers or 0, 1
                ):
                    continue
                if point.throughput > capacity * (1 + noise(point)):
                    say(
                        "capacity",
                        point,
                        f"{named.name} allows at most {capacity:.0f}/s, and "
                        f"{point.throughput:.0f}/s were measured",
                    )
        over = named is not None and (named.utilisation or 0.0) > 1 + tolerance
        if named is not None and over:
            at = _read_at(verdict, ok)
            say(
                "parallelism",
                at if at is not None else ok[0],
                f"{named.name} is named at U {named.utilisation or 0.0:.2f}, above its "
                f"{named.servers or 0:g}",
            )
        members = [p for p in along(ok, verdict.axis).get(verdict.curve, [])]
        if "plateaus at" in verdict.sentence and len(members) > 1:
            shape = knee([(p.params[verdict.axis], p.throughput) for p in members], tolerance)
            if shape is not None and not shape.plateau:
                say("plateau", members[-1], "the knee of the same curve is still rising")
        pattern = _WILL_NOT_HELP["instances"]
        if pattern.search(verdict.change) or pattern.search(verdict.sentence):
            gained = _gain(verdict, ok, tolerance)
            if gained is not None:
                mine, more = gained
                say(
                    "will-not-help",
                    more,
                    f"more instances will not help, and {mine.throughput:.0f} → "
                    f"{more.throughput:.0f}/s were measured from {mine.label}",
                )
    found += _disagreements(verdicts, ok)
    return found


def _disagreements(verdicts: Sequence[Verdict], points: Sequence[Point]) -> list[Contradiction]:
    """Two verdicts that read one point and name different limits, neither saying why."""
    readers: dict[int, list[Verdict]] = {}
    for verdict in verdicts:
        if verdict.limit is None or verdict.kind in ("failed", "rising", "underloaded"):
            continue
        at = _read_at(verdict, points)
        if at is not None:
            readers.setdefault(at.index, []).append(verdict)
    found = []
    for index, several in readers.items():
        point = next(p for p in points if p.index == index)
        for a in several:
            for b in several:
                if a is b or a.limit == b.limit or a.axis >= b.axis:
                    continue
                if (b.limit or "") in a.sentence or (a.limit or "") in b.sentence:
                    continue  # the other is said, with its figures
                found.append(
                    Contradiction(
                        a.curve,
                        a.axis,
                        "one-point",
                        point.label,
                        f"names {a.limit} where [{b.curve or 'all'}] along {b.axis} names "
                        f"{b.limit}",
                    )
                )
    return found


def revise(
    verdicts: Sequence[Verdict], points: Sequence[Point], tolerance: float = 0.1
) -> list[Verdict]:
    """``verdicts`` with the claims that points refute taken back or said with what refutes
    them (capacities are already quoted from ``least_demands`` by ``judge``)."""
    ok = [p for p in points if p.status == "ok"]
    revised = []
    for verdict in verdicts:
        pattern = _WILL_NOT_HELP["instances"]
        if verdict.kind != "failed" and (
            pattern.search(verdict.change) or pattern.search(verdict.sentence)
        ):
            gained = _gain(verdict, ok, tolerance)
            if gained is not None:
                mine, more = gained
                measured = (
                    f"; more instances did help here: {mine.throughput:.0f} → "
                    f"{more.throughput:.0f}/s from {mine.label} to {more.label} (measured)"
                )
                change = pattern.sub("", verdict.change).strip("; ,")
                sentence = pattern.sub("", verdict.sentence) + measured
                verdict = replace(verdict, change=change, sentence=sentence)
        revised.append(verdict)
    return _say_each_other(revised, ok)


def _say_each_other(verdicts: list[Verdict], points: Sequence[Point]) -> list[Verdict]:
    """Where two curves read one point and name different limits, each says the other's, with
    both resources' U* at that point: they read it with the demands of different lowest
    points, which is why they may differ."""
    out = list(verdicts)
    for found in _disagreements(out, points):
        for n, verdict in enumerate(out):
            if verdict.curve != found.curve or verdict.axis != found.axis:
                continue
            other = next(
                v
                for v in out
                if v is not verdict
                and v.limit is not None
                and v.limit != verdict.limit
                and found.detail.endswith(f"names {v.limit}")
            )
            mine, theirs = _named(verdict), _named(other)
            figures = ""
            if mine is not None and theirs is not None and mine.load and theirs.load:
                figures = f" (U* {mine.load:.2f} here, {theirs.load:.2f} there)"
            note = (
                f"; at {found.point} the curve [{other.curve or 'all'}] along {other.axis} names "
                f"{other.limit} instead{figures}: each weighs the point with its own lowest "
                "point's demands"
            )
            out[n] = replace(verdict, sentence=verdict.sentence + note)
            back = out.index(other)
            out[back] = replace(
                other,
                sentence=other.sentence
                + f"; at {found.point} the curve [{verdict.curve or 'all'}] along "
                f"{verdict.axis} names {verdict.limit} instead",
            )
    return out
