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

# -- client spans (OpenTelemetry RPC conventions, plus otelkit's inference attributes) ---------
RPC_SYSTEM_NAME = "rpc.system.name"
RPC_METHOD = "rpc.method"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"
RPC_SYSTEM_TRITON_GRPC = "grpc"
RPC_SYSTEM_TRITON_HTTP = "kserve_v2_http"  # no RPC convention covers KServe's HTTP protocol
RPC_METHOD_GRPC_INFER = "inference.GRPCInferenceService/ModelInfer"
RPC_METHOD_GRPC_STREAM_INFER = "inference.GRPCInferenceService/ModelStreamInfer"
RPC_METHOD_HTTP_INFER = "v2/models/infer"
MODEL_NAME = f"{PREFIX}.model.name"
MODEL_VERSION = f"{PREFIX}.model.version"
REQUEST_ID = f"{PREFIX}.request.id"
BATCH_SIZE = f"{PREFIX}.request.batch_size"
INPUT_COUNT = f"{PREFIX}.request.inputs"
OUTPUT_COUNT = f"{PREFIX}.request.outputs"
REQUEST_BYTES = f"{PREFIX}.request.tensor_bytes"
RESPONSE_BYTES = f"{PREFIX}.response.tensor_bytes"
PROTOCOL = f"{PREFIX}.protocol"  # http, grpc
CALL_STYLE = f"{PREFIX}.call"  # infer, async_infer, stream, asyncio_infer, asyncio_stream
STREAM_REQUESTS = f"{PREFIX}.stream.requests"  # requests sent on a stream, on its span
STREAM_RESPONSES = f"{PREFIX}.stream.responses"  # responses received on it
SERIALIZE_S = f"{PREFIX}.client.serialize_s"  # building the request body before the wire
DESERIALIZE_S = f"{PREFIX}.client.deserialize_s"  # turning the response into a result
WIRE_S = f"{PREFIX}.client.wire_s"  # on the wire and in the server, as the client saw it

# -- server side: pipeline stages and HTTP server spans -----------------------------------------
STAGE_NAME = f"{PREFIX}.stage.name"
STAGE_GPU_S = f"{PREFIX}.stage.gpu_s"  # GPU time between CUDA events around the stage
STAGE_BATCH_REQUESTS = f"{PREFIX}.stage.batch_requests"  # requests of a batch-wide stage
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_ROUTE = "http.route"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
URL_PATH = "url.path"
URL_SCHEME = "url.scheme"
CLIENT_ADDRESS = "client.address"
NETWORK_PROTOCOL_VERSION = "network.protocol.version"

# metric attributes: short, Prometheus-friendly label names
M_MODEL = "model"
M_STAGE = "stage"
M_HTTP_METHOD = "http_request_method"
M_HTTP_ROUTE = "http_route"
M_HTTP_STATUS = "http_response_status_code"
M_MODEL_VERSION = "model_version"
M_SERVER = "server"
M_PROTOCOL = "protocol"
M_ERROR_TYPE = "error_type"

CLIENT_DURATION = MetricSpec(
    f"{PREFIX}.client.duration", "histogram", "s",
    "Inference calls as the client saw them, from the call to its result.", DURATION_BUCKETS_S,
)  # fmt: skip
CLIENT_REQUEST_BYTES = MetricSpec(
    f"{PREFIX}.client.request.size", "counter", "By", "Tensor bytes sent in inference requests.",
)  # fmt: skip
CLIENT_RESPONSE_BYTES = MetricSpec(
    f"{PREFIX}.client.response.size", "counter", "By",
    "Tensor bytes received in inference responses.",
)  # fmt: skip
CLIENT_IN_FLIGHT = MetricSpec(
    f"{PREFIX}.client.in_flight", "up_down_counter", "{request}",
    "Inference calls started and not yet finished.",
)  # fmt: skip
CLIENT_ERRORS = MetricSpec(
    f"{PREFIX}.client.errors", "counter", "{error}", "Failed inference calls, by error_type.",
)  # fmt: skip

STAGE_DURATION = MetricSpec(
    f"{PREFIX}.stage.duration", "histogram", "s",
    "Wall time of one pipeline stage on the server host.", DURATION_BUCKETS_S,
)  # fmt: skip
STAGE_GPU_DURATION = MetricSpec(
    f"{PREFIX}.stage.gpu.duration", "histogram", "s",
    "GPU time of one pipeline stage, between CUDA events recorded around it.", DURATION_BUCKETS_S,
)  # fmt: skip
STAGE_IN_FLIGHT = MetricSpec(
    f"{PREFIX}.stage.in_flight", "up_down_counter", "{stage}",
    "Pipeline stages started and not yet finished.",
)  # fmt: skip
STAGE_ERRORS = MetricSpec(
    f"{PREFIX}.stage.errors", "counter", "{error}", "Pipeline stages that raised, by error_type.",
)  # fmt: skip
HTTP_SERVER_DURATION = MetricSpec(
    "http.server.request.duration", "histogram", "s",
    "HTTP requests as the server saw them (OpenTelemetry HTTP server convention).",
    DURATION_BUCKETS_S,
)  # fmt: skip

SERVER_METRICS: tuple[MetricSpec, ...] = (
    STAGE_DURATION,
    STAGE_GPU_DURATION,
    STAGE_IN_FLIGHT,
    STAGE_ERRORS,
    HTTP_SERVER_DURATION,
)
CLIENT_METRICS: tuple[MetricSpec, ...] = (
    CLIENT_DURATION,
    CLIENT_REQUEST_BYTES,
    CLIENT_RESPONSE_BYTES,
    CLIENT_IN_FLIGHT,
    CLIENT_ERRORS,
)
TELEMETRY_METRICS: tuple[MetricSpec, ...] = (
    TELEMETRY_SPANS_EXPORTED,
    TELEMETRY_SPANS_DROPPED,
    TELEMETRY_EXPORT_ERRORS,
    TELEMETRY_QUEUE_SIZE,
)
METRICS: tuple[MetricSpec, ...] = CLIENT_METRICS + SERVER_METRICS + TELEMETRY_METRICS

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
