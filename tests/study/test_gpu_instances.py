"""GPU memory and utilisation per Triton model instance: a study point reads otelkit's real GPU
exporter replaying a recording (an H100's, its processes given Triton instance owners as the
exporter names them on a GPU node) while it loads a real Triton."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otelkit.study import Load, Study, read_results
from otelkit.testing import answers, wait_until
from otelkit.tritonserver import TritonServer, free_port
from tests.paths import ROOT, TESTS
from tests.study.conftest import remote

pytestmark = pytest.mark.triton

RECORDING = TESTS / "fixtures" / "gpu" / "h100x1.json"
OWNERS = ["", "triton", "triton:gnn_0_0", "triton:gnn_0_1"]  # python, server, two stubs


@pytest.fixture(scope="module")
def exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, object]]]:
    recording = json.loads(RECORDING.read_text())
    for sample in recording["samples"]:
        for processes in sample["processes"].values():
            for process, owner in zip(processes, OWNERS, strict=True):
                process["owner"] = owner
    path = tmp_path_factory.mktemp("gpu") / "owned.json"
    path.write_text(json.dumps(recording))
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "otelkit.cli",
            "gpu-exporter",
            "--replay",
            str(path),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--interval",
            "0.2",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_until(answers(url, proc), 60, "the GPU exporter", interval=0.2)
        yield url, recording
    finally:
        proc.terminate()
        proc.wait(15)


def test_each_point_records_gpu_memory_and_utilisation_per_model_instance(
    exporter: tuple[str, dict[str, object]], untraced_triton: TritonServer, tmp_path: Path
) -> None:
    url, recording = exporter
    out = tmp_path / "study.jsonl"
    results = Study(
        model="identity_fp32",
        server=remote(untraced_triton),
        gpu_metrics_url=url,
        load=Load(seconds=0.5, warmup_s=0.2),
        out=out,
        progress=False,
    ).run()
    samples: list[Any] = recording["samples"]  # type: ignore[assignment]
    uuid = "GPU-6e19195c-c2c2-16a4-18da-f1502460eac6"
    total = samples[0]["fields"][uuid]["memory.total"]
    recorded = {  # what each stub used at some sample of the replay (it cycles through them)
        owner: {
            p["used_bytes"] for s in samples for p in s["processes"][uuid] if p["owner"] == owner
        }
        for owner in OWNERS[2:]
    }
    utilisations = {round(s["fields"][uuid]["utilization.gpu"] / 100, 6) for s in samples}
    for point in (results.points[0], read_results(out).points[0]):
        assert sorted(point.gpu_instances) == ["gnn_0_0", "gnn_0_1"]  # not the server, not python
        for name, entry in point.gpu_instances.items():
            assert entry["gpu_uuid"] == uuid
            assert entry["memory_bytes"] in recorded[f"triton:{name}"]
            assert entry["gpu_memory_total_bytes"] == total
            assert entry["memory_share"] == pytest.approx(entry["memory_bytes"] / total)
            assert round(entry["gpu_utilization"], 6) in utilisations
    assert "gnn: 2 on GPUs, 0.4" in results.summary()  # GiB each, about 0.5 % of an H100
