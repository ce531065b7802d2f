"""NVML answering from a recording, through pynvml's own API, for tests of ``NvmlBackend``.

``NvmlReplay(recording).install(monkeypatch)`` replaces every pynvml function ``NvmlBackend``
calls with one that answers as the recorded GPUs did, in NVML's own types: values as recorded
(in the ctypes structures pynvml returns), and an error code as the NVMLError subclass pynvml
raises for it (``not_supported`` -> NVMLError_NotSupported, ``gpu_lost`` -> NVMLError_GpuIsLost,
``no_data`` -> NVMLError_NoData, ``error: ...`` -> NVMLError_Unknown). Any other pynvml function
that would reach the real library fails the test instead.

The layout of the machine follows the recording: GPU handles are ``("gpu", index)``, the MIG
devices of a GPU sit in every other slot of ``nvmlDeviceGetMigDeviceHandleByIndex`` (the slots
between raise NVMLError_NotFound, as empty slots do) with handles ``("mig", index, slot)``, and
a GPU supports GPM where the recording has a GPM value (or ``no_data``) for it.

Like ``ReplayBackend``, the replay is at one recorded sample at a time: ``advance()`` moves it on
(starting again after the last one), and a test calls it once before each ``begin_sample()`` of
the backend (``GpuSampler.start()`` and ``.sample()`` call that). GPM samples are real ctypes
pointers, each to a buffer of its own, so ``nvmlGpmMetricsGet`` can tell which two samples it
was given; it answers the metrics recorded at the later one, checks that both were taken of
the same device, the earlier one as ``sample1``, and notes the pair in ``metrics_asked``.
"""

from __future__ import annotations

import ctypes
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pynvml
import pytest

__all__ = ["CODES", "GpmSample", "NvmlReplay", "nvml_error"]

# A recording's error codes, as the NVML return codes behind them.
CODES: dict[str, int] = {
    "not_supported": pynvml.NVML_ERROR_NOT_SUPPORTED,
    "gpu_lost": pynvml.NVML_ERROR_GPU_IS_LOST,
    "no_data": pynvml.NVML_ERROR_NO_DATA,
}
GPM_METRICS: dict[int, str] = {  # NVML_GPM_METRIC_* -> field
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: "gpm.sm_occupancy",
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "gpm.tensor_activity",
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: "gpm.dram_activity",
}
GPM_FIELDS = tuple(GPM_METRICS.values())
# GPUs that have a MIG mode (nvmlDeviceGetMigMode answers); other GPUs answer NotSupported.
MIG_CAPABLE = ("A100", "A30", "H100", "H200", "H800", "H20", "GH200", "B200", "GB200")
MIG_SLOTS = 7  # nvmlDeviceGetMaxMigDeviceCount of an A100 or H100
# Messages of the codes pynvml does not know itself (it asks nvmlErrorString for those).
_MESSAGES = {pynvml.NVML_ERROR_NO_DATA: "No data", pynvml.NVML_ERROR_NOT_READY: "Not ready"}

Value = Any  # a recorded value: a number or an error code


def nvml_error(code: int) -> Exception:
    """The exception pynvml raises for an NVML return code (NVMLError_NotSupported, ...)."""
    error: Exception = pynvml.NVMLError(code)
    return error


def _raise_code(value: str, what: str) -> NoReturn:
    if value in CODES:
        raise nvml_error(CODES[value])
    if value.startswith("error"):
        raise nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    raise AssertionError(f"{what}: the recording holds the unknown code {value!r}")


def _whole(value: Value) -> Value:
    """A whole float as the integer NVML gave (``otelkit gpu record`` writes floats)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _integer(value: Value, ctype: type[Any], what: str) -> int:
    """A recorded number as NVML's integer of type ``ctype`` returns it."""
    value = _whole(value)
    if isinstance(value, str):
        _raise_code(value, what)
    assert isinstance(value, int) and not isinstance(value, bool), f"{what}: {value!r}"
    assert ctype(value).value == value, f"{what}: {value} does not fit NVML's {ctype.__name__}"
    return value


def _address(sample: Any) -> int:
    address = ctypes.cast(sample, ctypes.c_void_p).value
    assert address, "a GPM sample that nvmlGpmSampleAlloc did not allocate (NULL)"
    return address


@dataclass
class GpmSample:
    """One allocated GPM sample: its buffer, and which device it was taken of, when."""

    buffer: Any
    uuid: str | None = None
    position: int = 0  # the recorded sample it was taken at
    number: int = -1  # the how-manieth advance() it was taken after; -1: not taken yet


class NvmlReplay:
    """pynvml answering from a recording (see the module docstring)."""

    def __init__(self, recording: str | Path | dict[str, Any]) -> None:
        document: dict[str, Any] = (
            recording if isinstance(recording, dict) else json.loads(Path(recording).read_text())
        )
        self.devices: list[dict[str, Any]] = list(document["devices"])
        self.samples: list[dict[str, Any]] = list(document["samples"])
        self.source: dict[str, Any] = dict(document.get("source", {}))
        self.position = -1
        self.advances = 0
        self.initialized = False
        self.calls: Counter[str] = Counter()
        self.failures: dict[str, int] = {}  # pynvml function -> the code it raises every call
        self.gpm: dict[int, GpmSample] = {}  # the live GPM samples, by address
        self.gpm_allocated = 0
        self.gpm_freed = 0
        self.metrics_asked: list[tuple[str, int, int]] = []  # (uuid, number 1, number 2)
        self.empty_slots_asked = 0
        gpus = [d for d in self.devices if d.get("parent_uuid") is None]
        assert [d["index"] for d in gpus] == list(range(len(gpus))), "GPU indices 0, 1, ..."
        self.gpus: list[dict[str, Any]] = gpus
        self.handles: dict[Any, dict[str, Any]] = {("gpu", d["index"]): d for d in gpus}
        self.mig_slots: dict[str, dict[int, dict[str, Any]]] = {d["uuid"]: {} for d in gpus}
        for device in self.devices:
            parent = device.get("parent_uuid")
            if parent is None:
                continue
            slots = self.mig_slots[parent]
            slot = 2 * len(slots)  # every other slot: the ones between are empty
            assert slot < MIG_SLOTS, f"too many MIG devices on {parent}"
            slots[slot] = device
            index = next(g["index"] for g in gpus if g["uuid"] == parent)
            assert device["index"] == index, f"{device['uuid']}: a MIG device has its GPU's index"
            self.handles[("mig", index, slot)] = device

    # -- the replay's clock and set-up ----------------------------------------------------------

    def advance(self) -> None:
        """The next recorded sample (call before each ``begin_sample()`` of the backend)."""
        self.position = (self.position + 1) % len(self.samples)
        self.advances += 1

    def fail(self, function: str, code: int) -> None:
        """Make the pynvml function ``function`` raise the NVMLError of ``code`` from now on."""
        self.failures[function] = code

    def install(self, monkeypatch: pytest.MonkeyPatch) -> NvmlReplay:
        """Answer every NVML call ``NvmlBackend`` makes from this replay until the test ends."""
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(pynvml, name, self._counted(name, getattr(self, name)))
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", self._unanswered)
        # pynvml caches the message of a code it had to ask NVML for on the class: keep it local
        monkeypatch.setattr(
            pynvml.NVMLError, "_errcode_to_string", dict(pynvml.NVMLError._errcode_to_string)
        )
        return self

    def _counted(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            self.calls[name] += 1
            if name not in ("nvmlInit", "nvmlErrorString") and not self.initialized:
                raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
            if name in self.failures:
                raise nvml_error(self.failures[name])
            return function(*args)

        return call

    @staticmethod
    def _unanswered(name: str) -> Any:
        raise AssertionError(f"NvmlBackend called {name}, which the NVML replay does not answer")

    # -- what the recording says -----------------------------------------------------------------

    def _sample(self) -> dict[str, Any]:
        return self.samples[max(self.position, 0)]

    def _device(self, handle: Any) -> dict[str, Any]:
        if handle not in self.handles:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.handles[handle]

    def _value(self, handle: Any, field: str) -> Value:
        uuid = self._device(handle)["uuid"]
        return self._sample().get("fields", {}).get(uuid, {}).get(field, "not_supported")

    def _scalar(self, handle: Any, field: str, ctype: type[Any]) -> int:
        return _integer(self._value(handle, field), ctype, field)

    def _struct(self, handle: Any, struct: type[Any], fields: dict[str, str]) -> Any:
        """One NVML call answering several fields, as the ctypes structure pynvml returns."""
        values = {attribute: self._value(handle, field) for attribute, field in fields.items()}
        codes = {v for v in values.values() if isinstance(v, str)}
        if codes:  # one call: it fails for all of its fields, with one code, or for none
            one_code = len(codes) == 1 and all(isinstance(v, str) for v in values.values())
            assert one_code, f"{self._device(handle)['uuid']}: {values} are not one NVML call's"
            _raise_code(codes.pop(), str(fields))
        return struct(**{attribute: _whole(value) for attribute, value in values.items()})

    def _gpm_supported(self, uuid: str) -> bool:
        for sample in self.samples:
            for field in GPM_FIELDS:
                value = sample.get("fields", {}).get(uuid, {}).get(field, "not_supported")
                if not isinstance(value, str) or value == "no_data":
                    return True
        return False

    # -- pynvml: start, stop, devices ------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.initialized = False

    def nvmlErrorString(self, code: int) -> str:
        return _MESSAGES.get(code, f"NVML error {code}")

    def nvmlSystemGetDriverVersion(self) -> str:
        version = self.source.get("driver_version")
        if not isinstance(version, str):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return version

    def nvmlSystemGetNVMLVersion(self) -> str:
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not 0 <= index < len(self.gpus):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return ("gpu", index)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return str(self._device(handle)["uuid"])

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return str(self._device(handle)["name"])

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        device = self._device(handle)
        if handle[0] != "gpu" or not any(m in device["name"] for m in MIG_CAPABLE):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if self.mig_slots[device["uuid"]] else 0
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        self.nvmlDeviceGetMigMode(handle)
        return MIG_SLOTS

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, slot: int) -> Any:
        device = self._device(handle)
        if handle[0] != "gpu" or not 0 <= slot < MIG_SLOTS:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if slot not in self.mig_slots[device["uuid"]]:
            self.empty_slots_asked += 1
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", handle[1], slot)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        device = self._device(handle)
        if handle[0] != "mig":
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(device["mig_instance"])

    # -- pynvml: fields --------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        fields = {"gpu": "utilization.gpu", "memory": "utilization.memory"}
        return self._struct(handle, pynvml.c_nvmlUtilization_t, fields)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        assert not version, "NvmlBackend reads the v1 memory structure"
        fields = {"total": "memory.total", "free": "memory.free", "used": "memory.used"}
        return self._struct(handle, pynvml.c_nvmlMemory_t, fields)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._scalar(handle, "power.usage", ctypes.c_uint)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._scalar(handle, "power.limit", ctypes.c_uint)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self._scalar(handle, "energy", ctypes.c_ulonglong)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # only the GPU sensor is recorded
        return self._scalar(handle, "temperature", ctypes.c_uint)

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        fields = {pynvml.NVML_CLOCK_SM: "clock.sm", pynvml.NVML_CLOCK_MEM: "clock.memory"}
        if clock not in fields:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._scalar(handle, fields[clock], ctypes.c_uint)

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        fields = {
            pynvml.NVML_PCIE_UTIL_TX_BYTES: "pcie.tx",
            pynvml.NVML_PCIE_UTIL_RX_BYTES: "pcie.rx",
        }
        if counter not in fields:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._scalar(handle, fields[counter], ctypes.c_uint)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._scalar(handle, "clocks_event_reasons", ctypes.c_ulonglong)

    # -- pynvml: processes -----------------------------------------------------------------------

    def _processes(self, handle: Any) -> Value:
        uuid = self._device(handle)["uuid"]
        return self._sample().get("processes", {}).get(uuid, [])

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        found = self._processes(handle)
        if isinstance(found, str):
            _raise_code(found, "processes")
        device = self._device(handle)
        instance = device.get("mig_instance")
        return [
            pynvml.nvmlFriendlyObject(
                {
                    "pid": int(p["pid"]),
                    "usedGpuMemory": p.get("used_bytes"),  # pynvml's None: NVML_VALUE_NOT_AVAILABLE
                    "gpuInstanceId": 0xFFFFFFFF if instance is None else instance,
                    "computeInstanceId": 0xFFFFFFFF if instance is None else 0,
                }
            )
            for p in found
        ]

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        for found in self._sample().get("processes", {}).values():
            for process in found if isinstance(found, list) else ():
                if int(process["pid"]) == pid:
                    return str(process["name"])
        raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)

    # -- pynvml: GPM -----------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        device = self._device(handle)
        if handle[0] != "gpu":
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(self._gpm_supported(device["uuid"]))
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        buffer = ctypes.create_string_buffer(8)
        sample = ctypes.cast(buffer, pynvml.c_nvmlGpmSample_t)
        self.gpm[_address(sample)] = GpmSample(buffer)
        self.gpm_allocated += 1
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        address = _address(sample)
        assert address in self.gpm, "nvmlGpmSampleFree of a sample that is not allocated"
        del self.gpm[address]
        self.gpm_freed += 1

    def _take(self, device: dict[str, Any], sample: Any) -> Any:
        taken = self.gpm.get(_address(sample))
        assert taken is not None, "nvmlGpmSampleGet into a sample that is not allocated"
        values = self._sample().get("fields", {}).get(device["uuid"], {})
        if any(values.get(field) == "gpu_lost" for field in GPM_FIELDS):
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if not self._gpm_supported(device["uuid"]):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        taken.uuid, taken.position, taken.number = (
            device["uuid"],
            max(self.position, 0),
            self.advances,
        )
        return sample

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        if handle[0] != "gpu":  # a MIG device is sampled with nvmlGpmMigSampleGet
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._take(self._device(handle), sample)

    def nvmlGpmMigSampleGet(self, handle: Any, instance: int, sample: Any) -> Any:
        gpu = self._device(handle)
        if handle[0] != "gpu":
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for device in self.mig_slots[gpu["uuid"]].values():
            if device["mig_instance"] == instance:
                return self._take(device, sample)
        raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        assert 0 < request.numMetrics <= pynvml.NVML_GPM_METRIC_MAX
        first = self.gpm.get(_address(request.sample1))
        second = self.gpm.get(_address(request.sample2))
        assert first is not None and second is not None, "metrics of a sample not allocated"
        assert first.number >= 0 and second.number >= 0, "metrics of a sample not taken"
        assert first.uuid == second.uuid, "metrics between samples of two devices"
        assert first.number < second.number, "metrics from a sample to an earlier one"
        assert second.uuid is not None
        self.metrics_asked.append((second.uuid, first.number, second.number))
        values = self.samples[second.position].get("fields", {}).get(second.uuid, {})
        for slot in range(request.numMetrics):
            metric = request.metrics[slot]
            field = GPM_METRICS.get(metric.metricId)
            value = "not_supported" if field is None else values.get(field, "not_supported")
            if isinstance(value, str):
                metric.nvmlReturn = CODES.get(value, pynvml.NVML_ERROR_UNKNOWN)
                metric.value = 0.0
            else:
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = float(value)
        return request
