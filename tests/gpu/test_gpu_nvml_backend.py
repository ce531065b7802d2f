"""The real NVML backend, over NVML answering from the recordings through pynvml's own API.

``tests.nvml_replay`` puts a recording behind pynvml's functions (monkeypatched on the real
``pynvml`` module, raising pynvml's own NVMLError subclasses); ``NvmlBackend`` reads it as it
reads a GPU, and a ``GpuSampler`` over it must see what one over ``ReplayBackend`` sees. Without
any patching, this GPU-less machine's real NVML must make ``open()`` a clear ``GpuUnavailable``.
"""

from __future__ import annotations

import copy
import ctypes
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pynvml
import pytest

from otelkit.gpu import (
    Device,
    FieldNoData,
    FieldNotSupported,
    GpuLost,
    GpuReadError,
    GpuSampler,
    GpuUnavailable,
    NvmlBackend,
    ReplayBackend,
    Sample,
)
from tests.nvml_replay import GPM_FIELDS, NvmlReplay
from tests.paths import GPU_FIXTURES

FIXTURES = GPU_FIXTURES
RECORDINGS = [
    "h100x1",
    "a100x2",
    "h100x8",
    "a100-mig",
    "unsupported",
    "a100x2-lost",
    "h200-idle",
    "h200-busy",
]
Install = Callable[[Path], NvmlReplay]


def recording(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return document


def written(document: dict[str, Any], path: Path) -> Path:
    path.write_text(json.dumps(document))
    return path


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Install:
    """Put a recording behind pynvml for the rest of the test."""

    def put(path: Path) -> NvmlReplay:
        return NvmlReplay(path).install(monkeypatch)

    return put


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """An empty /proc: owners (and names NVML cannot give) are not this machine's processes."""
    empty = tmp_path / "proc"
    empty.mkdir()
    return empty


@contextmanager
def samplers(path: Path, proc: Path) -> Iterator[tuple[GpuSampler, GpuSampler]]:
    """A sampler over NvmlBackend (on the installed replay) and one over ReplayBackend(path)."""
    # interval_s: the background thread start() leaves behind never samples during a test;
    # slow_interval_s=0: NVML's slow fields read at every sample, as the replay gives them
    through_nvml = GpuSampler(
        NvmlBackend(proc=str(proc)), interval_s=3600, torch_cuda=False, slow_interval_s=0
    )
    from_file = GpuSampler(ReplayBackend(path), interval_s=3600, torch_cuda=False)
    try:
        yield through_nvml, from_file
    finally:
        through_nvml.stop()
        from_file.stop()


def take(nvml: NvmlReplay, *each: GpuSampler) -> None:
    """One sample of every sampler, with NVML at the next recorded sample (the first: start)."""
    nvml.advance()
    for sampler in each:
        if sampler.latest.at_ns == 0:
            sampler.start()
        else:
            sampler.sample()


def values_of(sample: Sample) -> list[tuple[Device, dict[str, float]]]:
    return [(reading.device, reading.values) for reading in sample.readings]


def processes_of(sample: Sample) -> list[tuple[str, list[tuple[int, str, int | None]]]]:
    """Each device's processes, owners aside (NvmlBackend resolves those from /proc)."""
    return [
        (r.device.uuid, [(p.pid, p.name, p.used_bytes) for p in r.processes])
        for r in sample.readings
    ]


def assert_same_sampling(through_nvml: GpuSampler, from_file: GpuSampler, number: int) -> None:
    where = f"sample {number}"
    assert through_nvml.devices == from_file.devices, where
    assert values_of(through_nvml.latest) == values_of(from_file.latest), where
    assert through_nvml.unsupported == from_file.unsupported, where
    assert through_nvml.lost == from_file.lost, where
    assert through_nvml.read_errors == from_file.read_errors, where
    assert through_nvml.latest.span_attributes == from_file.latest.span_attributes, where


def sample_both(path: Path, nvml: NvmlReplay, proc: Path) -> tuple[Sample, GpuSampler]:
    """Sample both through every recorded sample and once more, where both start again, checking
    that they agree at each; returns the last sample and the sampler over NVML."""
    with samplers(path, proc) as (through_nvml, from_file):
        for number in range(len(nvml.samples) + 1):
            take(nvml, through_nvml, from_file)
            assert_same_sampling(through_nvml, from_file, number)
        return through_nvml.latest, through_nvml


# -- 1. every recording reads the same through NVML as from the file ---------------------------


@pytest.mark.parametrize("name", RECORDINGS)
def test_nvml_backend_reads_each_recording_as_the_replay_backend_does(
    name: str, install: Install, proc: Path
) -> None:
    path = FIXTURES / f"{name}.json"
    nvml = install(path)
    last, _ = sample_both(path, nvml, proc)
    assert last.readings and all(r.values for r in last.readings), "nothing was compared"
    # what the comparison went through: every GPU, and GPM where the recording has it
    assert nvml.calls["nvmlDeviceGetHandleByIndex"] == len(nvml.gpus)
    gpm = {d["uuid"] for d in nvml.devices if nvml._gpm_supported(d["uuid"])}
    assert {uuid for uuid, _, _ in nvml.metrics_asked} == gpm
    assert all(second == first + 1 for _, first, second in nvml.metrics_asked)
    assert nvml.initialized is False and nvml.gpm == {}, "stop() released NVML and GPM samples"


@pytest.mark.parametrize("name", RECORDINGS)
def test_nvml_backend_gives_the_recorded_processes(name: str, install: Install, proc: Path) -> None:
    path = FIXTURES / f"{name}.json"
    nvml = install(path)
    with samplers(path, proc) as (through_nvml, from_file):
        for number in range(len(nvml.samples)):
            take(nvml, through_nvml, from_file)
            nvml_processes = processes_of(through_nvml.latest)
            assert nvml_processes == processes_of(from_file.latest), f"sample {number}"
    assert nvml.calls["nvmlDeviceGetComputeRunningProcesses"] > 0


def test_a_recorded_read_error_is_counted_the_same_through_nvml(
    install: Install, proc: Path, tmp_path: Path
) -> None:
    document = recording("a100x2")
    uuid = document["devices"][0]["uuid"]
    document["samples"][1]["fields"][uuid]["power.usage"] = "error: Unknown Error"
    document["samples"][3]["fields"][uuid]["power.usage"] = "error: Unknown Error"
    path = written(document, tmp_path / "a100x2-errors.json")
    nvml = install(path)
    _, sampler = sample_both(path, nvml, proc)
    assert sampler.read_errors == Counter({"power.usage": 2})


def test_a_gpm_metric_nvml_gives_as_nan_is_no_data_not_a_value(
    install: Install, proc: Path, tmp_path: Path
) -> None:
    # seen on a real H200: DRAM activity between two GPM samples a few ms apart is NaN
    document = recording("h100x1")
    uuid = document["devices"][0]["uuid"]
    document["samples"][2]["fields"][uuid]["gpm.dram_activity"] = float("nan")
    nvml = install(written(document, tmp_path / "h100x1-nan.json"))
    with samplers(FIXTURES / "h100x1.json", proc) as (through_nvml, _):
        for _ in range(3):
            take(nvml, through_nvml)
        (reading,) = through_nvml.latest.readings
    assert "gpm.dram_activity" not in reading.values
    assert (
        reading.values["gpm.sm_occupancy"]
        == document["samples"][2]["fields"][uuid]["gpm.sm_occupancy"]
    )
    assert through_nvml.read_errors == Counter()
    assert "gpm.dram_activity" not in through_nvml.unsupported[uuid]  # asked again next time


def h100_mig() -> dict[str, Any]:
    """a100-mig.json as an H100 with GPM: the parent and each MIG instance its own values."""
    document = copy.deepcopy(recording("a100-mig"))
    for device in document["devices"]:
        device["name"] = device["name"].replace("A100-SXM4-80GB", "H100 80GB HBM3")
    for number, sample in enumerate(document["samples"]):
        for device in document["devices"]:
            base = 10.0 * (device["mig_instance"] or 1) + number
            sample["fields"][device["uuid"]].update(
                {
                    field: "no_data" if number == 0 else base + offset / 4
                    for offset, field in enumerate(GPM_FIELDS)
                }
            )
    return document


def test_gpm_of_mig_instances_is_sampled_through_their_gpu(
    install: Install, proc: Path, tmp_path: Path
) -> None:
    path = written(h100_mig(), tmp_path / "h100-mig.json")
    nvml = install(path)
    last, _ = sample_both(path, nvml, proc)
    assert nvml.calls["nvmlGpmMigSampleGet"] == 4 * (len(nvml.samples) + 1)
    assert nvml.calls["nvmlGpmSampleGet"] == len(nvml.samples) + 1
    assert {uuid for uuid, _, _ in nvml.metrics_asked} == {r.device.uuid for r in last.readings}


# -- 2. MIG --------------------------------------------------------------------------------------


def test_mig_instances_follow_their_gpu_and_empty_slots_are_skipped(
    install: Install, proc: Path
) -> None:
    nvml = install(FIXTURES / "a100-mig.json")
    backend = NvmlBackend(proc=str(proc))
    devices = backend.open()
    try:
        gpu, *instances = devices
        assert (gpu.mig_instance, gpu.parent_uuid) == (None, None)
        assert [d.mig_instance for d in instances] == [3, 4, 5, 6]
        assert {(d.index, d.parent_uuid) for d in instances} == {(gpu.index, gpu.uuid)}
        assert all(d.name == "NVIDIA A100-SXM4-80GB MIG 1g.20gb" for d in instances)
        assert devices == ReplayBackend(FIXTURES / "a100-mig.json").open()
        # the MIG devices sit in slots 0, 2, 4, 6 of 7: the three between were asked and skipped
        assert nvml.calls["nvmlDeviceGetMigDeviceHandleByIndex"] == 7
        assert nvml.empty_slots_asked == 3
        # each MIG device reads through its own handle: its memory, not its GPU's
        nvml.advance()
        backend.begin_sample()
        fields = nvml.samples[0]["fields"]
        for device in devices:
            assert backend.read(device, "memory.total") == fields[device.uuid]["memory.total"]
        assert backend.read(instances[0], "memory.total") != backend.read(gpu, "memory.total")
        with pytest.raises(FieldNotSupported):
            backend.read(instances[0], "power.usage")
    finally:
        backend.close()


def test_gpus_without_mig_mode_have_no_instances(install: Install, proc: Path) -> None:
    for name in ("a100x2", "unsupported"):  # MIG disabled; no MIG mode at all (Pascal)
        nvml = install(FIXTURES / f"{name}.json")
        backend = NvmlBackend(proc=str(proc))
        assert backend.open() == ReplayBackend(FIXTURES / f"{name}.json").open()
        backend.close()
        assert nvml.calls["nvmlDeviceGetMigMode"] == len(nvml.gpus)
        assert nvml.calls["nvmlDeviceGetMigDeviceHandleByIndex"] == 0


# -- 3. NVML's errors ----------------------------------------------------------------------------

TRANSLATED = [
    (pynvml.NVML_ERROR_NOT_SUPPORTED, FieldNotSupported),
    (pynvml.NVML_ERROR_NO_PERMISSION, FieldNotSupported),
    (pynvml.NVML_ERROR_GPU_IS_LOST, GpuLost),
    (pynvml.NVML_ERROR_RESET_REQUIRED, GpuLost),
    (pynvml.NVML_ERROR_NO_DATA, FieldNoData),
    (pynvml.NVML_ERROR_NOT_READY, FieldNoData),
    (pynvml.NVML_ERROR_UNKNOWN, GpuReadError),
    (pynvml.NVML_ERROR_TIMEOUT, GpuReadError),
    (pynvml.NVML_ERROR_INVALID_ARGUMENT, GpuReadError),
]


@pytest.mark.parametrize(("code", "expected"), TRANSLATED)
def test_an_nvml_error_becomes_the_backends_exception(
    code: int, expected: type[Exception], install: Install, proc: Path
) -> None:
    nvml = install(FIXTURES / "h100x1.json")
    nvml.fail("nvmlDeviceGetPowerUsage", code)
    nvml.fail("nvmlDeviceGetComputeRunningProcesses", code)
    backend = NvmlBackend(proc=str(proc))
    (device,) = backend.open()
    try:
        nvml.advance()
        backend.begin_sample()
        message = str(pynvml.NVMLError(code))
        with pytest.raises(expected, match=message):
            backend.read(device, "power.usage")
        with pytest.raises(expected, match=message):
            backend.processes(device)
        assert backend.read(device, "temperature") == 47.0  # the other fields still read
    finally:
        backend.close()


def test_errors_unknown_are_counted_and_asked_again_no_permission_is_not_asked_again(
    install: Install, proc: Path
) -> None:
    nvml = install(FIXTURES / "h100x1.json")
    nvml.fail("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_UNKNOWN)
    nvml.fail("nvmlDeviceGetTotalEnergyConsumption", pynvml.NVML_ERROR_NO_PERMISSION)
    sampler = GpuSampler(NvmlBackend(proc=str(proc)), interval_s=3600, torch_cuda=False)
    try:
        for _ in range(3):
            take(nvml, sampler)
        (reading,) = sampler.latest.readings
        assert sampler.read_errors == Counter({"power.usage": 3})
        assert nvml.calls["nvmlDeviceGetPowerUsage"] == 3
        assert sampler.unsupported[reading.device.uuid] == {"energy"}
        assert nvml.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1
        assert "power.usage" not in reading.values and "energy" not in reading.values
        assert (
            reading.values["temperature"]
            == nvml.samples[2]["fields"][reading.device.uuid]["temperature"]
        )
        assert sampler.lost == {}
    finally:
        sampler.stop()


def test_nvml_slow_fields_are_read_once_per_slow_interval_and_repeated_between(
    install: Install, proc: Path
) -> None:
    nvml = install(FIXTURES / "h100x1.json")
    sampler = GpuSampler(
        NvmlBackend(proc=str(proc)), interval_s=3600, torch_cuda=False, slow_interval_s=0.5
    )
    try:
        for _ in range(3):
            take(nvml, sampler)
        assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 2  # one sample: transmit, receive
        assert nvml.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1
        assert nvml.calls["nvmlDeviceGetPowerUsage"] == 3  # the other fields: every sample
        (reading,) = sampler.latest.readings
        first = nvml.samples[0]["fields"][reading.device.uuid]
        third = nvml.samples[2]["fields"][reading.device.uuid]
        assert reading.values["energy"] == first["energy"] != third["energy"]
        assert reading.values["pcie.tx"] == first["pcie.tx"]
        assert reading.values["power.usage"] == third["power.usage"]
        time.sleep(0.6)
        take(nvml, sampler)
        (reading,) = sampler.latest.readings
        assert nvml.calls["nvmlDeviceGetTotalEnergyConsumption"] == 2
        fourth = nvml.samples[3]["fields"][reading.device.uuid]
        assert reading.values["energy"] == fourth["energy"]
    finally:
        sampler.stop()


def test_a_process_nvml_cannot_name_is_named_from_proc_and_owned_from_proc(
    install: Install, proc: Path
) -> None:
    nvml = install(FIXTURES / "h100x1.json")
    nvml.fail("nvmlSystemGetProcessName", pynvml.NVML_ERROR_NO_PERMISSION)
    backend_dir = "/opt/tritonserver/backends/python"
    stub = [
        f"{backend_dir}/triton_python_backend_stub",
        "/models/embedding/1/model.py",
        "triton_python_backend_shm_region_1",
        "1048576",
        "1048576",
        "1352331",
        backend_dir,
        "336",
        "embedding_0_0",
    ]
    argv = {
        1321841: ["/usr/bin/python3", "-m", "ingest"],
        1352331: ["/opt/tritonserver/bin/tritonserver", "--model-repository=/models"],
        1355929: stub,
    }
    for pid, args in argv.items():
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in args) + b"\0")
    (proc / "1321841" / "environ").write_bytes(b"HOME=/root\0OTEL_SERVICE_NAME=ingest\0")
    backend = NvmlBackend(proc=str(proc))
    (device,) = backend.open()
    try:
        nvml.advance()
        backend.begin_sample()
        found = [(p.pid, p.name, p.used_bytes, p.owner) for p in backend.processes(device)]
    finally:
        backend.close()
    assert found == [
        (1321841, "python3", 434110464, "ingest"),
        (1352331, "tritonserver", 501219328, "triton"),
        (1355929, "triton_python_backend_stub", 444596224, "triton:embedding_0_0"),
        (1373202, "", 434110464, ""),  # gone from /proc
    ]


@pytest.mark.parametrize(
    "function", ["nvmlGpmSampleAlloc", "nvmlGpmSampleGet", "nvmlGpmMetricsGet"]
)
def test_a_failed_gpm_sample_gives_no_gpm_value_rather_than_the_last_one(
    function: str, install: Install, proc: Path
) -> None:
    nvml = install(FIXTURES / "h100x1.json")
    backend = NvmlBackend(proc=str(proc))
    (device,) = backend.open()
    try:
        for _ in range(2):
            nvml.advance()
            backend.begin_sample()
        assert backend.read(device, "gpm.sm_occupancy") == 14.7  # recorded at sample 1
        nvml.fail(function, pynvml.NVML_ERROR_UNKNOWN)
        nvml.advance()
        backend.begin_sample()  # logs, does not raise
        for field in GPM_FIELDS:
            with pytest.raises(FieldNoData):
                backend.read(device, field)
        assert backend.read(device, "temperature") == 47.0
    finally:
        backend.close()


def test_a_failed_gpm_sample_is_freed(install: Install, proc: Path) -> None:
    nvml = install(FIXTURES / "h100x1.json")
    backend = NvmlBackend(proc=str(proc))
    backend.open()
    try:
        for number in range(5):
            if number == 2:
                nvml.fail("nvmlGpmSampleGet", pynvml.NVML_ERROR_GPU_IS_LOST)
            nvml.advance()
            backend.begin_sample()
            assert len(nvml.gpm) <= 1, f"{len(nvml.gpm)} GPM samples held after sample {number}"
    finally:
        backend.close()


# -- 4. open and close ---------------------------------------------------------------------------


def test_close_shuts_nvml_down_once_and_frees_the_gpm_samples_it_holds(
    install: Install, proc: Path
) -> None:
    nvml = install(FIXTURES / "h100x8.json")
    backend = NvmlBackend(proc=str(proc))
    devices = backend.open()
    for _ in range(3):
        nvml.advance()
        backend.begin_sample()
    assert backend.read(devices[0], "gpm.sm_occupancy") == 0.0
    assert len(nvml.gpm) == 8, "the backend holds the last GPM sample of each H100"
    assert (nvml.gpm_allocated, nvml.gpm_freed) == (24, 16)
    backend.close()
    assert nvml.calls["nvmlShutdown"] == 1 and not nvml.initialized
    assert nvml.gpm == {} and nvml.gpm_freed == 24
    backend.close()
    assert nvml.calls["nvmlShutdown"] == 1
    with pytest.raises(GpuReadError, match="not open"):
        backend.read(devices[0], "temperature")


def test_open_without_the_driver_is_unavailable_with_nvmls_reason(
    install: Install, proc: Path
) -> None:
    nvml = install(FIXTURES / "h100x1.json")
    nvml.fail("nvmlInit", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(GpuUnavailable, match=r"^NVML did not start: Driver Not Loaded$"):
        NvmlBackend(proc=str(proc)).open()
    assert nvml.calls["nvmlShutdown"] == 0


def test_open_with_no_gpu_is_unavailable_and_shuts_nvml_down(
    install: Install, proc: Path, tmp_path: Path
) -> None:
    document = recording("h100x1")
    document["devices"] = []
    nvml = install(written(document, tmp_path / "none.json"))
    with pytest.raises(GpuUnavailable, match=r"^NVML found no GPU$"):
        NvmlBackend(proc=str(proc)).open()
    assert nvml.calls["nvmlDeviceGetCount"] == 1
    assert nvml.calls["nvmlShutdown"] == 1 and not nvml.initialized


def test_open_when_listing_fails_is_unavailable_and_shuts_nvml_down(
    install: Install, proc: Path
) -> None:
    nvml = install(FIXTURES / "a100x2.json")
    nvml.fail("nvmlDeviceGetUUID", pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(GpuUnavailable, match=r"^NVML could not list the GPUs: GPU is lost$"):
        NvmlBackend(proc=str(proc)).open()
    assert nvml.calls["nvmlShutdown"] == 1 and not nvml.initialized


# -- 5. this machine's real NVML -----------------------------------------------------------------


def nvml_library_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_the_real_nvml_of_this_machine_opens_or_says_why_not() -> None:
    backend = NvmlBackend()
    if not nvml_library_loads():  # this machine: no driver, no libnvidia-ml
        with pytest.raises(GpuUnavailable) as raised:
            backend.open()
        assert str(raised.value) == "NVML did not start: NVML Shared Library Not Found"
        return
    try:  # a GPU host
        devices = backend.open()
    except GpuUnavailable as error:
        assert "NVML" in str(error)
        return
    try:
        assert devices and all(d.uuid.startswith(("GPU-", "MIG-")) for d in devices)
    finally:
        backend.close()
