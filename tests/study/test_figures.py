"""The figures across points and the verdicts, on synthetic points whose answers are known."""

from __future__ import annotations

import pytest

from otelkit.analysis.breakdown import CLIENT_OTHER, NETWORK, SERVER_OTHER, SERVER_QUEUE
from otelkit.study import StudyResults, derived
from otelkit.study.attribution import attribute, verdicts
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
        "record": "derived", "figure": "throughput_n_over_l", "curve": "concurrency=4",
        "axis": "batch_size", "at": 1, "value": pytest.approx(500.0),
        "estimate": "derived: N/ℓ, the batch over the mean latency, what the server gives with "
        "one request in flight; measured_items_per_s is what was measured",
        "latency_ms": pytest.approx(2.0, rel=0.005), "measured_items_per_s": 2000.0,
    }  # fmt: skip
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


def nersc_curve() -> list:
    """NERSC's finding: graph building slows down under load, the other stages do not."""
    stages = {"server embed": 0.8, "server filter": 2.2, "server gnn": 12.0}
    graph = [(1, 1.8, 60.0), (2, 2.5, 110.0), (4, 4.0, 145.0), (8, 5.6, 150.0)]
    return [
        make_point(
            {"concurrency": n}, t, {**stages, "server build_graph": ms, SERVER_QUEUE: 0.1}, index=i
        )
        for i, (n, ms, t) in enumerate(graph)
    ]


def test_a_stage_that_grows_with_load_is_named_contended_in_nerscs_words() -> None:
    (verdict,) = verdicts(nersc_curve(), unit="event")
    assert verdict.kind == "contended"
    assert verdict.limit == "build_graph"
    assert verdict.sentence == (
        "build_graph: 1.8 → 5.6 ms per event from 1 to 8 threads (×3.1) while the other stages "
        "stay within ±10 %: throughput plateaus at 150 events/s because build_graph is contended"
    )
    # the growth of every component, from the lowest point to each higher one
    assert set(verdict.growth) == {"concurrency=2", "concurrency=4", "concurrency=8"}
    top = {g.component: (g.low_ms, g.high_ms) for g in verdict.growth["concurrency=8"]}
    assert top["server build_graph"] == (1.8, 5.6)
    assert top["server gnn"] == (12.0, 12.0)


def test_a_growing_queue_with_flat_stages_is_saturation_at_the_least_capacity() -> None:
    # embed: 2 ms, 1 instance -> 500/s; gnn: 12 ms, 2 instances, 1.5 requests an execution
    # -> 250/s: gnn limits, though embed's share per instance is smaller
    stage_models = {"server embed": "embed", "server gnn": "gnn"}
    low = make_point(
        {"concurrency": 1},
        70.0,
        {"server embed": 2.0, "server gnn": 12.0, SERVER_QUEUE: 0.2},
        stage_models=stage_models,
    )
    triton = {
        "embed": figures(2.0, instances=1),
        "gnn": figures(12.0, per_execution=1.5, instances=2),
    }
    high = make_point(
        {"concurrency": 16},
        245.0,
        {"server embed": 2.1, "server gnn": 12.5, SERVER_QUEUE: 40.0},
        stage_models=stage_models,
        triton=triton,
        index=1,
    )
    verdict = attribute([low, high], "concurrency", unit="event")
    assert verdict.kind == "saturated"
    assert verdict.limit == "gnn"
    assert verdict.sentence == (
        "server queue: 0.2 → 40.0 ms per event from 1 to 16 threads while the stages stay within "
        "±10 %: the servers are saturated; throughput reaches 245 events/s, the capacity of gnn "
        "(250 events/s)"
    )


def test_an_ensemble_is_never_the_capacity_limit_its_slowest_step_is() -> None:
    # Triton's ensemble "tracking" runs embed then gnn; its compute time spans both steps
    # (14 ms), but the steps run as a pipeline in models of their own: gnn (12 ms, one
    # instance) caps throughput at 83 events/s, not the ensemble's 1 / 14 ms = 71
    stage_models = {"server embed": "embed", "server gnn": "gnn"}
    low = make_point({"concurrency": 1}, 60.0, {"server embed": 2.0, "server gnn": 12.0,
                     SERVER_QUEUE: 0.2}, stage_models=stage_models)  # fmt: skip
    triton = {
        "tracking": figures(14.0, 0.0, instances=None, ensemble=True),
        "embed": figures(2.0, instances=1),
        "gnn": figures(12.0, instances=1),
    }
    high = make_point({"concurrency": 8}, 80.0, {"server embed": 2.1, "server gnn": 12.2,
                      SERVER_QUEUE: 60.0}, stage_models=stage_models, triton=triton,
                      index=1)  # fmt: skip
    verdict = attribute([low, high], "concurrency", unit="event")
    assert verdict.kind == "saturated" and verdict.limit == "gnn"
    assert verdict.sentence.endswith("the capacity of gnn (83 events/s)")
    assert triton["tracking"].capacity_per_s() is None


def test_the_capacity_is_read_where_throughput_peaks_not_where_it_collapsed() -> None:
    # one gnn instance: 20 ms -> 50 events/s at 2 threads, where throughput peaks at 46; at 8
    # threads two processes thrash on the cores, gnn's compute grows to 45 ms and throughput
    # falls to 21. Read there, the capacity (22/s) would be below the 46/s reached.
    stage_models = {"server gnn": "gnn"}
    curve = [(1, 30.0, 20.0, 0.2), (2, 46.0, 20.0, 20.0), (8, 21.0, 45.0, 300.0)]
    points = [
        make_point(
            {"concurrency": n},
            t,
            {"server gnn": ms, SERVER_QUEUE: queue},
            stage_models=stage_models,
            triton={"gnn": figures(ms, queue, instances=1)},
            index=i,
        )
        for i, (n, t, ms, queue) in enumerate(curve)
    ]
    verdict = attribute(points, "concurrency", unit="event")
    assert (verdict.kind, verdict.limit) == ("saturated", "gnn")
    assert verdict.sentence.endswith(
        "the servers are saturated; throughput peaks at 46 events/s (2 threads) and falls to 21 "
        "at 8, the capacity of gnn (50 events/s)"
    )
    # Triton's counters alone say the same
    bare = [make_point(p.params, p.throughput, triton=p.triton, index=i)
            for i, p in enumerate(points)]  # fmt: skip
    assert attribute(bare, "concurrency", unit="event").sentence.endswith(
        "throughput peaks at 46 events/s (2 threads) and falls to 21 at 8, the capacity of gnn "
        "(50 events/s)"
    )


def test_growth_on_the_clients_side_says_the_client_limits() -> None:
    low = make_point({"rate": 100}, 100.0, {NETWORK: 0.5, CLIENT_OTHER: 0.2, "server m": 1.0})
    high = make_point(
        {"rate": 800}, 420.0, {NETWORK: 6.0, CLIENT_OTHER: 0.3, "server m": 1.05}, index=1
    )
    verdict = attribute([low, high], "rate")
    assert (verdict.kind, verdict.limit) == ("client", NETWORK)
    assert verdict.sentence.startswith(
        "network + offload: 0.5 → 6.0 ms per request from 100 to 800 requests/s (×12.0) while "
        "the stages stay within ±10 %"
    )


def test_growth_outside_the_stages_blames_the_servers_own_work() -> None:
    low = make_point({"concurrency": 1}, 90.0, {SERVER_OTHER: 1.0, "server m": 9.0})
    high = make_point({"concurrency": 4}, 110.0, {SERVER_OTHER: 20.0, "server m": 9.1}, index=1)
    verdict = attribute([low, high], "concurrency")
    assert (verdict.kind, verdict.limit) == ("contended", SERVER_OTHER)


def test_flat_time_per_request_means_nothing_caps_throughput_yet() -> None:
    low = make_point({"concurrency": 1}, 100.0, {"server m": 9.0, SERVER_QUEUE: 0.1})
    high = make_point({"concurrency": 2}, 198.0, {"server m": 9.3, SERVER_QUEUE: 0.2}, index=1)
    verdict = attribute([low, high], "concurrency")
    assert verdict.kind == "rising"
    assert "nothing caps it within the sweep" in verdict.sentence


def test_along_instances_the_verdict_follows_epsilon() -> None:
    comps = {"server m": 10.0, SERVER_QUEUE: 30.0}
    pays = [
        make_point({"instances": 1}, 95.0, comps),
        make_point({"instances": 2}, 186.0, {"server m": 10.1, SERVER_QUEUE: 10.0}, index=1),
    ]
    assert attribute(pays, "instances").sentence == (
        "throughput 95 → 186 requests/s from 1 to 2 instances (ε = 0.98): more instances pay"
    )
    idle = [
        make_point({"instances": 1, "concurrency": 1}, 95.0, {"server m": 10.0}),
        make_point({"instances": 2, "concurrency": 1}, 94.0, {"server m": 10.2}, index=1),
    ]
    assert attribute(idle, "instances").kind == "underloaded"
    shared = [
        make_point({"instances": 1}, 95.0, {"server m": 10.0, SERVER_QUEUE: 30.0}),
        make_point({"instances": 2}, 120.0, {"server m": 16.0, SERVER_QUEUE: 8.0}, index=1),
    ]
    found = attribute(shared, "instances")
    assert (found.kind, found.limit) == ("contended", "m")
    busy = [
        make_point({"instances": 1}, 95.0, {"server m": 10.0, SERVER_QUEUE: 30.0}),
        make_point(
            {"instances": 2},
            150.0,
            {"server m": 10.5, SERVER_OTHER: 1.5, SERVER_QUEUE: 12.0},
            index=1,
        ),
    ]
    found = attribute(busy, "instances")
    assert (found.kind, found.limit) == ("contended", SERVER_OTHER)
    assert found.sentence.endswith(
        "(ε = 0.79) while requests still queue 12.0 ms for an instance: the instances are busy "
        "and slow each other down (a shared CPU, GPU or memory bandwidth)"
    )


def test_without_traces_tritons_counters_decide() -> None:
    low = make_point({"concurrency": 1}, 95.0, triton={"m": figures(10.0, 0.1)})
    high = make_point(
        {"concurrency": 8}, 99.0, triton={"m": figures(10.1, 70.0, instances=1)}, index=1
    )
    verdict = attribute([low, high], "concurrency")
    assert (verdict.kind, verdict.limit) == ("saturated", "m")
    assert verdict.sentence.endswith("the capacity of m (99 requests/s)")
    bare = [make_point({"concurrency": 1}, 95.0), make_point({"concurrency": 8}, 99.0, index=1)]
    assert attribute(bare, "concurrency").kind == "unknown"


def test_failed_points_and_single_points_make_no_curve() -> None:
    failed = make_point({"concurrency": 8}, 0.0, index=1)
    failed.status = "failed"
    assert verdicts([make_point({"concurrency": 1}, 95.0), failed]) == []
