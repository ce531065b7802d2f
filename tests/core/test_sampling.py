"""The rate-limiting sampler: at most N new traces per second, whatever the load."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.sampling import ParentBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

import otelkit
from otelkit import ConfigError
from otelkit._core.sampling import RateLimitingSampler
from otelkit.analysis import load_spans

RATE = 50.0
SECONDS = 10.0
THREADS = 256


def test_the_rate_holds_within_10_percent_over_10_s_under_256_threads(tmp_path: Path) -> None:
    telemetry = otelkit.configure(
        service_name="rate-limited",
        traces_dir=str(tmp_path),
        sampler="ratelimiting",
        sampler_arg=RATE,
        bsp_schedule_delay_ms=200,
    )
    tracer = trace.get_tracer("rate-test")
    started = threading.Barrier(THREADS + 1)
    stop = threading.Event()
    attempts = [0] * THREADS

    def load(index: int) -> None:
        started.wait()
        while not stop.is_set():
            tracer.start_span("call").end()
            attempts[index] += 1

    threads = [threading.Thread(target=load, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    started.wait()
    began = time.monotonic()
    time.sleep(SECONDS)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - began
    otelkit.flush()
    sampled = len(load_spans(tmp_path))
    otelkit.shutdown()
    assert sum(attempts) > 20 * RATE * SECONDS  # the load was far above the limit
    assert abs(sampled - RATE * elapsed) <= 0.1 * RATE * elapsed, (sampled, elapsed)
    assert telemetry.stats()["exported"] == sampled


def remote_parent(sampled: bool) -> trace.Span:
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return NonRecordingSpan(SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=flags))


def test_the_parent_based_form_follows_the_parent_and_limits_roots() -> None:
    clock = iter(float(t) for t in range(100)).__next__  # one second per decision
    sampler = ParentBased(RateLimitingSampler(1.0, clock=lambda: 0.0))
    parent = trace.set_span_in_context(remote_parent(sampled=True))
    unsampled = trace.set_span_in_context(remote_parent(sampled=False))
    decisions = [sampler.should_sample(None, 1, "root").decision.is_sampled() for _ in range(3)]
    assert decisions == [True, False, False]  # the one credit is spent; the clock stands still
    assert all(sampler.should_sample(parent, 1, "c").decision.is_sampled() for _ in range(50))
    assert not any(sampler.should_sample(unsampled, 1, "c").decision.is_sampled() for _ in range(5))
    ticking = RateLimitingSampler(1.0, clock=clock)
    assert [ticking.should_sample(None, 1, "r").decision.is_sampled() for _ in range(4)] == [
        True,
        True,
        True,
        True,
    ]


def test_a_burst_after_idle_is_capped_at_one_second_of_credit() -> None:
    now = [0.0]
    sampler = RateLimitingSampler(5.0, clock=lambda: now[0])
    now[0] = 60.0  # a minute idle earns at most five credits
    burst = [sampler.should_sample(None, 1, "r").decision.is_sampled() for _ in range(8)]
    assert burst == [True] * 5 + [False] * 3


def test_it_is_configured_by_name_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_ratelimiting")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "25")
    telemetry = otelkit.configure(service_name="by-env", traces_dir=str(tmp_path))
    try:
        description = telemetry.tracer_provider.sampler.get_description()
        assert description.startswith("ParentBased{root:RateLimitingSampler{25/s}")
    finally:
        otelkit.shutdown()


@pytest.mark.parametrize(
    ("sampler", "arg", "expected"),
    [
        ("ratelimiting", 0.0, "traces per second, above 0, for ratelimiting"),
        ("parentbased_ratelimiting", 0.0, "traces per second, above 0"),
        ("traceidratio", 2.0, "a ratio from 0 to 1 for traceidratio"),
    ],
)
def test_a_sampler_argument_that_makes_no_sense_is_refused(
    sampler: str, arg: float, expected: str
) -> None:
    with pytest.raises(ConfigError, match=expected):
        otelkit.configure(sampler=sampler, sampler_arg=arg)


@pytest.mark.parametrize("sampler", ["parentbased_traceidratio", "traceidratio"])
def test_what_runs_beneath_a_root_the_ratio_turned_down_is_not_sampled_on_its_own(
    sampler: str, tmp_path: Path
) -> None:
    """A stage whose root decision is 'no' keeps its ids current: the stages beneath it, and
    a call made inside, see an unsampled parent (the same trace id) instead of no parent, so no
    trace holds a child without its root (before: about half of the unsampled roots' children
    came out as traces of their own)."""
    otelkit.configure(
        service_name="ratio", traces_dir=str(tmp_path), sampler=sampler, sampler_arg=0.5
    )
    beneath: list[trace.SpanContext] = []
    try:
        for _ in range(200):
            with otelkit.stage("root"), otelkit.stage("child"):
                beneath.append(trace.get_current_span().get_span_context())
        otelkit.flush()
    finally:
        otelkit.shutdown()
    spans = load_spans(tmp_path)
    roots = {s.span_id for s in spans if s.name == "root" and s.parent_span_id is None}
    children = [s for s in spans if s.name == "child"]
    assert 60 < len(roots) < 140  # the ratio: about 100 of 200
    assert all(child.parent_span_id in roots for child in children)
    assert len(children) == len(roots)
    assert all(context.is_valid for context in beneath)
    assert sum(context.trace_flags.sampled for context in beneath) == len(roots)
