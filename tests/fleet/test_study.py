"""``otelkit study`` over a fleet: real tritonservers joined and removed through a real etcd,
behind a real Envoy, on deployments whose limit is known by construction."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from otelkit.analysis._breakdown import LOAD_BALANCER
from otelkit.fleet import EtcdRegistry
from otelkit.report._study_charts import study_charts
from otelkit.study import Fleet, Load, Study, StudyResults, Tracing, read_results
from otelkit.study._capacity import resources
from otelkit.study._verdicts import Verdict
from tests.paths import ROOT, TESTS
from tests.study.truth.capacity import SHARED_HOST, TICKS

pytestmark = pytest.mark.triton

TRUTH = TESTS / "study" / "truth" / "models"
WITHIN = 0.15  # the truth table's bound on a predicted plateau

# Envoy's Lua burns this much of its worker's CPU on every request: with one worker the load
# balancer caps the fleet at about 1 / (10 ms + Envoy's own) by construction. The spin is CPU
# of the host's too: with the client's and both servers' ~4 ms a request, 2 cores allow
# 2 / 14 ms, 1.4 times the balancer's cap (a 3 ms spin put the two caps within 5 % of each
# other, and a run named the cores alone)
SPIN_S = 0.010
_SPIN = f"""function envoy_on_request(handle)
  local start = os.clock()
  while os.clock() - start < {SPIN_S} do end
end
"""
BUSY_BALANCER = {
    "name": "envoy.filters.http.lua",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
        "default_source_code": {"inline_string": _SPIN},
    },
}


def run(
    fleet: Fleet, sweep: dict[str, list[Any]], out: Path, tracing: Tracing | None = None
) -> StudyResults:
    results = Study(
        model=fleet.models[0],
        server=fleet,
        load=Load(seconds=2.0, warmup_s=0.5),
        sweep=sweep,
        tracing=tracing,
        out=out / "study.jsonl",
        progress=False,
    ).run()
    print(results.summary())  # what a failure needs to be read
    return results


def along(results: StudyResults, axis: str) -> Verdict:
    return next(v for v in results.verdicts if v.axis == axis)


def test_servers_joined_and_removed_through_etcd_scale_a_saturated_model(
    registry: EtcdRegistry, tmp_path: Path
) -> None:
    """(a) of the truth table on every server: one instance, 10 ms a request, 100/s a server.
    Two servers serve twice what one does; removed through the registry, the second stops
    taking requests, and the fleet serves what one server does again."""
    fleet = Fleet(TRUTH, models=["saturated"], registry=registry, log_dir=tmp_path)
    results = run(fleet, {"servers": [2, 1], "concurrency": [6]}, tmp_path)
    two, one = results.points
    assert (two.params["servers"], one.params["servers"]) == (2, 1)
    assert two.status == one.status == "ok"
    # Triton's counters of every server, summed: the fleet's instances are 1 a server
    assert two.triton["saturated"].instances == 2
    assert one.triton["saturated"].instances == 1
    assert two.triton["saturated"].requests == pytest.approx(two.requests, rel=0.05)
    assert one.throughput == pytest.approx(100, rel=0.15)  # one instance, 10 ms
    assert two.throughput / one.throughput == pytest.approx(2, rel=0.1)
    verdict = along(results, "servers")
    assert verdict.kind == "rising", verdict.sentence
    assert "more servers pay" in verdict.sentence
    (row,) = results.figure("server_efficiency")[1:]
    assert row.value == pytest.approx(1, rel=0.1)
    # the load balancer is measured, and far from its limit
    balancer = resources(two)["load balancer"]
    assert balancer.kind == "balancer" and balancer.servers == 1
    assert balancer.utilisation is not None and balancer.utilisation < 0.5
    assert registry.listing().servers == {}  # the study deregistered what it registered
    # the report plots throughput against servers, and the scaling over them
    charts = {chart.name for chart in study_charts(results)}
    assert {"study-throughput-servers", "study-server-efficiency"} <= charts
    # from one server's demands, what two would give, against what two gave
    predictions = {p.curve: p for p in results.predict(["fleet.servers=2"])}
    predicted = predictions["servers=1"].points[-1].throughput
    assert predicted == pytest.approx(two.throughput, rel=WITHIN)


def test_the_command_line_sweeps_servers(tmp_path: Path) -> None:
    out = tmp_path / "fleet.jsonl"
    command = [sys.executable, "-m", "otelkit.cli", "study", "run", "--fleet", str(TRUTH)]
    command += ["--model", "saturated", "--sweep", "servers=1,2", "--concurrency", "4"]
    command += ["--seconds", "1", "--warmup", "0.3", "--no-traces", "--quiet", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = read_results(out)
    assert [p.params["servers"] for p in results.points] == [1, 2]
    assert results.header["server"]["kind"] == "fleet"
    assert "more servers pay" in done.stdout


def test_a_busy_load_balancer_is_named_and_its_plateau_predicted(
    registry: EtcdRegistry, tmp_path: Path
) -> None:
    """Two servers of a light model (1 ms, 4 instances each) behind one Envoy worker that
    burns 10 ms of CPU a request: the load balancer caps the fleet, and more servers would not
    help. Traced, the sampled requests show the balancer's time as its own."""
    fleet = Fleet(
        TRUTH,
        models=["light"],
        registry=registry,
        balancer_workers=1,
        http_filters=[BUSY_BALANCER],
        log_dir=tmp_path,
    )
    traced = Tracing(per_second=20)
    results = run(fleet, {"servers": [2], "concurrency": [1, 8]}, tmp_path, traced)
    verdict = along(results, "concurrency")
    if verdict.kind == "undecided":
        # the host's 2 cores, which the worker shares with both servers and the client, read
        # within their windows' noise of it: both are named, with the change for each
        assert verdict.limit is not None and "the load balancer" in verdict.limit
        assert "--set balancer.workers=2" in verdict.change, verdict.sentence
    else:
        assert (verdict.kind, verdict.resource) == ("saturated", "balancer"), verdict.sentence
        assert "worker threads" in verdict.change
        assert "more servers will not help" in verdict.change
    low = results.points[0]
    demand = resources(low)["load balancer"].demand_ms
    assert SPIN_S * 1e3 <= demand <= SPIN_S * 1e3 * 1.3  # the spin, and Envoy's own
    # Envoy's CPU in each part of the window adds up to the point's: the same reads of /proc,
    # over the parts' lengths where the point's rate is over its reads' span, which differ by
    # the time from the first read of an edge to the middle of its hook (a few ms each end)
    assert low.host is not None and low.host.balancer_cores is not None
    parts = [(w.balancer_cores, w.seconds) for w in low.windows]
    assert all(cores is not None and seconds for cores, seconds in parts)
    envoy_s = sum((cores or 0.0) * (seconds or 0.0) for cores, seconds in parts)
    assert envoy_s == pytest.approx(low.host.balancer_cores * low.seconds, abs=0.05)
    # Envoy's span less the server's, in the breakdown: the spin, by the clock. Lua's
    # os.clock counts the whole Envoy process's CPU, so its other threads working meanwhile
    # (the tracer exporting the sampled spans, stats) end a spin early by the clock, by what
    # they burn during it: Envoy's demand beyond the spin a request, which bunches up (a CI
    # run read 2.53 ms for a 3 ms spin, 0.37 ms beyond it a request): twice that bounds it.
    assert low.traces is not None and low.traces.traces >= 10
    others_ms = max(0.0, demand - SPIN_S * 1e3)
    balanced = low.component_ms(LOAD_BALANCER) or 0.0
    assert SPIN_S * 1e3 - 2 * others_ms <= balanced <= SPIN_S * 1e3 * 2
    measured = max(p.throughput for p in results.points)
    # against the limit by construction: one worker spinning 10 ms a request allows at most
    # 1 / 10 ms (Envoy's own CPU lowers it); the worker shares the 2 cores with both servers
    # and the client, which the truth table's floor for a CPU limit allows for (SHARED_HOST)
    limit = 1 / SPIN_S
    assert SHARED_HOST * limit <= measured <= limit + 8 / results.points[-1].seconds
    assert verdict.predicted_per_s is not None, verdict.sentence
    # the capacity is not below what was measured, nor above the spin's
    assert measured <= verdict.predicted_per_s * 1.02, verdict.sentence
    assert verdict.predicted_per_s <= limit * (1 + TICKS), verdict.sentence
    assert results.contradictions() == []
    # what a second worker would give: the next limit (the host's 2 cores here, which the
    # clients, Envoy and both servers share), above this one by more than the plateau's bound
    (prediction,) = results.predict(["balancer.workers=2"])
    (plain,) = results.predict([])
    assert prediction.points[-1].limit != plain.points[-1].limit, prediction.points[-1]
    assert prediction.points[-1].throughput > (1 + WITHIN) * measured
