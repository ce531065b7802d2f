"""Triton's counters, scraped before and after a point and turned into per-request figures.

Triton's ``/metrics`` counters are cumulative, in microseconds. Over a point, per model:

- queue and compute (input, infer, output) time **per request**: each counter's growth over the
  requests that succeeded. Triton charges every request of a batch with the batch's whole
  compute time, so compute per request is also compute per execution;
- **mean batch size**: inferences over executions (Triton counts a batch of 8 as 8 inferences);
  **requests per execution**: how many requests the dynamic batcher put together;
- **saturation**: queue milliseconds per execution, as SuperSONIC scales on it;
- **capacity**: what the model's instances can serve at most, ``instances × requests per
  execution / compute time per execution``.

A counter that went down (the model was reloaded) is read from zero. The page's text may come
from any source (``fetch``): tests replay recorded pages.

>>> before = parse(RECORDED)
>>> after = parse(RECORDED.replace(" 100", " 300").replace(" 500000", " 1500000"))
>>> figures = difference(before, after)["sleep"]
>>> figures.requests, figures.compute_ms, figures.saturation_ms
(200, 5.0, 0.0)
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from otelkit import semconv

__all__ = ["ModelCounters", "ModelFigures", "Snapshot", "difference", "parse", "scrape"]

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
_GPU = {
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
            elif name in _GPU:
                uuid = sample.labels.get(semconv.M_GPU_UUID, "")
                gpus.setdefault(uuid, {})[_GPU[name]] = float(sample.value)
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
