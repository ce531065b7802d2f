"""Scaling on a Slurm site, run for real on this machine: the job script that
``otelkit fleet slurm-job`` writes runs real tritonservers that register in a real etcd, Envoy
balances over them, a real Prometheus scrapes them, and the scaler reads it. Slurm itself is
the only stand-in: an ``sbatch`` that records its call and runs the job in the background (as a
node would, with ``SLURM_JOB_ID`` set), and an ``scancel`` that records its call and sends the
job's process SIGTERM (as Slurm does first, before ``KillWait`` runs out)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml

from otelkit.fleet import EtcdRegistry, Renderer, envoy_hosts
from otelkit.fleet._scale import ScalePolicy, Scaler, prometheus_value, slurm
from otelkit.testing import answers, wait_until
from tests.fleet.components import LoadThreads, loopback_envoy
from tests.paths import ROOT, TESTS
from tests.prometheus import PrometheusServer
from tests.support import require_binary

pytestmark = [pytest.mark.triton, pytest.mark.prometheus]

TRUTH = TESTS / "study" / "truth" / "models"  # "saturated": one instance, 10 ms a request
CHART_VALUES = ROOT / "charts" / "otelkit-fleet" / "values.yaml"
QUERY = (  # the scaler's signal over 5 s, as Prometheus here scrapes every second
    "sum(rate(nv_inference_queue_duration_us[5s])) / "
    "(sum(rate(nv_inference_exec_count[5s])) > 0) / 1e3"
)
POLICY = ScalePolicy(
    high_ms=20.0,
    low_ms=2.0,
    min_servers=1,
    max_servers=2,
    up_after_s=0.0,
    down_after_s=2.0,
    cooldown_s=5.0,
)

SBATCH = """#!/bin/bash
# Slurm's sbatch, standing in: record the call, run the job in the background as a node would
echo "sbatch $*" >> "$SLURM_RECORD"
id=$(( $(cat "$SLURM_JOBS/last" 2>/dev/null || echo 100) + 1 ))
echo "$id" > "$SLURM_JOBS/last"
read -r http grpc metrics < <(python -c \\
    "from otelkit.tritonserver import free_port as f; print(f(), f(), f())")
SLURM_JOB_ID="$id" OTELKIT_FLEET_HOST=127.0.0.1 OTELKIT_FLEET_HTTP_PORT="$http" \\
    OTELKIT_FLEET_GRPC_PORT="$grpc" OTELKIT_FLEET_METRICS_PORT="$metrics" \\
    setsid bash "${@: -1}" > "$SLURM_JOBS/$id.log" 2>&1 &
echo $! > "$SLURM_JOBS/$id.pid"
echo "$id"
"""
SCANCEL = """#!/bin/bash
# Slurm's scancel, standing in: record the call, send the job SIGTERM as Slurm does first
echo "scancel $*" >> "$SLURM_RECORD"
kill -TERM "$(cat "$SLURM_JOBS/$1.pid")"
"""


class Load(LoadThreads):
    """``threads`` calling ``saturated`` through Envoy in a loop; failures kept."""

    def __init__(self, url: str, threads: int) -> None:
        super().__init__(threads)
        self.url = url
        self.failures: list[str] = []

    def _run(self) -> None:
        client = httpclient.InferenceServerClient(self.url, network_timeout=30)
        tensor = httpclient.InferInput("INPUT0", [16], "FP32")
        tensor.set_data_from_numpy(np.zeros(16, np.float32))
        while not self._stop.is_set():
            try:
                client.infer("saturated", [tensor])
                with self._lock:
                    self.calls += 1
            except Exception as error:  # every failure is the test's to report
                self.failures.append(f"{getattr(error, 'status', lambda: '')()} {error}")
        client.close()


@pytest.fixture
def site(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """The stand-ins for Slurm on PATH, and where they record."""
    bin_dir, jobs = tmp_path / "bin", tmp_path / "jobs"
    bin_dir.mkdir()
    jobs.mkdir()
    for name, text in (("sbatch", SBATCH), ("scancel", SCANCEL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    record = tmp_path / "slurm-calls"
    record.touch()
    saved = dict(os.environ)
    os.environ["SLURM_RECORD"], os.environ["SLURM_JOBS"] = str(record), str(jobs)
    path = [str(bin_dir), str(Path(sys.executable).parent), saved["PATH"]]
    os.environ["PATH"] = os.pathsep.join(path)
    os.environ["PYTHONPATH"] = str(ROOT)  # the truth table's models import its behaviour
    try:
        yield {"bin": bin_dir, "jobs": jobs, "record": record}
    finally:
        left = [int(p.read_text()) for p in jobs.glob("*.pid")]
        for pid in left:  # a job the test left running: drained and stopped as scancel would
            subprocess.run(["kill", "-TERM", str(pid)], check=False, capture_output=True)
        wait_until(
            lambda: not any(Path(f"/proc/{pid}").exists() for pid in left),
            40,
            "jobs' end",
            interval=0.2,
        )
        os.environ.clear()
        os.environ.update(saved)


def test_the_scaler_asks_for_a_server_under_load_and_lets_one_go_drained_when_idle(
    registry: EtcdRegistry, site: dict[str, Path], tmp_path: Path
) -> None:
    etcd_url, prefix = registry.etcd.url, registry.prefix
    job = tmp_path / "job.sbatch"
    command = [sys.executable, "-m", "otelkit.cli", "fleet", "slurm-job", "--etcd", etcd_url]
    command += ["--prefix", prefix, "--out", str(job), "--repository", str(TRUTH)]
    command += ["--model", "saturated", "--sbatch=--time=01:00:00", "--drain", "10"]
    command += ["--server-command", f"{sys.executable} -m otelkit.tritonserver"]
    subprocess.run(command, check=True, capture_output=True, timeout=60)
    assert "#SBATCH --time=01:00:00" in job.read_text()

    eds, file_sd = tmp_path / "eds", tmp_path / "targets.json"
    renderer = Renderer(registry, eds_dir=eds, file_sd=file_sd, resync_s=1.0)
    envoy, ports = loopback_envoy(tmp_path, eds, health_interval_s=0.5)
    targets = {"files": [str(file_sd)], "refresh_interval": "1s"}
    scrape = {"job_name": "triton", "file_sd_configs": [targets]}
    binary = require_binary("prometheus")
    (tmp_path / "prometheus").mkdir()
    prometheus = PrometheusServer(binary, {}, tmp_path / "prometheus", scrape_configs=[scrape])
    submit, cancel = slurm(f"sbatch --parsable {job}", "scancel {job}")
    scaler = Scaler(
        POLICY,
        saturation=lambda: prometheus_value(prometheus.url, QUERY),
        servers=lambda: list(registry.listing().servers),
        submit=submit,
        cancel=cancel,
    )
    url = f"127.0.0.1:{ports['http']}"

    def routed() -> set[str]:
        hosts = envoy_hosts(envoy.admin_url)
        return {n for n, c in hosts.items() if all(x["healthy"] for x in c.values())}

    renderer.start()
    envoy.start()
    prometheus.start()
    try:
        first = scaler.step()  # no server yet: fewer than the least
        assert (first.action, first.job) == ("up", "101"), first
        wait_until(
            lambda: routed() == {"triton-101"}, 120, "first server healthy in Envoy", interval=0.2
        )
        # Envoy balances onto a new server a second after its admin says healthy (known issues)
        ready = answers(f"http://{url}/v2/health/ready")
        wait_until(ready, 10, "first server served through Envoy", interval=0.2)
        with Load(url, threads=6) as heavy:
            wait_until(
                lambda: (prometheus_value(prometheus.url, QUERY) or 0) > 20,
                60,
                "saturation",
                interval=0.2,
            )
            # the query the Helm chart gives KEDA answers from the same Prometheus
            keda = yaml.safe_load(CHART_VALUES.read_text())["keda"]["query"]
            wait_until(
                lambda: (prometheus_value(prometheus.url, keda) or 0) > 0,
                30,
                "KEDA's query",
                interval=0.2,
            )
            wait_until(
                lambda: scaler.step().action == "up", 30, "a second server asked for", interval=0.2
            )
            assert scaler.submitted == 2
            again = scaler.step()  # saturated still, but at the most (one pending)
            assert again.action == "none", again
            wait_until(
                lambda: routed() == {"triton-101", "triton-102"},
                120,
                "second server routed",
                interval=0.2,
            )
        assert heavy.failures == []
        with Load(url, threads=1) as light:  # one server is enough now, and it stays in use
            wait_until(
                lambda: (prometheus_value(prometheus.url, QUERY) or 0) < 2, 60, "idle", interval=0.2
            )
            wait_until(lambda: scaler.step().action == "down", 30, "a server let go", interval=0.2)
            assert scaler.cancelled == 1
            wait_until(
                lambda: "triton-102" not in registry.listing().servers,
                10,
                "deregistration",
                interval=0.2,
            )
            pid = int((site["jobs"] / "102.pid").read_text())
            wait_until(
                lambda: not Path(f"/proc/{pid}").exists(), 40, "the drained job's end", interval=0.2
            )
            time.sleep(1.0)  # the survivor serves on
        assert light.failures == [] and light.calls > 0
        last = scaler.step()
        assert last.action == "none", last  # at the least
        calls = site["record"].read_text().splitlines()
        assert calls == [f"sbatch --parsable {job}"] * 2 + ["scancel 102"]
        log = (site["jobs"] / "102.log").read_text()
        assert "left the registry: draining" in log and "drained in" in log
    finally:
        prometheus.stop()
        envoy.stop()
        renderer.close()
