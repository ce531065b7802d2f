"""What a study records and reads back: histograms, Triton's counters, the results file, the
comparison of two files, parts merged, sweeps checked, repositories rewritten."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from otelkit._errors import StudyError
from otelkit.study import Load, merge_parts, read_results
from otelkit.study._counters import RECORDED, difference, parse
from otelkit.study._point import LatencyHistogram, Point, Window
from otelkit.study._results import ResultsWriter, StudyResults, compare, format_comparison, interval
from otelkit.study._runner import check, expand
from otelkit.study._servers import set_instance_count, stage_repository
from otelkit.study._workload import inputs_from_metadata
from tests.study.conftest import STUDY_MODELS, figures, make_point


def test_histogram_percentiles_stay_within_half_a_percent_and_merge_exactly() -> None:
    rng = random.Random(1)
    a = [rng.lognormvariate(-4.0, 0.8) for _ in range(5000)]
    b = [rng.lognormvariate(-3.0, 0.3) for _ in range(3000)]
    left, right = LatencyHistogram(), LatencyHistogram()
    left.add_many(a)
    right.add_many(b)
    merged = left.merged(LatencyHistogram.from_dict(json.loads(json.dumps(right.to_dict()))))
    both = sorted(a + b)
    for q in (0.5, 0.9, 0.99):
        exact = both[int(q * len(both)) - 1]
        assert merged.quantile(q) == pytest.approx(exact, rel=0.006)
    assert (merged.count, merged.max_s, merged.min_s) == (8000, max(both), min(both))
    assert merged.mean_s == pytest.approx(sum(both) / len(both))
    with pytest.raises(ValueError, match="other buckets"):
        LatencyHistogram.from_dict({**right.to_dict(), "ratio": 1.1})


PAGE = """\
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="gnn",version="1"} 1000
nv_inference_request_success{model="gnn",version="2"} 200
nv_inference_request_success{model="idle",version="1"} 5
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="gnn",reason="BACKEND",version="1"} 3
# TYPE nv_inference_count counter
nv_inference_count{model="gnn",version="1"} 4800
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{model="gnn",version="1"} 300
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="gnn",version="1"} 6000000
# TYPE nv_inference_compute_infer_duration_us counter
nv_inference_compute_infer_duration_us{model="gnn",version="1"} 12000000
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="gnn",version="1"} 7
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-1"} 0.85
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-1"} 7516192768
"""


def test_tritons_counters_become_figures_per_request_and_execution() -> None:
    before = parse(
        RECORDED.replace('model="sleep"', 'model="gnn"')
        .replace(" 100", " 0")
        .replace(" 500000", " 0")
    )
    after = parse(PAGE)
    assert after.gpus == {"GPU-1": {"utilization": 0.85, "memory_used_bytes": 7516192768.0}}
    found = difference(before, after)
    assert set(found) == {"gnn", "idle"}  # summed over versions; idle had requests too
    gnn = found["gnn"]
    assert (gnn.requests, gnn.failures, gnn.inferences, gnn.executions) == (1200, 3, 4800, 300)
    assert gnn.queue_ms == 5.0  # 6 s over 1200 requests
    assert gnn.compute_ms == 10.0
    assert gnn.batch_size == 16.0  # inferences an execution
    assert gnn.requests_per_execution == 4.0
    assert gnn.saturation_ms == 20.0  # queue ms an execution, as SuperSONIC's
    assert gnn.capacity_per_s(2) == 800.0  # 2 instances x 4 requests / 10 ms
    assert gnn.pending == 7.0
    # a counter that went down (a model reloaded) counts from zero
    reset = difference(after, parse(PAGE.replace(" 1000\n", " 10\n")))
    assert reset["gnn"].requests == 210


def test_results_file_holds_points_then_the_derived_table_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "study.jsonl"
    results = StudyResults({"unit": "event", "tolerance": 0.1}, [])
    with ResultsWriter(path, results.header) as writer:
        for index, (n, t) in enumerate([(1, 100.0), (2, 190.0), (4, 200.0)]):
            point = make_point(
                {"instances": n, "concurrency": 4},
                t,
                {"server m": 10.0},
                index=index,
                triton={"m": figures(10.0)},
            )
            point.windows = [Window(t, 10.0, 12.0)] * 10
            results.points.append(point)
            writer.point(point)
        results.derive()
        writer.finish(results)
    kinds = [json.loads(line)["record"] for line in path.read_text().splitlines()]
    assert kinds[:4] == ["study", "point", "point", "point"]
    assert kinds[-1] == "end"
    assert set(kinds[4:-1]) == {"derived", "verdict"}
    back = read_results(path)
    assert back.header == {"unit": "event", "tolerance": 0.1}
    assert [p.to_dict() for p in back.points] == [p.to_dict() for p in results.points]
    assert back.derived == results.derived
    assert back.verdicts == results.verdicts
    assert back.status == "complete"
    assert [round(r.value, 2) for r in back.figure("efficiency")] == [1.0, 0.95, 0.5]
    assert back.point(instances=2).throughput == 190.0
    summary = back.summary()
    assert "instances=2 concurrency=4" in summary and "efficiency [concurrency=4]" in summary
    # a study killed mid-write: the points written so far, status incomplete
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(path.read_text().splitlines()[:3]) + '\n{"record": "po')
    partial = read_results(cut)
    assert (len(partial.points), partial.status) == (2, "incomplete")


def test_compare_gives_each_change_an_interval(tmp_path: Path) -> None:
    rng = random.Random(2)

    def study(shift: float) -> StudyResults:
        point = make_point({"concurrency": 4}, 100.0 + shift)
        point.windows = [
            Window(
                100.0 + shift + rng.gauss(0, 2), 10.0 + rng.gauss(0, 0.2), 12.0 + rng.gauss(0, 0.3)
            )
            for _ in range(10)
        ]
        other = make_point({"concurrency": 8}, 150.0, index=1)
        return StudyResults({}, [point] if shift else [point, other])

    differences, unmatched = compare(study(0.0), study(10.0))
    assert unmatched == ["concurrency=8"]
    by_figure = {d.figure: d for d in differences}
    throughput = by_figure["throughput"]
    assert throughput.change == pytest.approx(10.0)
    assert throughput.low < 10.0 < throughput.high
    assert throughput.significant and throughput.low > 5.0
    assert not by_figure["p50_ms"].significant  # same latency, within noise
    text = format_comparison(differences, unmatched)
    assert "concurrency=4: throughput 100.00 → 110.00/s (+10.00, 95 % interval" in text
    assert "): higher" in text and "no significant change" in text
    assert "concurrency=8: measured in one file only" in text
    # Welch's interval on known samples; one sample a side gives no interval
    low, high = interval([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert (round(low, 2), round(high, 2)) == (0.73, 5.27)  # 3 ± t(0.975, 4) * 0.816
    assert interval([1.0], [2.0]) == (float("-inf"), float("inf"))


def test_parts_merge_into_one_point_from_all_requests() -> None:
    a, b = make_point({"concurrency": 2}, 100.0), make_point({"concurrency": 2}, 50.0)
    b.histogram = LatencyHistogram()
    b.histogram.add_many([0.030] * 500)
    a.errors, b.errors = {"TimeoutError": 2}, {"TimeoutError": 1, "ConnectionError": 4}
    merged = merge_parts([a, b])
    assert merged.throughput == 150.0
    assert merged.histogram.count == 600
    assert merged.latency_ms(0.5) == pytest.approx(30.0, rel=0.005)  # 500 of 600 at 30 ms
    assert merged.latency_ms(0.1) == pytest.approx(10.0, rel=0.005)
    assert merged.errors == {"TimeoutError": 3, "ConnectionError": 4}
    assert merged.parts == 2


def test_merged_parts_keep_their_requests_and_add_their_throughputs() -> None:
    # 400 requests over 4 s and 300 over 5 s: 700 requests, 100 + 60 a second
    a = Point(0, {"concurrency": 2}, requests=400, seconds=4.0)
    b = Point(0, {"concurrency": 2}, requests=300, seconds=5.0)
    merged = merge_parts([a, b])
    assert (merged.requests, merged.seconds, merged.throughput) == (700, 5.0, 160.0)
    back = Point.from_dict(json.loads(json.dumps(merged.to_dict())))
    assert (back.requests, back.throughput, back.to_dict()) == (700, 160.0, merged.to_dict())


def test_merged_parts_are_judged_on_all_their_failed_requests() -> None:
    a, b = make_point({"concurrency": 2}, 100.0), make_point({"concurrency": 2}, 100.0)
    a.errors, a.error_samples = {"TimeoutError": 1}, {"TimeoutError": "no answer in 1 s"}
    b.errors, b.error_samples = {"ConnectionError": 3}, {"ConnectionError": "refused"}
    a.failed_histogram.add_many([1.0])
    b.failed_histogram.add_many([0.5] * 3)
    a.check_errors(0.01)  # 1 of 101 measured requests
    assert (a.status, a.error_share) == ("ok", pytest.approx(1 / 101))
    merged = merge_parts([a, b], max_error_share=0.01)  # 4 of 204
    assert (merged.status, merged.error) == (
        "errors",
        "2.0 % of the measured requests failed (4 of 204), most ConnectionError (refused)",
    )
    assert merged.failed_histogram.count == 4
    assert merged.latency_ms(0.99) == pytest.approx(10.0, rel=0.005)  # the successful
    assert merged.all_requests_ms(0.99) == pytest.approx(500.0, rel=0.005)  # and the failed
    assert merge_parts([a, b], max_error_share=0.05).status == "ok"
    written = json.loads(json.dumps(merged.to_dict()))
    assert Point.from_dict(written).to_dict() == written
    del written["failed_histogram"]  # a file written before failed requests were timed
    assert Point.from_dict(written).failed_histogram.count == 0


def test_sweeps_expand_and_name_the_point_that_makes_no_sense() -> None:
    assert expand({"instances": [1, 2], "concurrency": [1, 4]})[1] == {
        "instances": 1,
        "concurrency": 4,
    }
    assert expand([{"concurrency": 2, "instances": 2}]) == [{"concurrency": 2, "instances": 2}]
    assert expand(None) == [{}]
    cases = [
        (
            {"concurrency": [1, "many"]},
            "point concurrency=many: concurrency is the number of "
            "requests in flight, 1 to 1000, not 'many'",
        ),
        (
            {"instances": [1, 0]},
            "point instances=0: instances is a whole number of model instances, 1 to 256, not 0",
        ),
        ({"rate": [10.0, -5.0]}, "point rate=-5.0: rate is requests per second, above 0"),
        ({"batch_size": [2.5]}, "point batch_size=2.5: batch_size is a whole number"),
        (
            {"colour": ["red"]},
            "point colour=red: nothing in this study takes the parameter "
            "'colour' (it takes: batch_size, concurrency, instances, rate, "
            "server)",
        ),
        ({"server": ["nope"]}, "point server=nope: no server labelled 'nope' (servers: twin)"),
        ({"concurrency": 3}, "sweep parameter 'concurrency' needs a list of values, not 3"),
    ]
    for sweep, message in cases:
        with pytest.raises(StudyError) as caught:
            check(
                expand(sweep),
                Load(),
                takers={"batch_size": "request", "instances": "server"},
                servers={"twin"},
            )
        assert message in str(caught.value)


def test_instance_counts_are_rewritten_in_a_linked_copy(tmp_path: Path) -> None:
    two_groups = (
        "instance_group [\n  { kind: KIND_GPU, count: 1, gpus: [0] },\n  { kind: KIND_GPU }\n]"
    )
    assert set_instance_count(two_groups, 3) == (
        "instance_group [\n  { kind: KIND_GPU, count: 3, gpus: [0] },\n"
        "  { count: 3, kind: KIND_GPU }\n]"
    )
    stage_repository(STUDY_MODELS, tmp_path / "repo", {"fixed_fp32": 2})
    model = tmp_path / "repo" / "fixed_fp32"
    assert "count: 2" in (model / "config.pbtxt").read_text()
    assert "count: 1" in (STUDY_MODELS / "fixed_fp32" / "config.pbtxt").read_text()
    assert (model / "1").is_symlink() and (model / "1" / "model.py").is_file()


def test_inputs_follow_the_models_metadata() -> None:
    metadata = {
        "inputs": [
            {"name": "HITS", "datatype": "FP32", "shape": [-1, -1, 3]},
            {"name": "ID", "datatype": "INT64", "shape": [-1, 1]},
            {"name": "TAG", "datatype": "BYTES", "shape": [-1]},
        ]
    }
    arrays = inputs_from_metadata(metadata, max_batch_size=8, batch_size=4, free_dim=10)
    assert {k: (v.shape, v.dtype.name) for k, v in arrays.items()} == {
        "HITS": ((4, 10, 3), "float32"),
        "ID": ((4, 1), "int64"),
        "TAG": ((4,), "object"),
    }
    same = inputs_from_metadata(metadata, max_batch_size=8, batch_size=4, free_dim=10)
    assert (same["HITS"] == arrays["HITS"]).all()  # seeded: the same inputs run after run
    unbatched = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [16]}]}
    assert inputs_from_metadata(unbatched, max_batch_size=0)["X"].shape == (16,)
    with pytest.raises(ValueError, match="batches of at most 8"):
        inputs_from_metadata(metadata, max_batch_size=8, batch_size=64)
    with pytest.raises(ValueError, match="no batch dimension"):
        inputs_from_metadata(unbatched, max_batch_size=None, batch_size=2)
