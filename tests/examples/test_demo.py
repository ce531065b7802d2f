"""``make demo`` runs in the suite, shortened through its own options, and fails loudly: it exits
non-zero naming each check that failed (labels that differ, broken nesting, a run with failed
events or none, a Triton it could not keep alive, a study without a verdict)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from gnn_tracking.driving.client import RunReport
from gnn_tracking.driving.demo import failed_checks

from tests.paths import ROOT

pytestmark = pytest.mark.triton


def run(threads: int, events: int, errors: int) -> RunReport:
    return RunReport(
        option=4,
        threads=threads,
        events=events,
        errors=errors,
        seconds=1.0,
        latencies_s=(0.01,) * events,
    )


def test_make_demo_runs_end_to_end_and_passes_its_checks(tmp_path: Path) -> None:
    stamp = tmp_path / "installed"  # the suite's environment is installed already
    stamp.touch()
    out = tmp_path / "demo"
    done = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "demo",
            f"STAMP={stamp}",
            f"PY={sys.executable}",
            f"DEMO_ARGS=--seconds 0.5 --threads 1 --no-twin --no-ray --study-seconds 0.6 "
            f"--out {out}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "all checks passed (5 runs" in done.stdout
    assert "options 0 and 4 give identical track labels" in done.stdout
    assert "=== where the time goes, per event (mean ms), from the traces ===" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert [run["option"] for run in summary["runs"]] == [0, 1, 2, 3, 4]
    assert all(run["events"] > 0 and run["errors"] == 0 for run in summary["runs"])
    served = [key for key in summary["breakdown_ms"] if key.startswith("triton/")]
    assert len(served) == 4  # options 1-4, each with its stages from the traces
    assert list((out / "traces").glob("*.jsonl"))
    # what caps throughput: the study's verdict on the ensemble, printed with its evidence
    assert "=== what caps throughput: otelkit study of the ensemble" in done.stdout
    records = [json.loads(line) for line in (out / "study.jsonl").read_text().splitlines()]
    assert [r["params"]["concurrency"] for r in records if r["record"] == "point"] == [1, 2, 4, 8]
    verdicts = [r for r in records if r["record"] == "verdict"]
    assert len(verdicts) == 1 and verdicts[0]["kind"] not in ("failed", "unknown")
    assert f"{verdicts[0]['kind']}: {verdicts[0]['sentence']}" in done.stdout


def test_each_failed_check_is_named() -> None:
    reports = [
        ("0 all in the client", run(1, 40, 0)),
        ("3 each stage", run(8, 0, 0)),
        ("4 one model", run(8, 30, 2)),
    ]
    failed = failed_checks(
        "1 of 4 events labelled differently",
        reports,
        2,
        "crashed 4 times",
        "no verdict on the ensemble's curve",
    )
    assert failed == [
        "track labels: 1 of 4 events labelled differently",
        "Triton: crashed 4 times",
        "run 3 each stage at 8 threads: no event completed",
        "run 4 one model at 8 threads: 2 events failed",
        "nesting: 2 problems in the traces",
        "study: no verdict on the ensemble's curve",
    ]
    assert failed_checks(None, reports[:1], 0) == []
