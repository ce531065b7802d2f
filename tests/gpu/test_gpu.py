"""GPU telemetry: the sampler over replayed real NVML readings, its metrics, the standalone
exporter (also on this GPU-less machine, through real NVML's absence), span enrichment, torch
memory and process owners from a real tritonserver's /proc entries."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import otelkit
from otelkit import semconv
from otelkit.analysis import load_spans
from otelkit.gpu import (
    FIELDS,
    Device,
    GpuLost,
    GpuProcess,
    GpuReadError,
    GpuSampler,
    RecordingError,
    ReplayBackend,
    record,
)
from otelkit.gpu import _owners as owners
from otelkit.gpu._exporter import GpuExporter
from otelkit.gpu._instruments import CLOCKS_EVENT_REASONS, FIELD_METRICS
from otelkit.testing import answers, wait_until
from otelkit.tritonserver import TritonServer, free_port
from tests.paths import GPU_FIXTURES, MODELS
from tests.support import require_binary

FIXTURES = GPU_FIXTURES
Labels = tuple[tuple[str, str], ...]


def recording(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return document


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        text: str = response.read().decode()
        return text


def samples(text: str) -> dict[str, dict[Labels, float]]:
    """Every sample of an exposition: name -> sorted labels -> value."""
    found: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def series_of(found: dict[str, dict[Labels, float]], spec: semconv.MetricSpec) -> dict[str, float]:
    """gpu_uuid (+ direction or reason) -> value of one GPU metric."""
    name = semconv.prometheus_name(spec)
    out = {}
    for labels, value in found.get(name, {}).items():
        attributes = dict(labels)
        extra = attributes.get("direction") or attributes.get("reason") or ""
        out[attributes["gpu_uuid"] + (f"/{extra}" if extra else "")] = value
    return out


def expected_metric_values(sample: dict[str, Any]) -> dict[str, dict[str, float]]:
    """What the exposition must show for one recorded sample, computed from the file alone."""
    expected: dict[str, dict[str, float]] = {}
    for uuid, fields in sample["fields"].items():
        for field, value in fields.items():
            if isinstance(value, str) or field not in FIELD_METRICS:
                continue
            spec, factor, extra = FIELD_METRICS[field]
            key = uuid + (f"/{extra[semconv.M_DIRECTION]}" if extra else "")
            expected.setdefault(spec.name, {})[key] = value * factor
    return expected


@pytest.fixture
def exporter_of() -> Iterator[Any]:
    started: list[GpuExporter] = []

    def start(name: str) -> GpuExporter:
        exporter = GpuExporter(ReplayBackend(FIXTURES / f"{name}.json"), "127.0.0.1", 0, 3600)
        started.append(exporter)
        return exporter

    yield start
    for exporter in started:
        exporter.close()


# -- the sampler over replayed recordings ------------------------------------------------------


@pytest.mark.parametrize("name", ["h100x1", "a100x2", "h100x8", "h200-idle", "h200-busy"])
def test_every_recorded_value_reaches_the_exposition_in_the_metrics_units(
    name: str, exporter_of: Any
) -> None:
    document = recording(name)
    exporter = exporter_of(name)
    for number, sample in enumerate(document["samples"][:3]):
        if number:
            exporter.sampler.sample()
        found = samples(scrape(exporter.url))
        for metric_name, values in expected_metric_values(sample).items():
            spec = next(s for s in semconv.GPU_METRICS if s.name == metric_name)
            assert series_of(found, spec) == pytest.approx(values), (name, number, metric_name)
        available = found[semconv.prometheus_name(semconv.GPU_AVAILABLE)]
        assert list(available.values()) == [1.0]


def test_the_real_h200_recording_shows_a_busy_gpu_and_the_process_that_keeps_it_busy(
    exporter_of: Any,
) -> None:
    # recorded by tests/fixtures/gpu/record.sh on a lent H200 under a bf16 matrix-product loop
    idle, busy = recording("h200-idle"), recording("h200-busy")
    assert busy["source"]["how"] == "recorded by otelkit gpu record"
    (uuid,) = [d["uuid"] for d in busy["devices"]]
    exporter = exporter_of("h200-busy")
    for _ in range(4):  # the second sample on: GPM's figures between two samples
        exporter.sampler.sample()
    found = samples(scrape(exporter.url))

    def one(spec: Any, **labels: str) -> float:
        series = found[semconv.prometheus_name(spec)]
        (value,) = [v for key, v in series.items() if labels.items() <= dict(key).items()]
        return value

    assert one(semconv.GPU_UTILIZATION) == 1.0
    assert one(semconv.GPU_TENSOR_ACTIVITY) > 0.5
    assert one(semconv.GPU_CLOCKS_EVENT, reason="sw_power_cap") == 1.0
    assert one(semconv.GPU_PROCESS_MEMORY, owner="matmul-load") > 2**29
    watts = one(semconv.GPU_POWER_USAGE)
    idle_watts = idle["samples"][-1]["fields"][uuid]["power.usage"] / 1000
    assert watts > 4 * idle_watts and watts <= one(semconv.GPU_POWER_LIMIT)


def test_gpus_are_labelled_like_triton_by_uuid_with_index_and_name(exporter_of: Any) -> None:
    document = recording("h100x8")
    found = samples(scrape(exporter_of("h100x8").url))
    used = found[semconv.prometheus_name(semconv.GPU_MEMORY_USED)]
    labels = [dict(key) for key in used]
    assert len(labels) == 8
    devices = {d["uuid"]: d for d in document["devices"]}
    for attributes in labels:
        device = devices[attributes["gpu_uuid"]]
        assert attributes["gpu"] == str(device["index"])
        assert attributes["gpu_name"] == device["name"]
        assert attributes["mig_instance"] == ""


def test_gpm_metrics_appear_from_the_second_sample_on_hopper_only(exporter_of: Any) -> None:
    hopper = exporter_of("h100x1")
    occupancy = semconv.prometheus_name(semconv.GPU_SM_OCCUPANCY)
    assert occupancy not in samples(scrape(hopper.url))  # GPM needs two samples
    hopper.sampler.sample()
    assert len(samples(scrape(hopper.url))[occupancy]) == 1
    ampere = exporter_of("a100x2")
    ampere.sampler.sample()
    assert occupancy not in samples(scrape(ampere.url))
    assert all("gpm.sm_occupancy" in skipped for skipped in ampere.sampler.unsupported.values())


class CountingReplay(ReplayBackend):
    """A replay that counts what the sampler asks for."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.asked: dict[tuple[str, str], int] = {}

    def read(self, device: Device, field: str) -> float:
        key = (device.uuid, field)
        self.asked[key] = self.asked.get(key, 0) + 1
        return super().read(device, field)


@pytest.mark.parametrize("name", ["unsupported", "a100-mig"])
def test_a_field_a_gpu_does_not_support_is_asked_once_then_skipped(name: str) -> None:
    document = recording(name)
    backend = CountingReplay(FIXTURES / f"{name}.json")
    sampler = GpuSampler(backend, torch_cuda=False).open()
    for _ in range(4):
        sampler.sample()
    first = document["samples"][0]["fields"]
    for uuid, fields in first.items():
        missing = {f for f, v in fields.items() if v == "not_supported"}
        assert missing, f"{name}: {uuid} was recorded with every field supported"
        assert sampler.unsupported[uuid] >= missing
        for field in FIELDS:
            assert backend.asked[(uuid, field)] == (1 if field in missing else 4)
    for reading in sampler.latest.readings:
        assert not set(reading.values) & sampler.unsupported[reading.device.uuid]


def test_mig_instances_are_series_of_their_own_beside_their_gpu(exporter_of: Any) -> None:
    document = recording("a100-mig")
    migs = [d for d in document["devices"] if d["mig_instance"] is not None]
    assert migs
    found = samples(scrape(exporter_of("a100-mig").url))
    used = {dict(k)["gpu_uuid"]: dict(k) for k in found["otelkit_gpu_memory_used_bytes"]}
    for mig in migs:
        labels = used[mig["uuid"]]
        assert labels["mig_instance"] == str(mig["mig_instance"])
        assert labels["gpu"] == str(mig["index"])
    utilization = series_of(found, semconv.GPU_UTILIZATION)
    assert not set(utilization) & {m["uuid"] for m in migs}  # NVML has none per MIG instance


def test_a_lost_gpu_stops_its_series_and_counts_while_the_other_goes_on(
    exporter_of: Any, caplog: pytest.LogCaptureFixture
) -> None:
    document = recording("a100x2-lost")
    good, lost = (d["uuid"] for d in document["devices"])
    exporter = exporter_of("a100x2-lost")
    power = semconv.GPU_POWER_USAGE
    assert set(series_of(samples(scrape(exporter.url)), power)) == {good, lost}
    exporter.sampler.sample()
    with caplog.at_level(logging.ERROR, logger="otelkit"):
        exporter.sampler.sample()  # sample 2: GPU 1 answers GpuIsLost
        exporter.sampler.sample()
    found = samples(scrape(exporter.url))
    assert series_of(found, power) == {
        good: document["samples"][3]["fields"][good]["power.usage"] / 1000
    }
    assert all(lost not in key for key in series_of(found, semconv.GPU_MEMORY_USED))
    counted = found[semconv.prometheus_name(semconv.GPU_LOST)]
    assert [dict(k)["gpu_uuid"] for k in counted] == [lost] and list(counted.values()) == [1.0]
    assert [r.message for r in caplog.records].count(next(iter(caplog.records)).message) == 1
    assert "lost" in caplog.records[0].message
    assert list(found[semconv.prometheus_name(semconv.GPU_AVAILABLE)].values()) == [1.0]


class FailingReplay(ReplayBackend):
    """A replay whose temperature read fails like a flaky NVML call, and whose sample start
    raises an unexpected error once."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.surprise = True

    def read(self, device: Device, field: str) -> float:
        if field == "temperature":
            raise GpuReadError("NVML_ERROR_UNKNOWN")
        return super().read(device, field)

    def processes(self, device: Device) -> list[GpuProcess]:
        if self.surprise:
            self.surprise = False
            raise RuntimeError("a bug below the sampler")
        return super().processes(device)


def test_failed_reads_are_counted_by_field_and_sampling_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sampler = GpuSampler(FailingReplay(FIXTURES / "a100x2.json"), 0.02, torch_cuda=False)
    with caplog.at_level(logging.WARNING, logger="otelkit"):
        sampler.start(wait=False)
        try:  # two GPUs, three samples or more
            wait_until(lambda: sampler.read_errors["temperature"] >= 6, 10, "6 failed reads")
        finally:
            sampler.stop()
    assert "a bug below the sampler" in caplog.text  # logged, and the thread went on
    assert sum("reading temperature" in r.message for r in caplog.records) == 1
    assert sampler.available and all("temperature" not in r.values for r in sampler.latest.readings)


def test_record_writes_a_file_that_replays_the_same_readings(tmp_path: Path) -> None:
    original = recording("a100x2-lost")
    copy = tmp_path / "copy.json"
    count = record(ReplayBackend(FIXTURES / "a100x2-lost.json"), copy, len(original["samples"]), 0)
    assert count == 2
    again = json.loads(copy.read_text())
    assert again["devices"] == original["devices"]
    for recorded, replayed in zip(original["samples"], again["samples"], strict=True):
        assert replayed["fields"] == recorded["fields"]
        assert replayed["processes"] == recorded["processes"]


def test_a_bad_recording_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(RecordingError, match=r"not an otelkit\.gpu\.recording/1 recording"):
        ReplayBackend(bad)
    with pytest.raises(RecordingError, match="not a readable JSON"):
        ReplayBackend(tmp_path / "missing.json")


# -- no GPU here: real NVML is absent ----------------------------------------------------------


def test_without_nvml_the_sampler_logs_once_and_reports_no_gpu(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="otelkit"):
        sampler = GpuSampler(interval_s=0.02, torch_cuda=False).start()
        time.sleep(0.1)
        sampler.stop()
    assert not sampler.available and sampler.latest.readings == ()
    assert sampler.unavailable_reason is not None and "NVML" in sampler.unavailable_reason
    assert [r.getMessage() for r in caplog.records if "GPU" in r.getMessage()] == [
        f"otelkit: no GPU metrics: {sampler.unavailable_reason}"
    ]


def run_exporter(*arguments: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "otelkit.cli",
        "gpu-exporter",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *arguments,
    ]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_until(answers(url, process), 30, "the GPU exporter", interval=0.1)
    except AssertionError:
        process.kill()
        raise AssertionError(process.communicate()[1]) from None
    return process, url


def stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    return stderr


def promtool_check(text: str) -> None:
    promtool = require_binary("promtool")
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_exporter_without_a_gpu_serves_available_0_and_no_gpu_series() -> None:
    process, url = run_exporter()
    text = scrape(url)
    stderr = stop(process)
    promtool_check(text)
    found = samples(text)
    assert found[semconv.prometheus_name(semconv.GPU_AVAILABLE)] == {(): 0.0}
    assert not [name for name in found if "gpu_uuid" in str(found[name])]
    assert "no GPU metrics: NVML did not start" in stderr


def test_the_exporter_replays_a_recording_that_promtool_accepts() -> None:
    process, url = run_exporter("--replay", str(FIXTURES / "h100x8.json"), "--interval", "0.2")
    first = samples(scrape(url))
    time.sleep(0.5)
    text = scrape(url)
    stop(process)
    promtool_check(text)
    used = first[semconv.prometheus_name(semconv.GPU_MEMORY_USED)]
    assert len(used) == 8
    durations = samples(text)[semconv.prometheus_name(semconv.GPU_SAMPLE_DURATION) + "_count"]
    assert next(iter(durations.values())) >= 3  # sampled again in the background


def test_the_exporter_names_a_taken_port_and_a_bad_recording(tmp_path: Path) -> None:
    process, url = run_exporter()
    port = url.split(":")[2].split("/")[0]
    try:
        taken = subprocess.run(
            [
                sys.executable,
                "-m",
                "otelkit.cli",
                "gpu-exporter",
                "--host",
                "127.0.0.1",
                "--port",
                port,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        stop(process)
    assert taken.returncode == 1 and f"cannot serve on 127.0.0.1:{port}" in taken.stderr
    (tmp_path / "bad.json").write_text("[]")
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "otelkit.cli",
            "gpu-exporter",
            "--replay",
            str(tmp_path / "bad.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "cannot replay" in bad.stderr


def test_gpu_record_without_a_gpu_says_so(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "otelkit.cli", "gpu", "record", "--out", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "nothing to record: NVML did not start" in done.stderr
    assert not (tmp_path / "r.json").exists()


# -- in process: configure(gpu=...), span enrichment, torch memory -----------------------------


@pytest.fixture
def configured(tmp_path: Path) -> Iterator[Any]:
    def configure(**options: Any) -> otelkit.telemetry.Telemetry:
        return otelkit.configure(
            service_name="gpu-tests",
            traces_exporter="jsonl",
            traces_dir=str(tmp_path),
            metrics_exporter="prometheus",
            prometheus_port=0,
            prometheus_host="127.0.0.1",
            bsp_schedule_delay_ms=50,
            **options,
        )

    yield configure
    otelkit.shutdown()


def test_configure_gpu_without_nvml_serves_the_no_gpu_gauge(configured: Any) -> None:
    telemetry = configured(gpu=True)
    assert telemetry.gpu_sampler is not None
    sampler = telemetry.gpu_sampler  # configure() opens NVML in the sampler's thread
    wait_until(lambda: sampler.unavailable_reason, 10, "NVML found missing")
    found = samples(scrape(telemetry.prometheus_url))
    assert found[semconv.prometheus_name(semconv.GPU_AVAILABLE)] == {(): 0.0}


def test_server_spans_carry_the_gpu_of_their_process_when_asked(
    configured: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    document = recording("h100x1")
    configured(gpu_span_attributes=True, gpu_replay=str(FIXTURES / "h100x1.json"))

    @otelkit.stage("embed", model="gpu-tests")
    def embed() -> int:
        return 1

    embed()
    configured(gpu_replay=str(FIXTURES / "h100x1.json"))
    embed()
    otelkit.flush()
    spans = [s for s in load_spans(tmp_path) if s.name == "embed"]
    assert len(spans) == 2
    enriched, plain = spans
    fields = document["samples"][0]["fields"][document["devices"][0]["uuid"]]
    assert enriched.attributes[semconv.SPAN_GPU_UUID] == document["devices"][0]["uuid"]
    assert enriched.attributes[semconv.SPAN_GPU_UTILIZATION] == fields["utilization.gpu"] / 100
    assert enriched.attributes[semconv.SPAN_GPU_MEMORY_USED] == fields["memory.used"]
    assert semconv.SPAN_GPU_UUID not in plain.attributes


def test_the_gpu_of_a_process_is_the_one_holding_its_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    document = recording("h100x8")
    backend = ReplayBackend(FIXTURES / "h100x8.json")
    target = backend.devices[5]
    original = backend.processes

    def processes(device: Device) -> list[GpuProcess]:
        mine = [GpuProcess(os.getpid(), "python", 2**30)] if device == target else []
        return original(device) + mine

    monkeypatch.setattr(backend, "processes", processes)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", document["devices"][2]["uuid"])
    sampler = GpuSampler(backend, torch_cuda=False).open()
    assert sampler.sample().span_attributes[semconv.SPAN_GPU_UUID] == target.uuid
    monkeypatch.setattr(backend, "processes", original)
    assert sampler.sample().span_attributes[semconv.SPAN_GPU_UUID] == document["devices"][2]["uuid"]


class RecordedCuda:
    """torch.cuda's memory counters as a two-GPU process reported them (torch 2.x, one H100
    pair); CUDA cannot run here, so its counters are replayed behind torch.cuda's names."""

    READINGS = ((1_073_741_824, 2_147_483_648, 1_610_612_736), (0, 0, 0))

    class Properties:
        def __init__(self, index: int) -> None:
            self.uuid = f"6e19195c-0000-0000-0000-00000000000{index}"

    def device_count(self) -> int:
        return len(self.READINGS)

    def memory_allocated(self, index: int) -> int:
        return self.READINGS[index][0]

    def memory_reserved(self, index: int) -> int:
        return self.READINGS[index][1]

    def max_memory_allocated(self, index: int) -> int:
        return self.READINGS[index][2]

    def get_device_properties(self, index: int) -> Properties:
        return self.Properties(index)


def test_torch_memory_per_device_is_published_with_the_nvml_uuid_form() -> None:
    exporter = GpuExporter(ReplayBackend(FIXTURES / "h100x1.json"), "127.0.0.1", 0, 3600)
    try:
        exporter.sampler._torch = RecordedCuda  # type: ignore[assignment]
        exporter.sampler.sample()
        found = samples(scrape(exporter.url))
    finally:
        exporter.close()
    for spec, column in (
        (semconv.GPU_TORCH_ALLOCATED, 0),
        (semconv.GPU_TORCH_RESERVED, 1),
        (semconv.GPU_TORCH_PEAK, 2),
    ):
        values = {dict(k)["gpu_uuid"]: v for k, v in found[semconv.prometheus_name(spec)].items()}
        assert values == {
            f"GPU-6e19195c-0000-0000-0000-00000000000{i}": float(reading[column])
            for i, reading in enumerate(RecordedCuda.READINGS)
        }


def test_clocks_event_reasons_become_one_series_per_reason(exporter_of: Any) -> None:
    document = recording("a100x2")
    found = samples(scrape(exporter_of("a100x2").url))
    active = series_of(found, semconv.GPU_CLOCKS_EVENT)
    for uuid, fields in document["samples"][0]["fields"].items():
        mask = int(fields["clocks_event_reasons"])
        for bit, reason in CLOCKS_EVENT_REASONS.items():
            assert active[f"{uuid}/{reason}"] == (1.0 if mask & bit else 0.0)


# -- owners of GPU processes, read from a real tritonserver's /proc entries ---------------------


def parent_pid(entry: Path) -> int | None:
    try:
        return int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_owners_name_triton_model_instances_and_otelkit_services(tmp_path: Path) -> None:
    models = MODELS
    with TritonServer(models, env={"OTEL_SERVICE_NAME": "not-the-owner"}) as server:
        stubs = {}
        for entry in Path("/proc").iterdir():  # the stubs of this server (others may run)
            if entry.name.isdigit() and parent_pid(entry) == server.pid:
                stubs[int(entry.name)] = owners.owner(int(entry.name))
        server_owner = owners.owner(server.pid)
    assert sorted(stubs.values()) == sorted(
        f"triton:{model.name}_0_0" for model in models.iterdir() if model.is_dir()
    )
    assert server_owner == "triton"
    service = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys; from otelkit.gpu import _owners as owners; "
            "print(owners.owner(os.getpid()))",
        ],
        env={**os.environ, "OTEL_SERVICE_NAME": "tracking-server"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert service.stdout.strip() == "tracking-server"
    assert owners.owner(2**22 + 12345, str(tmp_path)) == ""  # gone or unreadable: unknown


def test_a_gpu_lost_error_from_a_backend_is_not_raised_to_the_caller() -> None:
    class LostAtOnce(ReplayBackend):
        def read(self, device: Device, field: str) -> float:
            raise GpuLost("NVML_ERROR_GPU_IS_LOST")

    sampler = GpuSampler(LostAtOnce(FIXTURES / "h100x1.json"), torch_cuda=False)
    assert sampler.start().latest.readings == ()
    sampler.stop()
    assert list(sampler.lost) == [recording("h100x1")["devices"][0]["uuid"]]
