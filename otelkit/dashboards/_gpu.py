"""*GPU*: what otelkit's NVML sampler reads, beside what Triton reports for the same GPUs.

otelkit's gauges carry ``gpu``, ``gpu_uuid``, ``gpu_name`` and ``mig_instance``; Triton's
``nv_gpu_*`` carry only ``gpu_uuid``. Triton's series are joined to otelkit's names on
``gpu_uuid`` and fall back to the bare uuid when no otelkit sampler reads that GPU.
"""

from __future__ import annotations

from typing import Any

from otelkit import semconv
from otelkit.dashboards._grafana import (
    INSTANCE,
    Q,
    dashboard,
    rate,
    selector,
    stat,
    timeseries,
)
from otelkit.dashboards._options import DashboardOptions

__all__ = ["build", "triton_gpu"]

_LEGEND = "{{instance}} GPU {{gpu}} {{mig_instance}}"
_TRITON_LEGEND = "Triton {{instance}} GPU {{gpu}} {{gpu_uuid}}"
_TOTAL = semconv.prometheus_name(semconv.GPU_MEMORY_TOTAL)


def _gpu(spec: semconv.MetricSpec, *matchers: str) -> str:
    return selector(semconv.prometheus_name(spec), INSTANCE, *matchers)


def triton_gpu(metric: str) -> str:
    """One of Triton's ``nv_gpu_*`` gauges with otelkit's ``gpu`` and ``gpu_name`` labels added.

    The names come from whole GPUs (``mig_instance=""``) so each uuid matches once; a GPU that
    no otelkit sampler reads keeps its bare series.
    """
    triton = selector(metric, INSTANCE)
    whole_gpus = selector(_TOTAL, 'mig_instance=""')
    names = f"group by (gpu_uuid, gpu, gpu_name) ({whole_gpus})"
    named = f"{triton} * on (gpu_uuid) group_left (gpu, gpu_name) {names}"
    return f"({named}) or on (gpu_uuid) {triton}"


def _availability() -> list[Any]:
    available = _gpu(semconv.GPU_AVAILABLE)
    return [
        stat(
            "Samplers reading GPUs",
            [Q(f"count({available} == 1) or vector(0)", "sampling")],
            description="Processes whose otelkit GPU sampler reads at least one GPU.",
        ),
        stat(
            "Samplers without GPU",
            [Q(f"count({available} == 0) or vector(0)", "no GPU")],
            description="No NVML, no driver or no GPU: these processes export no GPU metrics.",
        ),
        stat(
            "GPUs seen",
            [Q(f"count(group by (gpu_uuid) ({_gpu(semconv.GPU_MEMORY_TOTAL)}))", "GPUs")],
        ),
        stat(
            "GPUs lost",
            [Q(f"sum({_gpu(semconv.GPU_LOST)}) or vector(0)", "lost")],
            description="GPUs that fell off the bus (NVML GpuIsLost) since the sampler started.",
        ),
    ]


def _utilisation() -> list[Any]:
    return [
        timeseries(
            "GPU utilisation: otelkit and Triton",
            [
                Q(_gpu(semconv.GPU_UTILIZATION), f"otelkit {_LEGEND}"),
                Q(triton_gpu(semconv.TRITON_GPU_UTILIZATION), _TRITON_LEGEND),
            ],
            unit="percentunit",
            description="Share of time a kernel ran: busy is not saturated. "
            "Compare with the saturation panel of the Inference service dashboard.",
        ),
        timeseries(
            "Memory activity",
            [
                Q(_gpu(semconv.GPU_MEMORY_UTILIZATION), f"memory {_LEGEND}"),
            ],
            unit="percentunit",
            width=6,
        ),
        timeseries(
            "PCIe throughput",
            [
                Q(_gpu(semconv.GPU_PCIE_THROUGHPUT), f"{_LEGEND} {{{{direction}}}}"),
            ],
            unit="Bps",
            width=6,
        ),
    ]


def _memory() -> list[Any]:
    process = _gpu(semconv.GPU_PROCESS_MEMORY)
    return [
        timeseries(
            "Memory used and total",
            [
                Q(_gpu(semconv.GPU_MEMORY_USED), f"used {_LEGEND}"),
                Q(_gpu(semconv.GPU_MEMORY_TOTAL), f"total {_LEGEND}"),
                Q(triton_gpu(semconv.TRITON_GPU_MEMORY_USED), f"used {_TRITON_LEGEND}"),
                Q(triton_gpu(semconv.TRITON_GPU_MEMORY_TOTAL), f"total {_TRITON_LEGEND}"),
            ],
            unit="bytes",
            width=8,
        ),
        timeseries(
            "Memory per process",
            [
                Q(process, "{{instance}} GPU {{gpu}} {{process_name}} {{pid}} {{owner}}"),
            ],
            unit="bytes",
            width=8,
            stack=True,
            description="owner names the Triton model "
            "instance (triton:<instance>) or otelkit service of each process, when known.",
        ),
        timeseries(
            "torch memory per process",
            [
                Q(_gpu(semconv.GPU_TORCH_ALLOCATED), "allocated {{instance}} GPU {{gpu}}"),
                Q(_gpu(semconv.GPU_TORCH_RESERVED), "reserved {{instance}} GPU {{gpu}}"),
                Q(_gpu(semconv.GPU_TORCH_PEAK), "peak {{instance}} GPU {{gpu}}"),
            ],
            unit="bytes",
            width=8,
        ),
    ]


def _power_and_clocks() -> list[Any]:
    clocks_held = f"{_gpu(semconv.GPU_CLOCKS_EVENT)} == 1"
    return [
        timeseries(
            "Power usage vs limit",
            [
                Q(_gpu(semconv.GPU_POWER_USAGE), f"usage {_LEGEND}"),
                Q(_gpu(semconv.GPU_POWER_LIMIT), f"limit {_LEGEND}"),
                Q(rate(semconv.prometheus_name(semconv.GPU_ENERGY), INSTANCE), f"mean {_LEGEND}"),
                Q(triton_gpu(semconv.TRITON_GPU_POWER_USAGE), f"usage {_TRITON_LEGEND}"),
                Q(triton_gpu(semconv.TRITON_GPU_POWER_LIMIT), f"limit {_TRITON_LEGEND}"),
            ],
            unit="watt",
            description="mean: the energy counter's rate, the average power "
            "between scrapes that one reading of the usage can miss.",
        ),
        timeseries(
            "Clocks held down by",
            [
                Q(clocks_held, f"{_LEGEND} {{{{reason}}}}"),
            ],
            steps=True,
            stack=True,
            description="Reasons active per GPU (power cap, thermal, "
            "...): a GPU at its power cap runs slower at the same utilisation.",
        ),
        timeseries("Temperature", [Q(_gpu(semconv.GPU_TEMPERATURE), _LEGEND)], unit="celsius"),
        timeseries(
            "Clocks",
            [
                Q(_gpu(semconv.GPU_CLOCK_SM), f"SM {_LEGEND}"),
                Q(_gpu(semconv.GPU_CLOCK_MEMORY), f"memory {_LEGEND}"),
            ],
            unit="hertz",
        ),
    ]


def _activity() -> list[Any]:
    note = "GPM metrics: Hopper and newer only; empty on older GPUs."
    return [
        timeseries(
            "SM occupancy",
            [Q(_gpu(semconv.GPU_SM_OCCUPANCY), _LEGEND)],
            unit="percentunit",
            width=8,
            description=note,
        ),
        timeseries(
            "Tensor core activity",
            [Q(_gpu(semconv.GPU_TENSOR_ACTIVITY), _LEGEND)],
            unit="percentunit",
            width=8,
            description=note,
        ),
        timeseries(
            "DRAM activity",
            [Q(_gpu(semconv.GPU_DRAM_ACTIVITY), _LEGEND)],
            unit="percentunit",
            width=8,
            description=note,
        ),
    ]


def build(options: DashboardOptions) -> Any:
    """The *GPU* dashboard as a grafanalib ``Dashboard``."""
    return dashboard(
        options,
        "gpu",
        "GPU",
        "Utilisation, memory (per process too), power against its limit, clocks and what holds "
        "them down, SM occupancy and tensor activity, from otelkit's NVML sampler beside "
        "Triton's nv_gpu_* joined on gpu_uuid.",
        semconv.TRITON_REQUEST_SUCCESS,
        [
            ("Availability", _availability()),
            ("Utilisation", _utilisation()),
            ("Memory", _memory()),
            ("Power, clocks and temperature", _power_and_clocks()),
            ("Activity (GPM)", _activity()),
        ],
    )
