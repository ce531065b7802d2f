"""The sampler's last sample as OpenTelemetry observable instruments, named from ``semconv``.

Callbacks only read ``GpuSampler.latest``: a scrape or an OTLP push never calls NVML. NVML's
units become the metrics' (percent to ratio, milliwatts to watts, MHz to Hz, KB/s to bytes/s);
the clocks-event bitmask becomes one 0/1 series per reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otelkit import semconv
from otelkit.gpu._sampler import GpuSampler, Sample

__all__ = ["CLOCKS_EVENT_REASONS", "FIELD_METRICS", "observe"]

# NVML field -> (metric, factor from NVML's unit to the metric's, extra attributes)
FIELD_METRICS: dict[str, tuple[semconv.MetricSpec, float, dict[str, str]]] = {
    "utilization.gpu": (semconv.GPU_UTILIZATION, 0.01, {}),
    "utilization.memory": (semconv.GPU_MEMORY_UTILIZATION, 0.01, {}),
    "memory.used": (semconv.GPU_MEMORY_USED, 1.0, {}),
    "memory.free": (semconv.GPU_MEMORY_FREE, 1.0, {}),
    "memory.total": (semconv.GPU_MEMORY_TOTAL, 1.0, {}),
    "power.usage": (semconv.GPU_POWER_USAGE, 1e-3, {}),
    "power.limit": (semconv.GPU_POWER_LIMIT, 1e-3, {}),
    "energy": (semconv.GPU_ENERGY, 1e-3, {}),
    "temperature": (semconv.GPU_TEMPERATURE, 1.0, {}),
    "clock.sm": (semconv.GPU_CLOCK_SM, 1e6, {}),
    "clock.memory": (semconv.GPU_CLOCK_MEMORY, 1e6, {}),
    "pcie.tx": (semconv.GPU_PCIE_THROUGHPUT, 1024.0, {semconv.M_DIRECTION: "transmit"}),
    "pcie.rx": (semconv.GPU_PCIE_THROUGHPUT, 1024.0, {semconv.M_DIRECTION: "receive"}),
    "gpm.sm_occupancy": (semconv.GPU_SM_OCCUPANCY, 0.01, {}),
    "gpm.tensor_activity": (semconv.GPU_TENSOR_ACTIVITY, 0.01, {}),
    "gpm.dram_activity": (semconv.GPU_DRAM_ACTIVITY, 0.01, {}),
}
# nvmlClocksEventReason* bits, named as nvidia-smi -q lists them
CLOCKS_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

SamplerSource = Callable[[], GpuSampler | None]
Read = Callable[[GpuSampler, Sample], Iterable[Observation]]


def _fields(spec: semconv.MetricSpec) -> Read:
    mapped = [(f, factor, extra) for f, (s, factor, extra) in FIELD_METRICS.items() if s is spec]

    def read(sampler: GpuSampler, sample: Sample) -> Iterator[Observation]:
        for reading in sample.readings:
            labels = reading.device.labels
            for field, factor, extra in mapped:
                value = reading.values.get(field)
                if value is not None:
                    yield Observation(value * factor, {**labels, **extra})

    return read


def _clocks_events(sampler: GpuSampler, sample: Sample) -> Iterator[Observation]:
    for reading in sample.readings:
        mask = reading.values.get("clocks_event_reasons")
        if mask is None:
            continue
        for bit, reason in CLOCKS_EVENT_REASONS.items():
            active = 1 if int(mask) & bit else 0
            yield Observation(active, {**reading.device.labels, semconv.M_REASON: reason})


def _available(sampler: GpuSampler, sample: Sample) -> list[Observation]:
    return [Observation(1 if sample.readings else 0)]


def _process_memory(sampler: GpuSampler, sample: Sample) -> Iterator[Observation]:
    for reading in sample.readings:
        for process in reading.processes:
            if process.used_bytes is None:
                continue
            yield Observation(
                process.used_bytes,
                {
                    **reading.device.labels,
                    semconv.M_PID: str(process.pid),
                    semconv.M_PROCESS_NAME: process.name,
                    semconv.M_OWNER: process.owner,
                },
            )


def _torch(attribute: str) -> Read:
    def read(sampler: GpuSampler, sample: Sample) -> Iterator[Observation]:
        for memory in sample.torch:
            labels = {semconv.M_GPU: str(memory.index), semconv.M_GPU_UUID: memory.uuid}
            yield Observation(getattr(memory, attribute), labels)

    return read


def _lost(sampler: GpuSampler, sample: Sample) -> Iterator[Observation]:
    for device in list(sampler.lost.values()):
        yield Observation(1, device.labels)


def _read_errors(sampler: GpuSampler, sample: Sample) -> Iterator[Observation]:
    for field, count in list(sampler.read_errors.items()):
        yield Observation(count, {semconv.M_FIELD: field})


_READS: tuple[tuple[semconv.MetricSpec, Read], ...] = (
    (semconv.GPU_AVAILABLE, _available),
    *((spec, _fields(spec)) for spec in dict.fromkeys(s for s, _, _ in FIELD_METRICS.values())),
    (semconv.GPU_CLOCKS_EVENT, _clocks_events),
    (semconv.GPU_PROCESS_MEMORY, _process_memory),
    (semconv.GPU_TORCH_ALLOCATED, _torch("allocated")),
    (semconv.GPU_TORCH_RESERVED, _torch("reserved")),
    (semconv.GPU_TORCH_PEAK, _torch("peak")),
    (semconv.GPU_LOST, _lost),
    (semconv.GPU_READ_ERRORS, _read_errors),
)


def _callback(source: SamplerSource, read: Read) -> Callable[[CallbackOptions], Any]:
    def callback(options: CallbackOptions) -> list[Observation]:
        sampler = source()
        return list(read(sampler, sampler.latest)) if sampler is not None else []

    return callback


def observe(meter: Meter, source: SamplerSource) -> None:
    """Create every GPU instrument on ``meter``, observing the sampler ``source()`` returns."""
    for spec, read in _READS:
        create = (
            meter.create_observable_counter
            if spec.kind == "counter"
            else meter.create_observable_gauge
        )
        create(spec.name, [_callback(source, read)], unit=spec.unit, description=spec.description)
