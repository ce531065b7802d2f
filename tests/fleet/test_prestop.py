"""The chart's preStop hook (charts/otelkit-fleet/files/drain.sh) run against a real server:
two tritonservers, each under ``otelkit fleet serve`` as a pod's container runs it, registered
in a real etcd behind a real Envoy, under load; the hook drains one while the other serves on,
and no call fails."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otelkit.fleet import EtcdRegistry, Renderer, envoy_hosts
from otelkit.testing import answers, wait_until
from otelkit.tritonserver import free_port
from tests.fleet.components import loopback_envoy
from tests.fleet.test_slurm import TRUTH, Load
from tests.paths import ROOT

pytestmark = pytest.mark.triton

DRAIN = ROOT / "charts" / "otelkit-fleet" / "files" / "drain.sh"


def serving(name: str, registry: EtcdRegistry, log: Path) -> subprocess.Popen[bytes]:
    """``otelkit fleet serve`` over a tritonserver, as the chart's container runs it."""
    ports = [free_port() for _ in range(3)]
    http, grpc, metrics = (f"127.0.0.1:{p}" for p in ports)
    command = [sys.executable, "-m", "otelkit.cli", "fleet", "serve", "--etcd", registry.etcd.url]
    command += ["--prefix", registry.prefix, "--name", name, "--http", http, "--grpc", grpc]
    command += ["--metrics", metrics, "--model", "saturated", "--ttl", "5", "--drain", "10", "--"]
    command += [sys.executable, "-m", "otelkit.tritonserver", f"--model-repository={TRUTH}"]
    command += ["--model-control-mode=explicit", "--load-model=saturated"]
    command += [f"--http-port={ports[0]}", f"--grpc-port={ports[1]}", f"--metrics-port={ports[2]}"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # the truth table's models import its behaviour
    with log.open("wb") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


def test_the_prestop_hook_drains_its_server_and_no_call_is_lost(
    registry: EtcdRegistry, tmp_path: Path
) -> None:
    eds = tmp_path / "eds"
    renderer = Renderer(registry, eds_dir=eds, resync_s=1.0).start()
    envoy, ports = loopback_envoy(tmp_path, eds, health_interval_s=0.5)
    envoy.start()
    servers = {
        name: serving(name, registry, tmp_path / f"{name}.log") for name in ("pod-a", "pod-b")
    }
    url = f"127.0.0.1:{ports['http']}"

    def routed() -> dict[str, int]:
        hosts = envoy_hosts(envoy.admin_url)
        return {n: sum(c["requests"] for c in hosts[n].values()) for n in hosts}

    try:
        wait_until(
            lambda: set(routed()) == set(servers), 120, "both servers in Envoy", interval=0.2
        )
        ready = answers(f"http://{url}/v2/health/ready")
        wait_until(ready, 10, "calls through Envoy", interval=0.2)
        with Load(url, threads=4) as load:
            wait_until(
                lambda: all(n > 0 for n in routed().values()), 20, "both serving", interval=0.2
            )
            began = time.monotonic()
            hook = subprocess.run(
                ["/bin/sh", str(DRAIN)],
                env=dict(os.environ, OTELKIT_SERVE_PID=str(servers["pod-b"].pid)),
                timeout=60,
            )
            took = time.monotonic() - began
            assert hook.returncode == 0
            assert servers["pod-b"].poll() == 0  # the hook returned once the server had ended
            assert "pod-b" not in registry.listing().servers
            after, calls = routed().get("pod-b"), load.calls
            # the other serves on, and nothing more goes to the drained one
            wait_until(lambda: load.calls >= calls + 30, 20, "30 calls once drained")
            assert routed().get("pod-b") == after
        assert load.failures == [] and load.calls > 0
        assert took >= 2.0  # it waited for Envoy to let go (--settle), not just for a signal
        log = (tmp_path / "pod-b.log").read_text()
        assert "left the registry: draining" in log and "drained in" in log
        assert servers["pod-a"].poll() is None
    finally:
        for process in servers.values():
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=40)
        envoy.stop()
        renderer.close()
