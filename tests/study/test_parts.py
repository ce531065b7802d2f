"""One point driven by two client processes side by side, merged into one point."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otelkit.cli import main
from otelkit.study import read_results
from otelkit.tritonserver import TritonServer
from tests.paths import ROOT

pytestmark = pytest.mark.triton


def test_two_client_processes_make_one_point_from_all_their_requests(
    untraced_triton: TritonServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start = time.time() + 8.0  # both processes are up by then, and start together
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    parts = [tmp_path / f"part-{n}.jsonl" for n in range(2)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "otelkit.cli",
                "study",
                "run",
                "--url",
                untraced_triton.http_url,
                "--metrics-url",
                untraced_triton.metrics_url,
                "--model",
                "identity_fp32",
                "--sweep",
                f"concurrency={1 + n}",
                "--seconds",
                "1.5",
                "--warmup",
                "0.3",
                "--no-traces",
                "--quiet",
                "--start-at",
                str(start),
                "--slot",
                "10",
                "--out",
                str(part),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n, part in enumerate(parts)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    one, two = (read_results(p).points[0] for p in parts)
    assert abs(one.started_at - two.started_at) < 0.5
    # the parts' own parameters differ here (1 and 2 in flight): merging refuses that
    assert main(["study", "merge", *map(str, parts), "--out", str(tmp_path / "bad.jsonl")]) == 2
    assert "not the same sweep" in capsys.readouterr().err
    for part in parts:  # the same point for both: 1 + 2 requests in flight
        text = part.read_text().replace('"concurrency": 2', '"concurrency": 1')
        part.write_text(text.replace("concurrency=2", "concurrency=1"))
    merged_path = tmp_path / "merged.jsonl"
    assert main(["study", "merge", *map(str, parts), "--out", str(merged_path)]) == 0
    merged = read_results(merged_path).points[0]
    assert merged.parts == 2
    assert merged.throughput == pytest.approx(one.throughput + two.throughput, rel=0.01)
    assert merged.histogram.count == one.histogram.count + two.histogram.count
    assert min(one.latency_ms(0.5), two.latency_ms(0.5)) <= merged.latency_ms(0.5)
    assert merged.latency_ms(0.5) <= max(one.latency_ms(0.5), two.latency_ms(0.5))
    assert merged.histogram.max_s == max(one.histogram.max_s, two.histogram.max_s)
    # Triton's figures are the first part's: over its window, both processes' requests (the
    # windows open a few hundredths of a second apart, hence the margin)
    served = merged.triton["identity_fp32"].requests
    assert served == pytest.approx(merged.requests, rel=0.12)
    assert served > 1.3 * one.requests
