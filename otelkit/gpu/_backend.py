"""The interface the GPU sampler reads through, and what it returns.

A backend answers NVML's questions in NVML's own units: one field of one device at a time, and
the processes on a device. The real one is ``NvmlBackend``; ``ReplayBackend`` answers from a
recording made on a real GPU by ``otelkit gpu record``, the way prometheus_client's process
collector reads a ``/proc`` it is given. Everything above this interface (skipping unsupported
fields, lost GPUs, units, metric names) is the same for both.

A field that a device does not have raises ``FieldNotSupported`` (the sampler stops asking), one
without a value yet raises ``FieldNoData`` (GPM before its second sample), a GPU that fell off the
bus raises ``GpuLost``, anything else ``GpuReadError``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from otelkit import semconv

__all__ = [
    "FIELDS",
    "SLOW_FIELDS",
    "Device",
    "FieldNoData",
    "FieldNotSupported",
    "GpuBackend",
    "GpuLost",
    "GpuProcess",
    "GpuReadError",
    "GpuUnavailable",
]

# Every field a backend is asked for, in NVML's units (see ``otelkit.gpu._instruments``).
FIELDS: tuple[str, ...] = (
    "utilization.gpu",  # %, nvmlDeviceGetUtilizationRates
    "utilization.memory",  # %
    "memory.used",  # bytes, nvmlDeviceGetMemoryInfo
    "memory.free",
    "memory.total",
    "power.usage",  # mW, nvmlDeviceGetPowerUsage
    "power.limit",  # mW, nvmlDeviceGetEnforcedPowerLimit
    "energy",  # mJ since the driver loaded, nvmlDeviceGetTotalEnergyConsumption
    "temperature",  # degrees C, nvmlDeviceGetTemperature(GPU)
    "clock.sm",  # MHz, nvmlDeviceGetClockInfo
    "clock.memory",
    "pcie.tx",  # KB/s, nvmlDeviceGetPcieThroughput
    "pcie.rx",
    "clocks_event_reasons",  # bitmask, nvmlDeviceGetCurrentClocksEventReasons
    "gpm.sm_occupancy",  # %, GPM between the last two samples (Hopper and newer)
    "gpm.tensor_activity",
    "gpm.dram_activity",
)

# Fields NVML answers slowly: PCIe throughput waits out NVML's 20 ms window per direction and
# the energy counter takes milliseconds of CPU, where every other field takes microseconds
# (measured on an H200: docs/performance.md). Together they were most of a sample's cost. A
# backend that declares them in ``slow_fields`` has them read every
# ``GpuSampler(slow_interval_s=...)`` rather than every sample; the others keep their interval.
SLOW_FIELDS: frozenset[str] = frozenset({"energy", "pcie.tx", "pcie.rx"})


class GpuUnavailable(Exception):
    """No GPU can be sampled here: NVML, its driver or any device is missing."""


class FieldNotSupported(Exception):
    """The device does not provide this field."""


class FieldNoData(Exception):
    """The field has no value yet (GPM needs two samples); ask again next time."""


class GpuLost(Exception):
    """The GPU fell off the bus or needs a reset; it answers nothing until then."""


class GpuReadError(Exception):
    """NVML failed to read a field for another reason."""


@dataclass(frozen=True)
class Device:
    """A GPU, or a MIG instance of one (with its parent's uuid and index)."""

    uuid: str
    index: int
    name: str
    mig_instance: int | None = None
    parent_uuid: str | None = None

    @property
    def labels(self) -> dict[str, str]:
        """The metric attributes of every series of this device."""
        return {
            semconv.M_GPU: str(self.index),
            semconv.M_GPU_UUID: self.uuid,
            semconv.M_GPU_NAME: self.name,
            semconv.M_MIG_INSTANCE: "" if self.mig_instance is None else str(self.mig_instance),
        }


@dataclass(frozen=True)
class GpuProcess:
    """A process holding device memory, with the service or model instance it belongs to."""

    pid: int
    name: str
    used_bytes: int | None  # None where NVML cannot tell (MIG without permission, WDDM)
    owner: str = ""


class GpuBackend(ABC):
    """Where the sampler's readings come from; see the module docstring."""

    slow_fields: frozenset[str] = frozenset()
    """Fields costly to read (``SLOW_FIELDS`` for NVML): the sampler reads them less often."""

    @abstractmethod
    def open(self) -> list[Device]:
        """Start and list the devices (GPUs, then their MIG instances); ``GpuUnavailable``."""

    def begin_sample(self) -> None:  # noqa: B027 - a hook, most backends need nothing
        """One sample of every device starts (GPM takes its sample, a replay moves on)."""

    @abstractmethod
    def read(self, device: Device, field: str) -> float:
        """One field of ``FIELDS`` in NVML's units, or one of this module's exceptions."""

    @abstractmethod
    def processes(self, device: Device) -> list[GpuProcess]:
        """The processes holding memory on ``device``."""

    def describe(self) -> dict[str, str]:
        """Driver and library versions, for recordings and logs."""
        return {}

    def close(self) -> None:  # noqa: B027 - a hook
        """Release NVML."""
