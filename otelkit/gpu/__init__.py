"""GPU telemetry from NVML, with a backend that can be replaced by a recording.

``GpuSampler`` reads every GPU and MIG instance through a ``GpuBackend`` (``NvmlBackend`` on a
real node, ``ReplayBackend`` for a file written by ``otelkit gpu record``) in its own thread;
``otelkit.configure(gpu=True)`` starts one and publishes its readings as observable gauges over
OTLP and on the Prometheus endpoint; ``otelkit gpu-exporter`` serves them as a process of its
own. Nothing here imports ``pynvml`` or ``torch`` until a sampler starts.
"""

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
