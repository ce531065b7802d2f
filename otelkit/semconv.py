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
#: the head sampler that chose this process's traces, and its argument (``parentbased_ratelimiting
#: 10/s``): a reader of a trace store can say how its traces were chosen
OTELKIT_SAMPLER = f"{PREFIX}.sampler"
#: the Collector tail sampling processor's policy that kept a trace (on the instrumentation scope,
#: with its feature gate ``processor.tailsamplingprocessor.recordpolicy``): otelkit's reader
#: puts it on each span of the scope
TAIL_SAMPLING_POLICY = "tailsampling.policy"

# -- attributes on otelkit's own telemetry-health metrics ------------------------------------
DROP_REASON = "reason"
DROP_REASON_QUEUE_FULL = "queue_full"
DROP_REASON_EXPORT_FAILED = "export_failed"
DROP_REASON_SHUTDOWN = "shutdown"
EXPORTER = "exporter"

# Request and stage durations run from sub-millisecond (a small MLP on a GPU) to a minute (a
# large event through the whole pipeline on a CPU): buckets resolve 100 us to 60 s.
DURATION_BUCKETS_S: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

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
    f"{PREFIX}.telemetry.spans.exported",
    "counter",
    "{span}",
    "Spans handed to the exporter and accepted by it.",
)
TELEMETRY_SPANS_DROPPED = MetricSpec(
    f"{PREFIX}.telemetry.spans.dropped",
    "counter",
    "{span}",
    "Spans lost before reaching the backend, by reason (queue_full, export_failed, shutdown).",
)
TELEMETRY_EXPORT_ERRORS = MetricSpec(
    f"{PREFIX}.telemetry.export.errors",
    "counter",
    "{error}",
    "Export requests that failed, by exporter.",
)
TELEMETRY_INTERNAL_ERRORS = MetricSpec(
    f"{PREFIX}.telemetry.internal.errors",
    "counter",
    "{error}",
    "Failures of otelkit's own code, caught so that the program went on (the first at each "
    "place is logged with its traceback).",
)
TELEMETRY_QUEUE_SIZE = MetricSpec(
    f"{PREFIX}.telemetry.spans.queued",
    "up_down_counter",
    "{span}",
    "Spans waiting in the export queue.",
)
TELEMETRY_IN_EXPORT = MetricSpec(
    f"{PREFIX}.telemetry.spans.exporting",
    "up_down_counter",
    "{span}",
    "Spans of the batch being exported now. Every span ended is exported, dropped, queued or "
    "exporting.",
)

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
CONNECT_S = f"{PREFIX}.client.connect_s"  # within wire_s: a new connection's resolve + connect

# -- server side: pipeline stages and HTTP server spans -----------------------------------------
STAGE_NAME = f"{PREFIX}.stage.name"
# -- a proxy between client and server (Envoy's spans: an ``ingress`` SERVER span, one
# ``egress`` CLIENT span an attempt, to the server that answered) ---------------------------
PROXY_COMPONENT = "component"  # Envoy tags its spans component=proxy
PROXY = "proxy"
PROXY_UPSTREAM_ADDRESS = "upstream_address"  # on an egress span: the server it called
#: ``otelkit breakdown --group-by`` this key groups requests by the server that answered them
ANSWERED_BY = f"{PREFIX}.server.answered"
STAGE_GPU_S = f"{PREFIX}.stage.gpu_s"  # GPU time between CUDA events around the stage
STAGE_GPU_MEMORY_GROWTH = f"{PREFIX}.stage.gpu.memory_growth"  # torch bytes allocated, end - start
STAGE_BATCH_REQUESTS = f"{PREFIX}.stage.batch_requests"  # requests of a batch-wide stage
# events on an HTTP server span (FastAPI, Starlette): the request's body read whole, the
# response's headers sent, its body sent whole; the breakdown cuts the span at them
HTTP_REQUEST_RECEIVED = f"{PREFIX}.http.request.received"
HTTP_RESPONSE_STARTED = f"{PREFIX}.http.response.started"
HTTP_RESPONSE_SENT = f"{PREFIX}.http.response.sent"
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_ROUTE = "http.route"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
URL_PATH = "url.path"
URL_SCHEME = "url.scheme"
CLIENT_ADDRESS = "client.address"
NETWORK_PROTOCOL_VERSION = "network.protocol.version"
# gRPC server spans (otelkit.server.grpc): rpc.system.name, rpc.method and server.* as above
RPC_RESPONSE_STATUS_CODE = "rpc.response.status_code"  # the status name: OK, INTERNAL, ...
# The codes that mean the server failed (the RPC conventions); others are the caller's error.
RPC_SERVER_ERROR_CODES = (
    "UNKNOWN",
    "DEADLINE_EXCEEDED",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
)
CLIENT_PORT = "client.port"

# -- Ray Serve: deployments' requests, the wait before a replica took one, batched calls --------
RAY_SERVE_DEPLOYMENT = f"{PREFIX}.ray_serve.deployment"
RAY_SERVE_REPLICA = f"{PREFIX}.ray_serve.replica"
RAY_SERVE_APPLICATION = f"{PREFIX}.ray_serve.application"
RAY_SERVE_METHOD = f"{PREFIX}.ray_serve.method"  # the deployment method a handle called
RAY_SERVE_ROUTE = f"{PREFIX}.ray_serve.route"  # the application's route prefix
RAY_SERVE_QUEUE_SPAN = f"{PREFIX}.ray_serve.queued"  # from .remote() until the replica took it
RAY_SERVE_BATCH_SPAN = f"{PREFIX}.ray_serve.batch"  # one @serve.batch call, linked to its requests
RAY_SERVE_BATCH_SIZE = f"{PREFIX}.ray_serve.batch.size"

# -- otelkit study: the root span of each request a study sends, and what it carries -----------
STUDY_SPAN = f"{PREFIX}.study.request"
STUDY_RUN = f"{PREFIX}.study.run"  # one id per study run: several runs may share a trace file
STUDY_POINT = f"{PREFIX}.study.point"  # the point's index in its sweep
STUDY_PARAM = f"{PREFIX}.study.param"  # + ".<name>": each of the point's parameters
STUDY_PHASE = f"{PREFIX}.study.phase"  # warmup or measure: only measured requests are analysed
STUDY_PHASE_WARMUP = "warmup"
STUDY_PHASE_MEASURE = "measure"
# an open loop's request that waited for a free client thread: a stage from its scheduled
# arrival until a thread took it (the breakdown's "client backlog")
STUDY_BACKLOG_STAGE = "backlog"
# Triton's attribute on its model span (the stage spans of a Python-backend model hang under it)
TRITON_SPAN_MODEL_NAME = "triton.model_name"

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
M_RPC_METHOD = "rpc_method"
M_RPC_STATUS = "rpc_response_status_code"
M_DEPLOYMENT = "deployment"
M_APPLICATION = "application"
M_METHOD = "method"

CLIENT_DURATION = MetricSpec(
    f"{PREFIX}.client.duration",
    "histogram",
    "s",
    "Inference calls as the client saw them, from the call to its result.",
    DURATION_BUCKETS_S,
)
CLIENT_REQUEST_BYTES = MetricSpec(
    f"{PREFIX}.client.request.size",
    "counter",
    "By",
    "Tensor bytes sent in inference requests.",
)
CLIENT_RESPONSE_BYTES = MetricSpec(
    f"{PREFIX}.client.response.size",
    "counter",
    "By",
    "Tensor bytes received in inference responses.",
)
CLIENT_IN_FLIGHT = MetricSpec(
    f"{PREFIX}.client.in_flight",
    "up_down_counter",
    "{request}",
    "Inference calls started and not yet finished.",
)
CLIENT_ERRORS = MetricSpec(
    f"{PREFIX}.client.errors",
    "counter",
    "{error}",
    "Failed inference calls, by error_type.",
)

STAGE_DURATION = MetricSpec(
    f"{PREFIX}.stage.duration",
    "histogram",
    "s",
    "Wall time of one pipeline stage on the server host.",
    DURATION_BUCKETS_S,
)
STAGE_GPU_DURATION = MetricSpec(
    f"{PREFIX}.stage.gpu.duration",
    "histogram",
    "s",
    "GPU time of one pipeline stage, between CUDA events recorded around it.",
    DURATION_BUCKETS_S,
)
STAGE_IN_FLIGHT = MetricSpec(
    f"{PREFIX}.stage.in_flight",
    "up_down_counter",
    "{stage}",
    "Pipeline stages started and not yet finished.",
)
STAGE_ERRORS = MetricSpec(
    f"{PREFIX}.stage.errors",
    "counter",
    "{error}",
    "Pipeline stages that raised, by error_type.",
)
HTTP_SERVER_DURATION = MetricSpec(
    "http.server.request.duration",
    "histogram",
    "s",
    "HTTP requests as the server saw them (OpenTelemetry HTTP server convention).",
    DURATION_BUCKETS_S,
)
RPC_SERVER_DURATION = MetricSpec(
    "rpc.server.call.duration",
    "histogram",
    "s",
    "RPCs as the gRPC server saw them (OpenTelemetry RPC server convention).",
    DURATION_BUCKETS_S,
)
RAY_SERVE_CALL_DURATION = MetricSpec(
    f"{PREFIX}.ray_serve.call.duration",
    "histogram",
    "s",
    "DeploymentHandle calls as the called replica ran them, by deployment and method.",
    DURATION_BUCKETS_S,
)

# -- GPU telemetry (NVML), labelled like Triton's nv_gpu_* (gpu_uuid) so the two can be joined --
M_GPU = "gpu"  # NVML index of the GPU (a MIG instance carries its parent's)
M_GPU_UUID = "gpu_uuid"
M_GPU_NAME = "gpu_name"
M_MIG_INSTANCE = "mig_instance"  # GPU instance id of a MIG device; "" on a whole GPU
M_PID = "pid"
M_PROCESS_NAME = "process_name"
M_OWNER = "owner"  # the Triton model instance (triton:<instance>) or otelkit service of a pid
M_DIRECTION = "direction"  # transmit, receive
M_REASON = "reason"
M_FIELD = "field"
# span attributes added by span enrichment (configure(gpu_span_attributes=True))
SPAN_GPU_UUID = f"{PREFIX}.gpu.uuid"
SPAN_GPU_UTILIZATION = f"{PREFIX}.gpu.utilization"
SPAN_GPU_MEMORY_USED = f"{PREFIX}.gpu.memory.used"


def _gpu_gauge(name: str, unit: str, description: str) -> MetricSpec:
    return MetricSpec(f"{PREFIX}.gpu.{name}", "gauge", unit, description)


GPU_AVAILABLE = _gpu_gauge(
    "available", "", "1 while at least one GPU is sampled; 0 without NVML, driver or GPU."
)
GPU_UTILIZATION = _gpu_gauge(
    "utilization", "1", "Share of the last sample period a kernel ran on the GPU (NVML)."
)
GPU_MEMORY_UTILIZATION = _gpu_gauge(
    "memory.utilization", "1", "Share of the last sample period device memory was read or written."
)
GPU_MEMORY_USED = _gpu_gauge("memory.used", "By", "Device memory in use.")
GPU_MEMORY_FREE = _gpu_gauge("memory.free", "By", "Device memory free.")
GPU_MEMORY_TOTAL = _gpu_gauge("memory.total", "By", "Device memory in all.")
GPU_POWER_USAGE = _gpu_gauge("power.usage", "W", "Power drawn by the board.")
GPU_POWER_LIMIT = _gpu_gauge("power.limit", "W", "Power limit the driver enforces.")
GPU_ENERGY = MetricSpec(
    f"{PREFIX}.gpu.energy", "counter", "J", "Energy used by the GPU since the driver loaded."
)
GPU_TEMPERATURE = _gpu_gauge("temperature", "Cel", "GPU core temperature.")
GPU_CLOCK_SM = _gpu_gauge("clock.sm", "Hz", "Current SM clock.")
GPU_CLOCK_MEMORY = _gpu_gauge("clock.memory", "Hz", "Current memory clock.")
GPU_PCIE_THROUGHPUT = _gpu_gauge(
    "pcie.throughput", "By/s", "PCIe bytes per second over NVML's last 20 ms window, by direction."
)
GPU_CLOCKS_EVENT = _gpu_gauge(
    "clocks_event.active", "", "1 while a reason holds the clocks down (power cap, thermal, ...)."
)
GPU_SM_OCCUPANCY = _gpu_gauge(
    "sm.occupancy", "1", "Resident warps over the SMs' maximum, between samples (GPM, Hopper+)."
)
GPU_TENSOR_ACTIVITY = _gpu_gauge(
    "tensor.activity", "1", "Share of time the SMs ran tensor-core work (GPM, Hopper+)."
)
GPU_DRAM_ACTIVITY = _gpu_gauge(
    "dram.activity", "1", "DRAM bandwidth used over its maximum (GPM, Hopper+)."
)
GPU_PROCESS_MEMORY = _gpu_gauge(
    "process.memory.used", "By", "Device memory of one process, with its owner when known."
)
GPU_TORCH_ALLOCATED = _gpu_gauge(
    "torch.memory.allocated", "By", "Memory held by this process's torch tensors, per device."
)
GPU_TORCH_RESERVED = _gpu_gauge(
    "torch.memory.reserved", "By", "Memory reserved by this process's torch caching allocator."
)
GPU_TORCH_PEAK = _gpu_gauge(
    "torch.memory.peak", "By", "Highest memory held by torch tensors since the process started."
)
GPU_LOST = MetricSpec(
    f"{PREFIX}.gpu.lost", "counter", "{gpu}", "GPUs that fell off the bus (NVML GpuIsLost)."
)
GPU_READ_ERRORS = MetricSpec(
    f"{PREFIX}.gpu.read.errors", "counter", "{error}", "NVML reads that failed, by field."
)
GPU_SAMPLE_DURATION = MetricSpec(
    f"{PREFIX}.gpu.sample.duration",
    "histogram",
    "s",
    "Wall time of one NVML sample of every GPU.",
    DURATION_BUCKETS_S,
)

# What users already run, to cross-check ours: (DCGM exporter field, Triton metric), "" if none.
GPU_EQUIVALENTS: dict[str, tuple[str, str]] = {
    GPU_UTILIZATION.name: ("DCGM_FI_DEV_GPU_UTIL (%)", "nv_gpu_utilization"),
    GPU_MEMORY_UTILIZATION.name: ("DCGM_FI_DEV_MEM_COPY_UTIL (%)", ""),
    GPU_MEMORY_USED.name: ("DCGM_FI_DEV_FB_USED (MiB)", "nv_gpu_memory_used_bytes"),
    GPU_MEMORY_FREE.name: ("DCGM_FI_DEV_FB_FREE (MiB)", ""),
    GPU_MEMORY_TOTAL.name: ("", "nv_gpu_memory_total_bytes"),
    GPU_POWER_USAGE.name: ("DCGM_FI_DEV_POWER_USAGE", "nv_gpu_power_usage"),
    GPU_POWER_LIMIT.name: ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "nv_gpu_power_limit"),
    GPU_ENERGY.name: ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ)", "nv_energy_consumption"),
    GPU_TEMPERATURE.name: ("DCGM_FI_DEV_GPU_TEMP", ""),
    GPU_CLOCK_SM.name: ("DCGM_FI_DEV_SM_CLOCK (MHz)", ""),
    GPU_CLOCK_MEMORY.name: ("DCGM_FI_DEV_MEM_CLOCK (MHz)", ""),
    GPU_PCIE_THROUGHPUT.name: ("DCGM_FI_PROF_PCIE_TX_BYTES / _RX_BYTES", ""),
    GPU_CLOCKS_EVENT.name: ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS (bitmask)", ""),
    GPU_SM_OCCUPANCY.name: ("DCGM_FI_PROF_SM_OCCUPANCY", ""),
    GPU_TENSOR_ACTIVITY.name: ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", ""),
    GPU_DRAM_ACTIVITY.name: ("DCGM_FI_PROF_DRAM_ACTIVE", ""),
}

GPU_METRICS: tuple[MetricSpec, ...] = (
    GPU_AVAILABLE,
    GPU_UTILIZATION,
    GPU_MEMORY_UTILIZATION,
    GPU_MEMORY_USED,
    GPU_MEMORY_FREE,
    GPU_MEMORY_TOTAL,
    GPU_POWER_USAGE,
    GPU_POWER_LIMIT,
    GPU_ENERGY,
    GPU_TEMPERATURE,
    GPU_CLOCK_SM,
    GPU_CLOCK_MEMORY,
    GPU_PCIE_THROUGHPUT,
    GPU_CLOCKS_EVENT,
    GPU_SM_OCCUPANCY,
    GPU_TENSOR_ACTIVITY,
    GPU_DRAM_ACTIVITY,
    GPU_PROCESS_MEMORY,
    GPU_TORCH_ALLOCATED,
    GPU_TORCH_RESERVED,
    GPU_TORCH_PEAK,
    GPU_LOST,
    GPU_READ_ERRORS,
    GPU_SAMPLE_DURATION,
)

# -- the fleet (otelkit.fleet): the renderer's own metrics, and the labels it gives targets --------
M_SITE = "site"  # the fleet's metrics: a server's site (M_SERVER: its name)
#: ``file_sd`` labels on every series scraped from a registered server: which server, which site
FLEET_SERVER_LABEL = "otelkit_server"
FLEET_SITE_LABEL = "otelkit_site"
FLEET_SERVERS = MetricSpec(
    f"{PREFIX}.fleet.servers",
    "gauge",
    "{server}",
    "Servers registered with a live heartbeat and rendered into Envoy's endpoints, by site.",
)
FLEET_REFUSED = MetricSpec(
    f"{PREFIX}.fleet.registrations.refused",
    "gauge",
    "{registration}",
    "Entries of the registry refused as malformed or hostile: nothing is rendered from them.",
)
FLEET_HEARTBEAT_AGE = MetricSpec(
    f"{PREFIX}.fleet.heartbeat.age",
    "gauge",
    "s",
    "Seconds since each registered server's last heartbeat, by server and site.",
)
FLEET_RENDERS = MetricSpec(
    f"{PREFIX}.fleet.renders",
    "counter",
    "{render}",
    "Times the renderer rewrote Envoy's endpoints or Prometheus' targets.",
)
FLEET_REGISTRY_ERRORS = MetricSpec(
    f"{PREFIX}.fleet.registry.errors",
    "counter",
    "{error}",
    "Reads of the registry or writes of a rendered file that failed (the last files stay).",
)
FLEET_UNRESOLVED = MetricSpec(
    f"{PREFIX}.fleet.unresolved",
    "gauge",
    "{server}",
    "Registered servers left out of Envoy's endpoints because their address does not resolve.",
)
FLEET_SATURATION = MetricSpec(
    f"{PREFIX}.fleet.saturation",
    "gauge",
    "ms",
    "Each server's queue ms per execution over the draining window (SuperSONIC's signal).",
)
FLEET_DRAINED = MetricSpec(
    f"{PREFIX}.fleet.drained",
    "gauge",
    "",
    "1 while a server is drained (Envoy sends it no new request) for its saturation, else 0.",
)
FLEET_METRICS: tuple[MetricSpec, ...] = (
    FLEET_SERVERS,
    FLEET_REFUSED,
    FLEET_HEARTBEAT_AGE,
    FLEET_RENDERS,
    FLEET_REGISTRY_ERRORS,
    FLEET_UNRESOLVED,
    FLEET_SATURATION,
    FLEET_DRAINED,
)

# -- Envoy's Prometheus metrics (/stats/prometheus of its admin), as the fleet's panels and rules
# read them. Counters keep Envoy's names (no _total). Per-server figures need the clusters'
# per_endpoint_stats (otelkit.fleet._envoy sets it); their envoy_endpoint_hostname is the name a
# server registered.
ENVOY_ENDPOINT_REQUESTS = "envoy_cluster_endpoint_rq_total"
ENVOY_ENDPOINT_ERRORS = "envoy_cluster_endpoint_rq_error"
ENVOY_ENDPOINT_ACTIVE = "envoy_cluster_endpoint_rq_active"
ENVOY_ENDPOINT_HEALTHY = "envoy_cluster_endpoint_healthy"
ENVOY_MEMBERSHIP_HEALTHY = "envoy_cluster_membership_healthy"
ENVOY_MEMBERSHIP_TOTAL = "envoy_cluster_membership_total"
ENVOY_REQUEST_TIME_MS = "envoy_cluster_upstream_rq_time"  # a histogram, in milliseconds
ENVOY_RETRIES = "envoy_cluster_upstream_rq_retry"
ENVOY_EJECTIONS_ACTIVE = "envoy_cluster_outlier_detection_ejections_active"
ENVOY_HEALTH_CHECK_FAILURES = "envoy_cluster_health_check_failure"
ENVOY_METRICS: tuple[str, ...] = (
    ENVOY_ENDPOINT_REQUESTS,
    ENVOY_ENDPOINT_ERRORS,
    ENVOY_ENDPOINT_ACTIVE,
    ENVOY_ENDPOINT_HEALTHY,
    ENVOY_MEMBERSHIP_HEALTHY,
    ENVOY_MEMBERSHIP_TOTAL,
    f"{ENVOY_REQUEST_TIME_MS}_bucket",
    f"{ENVOY_REQUEST_TIME_MS}_sum",
    f"{ENVOY_REQUEST_TIME_MS}_count",
    ENVOY_RETRIES,
    ENVOY_EJECTIONS_ACTIVE,
    ENVOY_HEALTH_CHECK_FAILURES,
)
ENVOY_CLUSTER = "envoy_cluster_name"  # Envoy's label names
ENVOY_HOSTNAME = "envoy_endpoint_hostname"

# -- Triton's own Prometheus metrics (tritonserver 2.51, port 8002), as the dashboards query them --
# Counters keep Triton's names (no _total). Labels: model, version; nv_gpu_* carry gpu_uuid.
# The *_summary_us quantiles exist with --metrics-config=summary_latencies=true.
TRITON_REQUEST_SUCCESS = "nv_inference_request_success"
TRITON_REQUEST_FAILURE = "nv_inference_request_failure"
TRITON_INFERENCE_COUNT = "nv_inference_count"  # inferences, a batch of 8 counts 8
TRITON_EXECUTION_COUNT = "nv_inference_exec_count"  # model executions (batches)
TRITON_PENDING_REQUESTS = "nv_inference_pending_request_count"
TRITON_REQUEST_DURATION_US = "nv_inference_request_duration_us"  # cumulative microseconds
TRITON_QUEUE_DURATION_US = "nv_inference_queue_duration_us"
TRITON_COMPUTE_INPUT_US = "nv_inference_compute_input_duration_us"
TRITON_COMPUTE_INFER_US = "nv_inference_compute_infer_duration_us"
TRITON_COMPUTE_OUTPUT_US = "nv_inference_compute_output_duration_us"
TRITON_REQUEST_SUMMARY_US = "nv_inference_request_summary_us"
TRITON_QUEUE_SUMMARY_US = "nv_inference_queue_summary_us"
TRITON_GPU_UTILIZATION = "nv_gpu_utilization"
TRITON_GPU_MEMORY_USED = "nv_gpu_memory_used_bytes"
TRITON_GPU_MEMORY_TOTAL = "nv_gpu_memory_total_bytes"
TRITON_GPU_POWER_USAGE = "nv_gpu_power_usage"
TRITON_GPU_POWER_LIMIT = "nv_gpu_power_limit"
TRITON_CPU_UTILIZATION = "nv_cpu_utilization"
TRITON_METRICS: tuple[str, ...] = (
    TRITON_REQUEST_SUCCESS,
    TRITON_REQUEST_FAILURE,
    TRITON_INFERENCE_COUNT,
    TRITON_EXECUTION_COUNT,
    TRITON_PENDING_REQUESTS,
    TRITON_REQUEST_DURATION_US,
    TRITON_QUEUE_DURATION_US,
    TRITON_COMPUTE_INPUT_US,
    TRITON_COMPUTE_INFER_US,
    TRITON_COMPUTE_OUTPUT_US,
    TRITON_REQUEST_SUMMARY_US,
    TRITON_QUEUE_SUMMARY_US,
    TRITON_GPU_UTILIZATION,
    TRITON_GPU_MEMORY_USED,
    TRITON_GPU_MEMORY_TOTAL,
    TRITON_GPU_POWER_USAGE,
    TRITON_GPU_POWER_LIMIT,
    TRITON_CPU_UTILIZATION,
)
TRITON_MODEL = "model"  # Triton's label names
TRITON_VERSION = "version"

# -- Ray Serve's own Prometheus metrics (Ray 2.60, on Ray's metrics export port), as queried --
# Labels: deployment, application (and replica, route); processing latency excludes queueing.
RAY_SERVE_REQUESTS = "ray_serve_deployment_request_counter_total"
RAY_SERVE_ERRORS = "ray_serve_deployment_error_counter_total"
RAY_SERVE_PROCESSING_MS = "ray_serve_deployment_processing_latency_ms"  # histogram, in ms
RAY_SERVE_QUEUED = "ray_serve_deployment_queued_queries"  # waiting in callers' routers
RAY_SERVE_REPLICAS_HEALTHY = "ray_serve_deployment_replica_healthy"  # 1 per healthy replica
RAY_SERVE_LABEL_DEPLOYMENT = "deployment"
RAY_SERVE_METRICS: tuple[str, ...] = (
    RAY_SERVE_REQUESTS,
    RAY_SERVE_ERRORS,
    f"{RAY_SERVE_PROCESSING_MS}_bucket",
    f"{RAY_SERVE_PROCESSING_MS}_sum",
    f"{RAY_SERVE_PROCESSING_MS}_count",
    RAY_SERVE_QUEUED,
    RAY_SERVE_REPLICAS_HEALTHY,
)

SERVER_METRICS: tuple[MetricSpec, ...] = (
    STAGE_DURATION,
    STAGE_GPU_DURATION,
    STAGE_IN_FLIGHT,
    STAGE_ERRORS,
    HTTP_SERVER_DURATION,
    RPC_SERVER_DURATION,
    RAY_SERVE_CALL_DURATION,
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
    TELEMETRY_INTERNAL_ERRORS,
    TELEMETRY_QUEUE_SIZE,
    TELEMETRY_IN_EXPORT,
)
METRICS: tuple[MetricSpec, ...] = CLIENT_METRICS + SERVER_METRICS + TELEMETRY_METRICS + GPU_METRICS

_UNIT_SUFFIXES = {
    "s": "seconds",
    "ms": "milliseconds",
    "By": "bytes",
    "1": "ratio",
    "W": "watts",
    "J": "joules",
    "Cel": "celsius",
    "Hz": "hertz",
    "By/s": "bytes_per_second",
}


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
