"""``make study`` runs in the suite, shortened (``--quick``: one Triton start, no instance
sweep; the instance sweep's ε is tested on a small model in tests/study): its four results
files are complete and their figures have the seeds' shapes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from otelkit.study import read_results
from tests.paths import ROOT

pytestmark = pytest.mark.triton


@pytest.mark.timeout(900)  # a Triton start takes minutes on a loaded 2-core host
def test_make_study_writes_each_sweep_and_prints_its_verdicts(tmp_path: Path) -> None:
    stamp = tmp_path / "installed"  # the suite's environment is installed already
    stamp.touch()
    out = tmp_path / "study"
    done = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "study",
            f"STAMP={stamp}",
            f"PY={sys.executable}",
            f"STUDY_ARGS=--quick --out {out}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "=== verdicts ===" in done.stdout
    results = {
        name: read_results(out / f"{name}.jsonl")
        for name in ("options", "batch", "servers", "scaling")
    }
    for name, result in results.items():
        assert result.status == "complete", name
        assert all(p.status == "ok" and p.failed == 0 and p.requests > 0 for p in result.points)
        # a point is measured again only after tritonserver 2.51's crash (its handler's line)
        restarts = [r for p in result.points for r in p.restarts]
        assert all("after logging 'Signal (" in r for r in restarts), restarts
        assert bool(result.verdicts) == (name in ("servers", "scaling")), name  # along load
        for verdict in result.verdicts:
            assert f"{name} [{verdict.curve or 'all'}] {verdict.kind}: " in done.stdout
    options = results["options"]
    assert [p.params["option"] for p in options.points] == [0, 1, 2, 3, 4]
    offload = {row.curve: row for row in options.figure("offload_per_step_ms")}
    assert sorted(offload) == [f"option={n} concurrency=1" for n in (1, 2, 3, 4)]
    assert all(0 < row.value < 100 for row in offload.values())  # ms per call, traced
    # each served option's traces hold its server stages; option 0 none (no server)
    assert options.points[0].triton == {} or all(
        f.requests == 0 for f in options.points[0].triton.values()
    )
    assert options.points[4].traces is not None and options.points[4].traces.traces > 0
    by_batch = {row.at: row.value for row in results["batch"].figure("throughput_n_over_l")}
    assert sorted(by_batch) == [1, 16] and by_batch[16] > by_batch[1]  # batching pays here
    servers = {p.params["server"] for p in results["servers"].points}
    assert servers == {"triton", "fastapi"}
    assert "tracking" in results["servers"].points[0].triton  # Triton's counters, the twin none
    scaling = results["scaling"]
    assert [p.params["concurrency"] for p in scaling.points] == [1, 2]
    assert scaling.figure("strong_scaling")
    assert list((out / "traces").glob("*.jsonl"))
    # one page with every sweep and the traces grouped by the points' parameters
    page = (out / "report.html").read_text()
    assert f"report: {(out / 'report.html').resolve()}" in done.stdout
    for name in results:
        assert f'id="study-{name}"' in page
    assert "concurrency=2" in page and "batch_size=16" in page and "server=fastapi" in page
    assert "<script src=" not in page and 'href="http' not in page  # nothing fetched
