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

from dataclasses import asdict, dataclass
from typing import Any, Literal

from otelkit.study._point import Point

__all__ = ["Resource", "ResourceKind", "resources"]

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
        # What the host keeps busy with no request in flight (other processes, a server's own
        # polling, Ray's daemons) is not the requests' demand but fewer cores left for them.
        idle = min(host.idle_cores or 0.0, host.busy_cores, host.cores - 0.5)
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
