"""GPU telemetry from NVML, with a backend that can be replaced by a recording.

``GpuSampler`` reads every GPU and MIG instance through a ``GpuBackend`` (``NvmlBackend`` on a
real node, ``ReplayBackend`` for a file written by ``otelkit gpu record``) in its own thread;
``otelkit.configure(gpu=True)`` starts one and publishes its readings as observable gauges over
OTLP and on the Prometheus endpoint; ``otelkit gpu-exporter`` serves them as a process of its
own. Nothing here imports ``pynvml`` or ``torch`` until a sampler starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from otelkit.gpu._backend import (
        FIELDS,
        Device,
        FieldNoData,
        FieldNotSupported,
        GpuBackend,
        GpuLost,
        GpuProcess,
        GpuReadError,
        GpuUnavailable,
    )
    from otelkit.gpu._nvml import NvmlBackend
    from otelkit.gpu._replay import RecordingError, ReplayBackend, record
    from otelkit.gpu._sampler import GpuSampler, Reading, Sample

__all__ = [
    "FIELDS",
    "Device",
    "FieldNoData",
    "FieldNotSupported",
    "GpuBackend",
    "GpuLost",
    "GpuProcess",
    "GpuReadError",
    "GpuSampler",
    "GpuUnavailable",
    "NvmlBackend",
    "Reading",
    "RecordingError",
    "ReplayBackend",
    "Sample",
    "record",
]

# ``otelkit.stage`` imports this package for its CUDA events (``_cuda_events``); the sampler and
# its backends come with the first use of one of their names.
_NAMES_OF = {
    "_backend": (
        "FIELDS",
        "Device",
        "FieldNoData",
        "FieldNotSupported",
        "GpuBackend",
        "GpuLost",
        "GpuProcess",
        "GpuReadError",
        "GpuUnavailable",
    ),
    "_nvml": ("NvmlBackend",),
    "_replay": ("RecordingError", "ReplayBackend", "record"),
    "_sampler": ("GpuSampler", "Reading", "Sample"),
}
_MODULE_OF = {name: module for module, names in _NAMES_OF.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'otelkit.gpu' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"otelkit.gpu.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
