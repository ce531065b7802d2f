"""The capacity model of one point: every resource a request uses, with the operational laws.

For each resource k, measured over the point's window (Denning and Buzen 1978; Lazowska et al.,
*Quantitative System Performance*, chs. 3-5):

- its parallelism m_k: a model's configured instances (times the servers of a fleet), the cores
  of the host that serves, a load balancer's worker threads, 1 for the client's Python threads
  (one GIL) or for a GPU;
- its demand D_k: busy milliseconds per request of the study's unit, with its visits (a model
  an event calls twice counts twice);
- its utilisation U_k = X . D_k / m_k (the utilisation law), X the point's throughput; where
  the resource reports its busy share itself (the host's cores from ``/proc/stat``, a GPU's
  ``nv_gpu_utilization``), that is U_k, and D_k is derived from it.

The bottleneck law, X <= m_k / D_k for every k, says what each resource allows at most: its
``limit_per_s``. Which resource caps a curve, and why, is ``verdicts.py``'s question; this
module only states each resource at one point.

>>> from otelkit.study._point import LatencyHistogram
>>> point = Point(0, {"concurrency": 1}, requests=500, seconds=5.0, cpu_s=2.0)
>>> client = resources(point)["client cpu"]
>>> client.demand_ms, client.servers, round(client.utilisation, 2), client.limit_per_s
(4.0, 1, 0.4, 250.0)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from otelkit.study._counters import ModelFigures
from otelkit.study._point import Point, Window
from otelkit.study._stats import mean_interval, t_quantile

__all__ = [
    "Resource",
    "ResourceKind",
    "Separation",
    "Spread",
    "Summary",
    "resources",
    "separation",
    "spread",
    "summary",
]

#: instances: a model's (or a deployment's) instances; client: the client process's CPU under
#: its GIL; gil: a Python server process's CPU under its GIL; cores: the serving host's cores;
#: balancer: the load balancer in front of a fleet, its worker threads (Envoy's ``--concurrency``);
#: gpu: one GPU; network: the link between client and server, each way (full duplex) at the
#: rate the study was told; stage: a traced stage of a model, whose parallelism is its
#: model's instances (``None`` where no model says).
ResourceKind = Literal["instances", "client", "gil", "cores", "balancer", "gpu", "network", "stage"]


@dataclass(frozen=True)
class Resource:
    """One resource at one point. ``demand_ms`` is busy ms per request, ``servers`` its m."""

    key: str  # the same at every point of a study: "model gnn", "stage match", "host cores"
    kind: ResourceKind
    name: str  # as a sentence names it
    servers: float | None  # instances, cores (less what other processes take), 1
    demand_ms: float
    utilisation: float | None  # X . D / m; None where m is unknown
    source: str  # where the demand was measured
    model: str | None = None  # the model a stage runs in

    @property
    def limit_per_s(self) -> float | None:
        """The bottleneck law's bound on throughput: m / D, requests per second."""
        if not self.servers or self.demand_ms <= 0:
            return None
        return self.servers / (self.demand_ms / 1e3)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _utilisation(throughput: float, demand_ms: float, servers: float | None) -> float | None:
    return throughput * demand_ms / 1e3 / servers if servers else None


def _instances(point: Point, model: str) -> int | None:
    """A model's instances (Triton's configuration, or the server's word: Ray Serve's
    replicas); the point's ``instances`` for a Triton model whose configuration was not read."""
    figures = point.triton.get(model)
    if figures is not None and figures.instances:
        return figures.instances
    if model in point.parallelism:
        return point.parallelism[model]
    return int(point.params.get("instances", 1)) if figures is not None else None


#: a reading of the host's idle use this far above what a point left unexplained by its
#: server's processes and its client, with as many cores free during the point, is a
#: transient, not the host's use (``resources``)
_TRANSIENT_CORES = 0.5


def other_use(point: Point) -> float:
    """The cores the host kept busy at ``point`` beside its requests: its cores less this are
    the cores the requests had (read from /proc/stat; 0 without a host reading)."""
    host = point.host
    if host is None or not host.cores or host.busy_cores is None:
        return 0.0
    # What the host keeps busy with no request in flight (other processes, a server's own
    # polling, Ray's daemons) is not the requests' demand but fewer cores left for them.
    idle = host.idle_cores or 0.0
    if host.server_cores is not None and point.seconds:
        # What the point itself left unexplained by the server's processes and the client
        # is the host's other use during it. A reading before the point half a core above
        # that, while the point left half a core free that this use could have taken, was
        # a transient, not the host's use (in CI: 1.09 cores read just before a point
        # that left 0.17 unexplained and 0.73 free). On a host loaded to its last core
        # the other processes yield to the point and the reading before it stands.
        unexplained = max(0.0, host.busy_cores - host.server_cores - point.cpu_s / point.seconds)
        free = host.cores - host.busy_cores
        if idle - unexplained >= _TRANSIENT_CORES and free >= _TRANSIENT_CORES:
            idle = unexplained
    return min(idle, host.busy_cores, host.cores - 0.5)


def resources(point: Point) -> dict[str, Resource]:
    """Every resource of ``point`` that its figures show, by key."""
    x = point.throughput
    found: dict[str, Resource] = {}
    if x <= 0:
        return found

    def add(
        key: str,
        kind: ResourceKind,
        name: str,
        servers: float | None,
        demand_ms: float,
        source: str,
        utilisation: float | None = None,
        model: str | None = None,
    ) -> None:
        if demand_ms <= 0:
            return
        if utilisation is None:
            utilisation = _utilisation(x, demand_ms, servers)
        found[key] = Resource(key, kind, name, servers, demand_ms, utilisation, source, model)

    for model, figures in point.triton.items():
        if figures.ensemble or not figures.executions:
            continue  # an ensemble's steps are models of their own, judged instead
        visits = figures.requests / point.requests if point.requests else 1.0
        add(
            f"model {model}",
            "instances",
            model,
            _instances(point, model),
            figures.demand_ms * visits,
            "Triton's compute counters",
        )
    traces = point.traces
    if traces is not None:
        served: dict[str, float] = {}
        for component, model in traces.stage_models.items():
            ms = point.component_ms(component) or 0.0
            stage = component.split(" ", 1)[1]
            add(
                f"stage {stage}",
                "stage",
                stage,
                _instances(point, model),
                ms,
                "traces",
                model=model,
            )
            served[model] = served.get(model, 0.0) + ms
        for model, ms in served.items():
            if model not in point.triton and model in point.parallelism:
                # A deployment without counters of its own: its stages' time and its replicas'
                # CPU (each a Python process, one GIL) are each the least of a replica's busy
                # time per request; the larger is the nearer.
                cpu_ms = point.process_cores.get(model, 0.0) * 1e3 / x
                source = "its replicas' CPU time" if cpu_ms > ms else "its stages in the traces"
                servers = point.parallelism[model]
                add(f"model {model}", "instances", model, servers, max(ms, cpu_ms), source)
    if point.cpu_s > 0 and point.requests:
        processes = max(1, point.parts)
        add(
            "client cpu",
            "client",
            "the client's CPU",
            processes,
            point.cpu_s * 1e3 / point.requests,
            "the client's CPU time",
        )
    host = point.host
    if host is not None and host.cores and host.busy_cores is not None:
        idle = other_use(point)
        add(
            "host cores",
            "cores",
            f"the host's {host.cores} cores",
            host.cores - idle,
            (host.busy_cores - idle) * 1e3 / x,
            "/proc/stat, less the host's idle use",
            host.busy_cores / host.cores,
        )
    if host is not None and host.python_processes and host.python_cores:
        many = host.python_processes > 1
        add(
            "server gil",
            "gil",
            f"the server's Python process{'es' if many else ''}",
            host.python_processes,
            host.python_cores * 1e3 / x,
            "the server process's CPU time",
        )
    if host is not None and host.balancer_workers and host.balancer_cores:
        add(
            "load balancer",
            "balancer",
            "the load balancer",
            host.balancer_workers,
            host.balancer_cores * 1e3 / x,
            "the load balancer's CPU time (Envoy's workers)",
        )
    if point.payload_bytes is not None and point.link_gbps:
        # a full-duplex link: each direction is its own; the busier one is the demand
        busiest = max(point.payload_bytes)
        add(
            "network",
            "network",
            f"the network ({point.link_gbps:g} Gb/s)",
            1,
            busiest * 8 / (point.link_gbps * 1e9) * 1e3,
            "tensor bytes a request",
        )
    for uuid, gauges in point.gpus.items():
        busy = gauges.get("utilization")
        if busy is not None and busy > 0:
            add(
                f"gpu {uuid}",
                "gpu",
                f"GPU {uuid[:12]}",
                1,
                busy * 1e3 / x,
                "nv_gpu_utilization",
                busy,
            )
    return found


@dataclass(frozen=True)
class Summary:
    """A figure of one point with its spread over the point's windows: ``value`` is the point's
    own (as ``resources`` gives it), ``median`` the windows' median, and ``low`` to ``high``
    the interval of the point's figure, centred on it."""

    value: float
    median: float
    low: float
    high: float
    windows: int  # the windows that held the figure

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summary(value: float, samples: Sequence[float], confidence: float = 0.95) -> Summary | None:
    """``value`` with the interval of the mean of its windows' ``samples``; ``None`` without
    samples (an interval needs two: with one, it is unbounded).

    The windows are batch means of one steady run, and the question a verdict asks of them is
    how far the point's own figure may be from the one a rerun would give: the t-interval of
    the mean of the batch means (``compare``'s machinery, ``_stats.py``) answers that, its width
    shrinking as the window grows. A percentile range of the windows (10th to 90th) would
    answer how much one tenth of the window varies, wider by about √10 whatever the window's
    length, and with ten windows its ends are single order statistics: no steadier than
    the extreme windows themselves.

    >>> s = summary(2.0, [1.9, 2.1, 2.0, 2.0])
    >>> s.median, round(s.low, 3), round(s.high, 3)
    (2.0, 1.87, 2.13)
    """
    if not samples:
        return None
    low, high = mean_interval(samples, confidence)
    half = (high - low) / 2
    return Summary(value, statistics.median(samples), value - half, value + half, len(samples))


@dataclass(frozen=True)
class Spread:
    """One resource of one point over the point's windows: its demand, utilisation and limit
    in each (``None`` where a window lacks the figure), and each summarised.

    ``reason`` says why a resource has no windows: its figure is read over the whole point
    only."""

    key: str
    servers: float | None
    throughputs: tuple[float, ...]  # of the windows that held the resource
    demands_ms: tuple[float | None, ...]  # every window's, in order
    utilisations: tuple[float | None, ...]
    throughput: Summary | None
    demand_ms: Summary | None
    utilisation: Summary | None
    limit_per_s: Summary | None
    reason: str = ""

    def load(self, peak_per_s: float, confidence: float = 0.95) -> Summary | None:
        """U* = X_peak · D / m with this point's demand (the lowest point's, as verdicts weigh
        it) and its spread over this point's windows."""
        if not self.servers or self.demand_ms is None:
            return None
        scale = peak_per_s / 1e3 / self.servers
        samples = [d * scale for d in self.demands_ms if d is not None]
        return summary(self.demand_ms.value * scale, samples, confidence)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Why a resource has no windows, by what its figure comes from.
_WHOLE_POINT = {
    "gpu": "Triton refreshes its GPU gauges every 2 s (--metrics-interval-ms): one read at the "
    "point's end, not one per part",
    "stage": "its demand comes from the traces, which are not cut into the window's parts",
}


def spread(point: Point, confidence: float = 0.95) -> dict[str, Spread]:
    """Every resource ``resources(point)`` names, with its figures in each of the point's
    windows: each window is read as a point of its own (its requests, length and what was read
    at its edges, with the point's configuration) through ``resources``, so a window's demand
    and utilisation are the point's, computed alike.

    A resource whose figure comes from a read of the whole point only (the traces' stages, the
    GPUs' gauges) has no windows and a ``reason``; so have all of them in a point whose windows
    lack their reads (a file from before they were read, a point measured to a count of
    ``requests``, a merged point's server-side figures).
    """
    found = resources(point)
    parts = [(w, _window_point(point, w)) for w in point.windows]
    measured = [(w, resources(p)) for w, p in parts if p is not None]
    spreads = {}
    for key, resource in found.items():
        reason = _WHOLE_POINT.get(resource.kind, "")
        if resource.source == "its stages in the traces":
            reason = _WHOLE_POINT["stage"]
        if not measured:
            reason = reason or "the point's windows were not read at their edges"
        rows = [(w, read.get(key)) for w, read in measured] if not reason else []
        held = [(w, r) for w, r in rows if r is not None]
        demands = [r.demand_ms if r is not None else None for _, r in rows]
        uses = [r.utilisation if r is not None else None for _, r in rows]
        limits = [r.limit_per_s for _, r in held if r.limit_per_s is not None]
        spreads[key] = Spread(
            key,
            resource.servers,
            tuple(w.throughput for w, _ in held),
            tuple(demands),
            tuple(uses),
            summary(point.throughput, [w.throughput for w, _ in held], confidence),
            summary(resource.demand_ms, [d for d in demands if d is not None], confidence),
            _summary_of(resource.utilisation, uses, confidence),
            _summary_of(resource.limit_per_s, limits, confidence),
            reason or ("no window held it" if not held else ""),
        )
    return spreads


@dataclass(frozen=True)
class Noise:
    """How each resource's demand scatters over the windows of a study's points, pooled:
    a window's demand relative to its point's mean, less one, for every point's windows in
    order (``None`` where a window did not hold the resource)."""

    deviations: dict[str, tuple[tuple[float | None, ...], ...]]

    def _pooled(self, a: str, b: str) -> tuple[float, int]:
        """The pooled covariance of ``a``'s and ``b``'s relative deviations over the windows
        that held both (a variance where ``a`` is ``b``), and its degrees of freedom."""
        total, df = 0.0, 0
        for one, other in zip(self.deviations.get(a, ()), self.deviations.get(b, ()), strict=False):
            pairs = [
                (x, y) for x, y in zip(one, other, strict=False) if x is not None and y is not None
            ]
            if len(pairs) < 2:
                continue
            mean_x = statistics.fmean(x for x, _ in pairs)
            mean_y = statistics.fmean(y for _, y in pairs)
            total += sum((x - mean_x) * (y - mean_y) for x, y in pairs)
            df += len(pairs) - 1
        return (total / df if df else math.nan), df

    def half_width(
        self, key: str, value: float, windows: int, confidence: float = 0.95
    ) -> float | None:
        """The half-width of the t-interval of ``key``'s figure ``value`` (proportional to its
        demand: U*, U), the mean of ``windows`` windows; None where the study holds no
        scatter of it."""
        variance, df = self._pooled(key, key)
        if not df or windows < 1:
            return None
        t = t_quantile(0.5 + confidence / 2, df)
        return t * math.sqrt(variance) * abs(value) / math.sqrt(windows)

    def difference_half_width(
        self,
        a: str,
        value_a: float,
        b: str,
        value_b: float,
        windows: int,
        confidence: float = 0.95,
    ) -> float | None:
        """The half-width of the interval of ``value_a - value_b``, each the mean of
        ``windows`` windows that held both: paired window by window, since both follow each
        window's throughput (``separation``'s reason), their covariance pooled like their
        variances."""
        var_a, df_a = self._pooled(a, a)
        var_b, df_b = self._pooled(b, b)
        cov, df = self._pooled(a, b)
        if not (df and df_a and df_b) or windows < 1:
            return None
        variance = value_a**2 * var_a + value_b**2 * var_b - 2 * value_a * value_b * cov
        t = t_quantile(0.5 + confidence / 2, df)
        return t * math.sqrt(max(variance, 0.0)) / math.sqrt(windows)


def pooled_noise(points: Sequence[Point]) -> Noise:
    """Each resource's scatter over its windows, for the study's ``points`` together: how a
    window's demand scatters about its point's is the host's and the measurement's, alike at
    every point of one study. Five repeats give one point four degrees of freedom, and the
    spread they gave one figure in two runs of one study differed ten-fold here (0.02 and 0.21
    of U* 0.75 at docs/study.md's ``instances=2 concurrency=4``); pooled over the study's six
    points, it has twenty-four."""
    found: dict[str, dict[int, tuple[float | None, ...]]] = {}
    indices = []
    for n, point in enumerate(points):
        if point.status != "ok" or len(point.windows) < 2:
            continue
        indices.append(n)
        for key, figures in spread(point).items():
            demands = [d for d in figures.demands_ms if d is not None]
            mean = statistics.fmean(demands) if len(demands) >= 2 else 0.0
            if mean > 0:
                found.setdefault(key, {})[n] = tuple(
                    d / mean - 1 if d is not None else None for d in figures.demands_ms
                )
    # aligned point by point: a point that did not hold a resource keeps its place, empty
    aligned = {key: tuple(rows.get(i, ()) for i in indices) for key, rows in found.items()}
    return Noise(aligned)


def _summary_of(
    value: float | None, samples: Sequence[float | None], confidence: float
) -> Summary | None:
    if value is None:
        return None
    return summary(value, [s for s in samples if s is not None], confidence)


def _window_point(point: Point, window: Window) -> Point | None:
    """A window as a point of its own, for ``resources``: its throughput, requests, length and
    reads, with the point's configuration (instances, parallelism, the host's cores and idle
    use, payloads) and its traces (a Ray deployment's stages, the floor of its demand)."""
    if window.requests is None or not window.seconds:
        return None
    part = Point(
        point.index,
        point.params,
        requests=window.requests,
        seconds=window.seconds,
        batch_size=point.batch_size,
        cpu_s=window.cpu_s or 0.0,
        parts=point.parts,
        traces=point.traces,
        parallelism=point.parallelism,
        process_cores=window.process_cores,
        payload_bytes=point.payload_bytes,
        link_gbps=point.link_gbps,
    )
    part.part_throughputs = [window.throughput]
    part.triton = {
        model: _configured(figures, point.triton.get(model))
        for model, figures in window.triton.items()
    }
    if point.host is not None:
        part.host = replace(
            point.host,
            busy_cores=window.busy_cores,
            python_cores=window.python_cores,
            balancer_cores=window.balancer_cores,
            seconds=window.seconds,
        )
    return part


def _configured(figures: ModelFigures, point: ModelFigures | None) -> ModelFigures:
    """A window's figures of a model with what the model's configuration said at the point."""
    if point is None:
        return figures
    return replace(
        figures,
        instances=point.instances,
        ensemble=point.ensemble,
        max_batch_size=point.max_batch_size,
        batch_delay_ms=point.batch_delay_ms,
    )


@dataclass(frozen=True)
class Separation:
    """Two resources' utilisations at one point: ``difference`` (a's less b's, the point's own
    figures) and the interval of it from their windows."""

    a: str
    b: str
    difference: float
    low: float
    high: float
    windows: int  # the windows both held

    @property
    def separable(self) -> bool:
        """Whether the interval leaves 0 out: one is busier than the other beyond the noise."""
        return self.low > 0 or self.high < 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "separable": self.separable}


def separation(
    a: Spread, b: Spread, *, peak_per_s: float | None = None, confidence: float = 0.95
) -> Separation:
    """Whether ``a``'s and ``b``'s utilisations at their point differ beyond its windows' noise.

    The windows of one point are read over the same parts for every resource, and both
    resources' utilisations follow each part's throughput: the interval is of their
    difference part by part (paired), which a Welch interval of two independent samples would
    widen by the throughput's own spread, counted twice. With ``peak_per_s``, the figure is U*
    = X_peak · D / m, and ``a`` and ``b`` are the lowest point's spreads (whose demands U*
    weighs). Unbounded (not separable) where fewer than two windows held both, or where a
    resource's parallelism is unknown.
    """
    pairs: list[tuple[float, float]] = []
    if peak_per_s is None:
        value_a = a.utilisation.value if a.utilisation is not None else None
        value_b = b.utilisation.value if b.utilisation is not None else None
        series_a, series_b = a.utilisations, b.utilisations
    else:
        scale_a = peak_per_s / 1e3 / a.servers if a.servers else None
        scale_b = peak_per_s / 1e3 / b.servers if b.servers else None
        value_a = _scaled(a.demand_ms, scale_a)
        value_b = _scaled(b.demand_ms, scale_b)
        series_a = tuple(d * scale_a if d is not None and scale_a else None for d in a.demands_ms)
        series_b = tuple(d * scale_b if d is not None and scale_b else None for d in b.demands_ms)
    if value_a is None or value_b is None:
        return Separation(a.key, b.key, math.nan, -math.inf, math.inf, 0)
    for one, other in zip(series_a, series_b, strict=False):
        if one is not None and other is not None:
            pairs.append((one, other))
    low, high = mean_interval([x - y for x, y in pairs], confidence)
    half = (high - low) / 2
    difference = value_a - value_b
    return Separation(a.key, b.key, difference, difference - half, difference + half, len(pairs))


def _scaled(figure: Summary | None, scale: float | None) -> float | None:
    return figure.value * scale if figure is not None and scale else None
