"""What-if: the throughput and latency a changed deployment would give, from measured demands.

The model is built from the lowest point of a curve (the demands a request has when nothing
waits) and solved by mean value analysis (Reiser and Lavenberg, 1980) for a closed loop of N
requests in flight:

- each model is a station with its instances as servers (load-dependent: with j requests
  present it serves min(j, m) / D a second);
- a stage that the verdict found serving one request at a time (a lock) is a station of one
  server, taken out of its model's demand;
- what the request spends outside the stations (the client, the network) is think time Z;
- the resources that every station shares (the host's cores, the client's CPU under its GIL, a
  GPU) bound throughput from above, X <= m / D, with the demand the verdict weighs (the peak's
  where it fell with load): when a change lifts the first limit, the next one takes over.

An open loop at rate λ gets min(λ, every bound). Every figure here is *derived*, never measured:
``otelkit study predict --confirm`` measures the changed deployment beside the prediction.

>>> stations = [Station("gnn", 10.0, 1)]
>>> [round(x) for x, _ in closed_loop(stations, think_ms=0.0, loads=[1, 2, 8])]
[100, 100, 100]
>>> [round(x) for x, _ in closed_loop([Station("gnn", 10.0, 2)], 0.0, [1, 2, 8])]
[100, 200, 200]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from otelkit._errors import StudyError
from otelkit.study._capacity import resources
from otelkit.study._derived import LOAD_AXES, along
from otelkit.study._point import Point
from otelkit.study._verdicts import Evidence, judge

__all__ = ["Prediction", "Station", "closed_loop", "parse_changes", "predict"]

#: what may be changed: a model's instances (replicas, for Ray Serve), the host's cores, the
#: client's processes (each with a GIL of its own), a fleet's servers (``fleet.servers``: every
#: model's instances scale with them), its load balancer's worker threads
#: (``balancer.workers``), the request's batch size (``request.batch_size``: demands fitted
#: linear in the batch over the batch sizes measured) and how many requests a stage's lock or
#: pool serves at a time (``match.parallelism``)
_SETTINGS = (
    "instances",
    "replicas",
    "cores",
    "processes",
    "servers",
    "workers",
    "batch_size",
    "parallelism",
)


@dataclass(frozen=True)
class Station:
    """A resource a request queues for: ``demand_ms`` per request on ``servers`` servers."""

    name: str
    demand_ms: float
    servers: float


@dataclass(frozen=True)
class Predicted:
    """One load's predicted throughput (requests/s), mean latency and limiting resource."""

    load: float
    throughput: float
    latency_ms: float
    limit: str


@dataclass
class Prediction:
    """A curve's prediction under ``changes``, from the demands of the point ``base``."""

    curve: str
    axis: str
    base: str
    changes: dict[str, dict[str, int]]
    points: list[Predicted] = field(default_factory=list)
    batch_size: int = 1  # inferences a request, for the inferences a second

    def summary(self, unit: str = "request") -> str:
        changed = ", ".join(f"{r}.{k}={v}" for r, c in self.changes.items() for k, v in c.items())
        lines = [
            f"predicted [{self.curve or 'all'}] with {changed or 'no change'} "
            f"(derived from {self.base}, mean value analysis):"
        ]
        items = self.batch_size
        for p in self.points:
            batch = f" ({p.throughput * items:.0f} inferences/s)" if items > 1 else ""
            lines.append(
                f"  {self.axis}={p.load:g}: {p.throughput:.0f} {unit}s/s{batch}, mean "
                f"{p.latency_ms:.1f} ms, limited by {p.limit}"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "record": "prediction",
            "curve": self.curve,
            "axis": self.axis,
            "base": self.base,
            "changes": self.changes,
            "derived": True,
            "points": [p.__dict__ for p in self.points],
        }


def parse_changes(settings: Sequence[str]) -> dict[str, dict[str, int]]:
    """``["gnn.instances=2", "host.cores=4"]`` as ``{"gnn": {"instances": 2}, ...}``.

    >>> parse_changes(["gnn.instances=2", "client.processes=4"])
    {'gnn': {'instances': 2}, 'client': {'processes': 4}}
    """
    changes: dict[str, dict[str, int]] = {}
    for setting in settings:
        name, _, value = setting.partition("=")
        resource, _, what = name.rpartition(".")
        if not resource or what not in _SETTINGS or not value.strip().isdigit():
            raise StudyError(
                f"--set {setting!r}: give RESOURCE.SETTING=N, SETTING one of "
                f"{', '.join(_SETTINGS)} (gnn.instances=2, host.cores=4, client.processes=2, "
                "fleet.servers=4, balancer.workers=2, request.batch_size=8)"
            )
        count = int(value)
        if count < 1:
            raise StudyError(f"--set {setting!r}: a count is 1 or more")
        changes.setdefault(resource, {})["replicas" if what == "replicas" else what] = count
    return changes


def closed_loop(
    stations: Sequence[Station], think_ms: float, loads: Sequence[int]
) -> list[tuple[float, float]]:
    """(throughput per s, response ms) at each of ``loads`` in flight: exact mean value
    analysis with load-dependent stations (a station of m servers serves j requests at
    min(j, m) / D), keeping each station's distribution of requests present."""
    top = max(loads, default=0)
    wanted, found = set(loads), {}
    present = [[1.0] for _ in stations]  # P(j requests at the station), one fewer in flight
    for n in range(1, top + 1):
        times = [
            sum(j * s.demand_ms / min(j, s.servers) * p[j - 1] for j in range(1, n + 1))
            for s, p in zip(stations, present, strict=True)
        ]
        response = sum(times)
        x = n / (think_ms + response)  # per ms
        updated = []
        for s, p in zip(stations, present, strict=True):
            now = [0.0] + [x * s.demand_ms / min(j, s.servers) * p[j - 1] for j in range(1, n + 1)]
            now[0] = max(0.0, 1.0 - sum(now))  # rounding may push it below 0 at large n
            updated.append(now)
        present = updated
        if n in wanted:
            found[n] = (x * 1e3, response)
    return [found[n] for n in loads]


def _changed(
    resource: str, what: str, base: float, changes: Mapping[str, Mapping[str, int]]
) -> float:
    settings = changes.get(resource, {})
    if what == "instances":
        return float(settings.get("instances", settings.get("replicas", base)))
    return float(settings.get(what, base))


def _cycle_ms(low: Point) -> float:
    """Little's law on the lowest point: its cycle is N / X (its mean latency in an open loop)."""
    in_flight = float(low.params.get("concurrency", 1))
    if low.throughput and "rate" not in low.params:
        return in_flight / low.throughput * 1e3
    return low.histogram.mean_s * 1e3


def _queued_ms(point: Point) -> float:
    """The ms a request of ``point`` waited in the models' queues (Triton's counters): a wait
    at the stations, not think time, when the lowest point already queues (a curve of one
    point at a high load)."""
    if not point.requests:
        return 0.0
    return sum(
        f.queue_ms * f.requests / point.requests
        for f in point.triton.values()
        if not f.ensemble and f.executions
    )


def _model(
    cycle_ms: float,
    evidence: Sequence[Evidence],
    changes: Mapping[str, Mapping[str, int]],
    fleet_servers: float = 1,
    queued_ms: float = 0.0,
) -> tuple[list[Station], list[Station], float]:
    """(queueing stations, shared bounds, think ms) from the lowest point's demands and cycle:
    what the stations do not hold, nor a request waited for in their queues (``queued_ms``),
    is think time (the client's work, the network), which a change leaves as it is.
    ``fleet_servers``: the servers the point had behind its balancer."""
    locks = {e.model: e for e in evidence if e.kind in ("lock", "pool") and e.model}
    scale = _changed("fleet", "servers", fleet_servers, changes) / fleet_servers
    stations, bounds = [], []
    for row in evidence:
        if row.kind == "instances":
            servers = _changed(row.name, "instances", row.servers or 1, changes) * scale
            held = locks.get(row.name)
            demand = row.low_ms - (held.low_ms if held else 0.0)
            stations.append(Station(row.name, max(demand, 0.0), servers))
            if held is not None:
                stations.append(_held(held, changes))
        elif row.kind in ("lock", "pool") and row.model not in {e.name for e in evidence}:
            stations.append(_held(row, changes))
        elif row.kind == "cores":
            cores = _changed("host", "cores", row.servers or 1, changes)
            bounds.append(
                Station(
                    row.name if cores == row.servers else f"the host's {cores:g} cores",
                    row.demand_ms,
                    cores,
                )
            )
        elif row.kind in ("gil", "network"):
            bounds.append(Station(row.name, row.demand_ms, row.servers or 1))
        elif row.kind == "balancer":
            workers = _changed("balancer", "workers", row.servers or 1, changes)
            bounds.append(Station(row.name, row.demand_ms, workers))
        elif row.kind == "client":
            processes = _changed("client", "processes", row.servers or 1, changes)
            bounds.append(Station("the client's CPU", row.demand_ms, processes))
        elif row.kind == "gpu":
            bounds.append(Station(row.name, row.demand_ms, row.servers or 1))
    think = max(0.0, cycle_ms - queued_ms - sum(s.demand_ms for s in stations))
    return [s for s in stations if s.demand_ms > 0], bounds, think


def _held(row: Evidence, changes: Mapping[str, Mapping[str, int]]) -> Station:
    """A lock's or a pool's station: its hold, with the k it serves at a time (changed by
    ``STAGE.parallelism=K``)."""
    k = _changed(row.name, "parallelism", row.servers or 1, changes)
    at_once = "one" if k == 1 else f"{k:g}"
    return Station(f"{row.name} ({at_once} at a time)", row.low_ms, k)


def predict(
    points: Sequence[Point],
    changes: Mapping[str, Mapping[str, int]],
    *,
    loads: Sequence[float] | None = None,
    tolerance: float = 0.1,
) -> list[Prediction]:
    """One prediction per curve along concurrency or rate among ``points`` under ``changes``,
    at the curve's loads (or ``loads``)."""
    ok = [p for p in points if p.status == "ok"]
    known = {e for p in ok for e in p.triton} | set(p for q in ok for p in q.parallelism)
    # a traced stage: what it holds may be changed (a lock's or a pool's parallelism)
    known |= {
        component.split(" ", 1)[1]
        for p in ok
        if p.traces is not None
        for component in p.traces.stage_models
    }
    for resource in changes:
        if resource not in known | {"host", "client", "request", "fleet", "balancer"}:
            raise StudyError(
                f"no resource {resource!r} in the study: its models are "
                f"{', '.join(sorted(known)) or 'none'}; host, client, request, fleet, balancer"
            )
    batch = changes.get("request", {}).get("batch_size")
    if batch is not None:
        return _batch_what_if(ok, changes, batch, loads, tolerance)
    found = []
    for axis in LOAD_AXES[:2]:
        for curve, members in along(ok, axis).items():
            verdict = judge(members, axis, curve, tolerance=tolerance) if len(members) > 1 else None
            evidence = verdict.evidence if verdict else _single(members[0])
            low = members[0]
            fleet = float(low.params.get("servers", 1))
            cycle = _cycle_ms(low)
            stations, bounds, think = _model(cycle, evidence, changes, fleet, _queued_ms(low))
            at = list(loads) if loads is not None else [p.params[axis] for p in members]
            prediction = Prediction(
                curve,
                axis,
                f"{members[0].label}'s demands",
                {k: dict(v) for k, v in changes.items()},
            )
            prediction.points = _solve(stations, bounds, think, axis, at)
            found.append(prediction)
    return found


def _line(values: Sequence[tuple[float, float]], at: float) -> float:
    """The least-squares line through (x, y) ``values``, at ``at``."""
    xs, ys = [x for x, _ in values], [y for _, y in values]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in values) / spread if spread else 0.0
    return mean_y + slope * (at - mean_x)


def _batch_what_if(
    points: Sequence[Point],
    changes: Mapping[str, Mapping[str, int]],
    batch: int,
    loads: Sequence[float] | None,
    tolerance: float,
) -> list[Prediction]:
    """A request of ``batch`` inferences: each demand, and the lowest point's cycle, fitted
    linear in the batch size (a fixed cost a request and one an inference) over the batch
    sizes the study measured, at the lowest load of each."""
    found = []
    for axis in LOAD_AXES[:2]:
        for curve, members in along(points, axis, leave_out="batch_size").items():
            sizes = sorted({int(p.params.get("batch_size", p.batch_size)) for p in members})
            if len(sizes) < 2:
                continue
            by_size = {
                b: [p for p in members if p.params.get("batch_size", p.batch_size) == b]
                for b in sizes
            }
            rows = {}
            for b, at_b in by_size.items():
                verdict = judge(at_b, axis, tolerance=tolerance) if len(at_b) > 1 else None
                rows[b] = {e.key: e for e in (verdict.evidence if verdict else _single(at_b[0]))}
            nearest = min(sizes, key=lambda b: abs(b - batch))
            evidence = []
            for key, row in rows[nearest].items():
                seen = [(b, r[key].low_ms) for b, r in rows.items() if key in r]
                if len(seen) >= 2:
                    low_ms = max(0.0, _line(seen, batch))
                    evidence.append(replace(row, low_ms=low_ms, peak_ms=low_ms))
            cycle = _line([(b, _cycle_ms(at_b[0])) for b, at_b in by_size.items()], batch)
            stations, bounds, think = _model(cycle, evidence, changes)
            template = by_size[nearest]
            at = list(loads) if loads is not None else [p.params[axis] for p in template]
            base = f"batch sizes {', '.join(map(str, sizes))} (demands fitted linear in the batch)"
            prediction = Prediction(
                curve, axis, base, {k: dict(v) for k, v in changes.items()}, batch_size=batch
            )
            prediction.points = _solve(stations, bounds, think, axis, at)
            found.append(prediction)
    if not found:
        raise StudyError(
            "request.batch_size needs a curve measured at two batch sizes or more "
            "(sweep batch_size=1,8 with a load axis)"
        )
    return found


def _single(point: Point) -> tuple[Evidence, ...]:
    return tuple(
        Evidence(
            r.key,
            r.kind,
            r.name,
            r.servers,
            r.demand_ms,
            r.demand_ms,
            r.utilisation,
            point.throughput,
            r.model,
        )
        for r in resources(point).values()
    )


def _solve(
    stations: list[Station], bounds: list[Station], think: float, axis: str, loads: list[float]
) -> list[Predicted]:
    every = stations + bounds
    caps = [(s.servers / s.demand_ms * 1e3, s.name) for s in every if s.demand_ms > 0]
    out = []
    if axis == "concurrency":
        solved = [x for x, _ in closed_loop(stations, think, [int(n) for n in loads])]
        for n, x in zip(loads, solved, strict=True):
            cap, name = min(caps, default=(float("inf"), "nothing measured"))
            if x < cap:  # the stations' own queueing: the busiest one limits
                name = (
                    max(stations, key=lambda s: s.demand_ms / s.servers).name
                    if stations
                    else "the think time"
                )
            throughput = min(x, cap)
            out.append(Predicted(n, throughput, n / throughput * 1e3, name))  # Little's law
        return out
    for rate in loads:
        cap, name = min(caps, default=(float("inf"), "nothing measured"))
        throughput = min(float(rate), cap)
        out.append(
            Predicted(
                rate,
                throughput,
                _open_latency(stations, think, throughput),
                name if throughput < rate else "the rate",
            )
        )
    return out


def _open_latency(stations: list[Station], think: float, rate: float) -> float:
    """The mean response of an open network at ``rate`` a second (each station M/M/1 on its
    share D/m, plus the delay D(m-1)/m): infinite once a station is full."""
    total = think
    for s in stations:
        busy = rate * s.demand_ms / 1e3 / s.servers
        if busy >= 1:
            return float("inf")
        total += s.demand_ms / s.servers / (1 - busy) + s.demand_ms * (s.servers - 1) / s.servers
    return total
