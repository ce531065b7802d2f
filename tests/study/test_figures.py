"""The figures across points and the verdicts, on synthetic points whose answers are known."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from otelkit.analysis._breakdown import NETWORK
from otelkit.study import Point, StudyResults
from otelkit.study import _derived as derived
from otelkit.study._counters import HostUsage
from otelkit.study._verdicts import Verdict, judge, verdicts
from tests.study.conftest import figures, make_point


def rows(found: list[derived.Row]) -> list[tuple[str, str, object, float]]:
    return [(r.figure, r.curve, r.at, round(r.value, 3)) for r in found]


def test_efficiency_is_throughput_per_instance_over_one_instances() -> None:
    points = [
        make_point({"instances": 1, "concurrency": 8}, 100.0),
        make_point({"instances": 2, "concurrency": 8}, 180.0),
        make_point({"instances": 4, "concurrency": 8}, 240.0),
        make_point({"instances": 1, "concurrency": 1}, 60.0),
        make_point({"instances": 2, "concurrency": 1}, 60.0),
    ]
    assert rows(derived.efficiency(points)) == [
        ("efficiency", "concurrency=8", 1, 1.0),
        ("efficiency", "concurrency=8", 2, 0.9),  # (180/2)/100
        ("efficiency", "concurrency=8", 4, 0.6),  # (240/4)/100
        ("efficiency", "concurrency=1", 1, 1.0),
        ("efficiency", "concurrency=1", 2, 0.5),
    ]


def test_strong_scaling_runs_along_n_threads_with_n_instances() -> None:
    # t_n is the time for a fixed number of events, 1/T: (t1/n)/tn = T_n / (n T_1)
    points = [
        make_point({"instances": n, "concurrency": c}, t)
        for n, c, t in [(1, 1, 50.0), (2, 2, 95.0), (3, 3, 135.0), (4, 4, 150.0), (1, 4, 52.0)]
    ]
    assert rows(derived.strong_scaling(points)) == [
        ("strong_scaling", "", 1, 1.0),
        ("strong_scaling", "", 2, 0.95),
        ("strong_scaling", "", 3, 0.9),
        ("strong_scaling", "", 4, 0.75),
    ]
    # without instances in the sweep, along the client's threads alone
    alone = [make_point({"concurrency": c}, t) for c, t in [(1, 50.0), (2, 80.0)]]
    assert rows(derived.strong_scaling(alone)) == [
        ("strong_scaling", "", 1, 1.0),
        ("strong_scaling", "", 2, 0.8),
    ]


def test_throughput_over_batch_size_is_n_over_latency() -> None:
    points = [
        make_point({"batch_size": n, "concurrency": 1}, 1000.0 / ms, latency_ms=ms)
        for n, ms in [(1, 2.0), (4, 4.0), (16, 10.0), (64, 32.0)]
    ]
    found = derived.throughput_by_batch(points)
    assert rows(found) == [
        ("throughput_n_over_l", "concurrency=1", 1, 500.0),  # 1 / 2 ms
        ("throughput_n_over_l", "concurrency=1", 4, 1000.0),
        ("throughput_n_over_l", "concurrency=1", 16, 1600.0),
        ("throughput_n_over_l", "concurrency=1", 64, 2000.0),
    ]
    # the measured inferences a second agree at one request in flight (10 s of requests)
    measured = [r.detail["measured_items_per_s"] for r in found]
    assert measured == pytest.approx([500, 1000, 1600, 2000], rel=0.005)


def test_n_over_latency_says_it_is_derived_beside_the_measured_inferences() -> None:
    # 4 in flight: N/ℓ is what one request in flight would give, a quarter of what was measured
    points = [
        make_point({"batch_size": n, "concurrency": 4}, 4000.0 / ms, latency_ms=ms)
        for n, ms in [(1, 2.0), (4, 4.0)]
    ]
    results = StudyResults({"unit": "request"}, points)
    results.derive()
    (row, _) = results.figure("throughput_n_over_l")
    assert row.to_dict() == {
        "record": "derived",
        "figure": "throughput_n_over_l",
        "curve": "concurrency=4",
        "axis": "batch_size",
        "at": 1,
        "value": pytest.approx(500.0),
        "estimate": "derived: N/ℓ, the batch over the mean latency, what the server gives with "
        "one request in flight; measured_items_per_s is what was measured",
        "latency_ms": pytest.approx(2.0, rel=0.005),
        "measured_items_per_s": 2000.0,
    }
    lines = [line for line in results.summary().splitlines() if "N/ℓ" in line]
    assert lines == [
        "T = N/ℓ (derived: batch over mean latency, as at 1 request in flight) [concurrency=4] at "
        "batch_size=1: 500.0 inferences/s; measured 2000.0",
        "T = N/ℓ (derived: batch over mean latency, as at 1 request in flight) [concurrency=4] at "
        "batch_size=4: 1000.0 inferences/s; measured 4000.0",
    ]


def test_offload_overhead_is_per_call() -> None:
    one_call = make_point(
        {"option": 4}, 10.0, {NETWORK: 0.7, "client serialize": 0.2, "server gnn": 12.0}, calls=1.0
    )
    five_calls = make_point(
        {"option": 3},
        8.0,
        {NETWORK: 3.5, "client serialize": 0.5, "client deserialize": 0.5},
        calls=5.0,
    )
    found = derived.offload_overhead([one_call, five_calls])
    assert [(r.curve, round(r.value, 3)) for r in found] == [("option=4", 0.9), ("option=3", 0.9)]


@pytest.mark.parametrize(
    ("curve", "tolerance", "knee"),
    [
        ([(1, 50.0), (2, 95.0), (4, 140.0), (8, 150.0), (16, 152.0)], 0.1, (4, True)),
        ([(1, 50.0), (2, 95.0), (4, 140.0), (8, 150.0), (16, 152.0)], 0.02, (8, True)),
        ([(1, 50.0), (2, 100.0), (4, 200.0)], 0.1, (4, False)),  # still rising
        ([(4, 100.0), (1, 99.0)], 0.1, (1, True)),  # any order
    ],
)
def test_knee_is_the_lowest_load_within_tolerance_of_the_highest(
    curve: list[tuple[int, float]], tolerance: float, knee: tuple[int, bool]
) -> None:
    found = derived.knee(curve, tolerance)
    assert found is not None
    assert (found.at, found.plateau) == knee
    assert found.highest == max(t for _, t in curve)


def test_knee_refuses_a_tolerance_that_makes_no_sense() -> None:
    with pytest.raises(ValueError, match="tolerance is a share from 0 to 1"):
        derived.knee([(1, 1.0)], 1.5)


# -- verdicts ----------------------------------------------------------------------------------
# Synthetic points whose figures obey Little's law (latency = in flight / throughput) and whose
# Triton counters cover the same requests: the laws decide as they do on measured points
# (tests/study/test_truth_table.py holds the real deployments).


def point(
    params: dict[str, Any],
    throughput: float,
    components: dict[str, float] | None = None,
    *,
    models: dict[str, tuple[float, int]] | None = None,
    queue_ms: float = 0.1,
    index: int = 0,
    **options: Any,
) -> Point:
    """A point at ``throughput`` whose Triton ``models`` are (compute ms, instances)."""
    in_flight = params.get("concurrency", 1)
    triton = {
        name: figures(ms, queue_ms, instances=n, requests=round(throughput * 10))
        for name, (ms, n) in (models or {}).items()
    }
    latency = options.pop("latency_ms", 1e3 * in_flight / throughput)
    cpu_s = options.pop("cpu_s", 0.0)  # the client's CPU seconds over the 10 s window
    found = make_point(
        params, throughput, components, triton=triton, index=index, latency_ms=latency, **options
    )
    found.cpu_s = cpu_s
    return found


def test_nerscs_curve_names_the_stage_that_waits_for_something_unmeasured() -> None:
    # NERSC's finding: graph building slows down under load while the other stages do not, and
    # no resource the study measures is busy: the stage is named, its wait left unnamed
    stages = {"server embed": 0.8, "server filter": 2.2, "server gnn": 12.0}
    graph = [(1, 1.8, 60.0), (2, 2.5, 110.0), (4, 4.0, 145.0), (8, 5.6, 150.0)]
    curve = [
        point(
            {"concurrency": n},
            t,
            {**stages, "server build_graph": ms},
            index=i,
            stage_models={"server build_graph": "graph"},
        )
        for i, (n, ms, t) in enumerate(graph)
    ]
    (verdict,) = verdicts(curve, unit="event")
    assert (verdict.kind, verdict.limit, verdict.resource) == (
        "contended",
        "build_graph",
        "unmeasured",
    )
    assert verdict.sentence.startswith(
        "build_graph in graph: 1.8 → 5.6 ms per event (×3.1); throughput plateaus at 150 "
        "events/s from 1 to 8 threads, because build_graph waits for a resource the study does "
        "not measure"
    )
    assert verdict.predicted_per_s is None  # nothing measured gives the wait's capacity
    assert verdict.plateau_per_s == 150.0


def test_the_least_capacity_saturates_whatever_the_queue_does() -> None:
    # embed: 2 ms on 1 instance -> 500/s; gnn: 8 ms on 2 instances -> 250/s. The queue grows
    # by (N-1) service times in a closed loop: it is a symptom, never the verdict's reason.
    models = {"embed": (2.0, 1), "gnn": (8.0, 2)}
    low = point({"concurrency": 1}, 95.0, models=models)
    high = point({"concurrency": 16}, 245.0, models=models, queue_ms=55.0, index=1)
    verdict = judge([low, high], "concurrency", unit="event")
    assert (verdict.kind, verdict.resource, verdict.limit) == ("saturated", "instances", "gnn")
    assert verdict.predicted_per_s == pytest.approx(250.0)
    assert verdict.plateau_per_s == 245.0
    assert verdict.sentence.startswith(
        "gnn's 2 instances are busy all the time: 8.0 ms per event allows at most 250 events/s "
        "(predicted: 2 instances / 8.0 ms)"
    )
    assert [e.name for e in verdict.evidence[:2]] == ["gnn", "embed"]
    assert verdict.change == "more instances of gnn, or batching"


def test_an_ensemble_is_never_the_limit_its_slowest_step_is() -> None:
    low = point({"concurrency": 1}, 60.0, models={"embed": (2.0, 1), "gnn": (12.0, 1)})
    low.triton["tracking"] = figures(14.0, 0.0, ensemble=True, requests=600)
    high = point(
        {"concurrency": 8},
        82.0,
        models={"embed": (2.0, 1), "gnn": (12.0, 1)},
        queue_ms=60.0,
        index=1,
    )
    high.triton["tracking"] = figures(14.0, 0.0, ensemble=True, requests=820)
    verdict = judge([low, high], "concurrency", unit="event")
    assert (verdict.kind, verdict.limit) == ("saturated", "gnn")
    assert verdict.predicted_per_s == pytest.approx(1000 / 12)
    assert "tracking" not in {e.name for e in verdict.evidence}


def test_a_stage_that_serves_one_at_a_time_is_named_and_more_instances_are_not_advised() -> None:
    # NERSC's shape on 4 instances: prep 2 ms, match 6 ms under a lock every instance shares
    def at(n: int, t: float, match_ms: float, index: int) -> Point:
        return point(
            {"concurrency": n},
            t,
            {"server prep": 2.0, "server match": match_ms},
            models={"locked": (2.0 + match_ms, 4)},
            index=index,
            stage_models={"server prep": "locked", "server match": "locked"},
        )

    verdict = judge([at(1, 110.0, 6.0, 0), at(8, 160.0, 22.0, 1)], "concurrency")
    assert (verdict.kind, verdict.resource, verdict.limit) == ("contended", "lock", "match")
    assert verdict.predicted_per_s == pytest.approx(1000 / 6)
    assert "more instances will not help" in verdict.change
    # the instances' U* is 160 x 8 ms / 4 = 0.32: not what caps it
    instances = next(e for e in verdict.evidence if e.key == "model locked")
    assert instances.load == pytest.approx(0.32)


def test_a_stage_that_grew_beyond_what_one_at_a_time_allows_is_no_lock() -> None:
    # 4 instances burning 10 ms of CPU on 2 cores: compute doubles, but 176/s x 11 ms = 1.9
    # requests at a time: no lock does that; the cores (U 1.0) do
    def at(n: int, t: float, ms: float, busy: float, index: int) -> Point:
        found = point(
            {"concurrency": n},
            t,
            {"server compute": ms},
            models={"cores": (ms, 4)},
            index=index,
            stage_models={"server compute": "cores"},
        )
        found.host = HostUsage(2, busy, None, 10.0)
        return found

    verdict = judge([at(1, 85.0, 11.0, 0.98, 0), at(8, 176.0, 22.7, 2.0, 1)], "concurrency")
    assert (verdict.kind, verdict.resource) == ("contended", "cores")
    # the lock hypothesis is refuted: 176/s x 11 ms is 1.9 requests at a time
    assert [e.key for e in verdict.evidence if e.kind == "lock"] == []
    assert verdict.predicted_per_s == pytest.approx(2 / (0.98 / 85.0))
    assert "more instances will not help" in verdict.change


def test_a_client_busy_with_its_own_work_is_the_limit_not_the_network() -> None:
    # the wait for the GIL lies between the client's span and the server's: network + client wait
    # grows, but the client's own CPU (9.5 ms a request, one core) is what the laws name
    low = point({"concurrency": 1}, 96.0, {NETWORK: 0.5, "server m": 1.0}, cpu_s=9.1)
    high = point({"concurrency": 8}, 104.0, {NETWORK: 46.0, "server m": 1.0}, cpu_s=9.9, index=1)
    verdict = judge([low, high], "concurrency")
    assert (verdict.kind, verdict.resource) == ("client", "client")
    assert verdict.predicted_per_s == pytest.approx(96.0 / 0.91, rel=1e-3)
    assert "more threads" in verdict.change


def test_a_dynamic_batchers_delay_is_the_batchers_not_contention() -> None:
    def at(n: int, t: float, queue: float, index: int) -> Point:
        found = point({"concurrency": n}, t, models={"m": (2.0, 1)}, queue_ms=queue, index=index)
        found.triton["m"] = replace(found.triton["m"], batch_delay_ms=20.0, max_batch_size=8)
        return found

    verdict = judge([at(1, 45.0, 19.8, 0), at(2, 88.0, 19.5, 1)], "concurrency")
    assert verdict.kind == "batching"
    assert "within its 20 ms max_queue_delay" in verdict.sentence


def test_without_traces_the_configured_instances_give_the_capacity() -> None:
    # 4 instances of a 10 ms model: 100 -> 398 requests/s is rising, its capacity 400/s, not
    # the 100/s one instance would give
    low = point({"concurrency": 1}, 100.0, models={"m": (10.0, 4)})
    high = point({"concurrency": 4}, 398.0, models={"m": (10.0, 4)}, index=1)
    verdict = judge([low, high], "concurrency")
    assert verdict.kind in ("rising", "saturated")
    assert verdict.predicted_per_s == pytest.approx(400.0)


def test_an_open_loop_falling_behind_its_rate_is_not_rising() -> None:
    # 800/s offered, 420/s served: latency from the scheduled time grows 2 -> 2,000 ms
    low = point({"rate": 100}, 100.0, models={"m": (2.3, 1)}, latency_ms=2.0)
    high = point({"rate": 800}, 420.0, models={"m": (2.3, 1)}, latency_ms=2000.0, index=1)
    verdict = judge([low, high], "rate")
    assert (verdict.kind, verdict.limit) == ("saturated", "m")
    assert "800/s the rest wait in the client's backlog" in verdict.sentence
    assert verdict.predicted_per_s == pytest.approx(1000 / 2.3)


def test_flat_time_per_request_means_nothing_caps_throughput_yet() -> None:
    low = point({"concurrency": 1}, 100.0, models={"m": (9.0, 4)})
    high = point({"concurrency": 2}, 198.0, models={"m": (9.1, 4)}, index=1)
    verdict = judge([low, high], "concurrency")
    assert verdict.kind == "rising"
    assert verdict.plateau_per_s is None
    assert "no resource is at its limit; the nearest limit is m's 4 instances at 444" in (
        verdict.sentence
    )


def test_along_instances_the_verdict_follows_epsilon_and_the_cores() -> None:
    pays = [
        point({"instances": 1}, 95.0, models={"m": (10.0, 1)}),
        point({"instances": 2}, 186.0, models={"m": (10.1, 2)}, index=1),
    ]
    assert judge(pays, "instances").sentence == (
        "throughput 95 → 186 requests/s from 1 to 2 instances (ε = 0.98): more instances pay"
    )
    idle = [
        point({"instances": 1, "concurrency": 1}, 95.0, models={"m": (10.0, 1)}),
        point({"instances": 2, "concurrency": 1}, 94.0, models={"m": (10.2, 2)}, index=1),
    ]
    assert judge(idle, "instances").kind == "underloaded"
    cores = [
        point({"instances": 2}, 170.0, models={"m": (11.0, 2)}),
        point({"instances": 4}, 176.0, models={"m": (22.0, 4)}, index=1),
    ]
    for found, busy in zip(cores, (1.9, 2.0), strict=True):
        found.host = HostUsage(2, busy, None, 10.0)
    verdict = judge(cores, "instances")
    assert (verdict.kind, verdict.resource) == ("contended", "cores")
    assert verdict.sentence.startswith("throughput 170 → 176 requests/s from 2 to 4 instances")


def test_a_curve_with_failed_points_says_so_instead_of_a_verdict() -> None:
    failed = make_point({"concurrency": 8}, 0.0, index=1)
    failed.status, failed.error = "failed", "the server died"
    (verdict,) = verdicts([make_point({"concurrency": 1}, 95.0), failed])
    assert verdict.kind == "failed"
    assert verdict.sentence == (
        "no verdict: 1 of 2 points did not measure cleanly: concurrency=8 (failed: the server died)"
    )
    assert verdicts([make_point({"concurrency": 1}, 95.0)]) == []  # one point is no curve


def test_a_verdict_survives_the_results_file() -> None:
    low = point({"concurrency": 1}, 95.0, models={"gnn": (8.0, 2), "embed": (2.0, 1)})
    high = point({"concurrency": 16}, 245.0, models={"gnn": (8.0, 2), "embed": (2.0, 1)}, index=1)
    verdict = judge([low, high], "concurrency")
    assert Verdict.from_dict(json.loads(json.dumps(verdict.to_dict()))) == verdict


def test_a_stage_of_a_one_instance_model_is_never_a_lock_of_its_own() -> None:
    """A Ray Serve truth-table run: one replica of a CPU-bound deployment, its stage 43.6 ms
    alone and 52.7 ms with 4 in flight (the replica sharing 2 cores with the client and the
    proxy), 18/s at the plateau: 18 x 43.6 ms is 0.79 "one at a time", but a model of one
    instance serves one at a time already. The lock would be the instance, named as such."""

    def at(n: int, t: float, ms: float, index: int) -> Point:
        return point(
            {"concurrency": n},
            t,
            {"server compute": ms},
            models={"Busy": (ms + 3.0, 1)},
            index=index,
            stage_models={"server compute": "Busy"},
        )

    verdict = judge([at(1, 17.0, 43.6, 0), at(4, 18.0, 52.7, 1)], "concurrency")
    assert [e.key for e in verdict.evidence if e.kind == "lock"] == []
    assert (verdict.kind, verdict.resource, verdict.limit) == ("saturated", "instances", "Busy")
