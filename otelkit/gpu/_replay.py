"""Recordings of real NVML readings: ``record`` writes one, ``ReplayBackend`` answers from it.

A recording is one JSON document::

    {"format": "otelkit.gpu.recording/1", "source": {...}, "interval_s": 1.0,
     "devices": [{"uuid": "GPU-...", "index": 0, "name": "...", "mig_instance": null,
                  "parent_uuid": null}],
     "samples": [{"elapsed_s": 0.0,
                  "fields": {"GPU-...": {"power.usage": 71234, "gpm.sm_occupancy": "no_data"}},
                  "processes": {"GPU-...": [{"pid": 1, "name": "tritonserver",
                                             "used_bytes": 123, "owner": "triton"}]}}]}

Values are NVML's own (see ``FIELDS``); a string is an error code: ``not_supported``,
``no_data``, ``gpu_lost`` or ``error: <message>``. A replay steps through the samples, one per
``begin_sample()``, and starts again after the last one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

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

__all__ = ["FORMAT", "RecordingError", "ReplayBackend", "record"]

FORMAT = "otelkit.gpu.recording/1"
_ERRORS: dict[str, type[Exception]] = {
    "not_supported": FieldNotSupported,
    "no_data": FieldNoData,
    "gpu_lost": GpuLost,
}


class RecordingError(ValueError):
    """A recording file that cannot be replayed, with the reason."""


def _raise_code(code: str, what: str) -> None:
    make = _ERRORS.get(code)
    if make is not None:
        raise make(what)
    if code.startswith("error"):
        raise GpuReadError(f"{what}: {code}")
    raise RecordingError(f"{what}: unknown code {code!r}")


def _device(entry: dict[str, Any]) -> Device:
    return Device(
        str(entry["uuid"]),
        int(entry["index"]),
        str(entry["name"]),
        entry.get("mig_instance"),
        entry.get("parent_uuid"),
    )


class ReplayBackend(GpuBackend):
    """Answers as the recorded NVML did, sample after sample."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            document = json.loads(self.path.read_text())
        except (OSError, ValueError) as error:
            raise RecordingError(f"{self.path}: not a readable JSON recording ({error})") from None
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise RecordingError(f"{self.path}: not an {FORMAT} recording")
        try:
            self.devices = [_device(entry) for entry in document["devices"]]
            self.samples: list[dict[str, Any]] = list(document["samples"])
        except (KeyError, TypeError, ValueError) as error:
            raise RecordingError(f"{self.path}: malformed devices or samples ({error})") from None
        if not self.samples:
            raise RecordingError(f"{self.path}: no samples")
        self.source: dict[str, Any] = document.get("source", {})
        self.interval_s = float(document.get("interval_s", 1.0))
        self.position = -1

    def open(self) -> list[Device]:
        if not self.devices:
            raise GpuUnavailable(f"the recording {self.path.name} holds no GPU")
        return list(self.devices)

    def begin_sample(self) -> None:
        self.position = (self.position + 1) % len(self.samples)

    def _current(self) -> dict[str, Any]:
        return self.samples[max(self.position, 0)]

    def read(self, device: Device, field: str) -> float:
        value = self._current().get("fields", {}).get(device.uuid, {}).get(field, "not_supported")
        if isinstance(value, str):
            _raise_code(value, f"{device.uuid} {field}")
        return float(value)

    def processes(self, device: Device) -> list[GpuProcess]:
        found = self._current().get("processes", {}).get(device.uuid, [])
        if isinstance(found, str):
            _raise_code(found, f"{device.uuid} processes")
        return [
            GpuProcess(int(p["pid"]), str(p["name"]), p.get("used_bytes"), str(p.get("owner", "")))
            for p in found
        ]

    def describe(self) -> dict[str, str]:
        return {"replay": str(self.path), **{k: str(v) for k, v in self.source.items()}}


def _code(error: Exception) -> str:
    for code, kind in _ERRORS.items():
        if isinstance(error, kind):
            return code
    return f"error: {error}"


def _answer(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except (FieldNotSupported, FieldNoData, GpuLost, GpuReadError) as error:
        return _code(error)


def _process_list(backend: GpuBackend, device: Device) -> list[dict[str, Any]]:
    return [vars(process) for process in backend.processes(device)]


def record(backend: GpuBackend, path: str | Path, samples: int, interval_s: float) -> int:
    """Write ``samples`` readings of every device of ``backend`` to ``path``; returns devices.

    Raises ``GpuUnavailable`` when there is nothing to record.
    """
    devices = backend.open()
    taken = []
    started = time.monotonic()
    try:
        for number in range(samples):
            if number:
                time.sleep(max(0.0, started + number * interval_s - time.monotonic()))
            backend.begin_sample()
            elapsed = round(time.monotonic() - started, 3)
            fields = {
                d.uuid: {f: _answer(partial(backend.read, d, f)) for f in FIELDS} for d in devices
            }
            processes = {d.uuid: _answer(partial(_process_list, backend, d)) for d in devices}
            taken.append({"elapsed_s": elapsed, "fields": fields, "processes": processes})
        source = {"how": "recorded by otelkit gpu record", **backend.describe()}
    finally:
        backend.close()
    document = {
        "format": FORMAT,
        "source": source,
        "interval_s": interval_s,
        "devices": [vars(d) for d in devices],
        "samples": taken,
    }
    Path(path).write_text(json.dumps(document, indent=1) + "\n")
    return len(devices)
