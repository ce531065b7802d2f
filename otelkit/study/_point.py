"""One measured point of a study, as the results file records it.

A point holds what the client saw (throughput, latency percentiles from every measured request,
errors by kind, the client's CPU), Triton's figures per model over the same window, the GPUs'
gauges when Triton has GPUs, and the trace breakdown of the sampled share of its requests. The
measured window is also cut into equal parts (batch means): the spread of the parts' figures
gives ``otelkit study compare`` its intervals.

A point driven by several client processes is the merge of their parts: throughputs add up and
latency percentiles come from the sum of the parts' histograms, that is from all requests.

The latency percentiles are the successful requests'; the failed ones' latencies have their own
histogram (a timeout's 30 s is not a successful answer's time), and ``all_requests_ms`` reads
both. A point whose failed share of its measured requests is above ``Load.max_error_share`` is
marked ``errors``: its figures are kept, and left out of those across points.

Requests the server refused (its queue full, a proxy's limit) are counted apart, by reason: a
point's ``offered`` rate is what was sent (an open loop's rate), ``throughput`` what was served
(goodput) and ``refused_per_s`` what was declined; a point whose requests were all refused has a
goodput of 0, and is not failed.

>>> shed = Point(1, {"rate": 160}, requests=64, seconds=2.0, refused={"queue full": 256})
>>> shed.offered, shed.throughput, shed.refused_per_s
(160.0, 32.0, 128.0)

>>> a = Point(0, {"concurrency": 4}, requests=400, seconds=4.0, histogram=LatencyHistogram())
>>> a.throughput, a.label
(100.0, 'concurrency=4')
>>> merge_parts([a, a]).throughput
200.0

**Latencies are kept as a log histogram**: percentiles within half a percent, mergeable across
processes. A point may be driven by several client processes, on several nodes: each keeps its
latencies in buckets 1 % wide (a bucket's upper edge is 1.01 times its lower one, from 1 µs up),
and the point's percentiles come from the sum of their buckets, that is from all requests. A
bucket is read as its geometric middle, so a percentile is off by at most 0.5 %; the maximum,
minimum and mean are kept exactly.

>>> histogram = LatencyHistogram()
>>> histogram.add_many([0.010, 0.011, 0.012, 0.013, 0.100])
>>> abs(histogram.quantile(0.5) - 0.012) < 0.005 * 0.012, histogram.max_s
(True, 0.1)
>>> both = histogram.merged(LatencyHistogram.from_dict(histogram.to_dict()))
>>> both.count, round(both.quantile(0.99) * 1e3, 1)
(10, 100.0)
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from otelkit._errors import StudyError
from otelkit.study._counters import HostUsage, ModelFigures
from otelkit.study._drive import LoadRun
from otelkit.study._traces import PointTraces

__all__ = [
    "LatencyHistogram",
    "Point",
    "Window",
    "judge_merged",
    "merge_parts",
    "merged_outcomes",
    "point_label",
]


_BASE_S = 1e-6
_RATIO = 1.01
_LOG_RATIO = math.log(_RATIO)


class LatencyHistogram:
    """Request latencies in seconds, in log buckets 1 % wide."""

    __slots__ = ("count", "counts", "max_s", "min_s", "sum_s")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.count = 0
        self.sum_s = 0.0
        self.max_s = 0.0
        self.min_s = math.inf

    @staticmethod
    def _index(seconds: float) -> int:
        if seconds <= _BASE_S:
            return 0
        return int(math.log(seconds / _BASE_S) / _LOG_RATIO)

    def add(self, seconds: float) -> None:
        """Count one latency."""
        index = self._index(seconds)
        self.counts[index] = self.counts.get(index, 0) + 1
        self.count += 1
        self.sum_s += seconds
        self.max_s = max(self.max_s, seconds)
        self.min_s = min(self.min_s, seconds)

    def add_many(self, latencies: Iterable[float]) -> None:
        """Count every latency of ``latencies``."""
        for seconds in latencies:
            self.add(seconds)

    @property
    def mean_s(self) -> float:
        """The exact mean, 0 when empty."""
        return self.sum_s / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        """The latency below which a share ``q`` of the requests fall (nearest rank); 0 if empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q is a share from 0 to 1, not {q!r}")
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for index in sorted(self.counts):
            seen += self.counts[index]
            if seen >= rank:
                middle: float = _BASE_S * _RATIO ** (index + 0.5)
                return min(self.max_s, max(self.min_s, middle))
        return self.max_s

    def merged(self, other: LatencyHistogram) -> LatencyHistogram:
        """A new histogram holding the requests of both."""
        out = LatencyHistogram()
        for part in (self, other):
            for index, n in part.counts.items():
                out.counts[index] = out.counts.get(index, 0) + n
        out.count = self.count + other.count
        out.sum_s = self.sum_s + other.sum_s
        out.max_s = max(self.max_s, other.max_s)
        out.min_s = min(self.min_s, other.min_s)
        return out

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (bucket indices as strings, as JSON object keys must be)."""
        return {
            "base_s": _BASE_S,
            "ratio": _RATIO,
            "count": self.count,
            "sum_s": self.sum_s,
            "max_s": self.max_s,
            "min_s": self.min_s if self.count else 0.0,
            "buckets": {str(index): n for index, n in sorted(self.counts.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencyHistogram:
        """The histogram ``to_dict`` wrote; refuses buckets of another layout."""
        if data.get("base_s") != _BASE_S or data.get("ratio") != _RATIO:
            raise ValueError(
                f"a histogram with other buckets: {data.get('base_s')}, {data.get('ratio')}"
            )
        out = cls()
        out.counts = {int(index): int(n) for index, n in data.get("buckets", {}).items()}
        out.count = int(data.get("count", sum(out.counts.values())))
        out.sum_s = float(data.get("sum_s", 0.0))
        out.max_s = float(data.get("max_s", 0.0))
        out.min_s = float(data["min_s"]) if out.count else math.inf
        return out


def point_label(params: Mapping[str, Any]) -> str:
    """``instances=2 concurrency=4``: how messages and tables name a point."""
    return " ".join(f"{k}={v}" for k, v in params.items()) or "the point"


@dataclass(frozen=True)
class Window:
    """One part of the measured window: the throughput and latency percentiles of the requests
    that completed within it, whatever their start, and what was read at its two edges.

    The parts are equal, each the window's tenth, up to the moments their edges' reads ran
    (``seconds``: the part's own length). The figures read at the edges are each ``None`` (or
    empty) where an edge's read failed, where the point does not have them (a remote host's
    cores), and in files written before they were read: the client's CPU seconds, the cores
    the host kept busy, the server's Python processes', the load balancer's, each model's own
    processes' (Ray Serve's replicas), and Triton's figures per model over the part.

    >>> part = Window(100.0, 5.0, 9.0, requests=50, seconds=0.5, cpu_s=0.1)
    >>> Window.from_dict(part.to_dict()) == part, part.cpu_cores
    (True, 0.2)
    """

    throughput: float
    p50_ms: float
    p99_ms: float
    requests: int | None = None  # completed within the part
    seconds: float | None = None
    cpu_s: float | None = None  # the client's (its processes' in a merged point)
    busy_cores: float | None = None  # the host's, from /proc/stat
    python_cores: float | None = None
    balancer_cores: float | None = None
    process_cores: dict[str, float] = field(default_factory=dict)
    triton: dict[str, ModelFigures] = field(default_factory=dict)

    @property
    def cpu_cores(self) -> float | None:
        """The client's CPU seconds over the part's length: cores it kept busy."""
        return self.cpu_s / self.seconds if self.cpu_s is not None and self.seconds else None

    def figures(self) -> dict[str, Any]:
        """What was read at the part's edges, for the results file (``windows`` keeps the
        three figures ``compare`` reads, as files always had them)."""
        return {
            "requests": self.requests,
            "seconds": self.seconds,
            "cpu_s": self.cpu_s,
            "busy_cores": self.busy_cores,
            "python_cores": self.python_cores,
            "balancer_cores": self.balancer_cores,
            "process_cores": self.process_cores,
            "triton": {m: f.to_dict() for m, f in self.triton.items()},
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "throughput": self.throughput,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            **self.figures(),
        }

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any] | Sequence[float], figures: Mapping[str, Any] | None = None
    ) -> Window:
        """A part from its three figures (a mapping, or the list files always held) and,
        where the file has them, what was read at its edges."""
        if isinstance(data, Mapping):
            figures = data if figures is None else figures
            first = (data["throughput"], data["p50_ms"], data["p99_ms"])
        else:
            first = (data[0], data[1], data[2])
        throughput, p50, p99 = map(float, first)
        read = figures or {}
        return cls(
            throughput,
            p50,
            p99,
            _maybe(int, read.get("requests")),
            _maybe(float, read.get("seconds")),
            _maybe(float, read.get("cpu_s")),
            _maybe(float, read.get("busy_cores")),
            _maybe(float, read.get("python_cores")),
            _maybe(float, read.get("balancer_cores")),
            {m: float(c) for m, c in (read.get("process_cores") or {}).items()},
            {m: ModelFigures.from_dict(f) for m, f in (read.get("triton") or {}).items()},
        )


@dataclass
class Point:
    """One point: its sweep ``params`` and every figure measured at it."""

    index: int
    params: dict[str, Any]
    status: str = "ok"  # ok, errors (too many failed requests: check_errors), failed
    error: str = ""
    requests: int = 0  # successful requests completed within the window
    seconds: float = 0.0  # the window's length
    batch_size: int = 1
    histogram: LatencyHistogram = field(default_factory=LatencyHistogram)
    errors: dict[str, int] = field(default_factory=dict)
    error_samples: dict[str, str] = field(default_factory=dict)
    windows: list[Window] = field(default_factory=list)
    cpu_s: float = 0.0  # client processes' CPU time over the window
    triton: dict[str, ModelFigures] = field(default_factory=dict)
    gpus: dict[str, dict[str, float]] = field(default_factory=dict)
    # per Triton model instance on a GPU (counters.py), when the study reads GPU metrics
    gpu_instances: dict[str, dict[str, Any]] = field(default_factory=dict)
    traces: PointTraces | None = None
    sampled: int = 0  # measured requests whose trace was sampled
    parts: int = 1  # client processes that drove the point
    started_at: float = 0.0  # when the measured window opened, seconds since the epoch
    # why the server failed in earlier attempts at this point, each followed by a restart
    restarts: list[str] = field(default_factory=list)
    # the CPU the window used: the serving host's cores (when it is this host) and the
    # server's processes (when the study started them)
    host: HostUsage | None = None
    # the latencies of the measured requests that failed (the histogram has the successful)
    failed_histogram: LatencyHistogram = field(default_factory=LatencyHistogram)
    # a merged point's parts' throughputs: its throughput is their sum (their windows differ)
    part_throughputs: list[float] = field(default_factory=list)
    # the servers of each model or deployment where the server says (Ray Serve's replicas)
    parallelism: dict[str, int] = field(default_factory=dict)
    # the cores each model's or deployment's own processes kept busy, where the server named
    # them (Ray Serve's replicas)
    process_cores: dict[str, float] = field(default_factory=dict)
    # tensor bytes a request sends and receives, where the workload knows (the network's demand)
    payload_bytes: tuple[int, int] | None = None
    link_gbps: float | None = None  # the network link's rate, as the study was told (one way)
    # measured requests the server declined to serve, by reason (``_drive.refusal``)
    refused: dict[str, int] = field(default_factory=dict)
    refusal_samples: dict[str, str] = field(default_factory=dict)
    # times the point was measured, the sweep's passes interleaved (``_repeats``): its windows
    # are then its repeats, one each
    repeats: int = 1

    @property
    def label(self) -> str:
        return point_label(self.params)

    @property
    def throughput(self) -> float:
        """Successful requests per second; a merged point's, the sum of its parts'."""
        if self.part_throughputs:
            return sum(self.part_throughputs)
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def refused_per_s(self) -> float:
        """Requests per second the server declined to serve."""
        return sum(self.refused.values()) / self.seconds if self.seconds else 0.0

    @property
    def offered(self) -> float:
        """Requests per second sent: an open loop's rate; a closed loop's measured requests,
        served, failed and refused, over the window."""
        if "rate" in self.params:
            return float(self.params["rate"])
        sent = self.histogram.count + self.failed + sum(self.refused.values())
        return sent / self.seconds if self.seconds else 0.0

    @property
    def items_per_s(self) -> float:
        """Inferences per second, measured: throughput times the batch size."""
        return self.throughput * self.batch_size

    def latency_ms(self, q: float) -> float:
        """The ``q`` quantile of the measured requests' latency, in ms."""
        return self.histogram.quantile(q) * 1e3

    def all_requests_ms(self, q: float) -> float:
        """The ``q`` quantile of every measured request's latency, the failed ones too, in ms."""
        return self.histogram.merged(self.failed_histogram).quantile(q) * 1e3

    @property
    def error_share(self) -> float:
        """The failed share of the measured requests (those started in the window); refused
        requests are among those measured, and not among the failed."""
        measured = self.histogram.count + self.failed + sum(self.refused.values())
        return self.failed / measured if measured else 0.0

    def check_errors(self, max_share: float) -> None:
        """Mark an ``ok`` point ``errors`` when more than ``max_share`` of its measured
        requests failed; its error says the share and the most frequent kind."""
        if self.status != "ok" or self.error_share <= max_share:
            return
        kind = max(self.errors, key=lambda k: self.errors[k])
        sample = f" ({self.error_samples[kind]})" if self.error_samples.get(kind) else ""
        self.status = "errors"
        self.error = (
            f"{self.error_share * 100:.1f} % of the measured requests failed "
            f"({self.failed} of {self.histogram.count + self.failed + sum(self.refused.values())})"
            f", most {kind}{sample}"
        )

    @property
    def cpu_cores(self) -> float:
        """Client CPU time over wall time: cores the client kept busy."""
        return self.cpu_s / self.seconds if self.seconds else 0.0

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    def component_ms(self, name: str) -> float | None:
        """Mean ms per request of a breakdown component, ``None`` without traces."""
        if self.traces is None or name not in self.traces.components:
            return None
        return self.traces.components[name].mean_ms

    @classmethod
    def from_run(
        cls, index: int, params: Mapping[str, Any], run: LoadRun, windows: int, batch_size: int
    ) -> Point:
        """The client's side of a point, from the driver's measured window."""
        histogram, failed = LatencyHistogram(), LatencyHistogram()
        histogram.add_many(run.latencies_s)
        failed.add_many(run.failed_latencies_s)
        point = cls(
            index,
            dict(params),
            requests=run.completed,
            seconds=run.window_s,
            batch_size=batch_size,
            histogram=histogram,
            errors=dict(run.errors),
            error_samples=dict(run.error_samples),
            cpu_s=run.cpu_s,
            started_at=run.opened_epoch,
            refused=dict(run.refused),
            refusal_samples=dict(run.refusal_samples),
        )
        point.windows = _windows(run, windows)
        point.failed_histogram = failed
        return point

    def to_dict(self) -> dict[str, Any]:
        return {
            "record": "point",
            "index": self.index,
            "params": self.params,
            "label": self.label,
            "status": self.status,
            "error": self.error,
            "requests": self.requests,
            "seconds": self.seconds,
            "throughput": self.throughput,
            "batch_size": self.batch_size,
            "items_per_s": self.items_per_s,
            "latency_ms": {
                "p50": self.latency_ms(0.5),
                "p90": self.latency_ms(0.9),
                "p99": self.latency_ms(0.99),
                "max": self.histogram.max_s * 1e3,
                "mean": self.histogram.mean_s * 1e3,
            },
            "errors": self.errors,
            "error_samples": self.error_samples,
            "client_cpu": {"cpu_s": self.cpu_s, "cores": self.cpu_cores},
            "triton": {m: f.to_dict() for m, f in self.triton.items()},
            "gpus": self.gpus,
            "gpu_instances": self.gpu_instances,
            "traces": self.traces.to_dict() if self.traces is not None else None,
            "sampled": self.sampled,
            "parts": self.parts,
            "started_at": self.started_at,
            "restarts": self.restarts,
            "host": self.host.to_dict() if self.host is not None else None,
            "windows": [[w.throughput, w.p50_ms, w.p99_ms] for w in self.windows],
            "window_figures": [w.figures() for w in self.windows],
            "histogram": self.histogram.to_dict(),
            "latency_ms_all_requests": {
                "p50": self.all_requests_ms(0.5),
                "p90": self.all_requests_ms(0.9),
                "p99": self.all_requests_ms(0.99),
            },
            "failed_histogram": self.failed_histogram.to_dict(),
            "part_throughputs": self.part_throughputs,
            "parallelism": self.parallelism,
            "process_cores": self.process_cores,
            "payload_bytes": list(self.payload_bytes) if self.payload_bytes else None,
            "link_gbps": self.link_gbps,
            "offered": self.offered,
            "refused": self.refused,
            "refused_per_s": self.refused_per_s,
            "refusal_samples": self.refusal_samples,
            "repeats": self.repeats,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Point:
        traces = data.get("traces")
        return cls(
            index=int(data["index"]),
            params=dict(data["params"]),
            status=str(data.get("status", "ok")),
            error=str(data.get("error", "")),
            requests=int(data.get("requests", 0)),
            seconds=float(data.get("seconds", 0.0)),
            batch_size=int(data.get("batch_size", 1)),
            histogram=LatencyHistogram.from_dict(data["histogram"]),
            errors={k: int(v) for k, v in data.get("errors", {}).items()},
            error_samples=dict(data.get("error_samples", {})),
            windows=_read_windows(data),
            cpu_s=float(data.get("client_cpu", {}).get("cpu_s", 0.0)),
            triton={m: ModelFigures.from_dict(f) for m, f in data.get("triton", {}).items()},
            gpus=dict(data.get("gpus", {})),
            gpu_instances=dict(data.get("gpu_instances", {})),
            traces=PointTraces.from_dict(traces) if traces else None,
            sampled=int(data.get("sampled", 0)),
            parts=int(data.get("parts", 1)),
            started_at=float(data.get("started_at", 0.0)),
            restarts=[str(r) for r in data.get("restarts", [])],
            host=HostUsage.from_dict(data["host"]) if data.get("host") else None,
            failed_histogram=LatencyHistogram.from_dict(data["failed_histogram"])
            if "failed_histogram" in data
            else LatencyHistogram(),  # a file written before failed requests were timed
            part_throughputs=[float(t) for t in data.get("part_throughputs", [])],
            parallelism={k: int(v) for k, v in data.get("parallelism", {}).items()},
            process_cores={k: float(v) for k, v in data.get("process_cores", {}).items()},
            payload_bytes=_pair(data.get("payload_bytes")),
            link_gbps=data.get("link_gbps"),
            refused={k: int(v) for k, v in data.get("refused", {}).items()},
            refusal_samples=dict(data.get("refusal_samples", {})),
            repeats=int(data.get("repeats", 1)),
        )


def _read_windows(data: Mapping[str, Any]) -> list[Window]:
    rows = data.get("windows", [])
    figures = data.get("window_figures") or [None] * len(rows)
    if len(figures) != len(rows):  # not this file's own: the figures cannot be matched
        figures = [None] * len(rows)
    return [Window.from_dict(row, read) for row, read in zip(rows, figures, strict=True)]


def _windows(run: LoadRun, count: int) -> list[Window]:
    """The window's ``count`` parts, each from the requests that completed within it.

    Where the driver read every edge of the parts, they run from one edge's read to the next
    (the same moments as the server's counters) and carry the client's CPU between them;
    otherwise (``requests``, or a load that stopped early) the parts are exact tenths, without
    the edges' figures."""
    read = len(run.edges) == count + 1
    if read:
        bounds = [e.at for e in run.edges]
        bounds[0], bounds[-1] = 0.0, run.window_s
    else:
        bounds = [run.window_s * k / count for k in range(count + 1)]
    ends: list[list[float]] = [[] for _ in range(count)]
    for end, latency in zip(run.ends_s, run.end_latencies_s, strict=True):
        slot = min(count - 1, max(0, bisect.bisect_right(bounds, end) - 1))  # the close: last
        ends[slot].append(latency)
    windows = []
    for k, latencies in enumerate(ends):
        histogram = LatencyHistogram()
        histogram.add_many(latencies)
        width = bounds[k + 1] - bounds[k]
        window = Window(
            len(latencies) / width if width > 0 else 0.0,
            histogram.quantile(0.5) * 1e3,
            histogram.quantile(0.99) * 1e3,
        )
        if read:
            first, last = run.edges[k].cpu_s, run.edges[k + 1].cpu_s
            cpu = last - first if first is not None and last is not None else None
            window = replace(window, requests=len(latencies), seconds=width, cpu_s=cpu)
        windows.append(window)
    return windows


def merge_parts(
    parts: Sequence[Point], max_skew_s: float = 1.0, max_error_share: float = 0.01
) -> Point:
    """One point from the parts that client processes measured over the same window.

    Requests and throughputs add up (each part's over its own window); the percentiles come
    from the merged histograms; the window is the longest part's: they ran side by side, their
    windows opening within ``max_skew_s`` of each other. A window's percentiles are the parts'
    means, weighted by their requests. The merged point is marked ``errors`` when more than
    ``max_error_share`` of all the parts' measured requests failed.
    """
    if not parts:
        raise ValueError("no parts to merge")
    first = parts[0]
    starts = [p.started_at for p in parts if p.started_at and p.status != "failed"]
    if starts and max(starts) - min(starts) > max_skew_s:
        raise StudyError(
            f"the parts did not run side by side: their windows opened "
            f"{max(starts) - min(starts):.1f} s apart (give them the same start and slot)",
            point=first.label,
        )
    merged = Point(
        first.index,
        dict(first.params),
        requests=sum(p.requests for p in parts),
        seconds=max(p.seconds for p in parts),
        batch_size=first.batch_size,
        cpu_s=sum(p.cpu_s for p in parts),
        sampled=sum(p.sampled for p in parts),
        parts=sum(p.parts for p in parts),
        started_at=min(starts, default=0.0),
        **merged_outcomes(parts),
    )
    merged.part_throughputs = [p.throughput for p in parts]
    judge_merged(merged, parts, max_error_share)
    if all(len(p.windows) == len(first.windows) for p in parts):
        for slot in range(len(first.windows)):
            rows = [p.windows[slot] for p in parts]
            total = sum(r.throughput for r in rows)
            weights = [r.throughput / total if total else 1 / len(rows) for r in rows]
            merged.windows.append(
                Window(
                    total,
                    sum(w * r.p50_ms for w, r in zip(weights, rows, strict=True)),
                    sum(w * r.p99_ms for w, r in zip(weights, rows, strict=True)),
                    **_merged_reads(rows),
                )
            )
    return merged


def merged_outcomes(points: Sequence[Point]) -> dict[str, Any]:
    """The outcomes of the requests of ``points`` together, as a merged ``Point``'s fields:
    both histograms merged, errors and refusals added by kind, each kind's first sample."""
    histogram, failed_histogram = LatencyHistogram(), LatencyHistogram()
    errors: dict[str, int] = {}
    refused: dict[str, int] = {}
    samples: dict[str, str] = {}
    refusal_samples: dict[str, str] = {}
    for point in points:
        histogram = histogram.merged(point.histogram)
        failed_histogram = failed_histogram.merged(point.failed_histogram)
        for total, more in ((errors, point.errors), (refused, point.refused)):
            for kind, n in more.items():
                total[kind] = total.get(kind, 0) + n
        for kept, seen in (
            (samples, point.error_samples),
            (refusal_samples, point.refusal_samples),
        ):
            for kind, message in seen.items():
                kept.setdefault(kind, message)
    return {
        "histogram": histogram,
        "failed_histogram": failed_histogram,
        "errors": errors,
        "error_samples": samples,
        "refused": refused,
        "refusal_samples": refusal_samples,
    }


def judge_merged(merged: Point, points: Sequence[Point], max_error_share: float) -> None:
    """A merged point fails with the first of ``points`` that failed, and is marked
    ``errors`` on all their requests' failed share."""
    failed = next((p for p in points if p.status == "failed"), None)
    if failed is not None:
        merged.status, merged.error = "failed", failed.error
    merged.check_errors(max_error_share)


def _merged_reads(rows: Sequence[Window]) -> dict[str, Any]:
    """The parts' requests and client CPU add up over the longest part, as the point's do; the
    server's figures are left out, as the merged point leaves out its host's: the processes
    may each have read another host, and their parts' edges differ by up to the skew."""
    requests = [r.requests for r in rows]
    seconds = [r.seconds for r in rows]
    cpu = [r.cpu_s for r in rows]
    if any(n is None for n in requests) or any(s is None for s in seconds):
        return {}
    return {
        "requests": sum(n for n in requests if n is not None),
        "seconds": max(s for s in seconds if s is not None),
        "cpu_s": None if any(c is None for c in cpu) else sum(c for c in cpu if c is not None),
    }


def _maybe(kind: Callable[[Any], Any], value: Any) -> Any:
    return None if value is None else kind(value)


def _pair(value: Any) -> tuple[int, int] | None:
    return (int(value[0]), int(value[1])) if value else None
