"""The real backend: NVML through ``nvidia-ml-py`` (imported as ``pynvml``).

Each field is one NVML call on a handle taken once at ``open()``. GPM metrics (SM occupancy,
tensor activity, DRAM bandwidth; Hopper and newer) come from two GPM samples: ``begin_sample``
takes one per supporting device and computes the metrics against the previous one.

``nvmlDeviceGetPcieThroughput`` measures over 20 ms inside the call, so a sample of a GPU takes
at least 40 ms of wall time (not of CPU); the sampler runs in its own thread for that reason.
"""

from __future__ import annotations

import logging
import math
import os
import platform
from collections.abc import Callable
from types import ModuleType
from typing import Any

from otelkit.gpu import _owners as owners
from otelkit.gpu._backend import (
    SLOW_FIELDS,
    Device,
    FieldNoData,
    FieldNotSupported,
    GpuBackend,
    GpuLost,
    GpuProcess,
    GpuReadError,
    GpuUnavailable,
)

__all__ = ["NvmlBackend"]

logger = logging.getLogger("otelkit")

Reader = Callable[[ModuleType, Any], float]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


_READERS: dict[str, Reader] = {
    "utilization.gpu": lambda nv, h: nv.nvmlDeviceGetUtilizationRates(h).gpu,
    "utilization.memory": lambda nv, h: nv.nvmlDeviceGetUtilizationRates(h).memory,
    "memory.used": lambda nv, h: nv.nvmlDeviceGetMemoryInfo(h).used,
    "memory.free": lambda nv, h: nv.nvmlDeviceGetMemoryInfo(h).free,
    "memory.total": lambda nv, h: nv.nvmlDeviceGetMemoryInfo(h).total,
    "power.usage": lambda nv, h: nv.nvmlDeviceGetPowerUsage(h),
    "power.limit": lambda nv, h: nv.nvmlDeviceGetEnforcedPowerLimit(h),
    "energy": lambda nv, h: nv.nvmlDeviceGetTotalEnergyConsumption(h),
    "temperature": lambda nv, h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
    "clock.sm": lambda nv, h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
    "clock.memory": lambda nv, h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
    "pcie.tx": lambda nv, h: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES),
    "pcie.rx": lambda nv, h: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES),
    "clocks_event_reasons": lambda nv, h: _clocks_event_reasons(nv, h),
}


def _clocks_event_reasons(nv: ModuleType, handle: Any) -> int:
    """The current reasons; drivers before 535 only have the older "throttle reasons" call."""
    try:
        reasons: int = nv.nvmlDeviceGetCurrentClocksEventReasons(handle)
    except nv.NVMLError_FunctionNotFound:
        reasons = nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
    return reasons


_GPM_METRICS = {  # field -> NVML_GPM_METRIC_* constant name
    "gpm.sm_occupancy": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "gpm.tensor_activity": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "gpm.dram_activity": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}


class _Gpm:
    """The previous GPM sample of one device and the metrics computed at the last one."""

    def __init__(self, previous: Any = None) -> None:
        self.previous = previous
        self.values: dict[str, float] = {}
        self.unsupported: set[str] = set()


class NvmlBackend(GpuBackend):
    """NVML on this host. ``proc`` is where process owners are looked up (``/proc``)."""

    slow_fields = SLOW_FIELDS

    def __init__(self, proc: str = "/proc") -> None:
        self._proc = proc
        self._nvml: ModuleType | None = None
        self._handles: dict[str, Any] = {}
        self._devices: dict[str, Device] = {}
        self._gpm: dict[str, _Gpm] = {}

    def open(self) -> list[Device]:
        try:
            import pynvml as nvml
        except ImportError:
            message = "nvidia-ml-py is not installed (pip install 'otelkit[gpu]')"
            raise GpuUnavailable(message) from None
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            raise GpuUnavailable(f"NVML did not start: {error}") from None
        self._nvml = nvml
        try:
            devices = self._enumerate(nvml)
        except nvml.NVMLError as error:
            self.close()
            raise GpuUnavailable(f"NVML could not list the GPUs: {error}") from None
        if not devices:
            self.close()
            raise GpuUnavailable("NVML found no GPU")
        return devices

    def _enumerate(self, nv: ModuleType) -> list[Device]:
        devices: list[Device] = []
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            gpu = Device(
                _text(nv.nvmlDeviceGetUUID(handle)), index, _text(nv.nvmlDeviceGetName(handle))
            )
            devices.append(gpu)
            self._handles[gpu.uuid] = handle
            self._devices[gpu.uuid] = gpu
            self._gpm_support(nv, gpu, handle)
            devices.extend(self._mig_devices(nv, gpu, handle))
        return devices

    def _mig_devices(self, nv: ModuleType, gpu: Device, handle: Any) -> list[Device]:
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(handle)
        except nv.NVMLError:
            return []  # not a MIG-capable GPU
        if current != nv.NVML_DEVICE_MIG_ENABLE:
            return []
        found = []
        for slot in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nv.NVMLError_NotFound:
                continue
            device = Device(
                _text(nv.nvmlDeviceGetUUID(mig)),
                gpu.index,
                _text(nv.nvmlDeviceGetName(mig)),
                nv.nvmlDeviceGetGpuInstanceId(mig),
                gpu.uuid,
            )
            self._handles[device.uuid] = mig
            self._devices[device.uuid] = device
            self._gpm_support(nv, device, handle)
            found.append(device)
        return found

    def _gpm_support(self, nv: ModuleType, device: Device, gpu_handle: Any) -> None:
        try:
            supported = nv.nvmlGpmQueryDeviceSupport(gpu_handle).isSupportedDevice
        except (nv.NVMLError, AttributeError):  # older drivers have no GPM entry point
            supported = False
        if supported:
            self._gpm[device.uuid] = _Gpm()

    def begin_sample(self) -> None:
        nv = self._nvml
        if nv is None:
            return
        for uuid, gpm in self._gpm.items():
            gpm.values = {}
            try:
                sample = nv.nvmlGpmSampleAlloc()
            except nv.NVMLError as error:
                logger.debug("otelkit: GPM sample of %s failed: %s", uuid, error)
                continue
            try:
                self._gpm_sample(nv, uuid, sample)
            except nv.NVMLError as error:
                logger.debug("otelkit: GPM sample of %s failed: %s", uuid, error)
                _free(nv, sample)
                continue
            previous, gpm.previous = gpm.previous, sample
            if previous is None:
                continue
            try:
                gpm.values = self._gpm_metrics(nv, previous, sample, gpm.unsupported)
            except nv.NVMLError as error:
                logger.debug("otelkit: GPM metrics of %s failed: %s", uuid, error)
            finally:
                _free(nv, previous)

    def _gpm_sample(self, nv: ModuleType, uuid: str, sample: Any) -> None:
        device = self._devices[uuid]
        if device.parent_uuid is None:
            nv.nvmlGpmSampleGet(self._handles[uuid], sample)
        else:  # a MIG instance is sampled through its parent GPU
            nv.nvmlGpmMigSampleGet(self._handles[device.parent_uuid], device.mig_instance, sample)

    @staticmethod
    def _gpm_metrics(
        nv: ModuleType, first: Any, second: Any, unsupported: set[str]
    ) -> dict[str, float]:
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(_GPM_METRICS)
        request.sample1, request.sample2 = first, second
        for slot, constant in enumerate(_GPM_METRICS.values()):
            request.metrics[slot].metricId = getattr(nv, constant)
        nv.nvmlGpmMetricsGet(request)
        values = {}
        for slot, field in enumerate(_GPM_METRICS):
            metric = request.metrics[slot]
            if metric.nvmlReturn == nv.NVML_SUCCESS:
                # a real H200 gives NaN DRAM activity for samples a few ms apart: no data,
                # never a value (the SDK warns on every non-finite gauge reading)
                if math.isfinite(metric.value):
                    values[field] = float(metric.value)
            elif metric.nvmlReturn == nv.NVML_ERROR_NOT_SUPPORTED:
                unsupported.add(field)
        return values

    def read(self, device: Device, field: str) -> float:
        nv = self._nvml
        if nv is None:
            raise GpuReadError("the backend is not open")
        if field in _GPM_METRICS:
            gpm = self._gpm.get(device.uuid)
            if gpm is None or field in gpm.unsupported:
                raise FieldNotSupported(field)
            if field not in gpm.values:
                raise FieldNoData(field)
            return gpm.values[field]
        try:
            return float(_READERS[field](nv, self._handles[device.uuid]))
        except nv.NVMLError as error:
            raise _translated(nv, error) from None

    def processes(self, device: Device) -> list[GpuProcess]:
        nv = self._nvml
        if nv is None:
            raise GpuReadError("the backend is not open")
        try:
            found = nv.nvmlDeviceGetComputeRunningProcesses(self._handles[device.uuid])
        except nv.NVMLError as error:
            raise _translated(nv, error) from None
        return [self._process(nv, p.pid, p.usedGpuMemory) for p in found]

    def _process(self, nv: ModuleType, pid: int, used: int | None) -> GpuProcess:
        try:
            name = os.path.basename(_text(nv.nvmlSystemGetProcessName(pid)))
        except nv.NVMLError:
            name = owners.process_name(pid, self._proc)
        return GpuProcess(pid, name, used, owners.owner(pid, self._proc))

    def describe(self) -> dict[str, str]:
        nv = self._nvml
        if nv is None:
            return {}
        found = {"host": platform.node()}
        for key, call in (
            ("driver_version", "nvmlSystemGetDriverVersion"),
            ("nvml_version", "nvmlSystemGetNVMLVersion"),
            ("cuda_driver_version", "nvmlSystemGetCudaDriverVersion"),
        ):
            try:
                found[key] = _text(str(getattr(nv, call)()))
            except nv.NVMLError:
                continue
        return found

    def close(self) -> None:
        nv, self._nvml = self._nvml, None
        if nv is None:
            return
        for gpm in self._gpm.values():
            if gpm.previous is not None:
                _free(nv, gpm.previous)
        self._gpm.clear()
        self._handles.clear()
        self._devices.clear()
        try:
            nv.nvmlShutdown()
        except nv.NVMLError as error:
            logger.debug("otelkit: nvmlShutdown failed: %s", error)


def _free(nv: ModuleType, sample: Any) -> None:
    try:
        nv.nvmlGpmSampleFree(sample)
    except nv.NVMLError as error:
        logger.debug("otelkit: freeing a GPM sample failed: %s", error)


def _translated(nv: ModuleType, error: Exception) -> Exception:
    unsupported = (
        nv.NVMLError_NotSupported,
        nv.NVMLError_NoPermission,
        nv.NVMLError_FunctionNotFound,
    )
    if isinstance(error, unsupported):
        return FieldNotSupported(str(error))
    if isinstance(error, (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired)):
        return GpuLost(str(error))
    if isinstance(error, (nv.NVMLError_NoData, nv.NVMLError_NotReady)):
        return FieldNoData(str(error))
    return GpuReadError(str(error))
