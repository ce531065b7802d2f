"""What a point reads when its window opens and closes: the host's CPU from ``/proc``, Triton's
counters, and the GPU exporter's figures per model instance.

**The host's CPU**: the whole host's cores, and the server's processes when the study knows
them. The capacity model (``capacity.py``) needs the demand of every resource a request uses.
The cores of the host that serves are one: a model with more busy instances than cores slows
down as it is given more load, and only the host's CPU time says why. The host's figure counts
every process on it (the client too, when it runs there): on a shared host that is what the
cores are asked for. Where ``/proc`` cannot be read (not Linux), the figures are missing and the
model goes without that resource.

>>> host = CpuSample(10.0, at=100.0), CpuSample(13.0, at=102.0)
>>> server = CpuSample(4.0, at=99.0), CpuSample(6.0, at=103.0)
>>> usage = HostUsage.between(host, server, cores=2)
>>> usage.busy_cores, usage.server_cores
(1.5, 0.5)

**Triton's counters**, scraped before and after a point and turned into per-request figures.
Triton's ``/metrics`` counters are cumulative, in microseconds. Over a point, per model:

- queue and compute (input, infer, output) time **per request**: each counter's growth over the
  requests that succeeded. Triton charges every request of a batch with the batch's whole
  compute time, so compute per request is also compute per execution;
- **mean batch size**: inferences over executions (Triton counts a batch of 8 as 8 inferences);
  **requests per execution**: how many requests the dynamic batcher put together;
- **saturation**: queue milliseconds per execution, as SuperSONIC scales on it;
- **capacity**: what the model's instances can serve at most, ``instances × requests per
  execution / compute time per execution``.

A counter that went down (the model was reloaded) is read from zero. A fleet's servers are read
each and their counters summed (``combine``): the fleet as one server. The page's text may come
from any source (``fetch``): tests replay recorded pages.

>>> before = parse(RECORDED)
>>> after = parse(RECORDED.replace(" 100", " 300").replace(" 500000", " 1500000"))
>>> figures = difference(before, after)["sleep"]
>>> figures.requests, figures.compute_ms, figures.saturation_ms
(200, 5.0, 0.0)

**GPU memory and utilisation per Triton model instance**, from otelkit's GPU metrics. otelkit's
GPU exporter (``otelkit gpu-exporter`` beside Triton, or a server configured with GPU metrics)
names the owner of each process on a GPU: ``triton:<model instance>`` for a Python-backend stub
(``embed_0_1``: instance 1 of group 0 of model ``embed``). A study given that page
(``Study(gpu_metrics_url=...)``, ``--gpu-metrics-url``) reads it when each point's window closes
and records, per instance, its device memory, its share of the GPU's memory (the field's "about
18 % of an A100 per instance") and the utilisation of the GPU it runs on (NVML gives utilisation
per device, not per process: instances on one GPU share its figure).

>>> from otelkit import semconv
>>> memory = semconv.prometheus_name(semconv.GPU_PROCESS_MEMORY)
>>> page = f'''# TYPE {memory} gauge
... {memory}{{gpu_uuid="GPU-1",pid="7",process_name="stub",owner="triton:gnn_0_1"}} 4e9
... '''
>>> parse_instances(page)["gnn_0_1"]["memory_bytes"]
4000000000.0
>>> model_of("build_graph_0_1")
'build_graph'
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from otelkit import semconv

__all__ = [
    "CpuSample",
    "HostUsage",
    "ModelCounters",
    "ModelFigures",
    "Snapshot",
    "combine",
    "difference",
    "host_sample",
    "idle_cores",
    "is_local",
    "listening_pids",
    "model_of",
    "parse",
    "parse_instances",
    "per_model",
    "python_pids",
    "scrape",
    "scrape_instances",
    "server_sample",
]


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC = Path("/proc")


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds used so far, read ``at`` (``time.perf_counter()``); ``None`` if unreadable."""

    seconds: float | None
    at: float

    def rate(self, later: CpuSample) -> float | None:
        """Cores kept busy from this sample to ``later``."""
        span = later.at - self.at
        if self.seconds is None or later.seconds is None or span <= 0:
            return None
        grown = later.seconds - self.seconds
        return grown / span if grown >= 0 else None


@dataclass(frozen=True)
class HostUsage:
    """A window's CPU use: ``busy_cores`` of the host's ``cores``, ``server_cores`` of the
    server's processes (``None`` when unknown), over ``seconds``."""

    cores: int
    busy_cores: float | None
    server_cores: float | None
    seconds: float
    # the server's own processes that are Python interpreters (a FastAPI or gRPC server): each
    # runs its Python under one GIL; their CPU, without their children's
    python_processes: int = 0
    python_cores: float | None = None
    # the cores the host kept busy just before the load, with no request in flight
    idle_cores: float | None = None
    # a load balancer in front of the servers (Envoy): its worker threads and the cores its
    # processes kept busy
    balancer_workers: int = 0
    balancer_cores: float | None = None

    @classmethod
    def between(
        cls,
        host: tuple[CpuSample, CpuSample],
        server: tuple[CpuSample, CpuSample],
        cores: int,
        python: tuple[int, CpuSample, CpuSample] = (0, CpuSample(None, 0.0), CpuSample(None, 0.0)),
    ) -> HostUsage:
        """From the host's busy time at the window's two ends, and the server's processes'
        around the whole load (a walk over a server's processes takes long under a busy GIL:
        it stays out of the window's hooks, and the rate over the load is the window's)."""
        busy = host[0].rate(host[1])
        busy = min(busy, cores) if busy is not None else None
        count, first, last = python
        return cls(
            cores,
            busy,
            server[0].rate(server[1]),
            host[1].at - host[0].at,
            count,
            first.rate(last) if count else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostUsage:
        return cls(
            int(data["cores"]),
            data.get("busy_cores"),
            data.get("server_cores"),
            float(data.get("seconds", 0.0)),
            int(data.get("python_processes", 0)),
            data.get("python_cores"),
            data.get("idle_cores"),
            int(data.get("balancer_workers", 0)),
            data.get("balancer_cores"),
        )


def host_cores() -> int:
    """The cores this process may run on (its affinity), which a container's limit narrows."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _host_busy_s(stat: Path = _PROC / "stat") -> float | None:
    """Seconds all cores spent busy since boot: every field of ``cpu`` but idle and iowait."""
    try:
        first = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    ticks = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICKS


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = list((_PROC / str(pid) / "task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return found


def _process_s(pid: int) -> float | None:
    """User and system seconds of one process (all its threads), ``None`` once it is gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # the name may hold spaces and parentheses
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


def _tree_s(roots: Iterable[int], children: bool = True) -> float | None:
    """CPU seconds of ``roots`` and every process below them (a Triton and its Python stubs).

    A child that exits within the window takes its time with it: the figure is for servers
    whose processes live through the point, as a model's instances do."""
    total, seen, queue = 0.0, set(), list(roots)
    if not queue:
        return None
    while queue:
        pid = queue.pop()
        if pid in seen:
            continue
        seen.add(pid)
        spent = _process_s(pid)
        if spent is None:
            continue
        total += spent
        if children:
            queue += _children(pid)
    return total


def host_sample() -> CpuSample:
    """The host's busy seconds, now: one read, cheap enough for a window's hooks."""
    return CpuSample(_host_busy_s(), time.perf_counter())


def idle_cores(seconds: float = 0.3) -> float | None:
    """The cores this host keeps busy over ``seconds`` now (call it with no load running)."""
    first = host_sample()
    time.sleep(seconds)
    return first.rate(host_sample())


def server_sample(pids: Iterable[int], children: bool = True) -> CpuSample:
    """The CPU seconds of ``pids`` and (with ``children``) their children, now (``None``
    without pids)."""
    found = list(pids)
    return CpuSample(_tree_s(found, children) if found else None, time.perf_counter())


def python_pids(pids: Iterable[int]) -> tuple[int, ...]:
    """Those of ``pids`` that run a Python interpreter (whose code shares one GIL)."""
    found = []
    for pid in pids:
        try:
            name = os.path.basename(os.readlink(_PROC / str(pid) / "exe"))
        except OSError:
            continue
        if name.startswith("python"):
            found.append(pid)
    return tuple(found)


def is_local(url: str | None) -> bool:
    """Whether ``host:port`` names this host (loopback, or one of its own names)."""
    if not url:
        return False
    host = url.rsplit(":", 1)[0].strip("[]") if ":" in url else url
    if host in ("localhost", socket.gethostname()):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{inode}]")
    return inodes


def listening_pids(url: str | None) -> tuple[int, ...]:
    """The processes of this host listening on ``url``'s port: a server the study did not
    start but that runs here (its children, a Triton's stubs, are counted with it)."""
    if not url or ":" not in url:
        return ()
    try:
        inodes = _listening_inodes(int(url.rsplit(":", 1)[1]))
    except ValueError:
        return ()
    found = []
    for entry in _PROC.iterdir() if inodes else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            links = {os.readlink(fd) for fd in (entry / "fd").iterdir()}
        except OSError:
            continue
        if links & inodes:
            found.append(int(entry.name))
    return tuple(found)


# counter name -> ModelCounters field
_COUNTERS = {
    semconv.TRITON_REQUEST_SUCCESS: "success",
    semconv.TRITON_REQUEST_FAILURE: "failure",
    semconv.TRITON_INFERENCE_COUNT: "inferences",
    semconv.TRITON_EXECUTION_COUNT: "executions",
    semconv.TRITON_REQUEST_DURATION_US: "request_us",
    semconv.TRITON_QUEUE_DURATION_US: "queue_us",
    semconv.TRITON_COMPUTE_INPUT_US: "input_us",
    semconv.TRITON_COMPUTE_INFER_US: "infer_us",
    semconv.TRITON_COMPUTE_OUTPUT_US: "output_us",
}
_GAUGES = {semconv.TRITON_PENDING_REQUESTS: "pending"}
_TRITON_GPU = {
    semconv.TRITON_GPU_UTILIZATION: "utilization",
    semconv.TRITON_GPU_MEMORY_USED: "memory_used_bytes",
    semconv.TRITON_GPU_MEMORY_TOTAL: "memory_total_bytes",
}

#: A page as tritonserver 2.51 serves it, trimmed to one model (for examples and tests).
RECORDED = f"""\
# TYPE {semconv.TRITON_REQUEST_SUCCESS} counter
{semconv.TRITON_REQUEST_SUCCESS}{{model="sleep",version="1"}} 100
# TYPE {semconv.TRITON_INFERENCE_COUNT} counter
{semconv.TRITON_INFERENCE_COUNT}{{model="sleep",version="1"}} 100
# TYPE {semconv.TRITON_EXECUTION_COUNT} counter
{semconv.TRITON_EXECUTION_COUNT}{{model="sleep",version="1"}} 100
# TYPE {semconv.TRITON_QUEUE_DURATION_US} counter
{semconv.TRITON_QUEUE_DURATION_US}{{model="sleep",version="1"}} 0
# TYPE {semconv.TRITON_COMPUTE_INFER_US} counter
{semconv.TRITON_COMPUTE_INFER_US}{{model="sleep",version="1"}} 500000
"""


@dataclass(frozen=True)
class ModelCounters:
    """One model's counters at one moment, summed over its versions."""

    success: float = 0.0
    failure: float = 0.0
    inferences: float = 0.0
    executions: float = 0.0
    request_us: float = 0.0
    queue_us: float = 0.0
    input_us: float = 0.0
    infer_us: float = 0.0
    output_us: float = 0.0
    pending: float = 0.0


@dataclass
class Snapshot:
    """Every model's counters, and the GPUs' gauges (by ``gpu_uuid``) when Triton has GPUs."""

    models: dict[str, ModelCounters] = field(default_factory=dict)
    gpus: dict[str, dict[str, float]] = field(default_factory=dict)


def combine(snapshots: Sequence[Snapshot]) -> Snapshot:
    """The counters of several servers (a fleet's) as one server's: each model's summed, the
    GPUs side by side.

    >>> one = Snapshot({"m": ModelCounters(success=3, queue_us=30.0)})
    >>> two = Snapshot({"m": ModelCounters(success=5, queue_us=50.0)})
    >>> combine([one, two]).models["m"].success, combine([one, two]).models["m"].queue_us
    (8.0, 80.0)
    """
    models: dict[str, dict[str, float]] = {}
    gpus: dict[str, dict[str, float]] = {}
    for snapshot in snapshots:
        for model, counters in snapshot.models.items():
            summed = models.setdefault(model, {})
            for name, value in asdict(counters).items():
                summed[name] = summed.get(name, 0.0) + value
        gpus.update(snapshot.gpus)
    return Snapshot({m: ModelCounters(**f) for m, f in models.items()}, gpus)


def parse(text: str) -> Snapshot:
    """A ``Snapshot`` of a Prometheus text page (Triton's ``/metrics``)."""
    values: dict[str, dict[str, float]] = {}
    gpus: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # the parser names a counter's samples <family>_total; Triton's have no suffix
            name = family.name if sample.name == f"{family.name}_total" else sample.name
            if name in _COUNTERS or name in _GAUGES:
                key = _COUNTERS.get(name) or _GAUGES[name]
                model = sample.labels.get(semconv.TRITON_MODEL, "")
                fields = values.setdefault(model, {})
                fields[key] = fields.get(key, 0.0) + float(sample.value)
            elif name in _TRITON_GPU:
                uuid = sample.labels.get(semconv.M_GPU_UUID, "")
                gpus.setdefault(uuid, {})[_TRITON_GPU[name]] = float(sample.value)
    return Snapshot({m: ModelCounters(**f) for m, f in values.items()}, gpus)


def scrape(
    url: str, timeout_s: float = 5.0, fetch: Callable[[str, float], str] | None = None
) -> Snapshot:
    """Fetch and parse ``url`` (Triton's ``http://host:8002/metrics``)."""
    if fetch is not None:
        return parse(fetch(url, timeout_s))
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return parse(response.read().decode("utf-8", "replace"))


@dataclass(frozen=True)
class ModelFigures:
    """One model over one point: counts, and milliseconds per request unless named otherwise."""

    requests: int
    failures: int
    inferences: int
    executions: int
    queue_ms: float
    compute_input_ms: float
    compute_infer_ms: float
    compute_output_ms: float
    request_ms: float
    pending: float  # requests waiting or running when the point ended
    instances: int | None = None  # from the model's configuration, when known
    # An ensemble's compute time spans its steps, each a model of its own with its own
    # instances working in a pipeline: the ensemble itself caps nothing (its steps do).
    ensemble: bool = False
    # the configuration's batching: its largest batch (0: the model does not batch) and the
    # dynamic batcher's longest wait for a fuller batch (None: no dynamic batcher)
    max_batch_size: int = 0
    batch_delay_ms: float | None = None

    @property
    def compute_ms(self) -> float:
        """Compute time per request, which is per execution too (see the module's notes)."""
        return self.compute_input_ms + self.compute_infer_ms + self.compute_output_ms

    @property
    def batch_size(self) -> float:
        """Mean batch size: inferences per execution."""
        return self.inferences / self.executions if self.executions else 0.0

    @property
    def requests_per_execution(self) -> float:
        return self.requests / self.executions if self.executions else 0.0

    @property
    def demand_ms(self) -> float:
        """Busy time of one instance per request: a batch's compute shared by its requests."""
        rpe = self.requests_per_execution
        return self.compute_ms / rpe if rpe else 0.0

    @property
    def saturation_ms(self) -> float:
        """Queue milliseconds per execution (SuperSONIC's saturation)."""
        return self.queue_ms * self.requests / self.executions if self.executions else 0.0

    def capacity_per_s(self, instances: int | None = None) -> float | None:
        """Requests a second the model's instances can serve at most, at this batching."""
        count = instances or self.instances
        if self.ensemble or not count or self.compute_ms <= 0 or not self.executions:
            return None
        return count * self.requests_per_execution / (self.compute_ms / 1e3)

    def to_dict(self) -> dict[str, Any]:
        derived = {
            "compute_ms": self.compute_ms,
            "batch_size": self.batch_size,
            "requests_per_execution": self.requests_per_execution,
            "saturation_ms": self.saturation_ms,
            "capacity_per_s": self.capacity_per_s(),
        }
        return {**asdict(self), **derived}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelFigures:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


def _grown(before: float, after: float) -> float:
    return after - before if after >= before else after  # a reset counter starts from zero


def difference(before: Snapshot, after: Snapshot) -> dict[str, ModelFigures]:
    """Each model's figures between two snapshots; models without requests are left out."""
    figures: dict[str, ModelFigures] = {}
    for model, end in after.models.items():
        start = before.models.get(model, ModelCounters())
        grown = {f: _grown(getattr(start, f), getattr(end, f)) for f in _COUNTERS.values()}
        requests = int(grown["success"])
        if requests <= 0 and grown["failure"] <= 0:
            continue

        def per_request(key: str, n: int = requests, g: Mapping[str, float] = grown) -> float:
            return g[key] / n / 1e3 if n else 0.0

        figures[model] = ModelFigures(
            requests=requests,
            failures=int(grown["failure"]),
            inferences=int(grown["inferences"]),
            executions=int(grown["executions"]),
            queue_ms=per_request("queue_us"),
            compute_input_ms=per_request("input_us"),
            compute_infer_ms=per_request("infer_us"),
            compute_output_ms=per_request("output_us"),
            request_ms=per_request("request_us"),
            pending=end.pending,
        )
    return figures


_OWNER_PREFIX = "triton:"
_MEMORY = semconv.prometheus_name(semconv.GPU_PROCESS_MEMORY)
_EXPORTER_GPU = {
    semconv.prometheus_name(semconv.GPU_UTILIZATION): "gpu_utilization",
    semconv.prometheus_name(semconv.GPU_MEMORY_TOTAL): "gpu_memory_total_bytes",
}


def model_of(instance: str) -> str:
    """The model of a Triton instance name, ``<model>_<group>_<index>``."""
    parts = instance.rsplit("_", 2)
    return parts[0] if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit() else instance


def parse_instances(text: str) -> dict[str, dict[str, Any]]:
    """Per model instance on a GPU: ``memory_bytes``, ``gpu_uuid``, and, when the page has its
    GPU's gauges, ``gpu_utilization`` (0 to 1), ``gpu_memory_total_bytes`` and
    ``memory_share`` (of the GPU's memory)."""
    instances: dict[str, dict[str, Any]] = {}
    gpus: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            uuid = sample.labels.get(semconv.M_GPU_UUID, "")
            if sample.name == _MEMORY:
                owner = sample.labels.get(semconv.M_OWNER, "")
                if owner.startswith(_OWNER_PREFIX) and len(owner) > len(_OWNER_PREFIX):
                    entry = instances.setdefault(owner[len(_OWNER_PREFIX) :], {"memory_bytes": 0.0})
                    entry["memory_bytes"] += float(sample.value)  # a stub on one GPU: one pid
                    entry["gpu_uuid"] = uuid
            elif sample.name in _EXPORTER_GPU:
                gpus.setdefault(uuid, {})[_EXPORTER_GPU[sample.name]] = float(sample.value)
    for entry in instances.values():
        gpu = gpus.get(entry["gpu_uuid"], {})
        entry.update(gpu)
        total = gpu.get("gpu_memory_total_bytes")
        if total:
            entry["memory_share"] = entry["memory_bytes"] / total
    return instances


def scrape_instances(url: str, timeout_s: float = 5.0) -> dict[str, dict[str, Any]]:
    """``parse_instances`` of the page at ``url`` (an exporter's ``/metrics``)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return parse_instances(response.read().decode("utf-8", "replace"))


def per_model(instances: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Per model: its instances on GPUs, their mean memory and mean share of a GPU's memory.

    >>> per_model({"gnn_0_0": {"memory_bytes": 2e9, "memory_share": 0.25},
    ...            "gnn_0_1": {"memory_bytes": 4e9, "memory_share": 0.75}})
    {'gnn': {'instances': 2.0, 'memory_bytes': 3000000000.0, 'memory_share': 0.5}}
    """
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for name, entry in instances.items():
        grouped.setdefault(model_of(name), []).append(entry)
    figures = {}
    for model, entries in sorted(grouped.items()):
        shares = [float(e["memory_share"]) for e in entries if "memory_share" in e]
        figures[model] = {
            "instances": float(len(entries)),
            "memory_bytes": sum(float(e["memory_bytes"]) for e in entries) / len(entries),
            **({"memory_share": sum(shares) / len(shares)} if shares else {}),
        }
    return figures
