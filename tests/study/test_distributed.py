"""A point driven by several client processes through existing engines: the tasks of a Slurm
job array (the generated scripts, run as Slurm would run them: no Slurm here) and Ray tasks
on the session's local Ray; each merged into one point."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otelkit._errors import StudyError
from otelkit.cli import main
from otelkit.study import read_results
from otelkit.study._cli import run_on_ray
from otelkit.study._parts import part_arguments, slurm_files
from otelkit.tritonserver import TritonServer
from tests.conftest import LocalRay
from tests.paths import ROOT

pytestmark = pytest.mark.triton


def run_args(triton: TritonServer) -> list[str]:
    return [
        "--url",
        triton.http_url,
        "--metrics-url",
        triton.metrics_url,
        "--model",
        "identity_fp32",
        "--sweep",
        "concurrency=1,2",
        "--seconds",
        "1.0",
        "--warmup",
        "0.3",
        "--no-traces",
        "--quiet",
    ]


def check_merged(path: Path, parts: int) -> None:
    merged = read_results(path)
    assert merged.status == "complete"
    assert [p.params for p in merged.points] == [{"concurrency": 1}, {"concurrency": 2}]
    for index, point in enumerate(merged.points):
        own = [
            read_results(path.parent / f"part-{i}-of-{parts}.jsonl").points[index]
            for i in range(parts)
        ]
        assert point.parts == parts and point.failed == 0
        assert point.throughput == pytest.approx(sum(p.throughput for p in own), rel=0.01)
        assert point.histogram.count == sum(p.histogram.count for p in own)
        assert max(p.started_at for p in own) - min(p.started_at for p in own) < 0.5


def test_a_slurm_job_array_of_two_tasks_and_its_merge_job(
    untraced_triton: TritonServer, tmp_path: Path
) -> None:
    command = f"{sys.executable} -m otelkit.cli"
    assert (
        main(
            [
                "study",
                "slurm",
                "--parts",
                "2",
                "--dir",
                str(tmp_path / "parts"),
                "--slot",
                "6",
                "--command",
                command,
                "--sbatch=--partition=cpu",
                "--",
                *run_args(untraced_triton),
            ]
        )
        == 0
    )
    parts = tmp_path / "parts"
    array = (parts / "study-array.sbatch").read_text()
    assert "#SBATCH --array=0-1\n" in array and "#SBATCH --partition=cpu\n" in array
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    env["OTELKIT_STUDY_START"] = str(
        int(time.time()) + 20
    )  # what submit.sh exports (a loaded host starts slowly)
    tasks = [
        subprocess.Popen(
            ["bash", str(parts / "study-array.sbatch")],
            cwd=tmp_path,
            text=True,
            env={**env, "SLURM_ARRAY_TASK_ID": str(task)},
            stderr=subprocess.PIPE,
        )
        for task in (0, 1)
    ]
    for task in tasks:
        _, err = task.communicate(timeout=120)
        assert task.returncode == 0, err
    done = subprocess.run(
        ["bash", str(parts / "study-merge.sbatch")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    check_merged(parts / "study.jsonl", 2)


def test_the_submit_script_submits_the_array_then_the_merge_after_it(tmp_path: Path) -> None:
    files = slurm_files(
        ["--url", "gpu:8000", "--model", "m"], parts=3, directory="parts", lead_s=60
    )
    (tmp_path / "parts").mkdir()
    for name, text in files.items():
        (tmp_path / "parts" / name).write_text(text)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text(
        '#!/bin/bash\necho "$OTELKIT_STUDY_START $*" >> sbatch.log\necho 4242\n'
    )
    (fake / "sbatch").chmod(0o755)
    before = time.time()
    done = subprocess.run(
        ["bash", "parts/submit.sh"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}"),
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    array, merge = (tmp_path / "sbatch.log").read_text().splitlines()
    start = int(array.split()[0])
    assert before + 59 <= start <= time.time() + 61
    assert array.split()[1:] == ["--parsable", "--export=ALL", "parts/study-array.sbatch"]
    assert merge.split()[1:] == [
        "--parsable",
        "--dependency=afterany:4242",
        "parts/study-merge.sbatch",
    ]


def test_two_ray_tasks_drive_each_point_and_merge(
    ray_local: LocalRay, untraced_triton: TritonServer, tmp_path: Path
) -> None:
    merged = run_on_ray(
        run_args(untraced_triton), parts=2, directory=tmp_path / "ray", slot_s=6.0, lead_s=25.0
    )
    assert merged.status == "complete"
    check_merged(tmp_path / "ray" / "study.jsonl", 2)


def test_the_parts_set_their_schedule_and_file_themselves() -> None:
    with pytest.raises(StudyError, match="drop --out"):
        part_arguments(
            ["--model", "m", "--out", "x.jsonl"], 0, 2, start_at=1.0, slot_s=5, directory="d"
        )
    with pytest.raises(StudyError, match="part 2 of 2"):
        part_arguments([], 2, 2, start_at=1.0, slot_s=5, directory="d")
    with pytest.raises(StudyError, match="1 or more"):
        slurm_files([], parts=0, directory="d")
