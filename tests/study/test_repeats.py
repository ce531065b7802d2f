"""A point measured several times, the sweep's passes interleaved (``Load(repeats=...)``): the
order of the measurements, the merge of the repeats, and the noise that their spread gives."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from otelkit.study import Endpoint, Load, Point, Remote, Study, Tracing, read_results
from otelkit.study._capacity import resources, separation, spread
from otelkit.study._counters import HostUsage
from otelkit.study._falsify import noise
from otelkit.study._point import LatencyHistogram, Window
from otelkit.study._repeats import merge_repeats
from tests.study.conftest import figures


def repeat(requests: int, seconds: float, compute_ms: float, busy: float, cpu_s: float) -> Point:
    """One repeat of a point, its windows read at their edges."""
    histogram = LatencyHistogram()
    histogram.add_many([0.010] * requests)
    parts = [
        Window(
            requests / seconds,
            10.0,
            10.0,
            requests=requests // 2,
            seconds=seconds / 2,
            cpu_s=cpu_s / 2,
            busy_cores=busy,
            triton={"m": figures(compute_ms, requests=requests // 2, instances=1)},
        )
        for _ in range(2)
    ]
    return Point(
        0,
        {"concurrency": 4},
        requests=requests,
        seconds=seconds,
        histogram=histogram,
        windows=parts,
        cpu_s=cpu_s,
        triton={"m": figures(compute_ms, requests=requests, instances=1)},
        host=HostUsage(2, busy, None, seconds, idle_cores=0.1),
        sampled=3,
    )


def test_repeats_merge_into_one_point_whose_windows_are_its_repeats() -> None:
    one, two = repeat(100, 1.0, 8.0, 0.5, 0.2), repeat(300, 2.0, 4.0, 1.5, 0.9)
    merged = merge_repeats([one, two])
    assert (merged.requests, merged.seconds, merged.repeats) == (400, 3.0, 2)
    assert merged.throughput == pytest.approx(400 / 3.0)
    assert merged.histogram.count == 400 and merged.sampled == 6
    assert merged.cpu_s == pytest.approx(1.1)
    # Triton's time per request weighted by requests, counts added
    model = merged.triton["m"]
    assert model.requests == 400 and model.executions == 400
    assert model.compute_infer_ms == pytest.approx((100 * 8.0 + 300 * 4.0) / 400)
    # the host's rates weighted by seconds
    assert merged.host is not None and merged.host.seconds == 3.0
    assert merged.host.busy_cores == pytest.approx((0.5 * 1.0 + 1.5 * 2.0) / 3.0)
    assert merged.host.idle_cores == pytest.approx(0.1) and merged.host.server_cores is None
    # one window a repeat, with what was read over it: each is a point of its own to spread
    assert [w.throughput for w in merged.windows] == [100.0, 150.0]
    assert [(w.requests, w.seconds, w.cpu_s) for w in merged.windows] == [
        (100, 1.0, pytest.approx(0.2)),
        (300, 2.0, pytest.approx(0.9)),
    ]
    assert [w.busy_cores for w in merged.windows] == [0.5, 1.5]
    assert [w.triton["m"].compute_infer_ms for w in merged.windows] == [8.0, 4.0]
    cores = spread(merged)["host cores"]
    assert not cores.reason and len(cores.demands_ms) == 2
    # and the merged point reads back from its file as it was written
    assert Point.from_dict(merged.to_dict()).to_dict() == merged.to_dict()


def test_a_failed_repeat_fails_the_point_and_errors_are_shared_over_all() -> None:
    good = repeat(1000, 1.0, 8.0, 0.5, 0.2)
    failed = Point(0, {"concurrency": 4}, status="failed", error="the server died")
    assert merge_repeats([good, failed]).status == "failed"
    erring = repeat(1000, 1.0, 8.0, 0.5, 0.2)
    erring.errors = {"timeout": 15}  # 1.5 % of one repeat, 0.75 % of both
    assert merge_repeats([good, erring], max_error_share=0.01).status == "ok"
    assert merge_repeats([erring, erring], max_error_share=0.01).status == "errors"


def test_repeats_that_disagree_widen_the_noise_and_agreeing_ones_do_not() -> None:
    """The spread between repeats, not within one, is what a state lasting a point shows."""
    same = merge_repeats([repeat(500, 1.0, 8.0, 1.0, 0.2) for _ in range(3)])
    apart = merge_repeats([repeat(n, 1.0, 8.0, 1.0, 0.2) for n in (500, 280, 520)])
    assert noise(same) == pytest.approx(0.02)  # the floor: three equal repeats
    assert noise(apart) > 0.3
    # two resources' utilisations are paired repeat by repeat: their difference's interval
    # is as wide as the repeats disagree
    gaps = []
    for point in (same, apart):
        both = spread(point)
        gaps.append(separation(both["host cores"], both["model m"]))
    assert [gap.windows for gap in gaps] == [3, 3]
    assert gaps[0].high - gaps[0].low == pytest.approx(0, abs=1e-9)
    assert gaps[1].high - gaps[1].low > 0.5


def test_a_study_interleaves_its_passes_and_reads_each_points_traces_once(
    tmp_path: Path,
) -> None:
    """Two points, three repeats: measured 0, 1, 0, 1, 0, 1; a request of the second pass
    takes twice as long as the others (a state lasting a point), which the merged point's
    windows show; the traces of every repeat are read once, after the last."""
    order: list[tuple[int, int]] = []
    opened = threading.Lock()

    def factory(params: Mapping[str, Any], endpoint: Endpoint) -> Any:
        with opened:
            turn = len(order)
            order.append((params["point"], turn))
        sleep_s = 0.010 if turn // 2 == 1 else 0.005
        return lambda index: time.sleep(sleep_s)

    out = tmp_path / "study.jsonl"
    results = Study(
        request=factory,
        server=Remote("127.0.0.1:1"),
        sweep={"point": [0, 1]},
        load=Load(concurrency=2, seconds=0.8, warmup_s=0.2, repeats=3),
        tracing=Tracing(per_second=40),
        out=out,
        progress=False,
    ).run()
    assert [p for p, _ in order] == [0, 1, 0, 1, 0, 1]
    assert results.status == "complete"
    for point in results.points:
        assert point.repeats == 3 and len(point.windows) == 3
        fast, slow, again = (w.throughput for w in point.windows)
        assert slow < 0.7 * min(fast, again), point.windows
        assert point.throughput == pytest.approx(point.requests / point.seconds)
        assert point.seconds == pytest.approx(3 * 0.8, rel=0.1)
        # every repeat's sampled requests are read, once
        assert point.traces is not None and point.sampled > 3 * 10
        assert point.traces.traces + point.traces.incomplete == point.sampled
        assert point.traces.traces >= 0.9 * point.sampled
        assert noise(point) > 0.2
    assert results.header["load"]["repeats"] == 3
    back = read_results(out)
    assert [p.repeats for p in back.points] == [3, 3]
    assert [p.throughput for p in back.points] == [p.throughput for p in results.points]


def test_repeats_are_checked_up_front() -> None:
    assert Load(repeats=3).problems() == []
    assert "repeats is how often each point is measured" in Load(repeats=0).problems()[0]
    assert Load(repeats=2.5).problems()  # type: ignore[arg-type]
    # the resources of a merged point are those of its repeats
    merged = merge_repeats([repeat(500, 1.0, 8.0, 1.0, 0.2)] * 3)
    assert set(resources(merged)) >= {"host cores", "model m"}
