"""The GPU sampler: a thread that reads every GPU through a backend once per interval.

Each sample replaces ``latest`` whole, so a scrape, an OTLP push or a span only ever reads the
last sample and never waits on NVML. A field a device does not support is skipped for that
device from then on; a GPU that is lost (``GpuIsLost``) drops out of every series, counts once in
``lost`` and is not asked again, while the others go on; a failed read counts in
``read_errors`` by field. Without NVML or a GPU the sampler logs one line and reports no GPU.

>>> sampler = GpuSampler(interval_s=1.0).start()   # NvmlBackend() unless a backend is given
>>> sampler.latest.readings[0].values["power.usage"]  # NVML's milliwatts
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from otelkit import semconv
from otelkit._core.hotmetrics import HOT
from otelkit.gpu import _torch_memory as torch_memory
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
from otelkit.gpu._torch_memory import TorchMemory

__all__ = ["EMPTY", "GpuSampler", "Reading", "Sample"]

logger = logging.getLogger("otelkit")

_PROCESSES = "processes"  # the pseudo-field of the process list, for skipping and errors


@dataclass(frozen=True)
class Reading:
    """One device in one sample: NVML's values by field, and the processes on it."""

    device: Device
    values: dict[str, float]
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class Sample:
    """Every device read at ``at_ns``, and torch's memory counters of this process."""

    at_ns: int
    readings: tuple[Reading, ...] = ()
    torch: tuple[TorchMemory, ...] = ()
    span_attributes: dict[str, Any] = field(default_factory=dict)


EMPTY = Sample(0)
_samplers: weakref.WeakSet[GpuSampler] = weakref.WeakSet()


class GpuSampler:
    """Reads ``backend`` (default: NVML) every ``interval_s`` seconds in a daemon thread.

    ``torch_cuda``: where torch's memory counters come from; by default ``torch.cuda`` once this
    process has started CUDA, ``False`` for none.
    """

    def __init__(
        self,
        backend: GpuBackend | None = None,
        interval_s: float = 1.0,
        *,
        torch_cuda: Any = None,
        slow_interval_s: float = 10.0,
    ) -> None:
        if not interval_s > 0 or not slow_interval_s >= 0:
            raise ValueError(
                f"interval_s must be positive, not {interval_s!r}, and "
                f"slow_interval_s not negative, not {slow_interval_s!r}"
            )
        if backend is None:
            from otelkit.gpu._nvml import NvmlBackend

            backend = NvmlBackend()
        self.backend = backend
        self.interval_s = interval_s
        self.slow_interval_s = slow_interval_s
        self._slow_read_at = float("-inf")  # when the backend's slow fields were last read
        self._slow_values: dict[str, dict[str, float]] = {}  # by device: their last values
        self._torch: Callable[[], Any] = (
            torch_memory.cuda_in_use
            if torch_cuda is None
            else (lambda: torch_cuda or None)  # False: never
        )
        self.devices: list[Device] = []
        self.unavailable_reason: str | None = None
        self.latest: Sample = EMPTY
        self.lost: dict[str, Device] = {}
        self.read_errors: Counter[str] = Counter()
        self.unsupported: dict[str, set[str]] = {}
        self._duration = HOT.histogram(semconv.GPU_SAMPLE_DURATION, ()).series(())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        _samplers.add(self)

    @property
    def available(self) -> bool:
        """Whether the last sample read at least one GPU."""
        return bool(self.latest.readings)

    def start(self, *, wait: bool = True) -> GpuSampler:
        """Open the backend and sample every ``interval_s`` in the background.

        ``wait``: open it and take the first sample before returning; otherwise the thread does
        (``nvmlInit`` can take seconds on a node without persistence mode).
        """
        if self._thread is not None:
            return self
        if wait:
            self.open().sample()
        self._stop.clear()  # also without NVML: torch may start CUDA later
        self._thread = threading.Thread(
            target=self._run, args=(not wait,), name="otelkit-gpu-sampler", daemon=True
        )
        self._thread.start()
        return self

    def open(self) -> GpuSampler:
        """Open the backend without sampling in the background: ``sample()`` when you like."""
        try:
            self.devices = self.backend.open()
        except GpuUnavailable as reason:
            self.unavailable_reason = str(reason)
            logger.warning("otelkit: no GPU metrics: %s", reason)
            return self
        self.unsupported = {device.uuid: set() for device in self.devices}
        names = sorted({d.name for d in self.devices if d.mig_instance is None})
        logger.info(
            "otelkit: sampling %d GPU device(s) (%s) every %g s",
            len(self.devices),
            ", ".join(names),
            self.interval_s,
        )
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop sampling and release the backend; ``latest`` keeps the last sample."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        with self._lock:
            self.backend.close()
            self.devices = []

    def _run(self, open_first: bool) -> None:
        if open_first:
            self.open()
            self._sample_safely()
        deadline = time.monotonic()
        while True:
            deadline += self.interval_s
            wait = deadline - time.monotonic()
            if wait < 0:  # a slow sample: skip the missed ticks rather than catch up
                deadline = time.monotonic()
                wait = 0
            if self._stop.wait(wait):
                return
            self._sample_safely()

    def _sample_safely(self) -> None:
        try:
            self.sample()
        except Exception:  # never let a sampling bug end the thread or reach the user
            logger.exception("otelkit: a GPU sample failed")

    def sample(self) -> Sample:
        """Read every device that is not lost, now; the new sample becomes ``latest``."""
        started = time.perf_counter()
        with self._lock:
            readings: list[Reading] = []
            now = time.monotonic()
            slow = now - self._slow_read_at >= self.slow_interval_s
            if slow:
                self._slow_read_at = now
            if self.devices:
                try:
                    self.backend.begin_sample()
                except (GpuReadError, FieldNoData) as error:
                    logger.debug("otelkit: starting a GPU sample: %s", error)
                for device in self.devices:
                    if device.uuid in self.lost:
                        continue
                    reading = self._read_device(device, slow)
                    if reading is not None:
                        readings.append(reading)
            cuda = self._torch()
            torch = torch_memory.read(cuda) if cuda is not None else ()
            found = tuple(readings)
            self.latest = Sample(time.time_ns(), found, torch, _span_attributes(found))
        if self.devices:
            self._duration.observe(time.perf_counter() - started)
        return self.latest

    def _read_device(self, device: Device, slow: bool) -> Reading | None:
        """``slow``: read the backend's slow fields too, else repeat their last values."""
        skip = self.unsupported[device.uuid]
        values: dict[str, float] = {}
        kept = self._slow_values.setdefault(device.uuid, {})
        try:
            for name in FIELDS:
                if name in skip:
                    continue
                if name not in self.backend.slow_fields:
                    self._read_field(device, name, skip, values)
                elif slow:
                    kept.pop(name, None)
                    self._read_field(device, name, skip, values)
                    if name in values:
                        kept[name] = values[name]
                elif name in kept:
                    values[name] = kept[name]
            processes: tuple[GpuProcess, ...] = ()
            if _PROCESSES not in skip:
                try:
                    processes = tuple(self.backend.processes(device))
                except (FieldNotSupported, FieldNoData, GpuReadError) as error:
                    self._failed(device, _PROCESSES, error, skip)
        except GpuLost as error:
            self._lose(device, error)
            return None
        return Reading(device, values, processes)

    def _read_field(
        self, device: Device, name: str, skip: set[str], values: dict[str, float]
    ) -> None:
        try:
            values[name] = self.backend.read(device, name)
        except (FieldNotSupported, FieldNoData, GpuReadError) as error:
            self._failed(device, name, error, skip)

    def _failed(self, device: Device, name: str, error: Exception, skip: set[str]) -> None:
        if isinstance(error, FieldNotSupported):
            skip.add(name)
            logger.debug(
                "otelkit: %s (%s) has no %s; not asked again", device.uuid, device.name, name
            )
        elif isinstance(error, GpuReadError):
            if not self.read_errors[name]:
                logger.warning(
                    "otelkit: reading %s of %s failed: %s (counted in %s)",
                    name,
                    device.uuid,
                    error,
                    semconv.GPU_READ_ERRORS.name,
                )
            self.read_errors[name] += 1

    def _lose(self, device: Device, error: Exception) -> None:
        lost = [device] + [d for d in self.devices if d.parent_uuid == device.uuid]
        for each in lost:
            self.lost[each.uuid] = each
        logger.error(
            "otelkit: GPU %s %s (%s) is lost (%s); its series stop, the other GPUs go on",
            device.index,
            device.uuid,
            device.name,
            error,
        )

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._thread = None  # it did not survive the fork; a child samples only if it starts
        self.latest = EMPTY


def _own_reading(readings: tuple[Reading, ...]) -> Reading | None:
    """The GPU this process uses: the one holding most of its memory, else the first of
    CUDA_VISIBLE_DEVICES, else the only GPU."""
    pid = os.getpid()
    best: tuple[int, Reading] | None = None
    for reading in readings:
        for process in reading.processes:
            if process.pid == pid and (best is None or (process.used_bytes or 0) > best[0]):
                best = (process.used_bytes or 0, reading)
    if best is not None:
        return best[1]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if visible:
        for reading in readings:
            device = reading.device
            if device.uuid.startswith(visible) or (
                device.mig_instance is None and visible == str(device.index)
            ):
                return reading
    whole = [r for r in readings if r.device.mig_instance is None]
    return whole[0] if len(whole) == 1 else None


def _span_attributes(readings: tuple[Reading, ...]) -> dict[str, Any]:
    reading = _own_reading(readings)
    if reading is None:
        return {}
    attributes: dict[str, Any] = {semconv.SPAN_GPU_UUID: reading.device.uuid}
    if "utilization.gpu" in reading.values:
        attributes[semconv.SPAN_GPU_UTILIZATION] = reading.values["utilization.gpu"] / 100
    if "memory.used" in reading.values:
        attributes[semconv.SPAN_GPU_MEMORY_USED] = int(reading.values["memory.used"])
    return attributes


def _after_fork_in_child() -> None:
    for sampler in list(_samplers):
        sampler._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
