"""Draining decisions over time, from counters given step by step (the real Triton's are in
test_envoy.py): the thresholds, the time held, the hysteresis, never the whole fleet."""

from __future__ import annotations

import pytest

from otelkit.fleet._drain import Draining, read_counters

MS = 1e3  # µs per ms


def feed(
    drain: Draining, steps: list[dict[str, float | None]], start: float = 0.0
) -> list[set[str]]:
    """One reading a second: each step maps a server to its queue ms per execution over that
    second (one execution a second), or None when its metrics are unreadable."""
    totals = {name: 0.0 for name in steps[0]}
    out = []
    for i, step in enumerate(steps):
        readings: dict[str, tuple[float, float] | None] = {}
        for name, ms in step.items():
            if ms is None:
                readings[name] = None
                continue
            totals[name] += ms * MS
            readings[name] = (totals[name], float(i))
        out.append(drain.observe(readings, now=start + i))
    return out


def test_a_server_is_drained_only_after_its_queue_stays_long() -> None:
    drain = Draining(high_ms=100, window_s=1, sustain_s=2)
    hot = [{"a": 150.0, "b": 1.0}] * 5
    decided = feed(drain, hot)
    # readings at 0 s (a baseline), 1 s (150 ms: over), 2 s, 3 s: held 2 s -> drained
    assert decided == [set(), set(), set(), {"a"}, {"a"}]
    assert drain.saturation() == pytest.approx({"a": 150.0, "b": 1.0})
    brief = Draining(high_ms=100, window_s=1, sustain_s=2)
    assert feed(brief, [{"a": 150.0, "b": 1.0}] * 3 + [{"a": 10.0, "b": 1.0}] * 3)[-1] == set()


def test_it_comes_back_only_below_the_low_mark_held_and_does_not_flap() -> None:
    drain = Draining(high_ms=100, low_ms=40, window_s=1, sustain_s=1)
    steps = [{"a": 150.0, "b": 1.0}] * 3  # drained at 2 s
    steps += [{"a": 60.0, "b": 1.0}] * 4  # below high, above low: stays drained
    steps += [{"a": 30.0, "b": 1.0}] * 3  # below low, held 1 s: back
    steps += [{"a": 90.0, "b": 1.0}] * 3  # below high: stays back
    decided = feed(drain, steps)
    assert decided[2] == {"a"} and all(d == {"a"} for d in decided[2:8])
    assert decided[8] == set() and all(d == set() for d in decided[8:])
    assert drain.decisions == 2


def test_a_drained_server_without_executions_has_an_empty_queue() -> None:
    drain = Draining(high_ms=100, window_s=1, sustain_s=0)
    feed(drain, [{"a": 500.0, "b": 1.0}] * 2)
    assert drain.drained == {"a"}
    # no execution since (no new work): its saturation is 0, and it returns
    drain.observe({"a": (1000 * MS, 1.0), "b": (3 * MS, 3.0)}, now=3.0)
    assert drain.observe({"a": (1000 * MS, 1.0), "b": (4 * MS, 4.0)}, now=4.0) == set()


def test_the_whole_fleet_is_never_drained() -> None:
    drain = Draining(high_ms=100, window_s=1, sustain_s=0)
    assert feed(drain, [{"a": 500.0, "b": 500.0}] * 3)[-1] == set()
    assert drain.drained == {"a", "b"}  # both saturated, as the metric says; none taken out


def test_unreadable_metrics_keep_the_state_and_a_restart_starts_again() -> None:
    drain = Draining(high_ms=100, window_s=1, sustain_s=0)
    feed(drain, [{"a": 500.0, "b": 1.0}] * 2)
    assert drain.observe({"a": None, "b": (5 * MS, 5.0)}, now=5.0) == {"a"}
    # counters back at zero (the server restarted): a fresh window, no bogus negative rate
    assert drain.observe({"a": (0.0, 0.0), "b": (6 * MS, 6.0)}, now=6.0) == {"a"}
    assert drain.observe({"a": (10 * MS, 1.0), "b": (7 * MS, 7.0)}, now=7.0) == set()
    # a server that left the fleet is forgotten
    assert drain.observe({"b": (8 * MS, 8.0)}, now=8.0) == set() and drain.saturation().keys() == {
        "b"
    }


def test_bad_thresholds_are_refused() -> None:
    with pytest.raises(ValueError, match="low_ms < high_ms"):
        Draining(high_ms=100, low_ms=100)


def test_counters_are_summed_over_models() -> None:
    page = """# HELP nv_inference_queue_duration_us Cumulative inference queuing duration
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="a",version="1"} 1500
nv_inference_queue_duration_us{model="b",version="1"} 500
# HELP nv_inference_exec_count Number of model executions performed
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{model="a",version="1"} 3
nv_inference_exec_count{model="b",version="1"} 1
"""
    assert read_counters(page) == (2000.0, 4.0)
