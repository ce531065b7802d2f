"""The load driver and the study loop on requests that only sleep: timing, counting, Ctrl-C."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from tritonclient.utils import InferenceServerException

from otelkit import semconv
from otelkit.analysis import Span, SpanKind, load_spans
from otelkit.analysis._store import SegmentWriter
from otelkit.study import (
    Endpoint,
    Load,
    Point,
    Remote,
    Study,
    StudyResults,
    Tracing,
    compare,
    format_comparison,
    read_results,
)
from otelkit.study._drive import drive, drive_tasks, error_kind
from otelkit.study._traces import collect, segment_names
from otelkit.tritonserver import free_port


def sleeper(
    seconds: float,
    seen: list[tuple[float, bool]] | None = None,
    slept: list[tuple[float, bool, float]] | None = None,
) -> Any:
    """Requests that sleep ``seconds``; ``seen`` gets when each began, ``slept`` also how long
    its call took by its own clock."""

    def call(index: int, measured: bool) -> None:
        began = time.perf_counter()
        if seen is not None:
            seen.append((began, measured))
        time.sleep(seconds)
        if slept is not None:
            slept.append((began, measured, time.perf_counter() - began))

    return call


def spread_sleeper(mean_s: float, concurrency: int) -> Any:
    """Requests that sleep ``mean_s`` ± 20 % (drawn from the request's index); each thread's
    first request sleeps up to ``mean_s`` more, so the threads' completions spread out in time
    instead of arriving together, as a server's do."""

    def call(index: int, measured: bool) -> None:
        draw = random.Random(index)
        first = draw.uniform(0.0, mean_s) if index < concurrency else 0.0
        time.sleep(first + mean_s * draw.uniform(0.8, 1.2))

    return call


def two_kinds_of_thread(fast_s: float, slow_s: float, concurrency: int) -> Any:
    """Requests that sleep ``fast_s`` on half the threads and ``slow_s`` on the other half; a
    thread's first request sleeps a share of its time more, so that each half's completions
    come evenly spaced, as in a steady closed loop, not all at once."""
    local = threading.local()

    def call(index: int, measured: bool) -> None:
        service_s = getattr(local, "service_s", None)
        if service_s is None:  # the thread's first request (indices 0 to concurrency - 1)
            service_s = local.service_s = fast_s if index % 2 else slow_s
            time.sleep(service_s * (index // 2) / (concurrency // 2))
        time.sleep(service_s)

    return call


def test_closed_loop_keeps_concurrency_in_flight_and_leaves_the_warmup_out() -> None:
    seen: list[tuple[float, bool]] = []
    slept: list[tuple[float, bool, float]] = []
    opened: list[float] = []
    run = drive(
        sleeper(0.005, seen, slept),
        Load(concurrency=4, seconds=1.0, warmup_s=0.3),
        on_window_start=lambda: opened.append(time.perf_counter()),
    )
    mean = statistics.fmean(run.latencies_s)
    # Little's law: requests in flight = throughput x latency
    assert run.completed / run.window_s * mean == pytest.approx(4, rel=0.1)
    # a latency is the call's own time: at least its sleep, and beyond what the call itself took
    # (a loaded host oversleeps: 8.6 ms means for 5 ms seen in CI) by the driver's bookkeeping only
    took = [s for _, measured, s in slept if measured]
    assert min(run.latencies_s) >= 0.005
    assert statistics.median(run.latencies_s) - statistics.median(took) < 0.001
    assert run.window_s == pytest.approx(1.0, abs=0.05)
    warmup = [t for t, measured in seen if not measured]
    first_measured = min(t for t, m in seen if m)
    assert warmup and max(warmup) < first_measured
    # the hook runs when the driving thread wakes at the window's start: a worker may take the
    # first measured request a scheduler's latency before it (0.3 ms seen in a CI-like run)
    assert abs(opened[0] - first_measured) < 0.05
    assert len(run.latencies_s) == sum(1 for _, m in seen if m)
    assert run.errors == {} and run.stopped is None


def test_compare_finds_a_ten_percent_drop_in_throughput() -> None:
    # 64 in flight for 100 ms, then 110 ms: 640 then 582 requests/s. Requests half as long as a
    # tenth of the window once left the first tenth short of the warm-up's completions and
    # swelled the last with those ending after the close: their spread hid the drop.
    load = Load(concurrency=64, seconds=2.0, warmup_s=0.3)

    def measured(service_s: float) -> StudyResults:
        run = drive(spread_sleeper(service_s, load.concurrency), load)
        point = Point.from_run(0, {"concurrency": 64}, run, load.windows, batch_size=1)
        print([round(w.throughput) for w in point.windows])
        return StudyResults({}, [point])

    before, after = measured(0.100), measured(0.110)
    throughput = next(d for d in compare(before, after)[0] if d.figure == "throughput")
    print(format_comparison([throughput]))
    for results in (before, after):
        point = results.points[0]
        shares = [w.throughput / point.throughput for w in point.windows]
        assert [round(share, 1) for share in shares if abs(share - 1) > 0.15] == []
    assert throughput.change / throughput.before == pytest.approx(100 / 110 - 1, abs=0.02)
    assert throughput.significant and throughput.high < 0


def test_a_count_of_requests_gives_the_closed_loops_throughput() -> None:
    # c/2 threads sending 10 ms requests and c/2 sending 40 ms ones: c/2 × (1/s₁ + 1/s₂) a
    # second, whatever the count of requests. The window once ended at the last measured
    # request's end, the warm-up's stragglers counted in it: it then waited for the slowest
    # requests in flight, 5 % short at 16 in flight and 320 requests, 6 % at 32 and 640.
    ratios = []
    for concurrency, requests in ((16, 320), (32, 640)):
        load = Load(concurrency=concurrency, requests=requests, warmup_s=0.3)
        run = drive(two_kinds_of_thread(0.010, 0.040, concurrency), load)
        assert len(run.latencies_s) == requests
        # each kind's time as measured: 10 or 40 ms and the sleep's own overhead
        fast_s = statistics.fmean(s for s in run.latencies_s if s < 0.025)
        slow_s = statistics.fmean(s for s in run.latencies_s if s >= 0.025)
        expected = concurrency / 2 * (1 / fast_s + 1 / slow_s)
        ratios.append(run.completed / run.window_s / expected)
    print(f"throughput over c/2 × (1/s₁ + 1/s₂): {[round(r, 3) for r in ratios]}")
    assert ratios == pytest.approx([1.0, 1.0], abs=0.02)


def test_a_count_of_requests_is_measured_exactly() -> None:
    run = drive(sleeper(0.002), Load(concurrency=3, requests=50, warmup_s=0.1))
    assert len(run.latencies_s) == 50
    assert run.completed >= 47  # those completing in the window, warm-up stragglers included


def test_open_loop_sends_poisson_arrivals_at_the_rate_whatever_the_answers() -> None:
    seen: list[tuple[float, bool]] = []
    run = drive(sleeper(0.02, seen), Load(rate=200.0, seconds=1.5, warmup_s=0.2, seed=3))
    measured = sorted(t for t, m in seen if m)
    # 300 expected; a Poisson count's standard deviation is its root, 17
    assert 250 <= len(measured) <= 350
    gaps = [b - a for a, b in itertools.pairwise(measured)]
    assert statistics.fmean(gaps) == pytest.approx(1 / 200, rel=0.2)
    assert statistics.stdev(gaps) == pytest.approx(statistics.fmean(gaps), rel=0.3)  # exponential
    # 20 ms answers at 200/s: 4 in flight on average, never throttling the arrivals
    assert statistics.fmean(run.latencies_s) == pytest.approx(0.02, rel=0.25)


def test_failed_requests_are_counted_by_kind_and_too_many_stop_the_point() -> None:
    def flaky(index: int, measured: bool) -> None:
        time.sleep(0.001)
        if index % 3 == 0:
            raise InferenceServerException("busy", status="StatusCode.UNAVAILABLE")

    run = drive(flaky, Load(concurrency=2, seconds=0.5, warmup_s=0.1))
    failed = run.errors["InferenceServerException StatusCode.UNAVAILABLE"]
    assert failed == pytest.approx((failed + len(run.latencies_s)) / 3, rel=0.15)
    sample = run.error_samples["InferenceServerException StatusCode.UNAVAILABLE"]
    assert sample == "[StatusCode.UNAVAILABLE] busy"
    assert run.stopped is None

    def dead(index: int, measured: bool) -> None:
        raise ConnectionRefusedError(111, "Connection refused")

    started = time.monotonic()
    run = drive(dead, Load(concurrency=8, seconds=30.0, warmup_s=0.0, max_errors=200))
    assert time.monotonic() - started < 5
    assert run.stopped == "errors"
    assert sum(run.errors.values()) + run.warmup_failed >= 200
    assert error_kind(TimeoutError()) == "TimeoutError"


def test_ctrl_c_stops_every_thread() -> None:
    def interrupt(elapsed: float, done: int) -> None:
        if elapsed > 0.3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        drive(sleeper(0.01), Load(concurrency=16, seconds=30.0, warmup_s=0.1), progress=interrupt)
    assert not [t for t in threading.enumerate() if t.name.startswith("otelkit-study")]


@pytest.fixture
def ctrl_c() -> Iterator[threading.Event]:
    """SIGINT raises KeyboardInterrupt in the main thread, as in a terminal, and sets the event
    when it has: a pytest started as a script's background job inherits SIGINT ignored, and
    Python then raises nothing."""
    raised = threading.Event()

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raised.set()
        signal.default_int_handler(signum, frame)

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        yield raised
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_study_of_a_users_requests_sweeps_its_own_parameter_and_keeps_points_on_ctrl_c(
    tmp_path: Path, ctrl_c: threading.Event
) -> None:
    made: list[dict[str, Any]] = []

    def factory(params: Mapping[str, Any], endpoint: Endpoint) -> Any:
        made.append(dict(params))
        pause = 0.002 * (1 + params["option"])

        def request(index: int) -> None:
            if params["option"] == 2 and index == 0:  # Ctrl-C while the third point runs:
                os.kill(os.getpid(), signal.SIGINT)
                ctrl_c.wait(timeout=30)  # raised before this request, and the point, ends
            time.sleep(pause)

        return request

    out = tmp_path / "study.jsonl"
    study = Study(
        request=factory,
        server=Remote("127.0.0.1:1"),
        sweep={"option": [0, 1, 2, 3]},
        load=Load(concurrency=2, seconds=0.5, warmup_s=0.1),
        out=out,
        progress=False,
    )
    results = study.run()
    assert results.interrupted
    assert made == [{"option": 0}, {"option": 1}, {"option": 2}]
    assert [p.params for p in results.points] == [{"option": 0}, {"option": 1}]
    back = read_results(out)
    assert (back.status, len(back.points)) == ("interrupted", 2)
    # each request slept 2 ms, then 4 (the option reached it), so 2 in flight completed at
    # most once per sleep each (and one more at the window's edge), whatever a busy host added
    for point, pause_s in zip(back.points, (0.002, 0.004), strict=True):
        assert point.histogram.min_s >= pause_s
        assert 0 < point.throughput <= 2 * (1 / pause_s + 1 / point.seconds)


def test_a_point_with_many_failed_requests_is_marked_and_keeps_their_latencies(
    tmp_path: Path,
) -> None:
    def factory(params: Mapping[str, Any], endpoint: Endpoint) -> Any:
        every = {1: 0, 2: 400, 4: 10}[params["concurrency"]]  # 1 request in `every` fails

        def request(index: int) -> None:
            if every and index % every == 0:
                time.sleep(0.02)
                raise TimeoutError("no answer in 20 ms")
            time.sleep(0.002)

        return request

    out = tmp_path / "study.jsonl"
    results = Study(
        request=factory,
        server=Remote("127.0.0.1:1"),
        sweep={"concurrency": [1, 2, 4]},
        load=Load(seconds=0.6, warmup_s=0.1),
        out=out,
        progress=False,
    ).run()
    print(results.summary())
    assert [p.status for p in results.points] == ["ok", "ok", "errors"]  # the sweep went on
    few, many = results.points[1], results.points[2]
    assert 0 < few.error_share < 0.01 and many.error_share == pytest.approx(0.1, abs=0.01)
    share = f"{many.error_share * 100:.1f} %"
    measured = many.histogram.count + many.failed
    assert many.error == (
        f"{share} of the measured requests failed ({many.failed} of {measured}), "
        f"most TimeoutError (no answer in 20 ms)"
    )
    # the failed requests' latencies, apart from the successful ones' and with them
    assert many.failed_histogram.count == many.failed
    assert many.failed_histogram.quantile(0.5) >= 0.02 > many.latency_ms(0.99) / 1e3
    assert many.all_requests_ms(0.99) >= 20.0
    lines = {line.split()[0]: line for line in results.summary().splitlines()[1:4]}
    assert f"too many errors, left out of the figures below: {many.error}" in lines["concurrency=4"]
    assert "all requests, the failed too: p50 " in lines["concurrency=2"]
    assert "all requests" not in lines["concurrency=1"]
    # knees and verdicts from the points whose requests succeeded
    (knee,) = results.figure("knee")
    assert knee.detail["highest"] == max(p.throughput for p in results.points[:2])
    back = read_results(out)
    assert [p.to_dict() for p in back.points] == [p.to_dict() for p in results.points]
    assert Load(max_error_share=1.5).problems() == [
        "max_error_share is a share of the measured requests, 0 to 1, not 1.5"
    ]


def test_asyncio_tasks_keep_many_requests_in_flight_from_one_thread() -> None:
    async def request(index: int, measured: bool) -> None:
        await asyncio.sleep(0.02)

    threads = threading.active_count()
    seen_threads: set[int] = set()

    def progress(elapsed: float, done: int) -> None:
        seen_threads.add(threading.active_count())

    run = drive_tasks(
        request, Load(concurrency=200, seconds=1.0, warmup_s=0.2, asyncio=True), progress=progress
    )
    mean = statistics.fmean(run.latencies_s)
    assert run.completed / run.window_s * mean == pytest.approx(200, rel=0.1)  # Little
    assert mean < 0.03
    assert max(seen_threads) <= threads + 2  # the loop's thread and one helper for the hooks
    assert Load(rate=5.0, asyncio=True).problems() == [
        "an open loop (rate) runs on threads: asyncio goes with a concurrency"
    ]
    assert Load(concurrency=5000, asyncio=True).problems() == []


POSTER = """
import http.client, sys, time, urllib.parse
url, body = urllib.parse.urlsplit(sys.argv[1]), open(sys.argv[2], "rb").read()
deadline = time.monotonic() + float(sys.argv[3])
while time.monotonic() < deadline:
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    for _ in range(5):  # a new connection every 5 posts: the receiver's threads come and go
        connection.request("POST", url.path, body, {"Content-Type": "application/x-protobuf"})
        response = connection.getresponse()
        assert response.status == 200 and response.read() == b""
    connection.close()
"""


def otlp_body(spans: int) -> bytes:
    """An OTLP/HTTP protobuf body of ``spans`` spans with a few attributes each."""
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    resource.resource.attributes.add(key="service.name").value.string_value = "poster"
    scope = resource.scope_spans.add()
    for n in range(spans):
        span = scope.spans.add(name=f"stage {n % 7}", start_time_unix_nano=n * 1000)
        span.trace_id, span.span_id = n.to_bytes(16, "big"), (n + 1).to_bytes(8, "big")
        span.end_time_unix_nano = n * 1000 + 500
        for key in ("model", "device", "option"):
            span.attributes.add(key=key).value.string_value = f"{key}-{n % 5}"
    return request.SerializeToString()


def test_the_clients_cpu_leaves_out_the_studys_receiver(tmp_path: Path) -> None:
    # The study's receiver decodes and writes what arrives in a process of its own: another
    # process posts traces to it through the second point, whose client figure must stay the
    # first's (requests that sleep), and every span posted is in the receiver's store.
    port = free_port()
    body = tmp_path / "body.bin"
    body.write_bytes(otlp_body(500))
    posters: list[subprocess.Popen[bytes]] = []

    def factory(params: Mapping[str, Any], endpoint: Endpoint) -> Any:
        if params["posts"]:  # for the warm-up, the window and the trace read-back after it
            url = f"http://127.0.0.1:{port}/v1/traces"
            posters.append(subprocess.Popen([sys.executable, "-c", POSTER, url, str(body), "3"]))
        return lambda index: time.sleep(0.005)

    try:
        results = Study(
            request=factory,
            server=Remote("127.0.0.1:1"),
            sweep={"posts": [0, 1]},
            load=Load(concurrency=4, seconds=1.5, warmup_s=0.5),
            tracing=Tracing(per_second=5, port=port),
            out=tmp_path / "study.jsonl",
            progress=False,
        ).run()
    finally:
        for poster in posters:
            assert poster.wait(15) == 0
    traces = tmp_path / "study-files" / "traces"
    spans = load_spans(traces)  # the receiver's segments (or JSON lines without the store)
    posted = sum(s.resource.get("service.name") == "poster" for s in spans) // 500  # a post's
    quiet, busy = results.points
    print(f"client CPU: {quiet.cpu_s:.3f} s quiet, {busy.cpu_s:.3f} s while {posted} posts came")
    assert posted >= 50  # 25,000 spans or more converted and written while the second ran
    assert list(traces.glob("spans-*.parquet")) and not list(traces.glob("*.jsonl"))
    assert busy.cpu_s == pytest.approx(quiet.cpu_s, abs=0.05 + 0.5 * quiet.cpu_s)


def test_an_open_loops_backlog_shows_in_its_traces(tmp_path: Path) -> None:
    # one client thread and 10 ms a request: at 40/s it keeps up, at 150/s the arrivals wait
    # for the thread; each traced request starts when it was due, its wait a "backlog" stage
    results = Study(
        request=lambda params, endpoint: lambda index: time.sleep(0.010),
        server=Remote("127.0.0.1:1"),
        sweep={"rate": [40.0, 150.0]},
        load=Load(seconds=1.5, warmup_s=0.3, max_in_flight=1),
        tracing=Tracing(per_second=50),
        out=tmp_path / "study.jsonl",
        progress=False,
    ).run()
    kept_up, behind = results.points
    assert kept_up.traces is not None and behind.traces is not None
    assert kept_up.component_ms("client backlog") < 5.0
    # behind: the backlog grows through the window; the traces see the waits the latencies do
    backlog = behind.component_ms("client backlog")
    assert backlog > 50.0
    total = behind.component_ms("total")
    assert total == pytest.approx(backlog + behind.component_ms("client other"), rel=0.1)
    # (the sampled share is rate-limited over a growing backlog: 397 ms traced, 454 measured)
    assert behind.histogram.mean_s * 1e3 == pytest.approx(total, rel=0.25)


def _measured_roots(run_id: str, point: int, count: int) -> list[Span]:
    """``count`` measured roots of ``point`` of run ``run_id``, one trace each."""
    attributes: dict[str, Any] = {
        semconv.STUDY_RUN: run_id,
        semconv.STUDY_POINT: point,
        semconv.STUDY_PHASE: semconv.STUDY_PHASE_MEASURE,
    }
    return [
        Span(
            f"{point:02x}{n:030x}",
            f"{n + 1:016x}",
            None,
            semconv.STUDY_SPAN,
            SpanKind.INTERNAL,
            1_000 * n,
            1_000 * n + 500,
            dict(attributes),
        )
        for n in range(count)
    ]


def test_a_point_reads_the_segments_written_during_it(tmp_path: Path) -> None:
    """With the study's receiver writing segments, a point's traces are read from the
    segments written since it began (made readable by ``flush`` at each read), never from
    the earlier points' segments, which hold none of its spans."""
    writer = SegmentWriter(tmp_path)
    writer.add(_measured_roots("run", 0, 3))
    writer.flush()
    old = segment_names(tmp_path)
    assert len(old) == 1
    writer.add(_measured_roots("run", 1, 2))  # held, not yet readable: collect flushes it
    flushed: list[int] = []

    def flush() -> None:
        flushed.append(writer.flush())

    found = collect(tmp_path, "run", 1, sampled=2, timeout_s=5.0, flush=flush, old=old)
    assert (found.traces, found.incomplete) == (2, 0) and flushed[0] == 2
    # point 0's spans are all in the old segment: read as new, they are found; left out, not
    assert collect(tmp_path, "run", 0, sampled=3, timeout_s=5.0).traces == 3
    started = time.monotonic()
    assert collect(tmp_path, "run", 0, sampled=3, timeout_s=0.5, old=old).traces == 0
    assert time.monotonic() - started < 3.0


def test_a_trace_short_of_one_of_its_models_stages_waits_for_it() -> None:
    """A model's stages come from its own process, whose exporter may send one request's
    stages in two batches: while spans may still arrive, a trace that has one of them and not
    another its model's traces ran is incomplete, not a stage of 0 ms (CI, acf4674: 19.23 ms
    for a 20 ms hold, two traces short); once nothing more arrives, a stage some requests skip
    is what they ran."""
    from otelkit.analysis import build_traces
    from otelkit.study._traces import summarize

    ms = 1_000_000

    def request(trace_id: str, stages: tuple[str, ...]) -> list[Span]:
        ids = iter(f"{n:016x}" for n in range(int(trace_id[:4], 16) << 8, 1 << 62))
        root, call, server = next(ids), next(ids), next(ids)
        point = {
            semconv.STUDY_RUN: "run",
            semconv.STUDY_POINT: 0,
            semconv.STUDY_PHASE: semconv.STUDY_PHASE_MEASURE,
        }
        spans = [
            Span(trace_id, root, None, semconv.STUDY_SPAN, SpanKind.INTERNAL, 0, 50 * ms, point),
            Span(trace_id, call, root, "infer", SpanKind.CLIENT, 1 * ms, 49 * ms),
            Span(
                trace_id,
                server,
                call,
                "pool3",
                SpanKind.SERVER,
                2 * ms,
                48 * ms,
                {semconv.TRITON_SPAN_MODEL_NAME: "pool3"},
            ),
        ]
        for n, stage in enumerate(stages):
            start = (3 + 21 * n) * ms
            attributes = {semconv.STAGE_NAME: stage}
            spans.append(
                Span(
                    trace_id,
                    next(ids),
                    server,
                    stage,
                    SpanKind.INTERNAL,
                    start,
                    start + 20 * ms,
                    attributes,
                )
            )
        return spans

    whole = request("a" * 32, ("prep", "gpu"))
    short = request("b" * 32, ("prep",))  # its gpu stage in the next batch
    traces = build_traces([*whole, *short]).values()
    waiting = summarize(traces, "run", 0, waiting=True)
    assert (waiting.traces, waiting.incomplete) == (1, 1)
    assert waiting.components["server gpu"].mean_ms == pytest.approx(20.0)
    settled = summarize(traces, "run", 0)  # nothing more came: the short one skipped gpu
    assert (settled.traces, settled.incomplete) == (2, 0)
    assert settled.components["server gpu"].mean_ms == pytest.approx(10.0)
