"""The figures of merit the field reports (AthenaTriton's, SONIC's), across a sweep's points.

- **throughput scaling efficiency** over model instances, ε = (Tᵢ/i)/T₁ (AthenaTriton), and
  over a fleet's servers, (Tₛ/s)/T₁;
- **strong scaling** with n client threads and n instances, (t₁/n)/tₙ: for a fixed amount of
  work t ∝ 1/T, so it is (Tₙ/n)/T₁ along the points where concurrency equals instances (along
  concurrency alone when instances are not swept);
- **throughput over batch size**, T = N/ℓ (SONIC): N inferences a request over the mean latency,
  an estimate of what the server gives with one request in flight (more in flight give more):
  its rows say so and carry the measured inferences a second;
- **offload overhead per step**: the client's span minus the server's (the network + client wait
  component, with the client's (de)serialising) over the calls a request makes;
- the **knee** of a throughput curve: the lowest load whose throughput is within ``tolerance``
  of the curve's highest. Beyond it, more load (or more instances) stops paying.

Each figure is computed per *curve*: the points that differ only in the swept parameter.

>>> knee([(1, 50.0), (2, 95.0), (4, 140.0), (8, 150.0), (16, 152.0)], tolerance=0.1)
Knee(at=4, throughput=140.0, highest=152.0, plateau=True)
>>> [round(r.value, 2) for r in scaling([(1, 100.0), (2, 190.0), (4, 300.0)])]
[1.0, 0.95, 0.75]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from otelkit.analysis._breakdown import NETWORK
from otelkit.study._point import Point, point_label

__all__ = [
    "Knee",
    "Row",
    "along",
    "curves",
    "efficiency",
    "knee",
    "knees",
    "offload_overhead",
    "scaling",
    "server_efficiency",
    "strong_scaling",
    "throughput_by_batch",
]

#: The parameters along which a study's load grows, in the order knees and verdicts prefer.
LOAD_AXES = ("concurrency", "rate", "instances", "servers")

#: The figures that are estimates from a formula, not measurements, and what they estimate.
ESTIMATES = {
    "throughput_n_over_l": "derived: N/ℓ, the batch over the mean latency, what the server "
    "gives with one request in flight; measured_items_per_s is what was measured",
}


@dataclass(frozen=True)
class Row:
    """One figure at one point: ``value`` of ``figure`` at ``at`` along ``axis`` of a curve."""

    figure: str
    curve: str  # the other parameters, e.g. "instances=2"
    axis: str
    at: Any
    value: float
    detail: dict[str, float]

    @property
    def estimate(self) -> str | None:
        """What the figure estimates, when it is derived by a formula rather than measured."""
        return ESTIMATES.get(self.figure)

    def to_dict(self) -> dict[str, Any]:
        estimate = {"estimate": self.estimate} if self.estimate else {}
        return {
            "record": "derived",
            "figure": self.figure,
            "curve": self.curve,
            "axis": self.axis,
            "at": self.at,
            "value": self.value,
            **estimate,
            **self.detail,
        }


@dataclass(frozen=True)
class Knee:
    """Where a curve stops paying: ``at`` reaches within tolerance of the ``highest``
    throughput; ``plateau`` is false when that is the last point (it may still rise)."""

    at: Any
    throughput: float
    highest: float
    plateau: bool


def along(points: Iterable[Point], axis: str, leave_out: str = "") -> dict[str, list[Point]]:
    """Every point with ``axis`` (failed ones too), grouped by its other parameters (``leave_out``
    aside) and sorted along ``axis``; a group may hold a single point."""
    grouped: dict[str, list[Point]] = {}
    for point in points:
        if axis in point.params:
            others = {k: v for k, v in point.params.items() if k not in (axis, leave_out)}
            grouped.setdefault(point_label(others) if others else "", []).append(point)
    return {k: sorted(v, key=lambda p: p.params[axis]) for k, v in grouped.items()}


def curves(points: Iterable[Point], axis: str) -> dict[str, list[Point]]:
    """The measured points with ``axis``, grouped by their other parameters, sorted along it."""
    measured = [p for p in points if p.status == "ok"]
    return {k: v for k, v in along(measured, axis).items() if len(v) > 1}


def scaling(values: Sequence[tuple[float, float]]) -> list[Row]:
    """(T_n/n)/(T_n0/n0) for each (n, T_n), relative to the lowest n (n0 = 1 gives ε)."""
    if not values:
        return []
    ordered = sorted(values)
    n0, t0 = ordered[0]
    base = t0 / n0 if n0 and t0 else 0.0
    return [
        Row("scaling", "", "n", n, (t / n) / base if base and n else 0.0, {"throughput": t})
        for n, t in ordered
    ]


def _scaled(points: Iterable[Point], axis: str, figure: str) -> list[Row]:
    rows = []
    for curve, members in curves(points, axis).items():
        for row in scaling([(p.params[axis], p.throughput) for p in members]):
            rows.append(Row(figure, curve, axis, row.at, row.value, row.detail))
    return rows


def efficiency(points: Iterable[Point]) -> list[Row]:
    """ε = (Tᵢ/i)/T₁ along ``instances``, per curve."""
    return _scaled(points, "instances", "efficiency")


def server_efficiency(points: Iterable[Point]) -> list[Row]:
    """ε = (Tₛ/s)/T₁ along ``servers`` (a fleet behind a load balancer), per curve."""
    return _scaled(points, "servers", "server_efficiency")


def strong_scaling(points: Iterable[Point]) -> list[Row]:
    """(t₁/n)/tₙ with n threads and n instances; along concurrency without instances."""
    points = [p for p in points if p.status == "ok" and "concurrency" in p.params]
    diagonal = [p for p in points if p.params.get("instances") == p.params["concurrency"]]
    if len({p.params["concurrency"] for p in diagonal}) > 1:
        others = [
            {k: v for k, v in p.params.items() if k not in ("instances", "concurrency")}
            for p in diagonal
        ]
        grouped: dict[str, list[Point]] = {}
        for point, rest in zip(diagonal, others, strict=True):
            grouped.setdefault(point_label(rest) if rest else "", []).append(point)
        rows = []
        for curve, members in grouped.items():
            values = [(p.params["concurrency"], p.throughput) for p in members]
            for row in scaling(values):
                rows.append(
                    Row(
                        "strong_scaling",
                        curve,
                        "concurrency=instances",
                        row.at,
                        row.value,
                        row.detail,
                    )
                )
        return rows
    if any("instances" in p.params for p in points):
        return []  # instances swept but never together with as many threads
    return _scaled(points, "concurrency", "strong_scaling")


def throughput_by_batch(points: Iterable[Point]) -> list[Row]:
    """T = N/ℓ along ``batch_size``: inferences per second of latency, per curve, an estimate
    valid at one request in flight; the detail holds the mean latency and the measured
    inferences per second."""
    rows = []
    for curve, members in curves(points, "batch_size").items():
        for point in members:
            latency_s = point.histogram.mean_s
            value = point.params["batch_size"] / latency_s if latency_s else 0.0
            detail = {"latency_ms": latency_s * 1e3, "measured_items_per_s": point.items_per_s}
            rows.append(
                Row(
                    "throughput_n_over_l",
                    curve,
                    "batch_size",
                    point.params["batch_size"],
                    value,
                    detail,
                )
            )
    return rows


def offload_overhead(points: Iterable[Point]) -> list[Row]:
    """Milliseconds of offload per call (client span minus server span), per traced point."""
    rows = []
    for point in points:
        traces = point.traces
        if point.status != "ok" or traces is None or traces.calls_per_request <= 0:
            continue
        ms = sum(
            point.component_ms(name) or 0.0
            for name in (NETWORK, "client serialize", "client deserialize")
        )
        value = ms / traces.calls_per_request
        detail = {"calls_per_request": traces.calls_per_request, "per_request_ms": ms}
        rows.append(Row("offload_per_step_ms", point.label, "", None, value, detail))
    return rows


def knee(values: Sequence[tuple[Any, float]], tolerance: float = 0.1) -> Knee | None:
    """The knee of a curve of (load, throughput): the lowest load within ``tolerance`` of the
    highest throughput."""
    if not values:
        return None
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance is a share from 0 to 1, not {tolerance!r}")
    ordered = sorted(values, key=lambda v: v[0])
    highest = max(t for _, t in ordered)
    for position, (at, throughput) in enumerate(ordered):
        if throughput >= (1 - tolerance) * highest:
            return Knee(at, throughput, highest, plateau=position < len(ordered) - 1)
    raise AssertionError("unreachable: the highest throughput is within tolerance of itself")


def knees(points: Iterable[Point], tolerance: float = 0.1) -> list[Row]:
    """The knee of every throughput curve along concurrency, rate, instances and servers."""
    points = list(points)
    rows = []
    for axis in LOAD_AXES:
        for curve, members in curves(points, axis).items():
            found = knee([(p.params[axis], p.throughput) for p in members], tolerance)
            if found is not None:
                detail = {
                    "throughput": found.throughput,
                    "highest": found.highest,
                    "plateau": float(found.plateau),
                    "tolerance": tolerance,
                }
                rows.append(Row("knee", curve, axis, found.at, found.throughput, detail))
    return rows
