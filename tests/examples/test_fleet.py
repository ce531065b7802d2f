"""``make fleet`` runs in the suite, shortened through its own options: etcd, Envoy and the
reference pipeline's tritonservers, one killed and one joining under load, every check held."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from gnn_tracking.driving.fleet import failed_checks

from tests.paths import ROOT

pytestmark = pytest.mark.triton


def test_make_fleet_runs_end_to_end_and_passes_its_checks(tmp_path: Path) -> None:
    stamp = tmp_path / "installed"  # the suite's environment is installed already
    stamp.touch()
    out = tmp_path / "fleet"
    done = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "fleet",
            f"STAMP={stamp}",
            f"PY={sys.executable}",
            f"FLEET_ARGS=--seconds 9 --threads 2 --servers 2 --out {out}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "all checks passed" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    routed = summary["requests_by_server"]
    assert set(routed) == {"triton-0", "triton-1", "triton-2"}
    assert all(count > 0 for count in routed.values())  # the newcomer (triton-2) served too
    assert summary["ejected_s"] < 2.0 and summary["routed_to_killed_after_ejection"] == 0
    assert summary["failed_events"] == summary["error_spans"]
    assert "load balancer" in done.stdout  # the breakdown through Envoy
    # the page groups the requests by the names the terminal prints, not by the servers'
    # addresses (their spans still carry those)
    page = (out / "report.html").read_text()
    data = json.loads(page.split('id="otelkit-data">', 1)[1].split("</script>", 1)[0])
    groups = set(data["views"])
    assert {"answered=triton-0", "answered=triton-1", "answered=triton-2"} <= groups, groups
    assert not any("127.0.0.1" in group for group in groups), groups


def test_each_failed_check_is_named() -> None:
    assert failed_checks(0.2, 0, 1.0, 2, 2) == []
    assert failed_checks(None, 3, None, 2, 1, ["triton-1: server other is 7.0 % ..."]) == [
        "the killed server was not ejected within 2.0 s",
        "3 requests routed to the killed server after its ejection",
        "the newcomer took no request",
        "2 failed events but 1 error spans: a failure went untraced",
        "unexplained time: triton-1: server other is 7.0 % ...",
    ]
