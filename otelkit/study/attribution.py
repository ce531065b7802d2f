"""What caps throughput along a sweep, and why: growth per component and one verdict per curve.

For each component of the breakdown (each client and server stage, the server queue, network +
offload, server other, client other), the growth of its time per request from the lowest point
of a curve to each higher one. Then one verdict per curve, from the lowest to the highest point:

- **saturated**: the server queue grows most while the stages stay flat: the servers are busy
  all the time, and the capacity limit is the model (and, in it, the stage) with the least
  throughput per instance, its instances and batching taken into account, read at the point
  where throughput peaks;
- **contended**: a stage's own time grows most: it is slowed down by the load itself (a lock,
  a shared device, memory bandwidth), in the form of NERSC's finding, "build_graph: 1.8 → 5.6
  ms per event from 1 to 8 threads (×3.1) while the other stages stay within ±10 %: throughput
  plateaus at 150 events/s because build_graph is contended";
- **client**: network + offload or the client's own time grows most: the client side limits;
- **rising**: the time per request stays flat: nothing caps throughput within the sweep (along
  instances: ε stays within tolerance of 1, more instances pay);
- **underloaded** (along instances): ε falls and nothing grows: the load does not keep more
  instances busy.

Without traces, Triton's queue and compute per request say saturated or contended per model.
When throughput falls after its peak by more than the tolerance, the verdict says where it
peaked and what it fell to: more load made things worse, not merely no better.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from otelkit.analysis.breakdown import CLIENT_OTHER, NETWORK, SERVER_OTHER, SERVER_QUEUE, TOTAL
from otelkit.study.derived import LOAD_AXES, curves, knee
from otelkit.study.point import Point

__all__ = ["Growth", "Verdict", "attribute", "growth", "verdicts"]

Kind = Literal["saturated", "contended", "client", "rising", "underloaded", "unknown"]
_Make = Callable[[Kind, "str | None", str], "Verdict"]
_CLIENT_SIDE = (NETWORK, CLIENT_OTHER, "client serialize", "client deserialize")
_AXIS_WORDS = {"concurrency": "threads", "rate": "requests/s", "instances": "instances"}


def is_stage(component: str) -> bool:
    """A pipeline stage (``server <stage>`` or ``client <stage>``), not a share of the call."""
    not_stages = (SERVER_QUEUE, SERVER_OTHER, *_CLIENT_SIDE, TOTAL)
    return component not in not_stages and component.startswith(("server ", "client "))


def _stage_name(component: str) -> str:
    return component.split(" ", 1)[1] if is_stage(component) else component


@dataclass(frozen=True)
class Growth:
    """One component's ms per request at the lowest point and at a higher one."""

    component: str
    low_ms: float
    high_ms: float

    @property
    def ratio(self) -> float:
        return self.high_ms / self.low_ms if self.low_ms > 0 else float("inf")

    @property
    def delta_ms(self) -> float:
        return self.high_ms - self.low_ms


@dataclass(frozen=True)
class Verdict:
    """What caps throughput along one curve, in one sentence."""

    curve: str
    axis: str
    kind: Kind
    limit: str | None  # the stage, component or model that limits
    sentence: str
    growth: dict[str, list[Growth]] = field(default_factory=dict)  # by higher point's label

    def to_dict(self) -> dict[str, Any]:
        table = {at: {g.component: [g.low_ms, g.high_ms] for g in rows}
                 for at, rows in self.growth.items()}  # fmt: skip
        return {"record": "verdict", "curve": self.curve, "axis": self.axis, "kind": self.kind,
                "limit": self.limit, "sentence": self.sentence, "growth_ms": table}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        table = {at: [Growth(c, lo, hi) for c, (lo, hi) in rows.items()]
                 for at, rows in data.get("growth_ms", {}).items()}  # fmt: skip
        return cls(data["curve"], data["axis"], data["kind"], data.get("limit"),
                   data["sentence"], table)  # fmt: skip


def growth(low: Point, high: Point) -> list[Growth]:
    """Every component's growth from ``low`` to ``high`` (traced points), largest first."""
    if low.traces is None or high.traces is None:
        return []
    names = (set(low.traces.components) | set(high.traces.components)) - {TOTAL}
    rows = [Growth(n, low.component_ms(n) or 0.0, high.component_ms(n) or 0.0) for n in names]
    return sorted(rows, key=lambda g: g.delta_ms, reverse=True)


def _spread(rows: Iterable[Growth]) -> float:
    """The largest relative change among ``rows`` (0.1 = ±10 %), ignoring empty components."""
    changes = [abs(g.ratio - 1) for g in rows if g.low_ms > 0]
    return max(changes, default=0.0)


@dataclass(frozen=True)
class _Words:
    unit: str
    axis: str
    low: Any
    high: Any
    tolerance: float

    def span(self) -> str:
        return f"from {self.low} to {self.high} {_AXIS_WORDS.get(self.axis, self.axis)}"

    def flat(self, spread: float, others: str) -> str:
        if spread <= self.tolerance:
            return f"while {others} stay within ±{self.tolerance * 100:.0f} %"
        return f"while {others} grow less (at most ×{1 + spread:.1f})"


def _capacity(point: Point, low: Point) -> tuple[str, str, float] | None:
    """(limiting model, its largest stage, requests/s it can serve) at ``point``'s instances
    and compute times (the stages' shares from ``low``'s traces)."""
    traces = low.traces
    by_model: dict[str, list[tuple[str, float]]] = {}
    if traces is not None:
        for component, model in traces.stage_models.items():
            by_model.setdefault(model, []).append((component, low.component_ms(component) or 0.0))
    for model in point.triton:
        by_model.setdefault(model, [])
    best: tuple[str, str, float] | None = None
    for model, stages in by_model.items():
        figures = point.triton.get(model)
        if figures is not None and figures.ensemble:
            continue  # its steps, models of their own, are judged instead
        instances = (figures.instances if figures else None) or point.params.get("instances", 1)
        capacity = figures.capacity_per_s(int(instances)) if figures else None
        if capacity is None:
            service_ms = sum(ms for _, ms in stages)
            capacity = int(instances) / (service_ms / 1e3) if service_ms > 0 else None
        if capacity is None:
            continue
        stage = max(stages, key=lambda s: s[1])[0] if stages else model
        if best is None or capacity < best[2]:
            best = (model, _stage_name(stage), capacity)
    return best


def attribute(points: list[Point], axis: str, curve: str = "", *, unit: str = "request",
              tolerance: float = 0.1) -> Verdict:  # fmt: skip
    """The verdict on one curve: ``points`` sorted along ``axis``, at least two."""
    low, high = points[0], points[-1]
    words = _Words(unit, axis, low.params[axis], high.params[axis], tolerance)
    table = {p.label: growth(low, p) for p in points[1:]}
    found = knee([(p.params[axis], p.throughput) for p in points], tolerance)
    assert found is not None
    # The capacity is read where throughput peaks: past the peak, instances that slow each
    # other down inflate the compute time, and the capacity it gives falls below what was
    # reached (on 2 cores: "plateaus at 46 events/s, the capacity of gnn (22 events/s)").
    peak = max(points, key=lambda p: p.throughput)
    top_t = f"{found.highest:.0f} {unit}s/s"
    if high.throughput < (1 - tolerance) * found.highest:
        where = f"{peak.params[axis]} {_AXIS_WORDS.get(axis, axis)}"
        throughput = (f"throughput peaks at {top_t} ({where}) and falls to "
                      f"{high.throughput:.0f} at {high.params[axis]}")  # fmt: skip
    elif found.plateau:
        throughput = f"throughput plateaus at {top_t}"
    else:
        throughput = f"throughput reaches {top_t}"
    rows = table[high.label]

    def verdict(kind: Kind, limit: str | None, sentence: str) -> Verdict:
        return Verdict(curve, axis, kind, limit, sentence, table)

    if axis == "instances":
        return _instances(low, high, rows, words, verdict)
    if not rows:
        return _without_traces(low, high, peak, words, throughput, verdict)
    total_low = low.component_ms(TOTAL) or 0.0
    total_high = high.component_ms(TOTAL) or 0.0
    top = rows[0]
    span = f"{top.low_ms:.1f} → {top.high_ms:.1f} ms per {unit} {words.span()}"
    if (total_low > 0 and total_high <= total_low * (1 + tolerance)) or top.delta_ms <= 0:
        return verdict("rising", None, (
            f"the time per {unit} stays within ±{tolerance * 100:.0f} % "
            f"({total_low:.1f} → {total_high:.1f} ms) {words.span()}: {throughput}, "
            "and nothing caps it within the sweep"))  # fmt: skip
    stages = [g for g in rows if is_stage(g.component)]
    if top.component == SERVER_QUEUE:
        flat = words.flat(_spread(stages), "the stages")
        limit = _capacity(peak, low)
        where = ""
        if limit is not None:
            model, stage, capacity = limit
            inside = f" in model {model}" if stage != model else ""
            where = f", the capacity of {stage}{inside} ({capacity:.0f} {unit}s/s)"
        return verdict(
            "saturated",
            limit[1] if limit else None,
            (f"server queue: {span} {flat}: the servers are saturated; {throughput}{where}"),
        )
    if is_stage(top.component):
        name = _stage_name(top.component)
        others = [g for g in stages if g.component != top.component]
        flat = words.flat(_spread(others), "the other stages")
        return verdict("contended", name, (
            f"{name}: {span} (×{top.ratio:.1f}) {flat}: {throughput} because {name} is "
            "contended"))  # fmt: skip
    if top.component in _CLIENT_SIDE:
        cores = f"; the client used {high.cpu_cores:.1f} CPU cores" if high.cpu_s else ""
        queue = [g for g in rows if g.component == SERVER_QUEUE]
        named = " and ".join(
            n for n, g in (("the stages", stages), ("the server queue", queue)) if g
        )
        flat = words.flat(_spread(stages + queue), named or "the servers")
        return verdict("client", top.component, (
            f"{top.component}: {span} (×{top.ratio:.1f}) {flat}: {throughput}, limited on the "
            f"client's side{cores}"))  # fmt: skip
    flat = words.flat(_spread(stages), "the stages")
    return verdict("contended", top.component, (
        f"{top.component}: {span} (×{top.ratio:.1f}) {flat}: {throughput} because the server's "
        "work outside its stages is contended"))  # fmt: skip


def _instances(
    low: Point, high: Point, rows: list[Growth], words: _Words, verdict: _Make
) -> Verdict:
    """More instances at the same load: they pay while ε stays near 1."""
    n_low, n_high = low.params["instances"], high.params["instances"]
    epsilon = (high.throughput / n_high) / (low.throughput / n_low) if low.throughput else 0.0
    unit = words.unit
    trend = (f"throughput {low.throughput:.0f} → {high.throughput:.0f} {unit}s/s "
             f"{words.span()} (ε = {epsilon:.2f})")  # fmt: skip
    if epsilon >= 1 - words.tolerance:
        return verdict("rising", None, f"{trend}: more instances pay")
    # grown: by more than the tolerance, of itself and of the whole request's time
    floor = words.tolerance * (low.component_ms(TOTAL) or 0.0)
    grown = [g for g in rows if g.ratio > 1 + words.tolerance and g.delta_ms > floor]
    if grown and is_stage(grown[0].component):
        top = grown[0]
        name = _stage_name(top.component)
        return verdict("contended", name, (
            f"{name}: {top.low_ms:.1f} → {top.high_ms:.1f} ms per {unit} {words.span()} "
            f"(×{top.ratio:.1f}): {trend} because the instances contend for what {name} "
            "needs"))  # fmt: skip
    if grown and grown[0].component in _CLIENT_SIDE:
        return verdict("client", grown[0].component, (
            f"{grown[0].component}: {grown[0].low_ms:.1f} → {grown[0].high_ms:.1f} ms per "
            f"{unit}: {trend}, limited on the client's side"))  # fmt: skip
    queue = high.component_ms(SERVER_QUEUE) or 0.0
    if queue > words.tolerance * (high.component_ms(TOTAL) or 0.0):
        # requests still wait for an instance: the instances are busy, and slower together
        growing = [g for g in rows if g.delta_ms > 0 and g.component != SERVER_QUEUE]
        limit = growing[0].component if growing else None
        return verdict("contended", limit, (
            f"{trend} while requests still queue {queue:.1f} ms for an instance: the "
            "instances are busy and slow each other down (a shared CPU, GPU or memory "
            "bandwidth)"))  # fmt: skip
    concurrency = high.params.get("concurrency")
    load = f" ({concurrency} in flight)" if concurrency else ""
    return verdict("underloaded", None, (
        f"{trend}: the load{load} does not keep more instances busy"))  # fmt: skip


def _without_traces(
    low: Point, high: Point, peak: Point, words: _Words, throughput: str, verdict: _Make
) -> Verdict:
    models = [m for m in high.triton if m in low.triton]
    if not models:
        return verdict("unknown", None, (
            f"{throughput} {words.span()}; no traces or server metrics to say why"))  # fmt: skip
    grown = {m: (high.triton[m].queue_ms - low.triton[m].queue_ms,
                 high.triton[m].compute_ms - low.triton[m].compute_ms) for m in models}  # fmt: skip
    model = max(models, key=lambda m: max(grown[m]))
    queue, compute = grown[model]
    lo, hi = low.triton[model], high.triton[model]
    if queue >= compute:
        at_peak = peak.triton.get(model, hi)
        capacity = at_peak.capacity_per_s(int(peak.params.get("instances", 1)))
        cap = f", the capacity of {model} ({capacity:.0f} {words.unit}s/s)" if capacity else ""
        return verdict("saturated", model, (
            f"{model} queue: {lo.queue_ms:.1f} → {hi.queue_ms:.1f} ms per {words.unit} "
            f"{words.span()} while its compute goes {lo.compute_ms:.1f} → {hi.compute_ms:.1f} "
            f"ms: the servers are saturated; {throughput}{cap}"))  # fmt: skip
    return verdict("contended", model, (
        f"{model} compute: {lo.compute_ms:.1f} → {hi.compute_ms:.1f} ms per {words.unit} "
        f"{words.span()}: {throughput} because {model} is contended"))  # fmt: skip


def verdicts(
    points: Iterable[Point], *, unit: str = "request", tolerance: float = 0.1
) -> list[Verdict]:
    """One verdict per curve along concurrency, rate and instances."""
    points = list(points)
    found = []
    for axis in LOAD_AXES:
        for curve, members in curves(points, axis).items():
            found.append(attribute(members, axis, curve, unit=unit, tolerance=tolerance))
    return found
