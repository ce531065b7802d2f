"""Every name otelkit emits: span names, attributes, metrics with their units and buckets.

This module is the single source that the code *and* the dashboards import, so a dashboard can
never query a metric the code does not emit. OpenTelemetry's own conventions are used where they
exist (``rpc.*``, ``server.*``, ``error.type``); what has no convention yet lives under the
``otelkit.`` prefix.

>>> prometheus_name(TELEMETRY_SPANS_DROPPED)
'otelkit_telemetry_spans_dropped_total'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DURATION_BUCKETS_S",
    "METRICS",
    "PREFIX",
    "MetricSpec",
    "prometheus_metric_name",
    "prometheus_name",
]

PREFIX = "otelkit"

# -- resource attributes ---------------------------------------------------------------------
SERVICE_NAME = "service.name"
SERVICE_INSTANCE_ID = "service.instance.id"
HOST_NAME = "host.name"
PROCESS_PID = "process.pid"
PROCESS_EXECUTABLE_NAME = "process.executable.name"
PROCESS_RUNTIME_NAME = "process.runtime.name"
PROCESS_RUNTIME_VERSION = "process.runtime.version"
TELEMETRY_DISTRO_NAME = "telemetry.distro.name"
TELEMETRY_DISTRO_VERSION = "telemetry.distro.version"
# Slurm has no OpenTelemetry convention: the variable names are Slurm's own, lower-cased.
SLURM_JOB_ID = "slurm.job.id"
SLURM_STEP_ID = "slurm.step.id"
SLURM_ARRAY_TASK_ID = "slurm.array.task.id"
SLURM_NODE_NAME = "slurm.node.name"
SLURM_CLUSTER_NAME = "slurm.cluster.name"
K8S_POD_NAME = "k8s.pod.name"
K8S_NAMESPACE_NAME = "k8s.namespace.name"
K8S_NODE_NAME = "k8s.node.name"

# -- attributes on otelkit's own telemetry-health metrics ------------------------------------
DROP_REASON = "reason"
DROP_REASON_QUEUE_FULL = "queue_full"
DROP_REASON_EXPORT_FAILED = "export_failed"
DROP_REASON_SHUTDOWN = "shutdown"
EXPORTER = "exporter"

# Request and stage durations run from sub-millisecond (a small MLP on a GPU) to a minute (a
# large event through the whole pipeline on a CPU): buckets resolve 100 us to 60 s.
DURATION_BUCKETS_S: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip

InstrumentKind = Literal["counter", "up_down_counter", "histogram", "gauge"]


@dataclass(frozen=True)
class MetricSpec:
    """A metric otelkit emits: its OpenTelemetry name, kind, unit (UCUM) and meaning."""

    name: str
    kind: InstrumentKind
    unit: str
    description: str
    buckets: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        # every duration shares one set of buckets so that panels can compare and sum them
        if self.kind == "histogram" and self.unit == "s" and self.buckets != DURATION_BUCKETS_S:
            raise ValueError(f"{self.name}: histograms in seconds use DURATION_BUCKETS_S")


TELEMETRY_SPANS_EXPORTED = MetricSpec(
    f"{PREFIX}.telemetry.spans.exported", "counter", "{span}",
    "Spans handed to the exporter and accepted by it.",
)  # fmt: skip
TELEMETRY_SPANS_DROPPED = MetricSpec(
    f"{PREFIX}.telemetry.spans.dropped", "counter", "{span}",
    "Spans lost before reaching the backend, by reason (queue_full, export_failed, shutdown).",
)  # fmt: skip
TELEMETRY_EXPORT_ERRORS = MetricSpec(
    f"{PREFIX}.telemetry.export.errors", "counter", "{error}",
    "Export requests that failed, by exporter.",
)  # fmt: skip
TELEMETRY_QUEUE_SIZE = MetricSpec(
    f"{PREFIX}.telemetry.spans.queued", "up_down_counter", "{span}",
    "Spans waiting in the export queue.",
)  # fmt: skip

METRICS: tuple[MetricSpec, ...] = (
    TELEMETRY_SPANS_EXPORTED,
    TELEMETRY_SPANS_DROPPED,
    TELEMETRY_EXPORT_ERRORS,
    TELEMETRY_QUEUE_SIZE,
)

_UNIT_SUFFIXES = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "1": "ratio"}


def prometheus_metric_name(name: str, unit: str, *, counter: bool) -> str:
    """The Prometheus sample name for an OpenTelemetry metric name and UCUM unit.

    Dots become underscores, the unit becomes a suffix (``s`` -> ``_seconds``), and counters
    end in ``_total``; histograms add ``_bucket``, ``_sum`` and ``_count`` to this name.
    """
    base = name.replace(".", "_").replace("-", "_")
    suffix = _UNIT_SUFFIXES.get(unit)
    if suffix and not base.endswith(f"_{suffix}"):
        base = f"{base}_{suffix}"
    return f"{base}_total" if counter else base


def prometheus_name(spec: MetricSpec) -> str:
    """The Prometheus sample name of one of otelkit's metrics (see ``prometheus_metric_name``)."""
    return prometheus_metric_name(spec.name, spec.unit, counter=spec.kind == "counter")
