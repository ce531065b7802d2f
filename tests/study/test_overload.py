"""Overload as data: a server that refuses requests past its capacity is measured, not a failed
study. Refusals are told from failures by the status and message servers send (Triton's, checked
here against a real tritonserver), counted apart by reason, and neither ``Load.max_errors`` nor
the error-share rule counts them; the study goes on to its next point and ends ``complete``,
with a verdict that names the model, the offered load where refusals start and the goodput
past it. A server that is truly gone still ends the study.

The refusing model (tests/study/truth/models/refusing) runs 10 ms a request on one instance and
keeps at most 4 requests waiting: by construction it serves at most 100/s
(tests/study/truth/capacity.py). Its queue policy sits inside a dynamic batcher, which gives the
instance up to 8 requests an execution: their stages still run one after another (100/s
whatever the batch), but up to 8 are in service at once, which a window's edges count.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from otelkit._errors import StudyError
from otelkit.cli import main
from otelkit.report._study_charts import study_charts
from otelkit.study import Load, Remote, Study, StudyResults, read_results
from otelkit.study._counters import HostUsage
from otelkit.study._drive import drive, refusal
from otelkit.study._overload import settle
from otelkit.study._point import LatencyHistogram, Point, merge_parts
from otelkit.study._results import ResultsWriter
from otelkit.study._verdicts import Verdict, verdicts
from otelkit.testing import wait_until
from otelkit.tritonserver import TritonServer, free_port
from tests.study.conftest import answered, points_written
from tests.study.truth.capacity import MODELS, triton

REFUSING = "refusing"
MAX_BATCH = 8  # the refusing model's max_batch_size: requests in service at once
SECONDS = 1.5
TOLERANCE = 0.1  # the study's default


def _triton(message: str, status: str) -> InferenceServerException:
    return InferenceServerException(message, status=status)


class HttpError(urllib.error.HTTPError):
    """An HTTP client's error whose message carries the answer's body, as a Python server's or
    Envoy's answers reach a request factory (httpx and aiohttp put it there too)."""

    def __init__(self, code: int, body: str) -> None:
        super().__init__("http://127.0.0.1/v2/models/m/infer", code, body, {}, None)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return f"HTTP Error {self.code}: {self.msg}"


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (_triton("[request id: <id_unknown>] Exceeds maximum queue size", "503"), "queue full"),
        (
            _triton(
                "[request id: <id_unknown>] Exceeds maximum queue size", "StatusCode.UNAVAILABLE"
            ),
            "queue full",
        ),
        (_triton("Request timeout expired", "StatusCode.UNAVAILABLE"), "queue timeout"),
        (_triton("Too Many Requests", "429"), "429 too many requests"),
        (_triton("Service Unavailable", "503"), "503 unavailable"),
        (
            HttpError(
                503,
                "upstream connect error or disconnect/reset before headers. reset reason: overflow",
            ),
            "proxy overflow",
        ),
        (
            HttpError(503, "upstream connect error or disconnect/reset before headers"),
            "proxy upstream",
        ),
        (HttpError(429, "Too Many Requests"), "429 too many requests"),
        (_triton("Concurrent RPC limit exceeded!", "StatusCode.RESOURCE_EXHAUSTED"), "rpc limit"),
        # failures: the server did not decline, something broke
        (ConnectionRefusedError(111, "Connection refused"), None),
        (
            _triton(
                "failed to connect to all addresses; last error: Connection refused",
                "StatusCode.UNAVAILABLE",
            ),
            None,
        ),
        (_triton("overflow in the model's output", "500"), None),
        (_triton("Received message larger than max", "StatusCode.RESOURCE_EXHAUSTED"), None),
        (HttpError(500, "Internal Server Error"), None),
        (TimeoutError("timed out"), None),
    ],
)
def test_a_refusal_is_told_from_a_failure(error: BaseException, reason: str | None) -> None:
    assert refusal(error) == reason


def test_refusals_stop_no_point_and_failures_still_do() -> None:
    """The driver's own rules: ``max_errors`` failures stop a point; as many refusals do not."""

    def refused(index: int, measured: bool) -> None:
        raise _triton("Exceeds maximum queue size", "503")

    def broken(index: int, measured: bool) -> None:
        raise _triton("internal error", "500")

    load = Load(concurrency=2, seconds=0.3, warmup_s=0.0, max_errors=20)
    run = drive(refused, load)
    assert run.stopped is None and not run.errors
    assert sum(run.refused.values()) > 20 and set(run.refused) == {"queue full"}
    assert run.refusal_samples["queue full"] == "[503] Exceeds maximum queue size"
    stopped = drive(broken, load)
    assert stopped.stopped == "errors" and not stopped.refused
    assert sum(stopped.errors.values()) >= 20


def _shed_point(index: int = 0, rate: int = 160) -> Point:
    histogram = LatencyHistogram()
    histogram.add_many([0.05] * 40)
    failed = LatencyHistogram()
    failed.add(0.5)
    return Point(
        index,
        {"rate": rate},
        requests=40,
        seconds=2.0,
        histogram=histogram,
        errors={"TimeoutError": 1},
        error_samples={"TimeoutError": "timed out"},
        failed_histogram=failed,
        refused={"queue full": 270, "queue timeout": 9},
        refusal_samples={"queue full": "[503] Exceeds maximum queue size"},
    )


def test_a_point_with_refusals_round_trips_and_shows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    point = _shed_point()
    # 1 failure in 320 measured requests: refusals are among the measured, not the failed
    point.check_errors(0.01)
    assert point.status == "ok" and point.error_share == pytest.approx(1 / 320)
    again = Point.from_dict(json.loads(json.dumps(point.to_dict())))
    assert again.refused == point.refused and again.refusal_samples == point.refusal_samples
    assert (again.offered, again.throughput, again.refused_per_s) == (160.0, 20.0, 139.5)
    assert again.errors == {"TimeoutError": 1}
    both = merge_parts([point, again])
    assert both.refused == {"queue full": 540, "queue timeout": 18}
    assert both.throughput == 40.0 and both.status == "ok"

    out = tmp_path / "study.jsonl"
    low = replace(_shed_point(0, 40), refused={}, refusal_samples={})
    results = StudyResults({"unit": "request"}, [low, _shed_point(1, 160)], path=out)
    results.derive(TOLERANCE, "request")
    writer = ResultsWriter(out, {"unit": "request"})
    for each in results.points:
        writer.point(each)
    writer.finish(results)
    (verdict,) = read_results(out).verdicts
    assert verdict == results.verdicts[0] and verdict.kind == "overload"
    assert Verdict.from_dict(verdict.to_dict()) == verdict
    assert main(["study", "show", str(out)]) == 0
    shown = capsys.readouterr().out
    header = shown.splitlines()[0].split()
    assert header[:4] == ["point", "offered/s", "served/s", "refused/s"], shown
    row = shown.splitlines()[2].split()
    assert row[:4] == ["rate=160", "160.0", "20.0", "139.5"], shown
    assert "refused: 270 queue full, 9 queue timeout" in shown


def _at_rate(rate: int, served: float, refused: float, client_cores: float = 0.0) -> Point:
    seconds = 2.0
    return Point(
        rate,
        {"rate": rate},
        requests=round(served * seconds),
        seconds=seconds,
        refused={"queue full": round(refused * seconds)} if refused else {},
        cpu_s=client_cores * seconds,
        host=HostUsage(2, 1.9, 0.5, seconds),
    )


def test_goodput_that_holds_past_the_onset() -> None:
    points = [_at_rate(40, 40, 0), _at_rate(160, 96, 60), _at_rate(320, 92, 230)]
    (verdict,) = verdicts(points)
    assert verdict.kind == "overload" and verdict.plateau_per_s == 96
    assert verdict.sentence == (
        "the server refuses requests past its capacity of 96 requests/s (served at 160/s "
        "offered); refusals start between 40/s offered (none refused) and 160/s (60/s refused, "
        "queue full); goodput holds past it: served 96/s at 160/s offered, 92/s at 320/s"
    )
    assert_claims(verdict, points, "rate")


def test_refusals_from_the_lowest_load_and_the_clients_share_of_a_collapse() -> None:
    # the client spends 0.9 of a core on the 320/s, most of them refused, on a busy host
    points = [_at_rate(80, 50, 30), _at_rate(320, 20, 300, client_cores=0.9)]
    (verdict,) = verdicts(points)
    assert "refusals start at or below 80/s offered (30/s refused, queue full)" in verdict.sentence
    assert verdict.sentence.endswith(
        "goodput collapses past it: served 50/s at 80/s offered, 20/s at 320/s; the client's "
        "CPU at 320/s offered: U 0.90 of a core, 2.81 ms a call, of a host whose 2 cores were "
        "U 0.95 busy: part of the collapse may be the client's own cost of the refused calls "
        "(drive it from another host to tell)"
    )
    assert_claims(verdict, points, "rate")
    light = [_at_rate(80, 50, 30), _at_rate(320, 20, 300, client_cores=0.1)]
    assert verdicts(light)[0].sentence.endswith("too little to explain the collapse")


def test_the_report_plots_offered_served_and_refused() -> None:
    low = replace(_shed_point(0, 40), refused={}, refusal_samples={})
    results = StudyResults({"unit": "request"}, [low, _shed_point(1, 160)])
    results.derive()
    (chart,) = [c for c in study_charts(results) if c.name == "study-overload-rate"]
    assert chart.title == "Offered, served and refused against rate"
    values = chart.spec["layer"][0]["data"]["values"]
    assert [(v["rate"], v["series"], v["requests/s"]) for v in values] == [
        (40, "offered", 40.0),
        (40, "served", 20.0),
        (40, "refused", 0.0),
        (160, "offered", 160.0),
        (160, "served", 20.0),
        (160, "refused", 139.5),
    ]
    assert not [c for c in study_charts(StudyResults({}, [low])) if "overload" in c.name]


def test_no_refusals_no_overload_columns() -> None:
    low = replace(_shed_point(0, 40), refused={}, refusal_samples={})
    summary = StudyResults({"unit": "request"}, [low], path=None).summary()
    assert summary.splitlines()[0].split()[:2] == ["point", "requests/s"]
    assert "refused" not in summary


def test_the_refusing_models_limit_by_construction() -> None:
    """What the capacity checks below take from the refusing model's config.pbtxt."""
    config = text_format.Parse(
        (MODELS / REFUSING / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    assert config.max_batch_size == MAX_BATCH
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 4
    limit = triton(REFUSING)
    # each request's 10 ms runs in turn within a batch: 100/s, batched or not
    assert (round(limit.per_s, 1), limit.partway, round(limit.request_s * 1e3)) == (100.0, 1, 10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    log = tmp_path_factory.mktemp("overload") / "tritonserver.log"
    with TritonServer(
        MODELS,
        model_control="explicit",
        load_models=(REFUSING, "expiring"),
        log_path=log,
    ) as triton_server:
        yield triton_server


def _shed(send: Callable[[], None], threads: int = 16, each: int = 12) -> list[BaseException]:
    """``threads`` clients sending ``each`` requests at once: the errors they got."""
    errors: list[BaseException] = []

    def client() -> None:
        for _ in range(each):
            try:
                send()
            except Exception as error:
                errors.append(error)

    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(client) for _ in range(threads)]:
            future.result()
    return errors


@pytest.mark.triton
@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(
    ("model", "reason"), [(REFUSING, "queue full"), ("expiring", "queue timeout")]
)
def test_triton_refusals_are_refusals(
    server: TritonServer, protocol: str, model: str, reason: str
) -> None:
    """Triton's own answers to a full queue and to an expired one, over both protocols."""
    local = threading.local()
    data = np.ones((1, 16), np.float32)

    def send() -> None:
        if not hasattr(local, "client"):
            local.client = (
                httpclient.InferenceServerClient(server.http_url)
                if protocol == "http"
                else grpcclient.InferenceServerClient(server.grpc_url)
            )
        module: Any = httpclient if protocol == "http" else grpcclient
        tensor = module.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(data)
        local.client.infer(model, [tensor])

    errors = _shed(send)
    assert errors, "16 clients at once on a queue of 4 (or of 5 ms) were all served"
    assert {refusal(error) for error in errors} == {reason}, {str(e) for e in errors}


def _study(server: TritonServer, out: Path, sweep: dict[str, list[Any]], **load: Any) -> Study:
    return Study(
        model=REFUSING,
        server=Remote(server.http_url, metrics_url=server.metrics_url),
        load=Load(seconds=SECONDS, warmup_s=0.5, **load),
        sweep=sweep,
        out=out,
        progress=False,
    )


def _end(out: Path) -> dict[str, Any]:
    end: dict[str, Any] = json.loads(out.read_text().splitlines()[-1])
    return end


def assert_claims(verdict: Verdict, points: list[Point], axis: str) -> None:
    """No claim of an overload verdict's sentence contradicts a point it was measured from."""
    ordered = sorted(points, key=lambda p: p.params[axis])
    sentence = verdict.sentence
    capacity = max(p.throughput for p in ordered)
    assert verdict.plateau_per_s == capacity
    assert f"capacity of {capacity:.0f} requests/s" in sentence
    first = next(i for i, p in enumerate(ordered) if p.refused)
    # the load where refusals start: none refused below it, some at it
    assert all(not p.refused for p in ordered[:first])
    if first:
        assert f"between {_at(ordered[first - 1], axis)} (none refused) and" in sentence
    else:
        assert "refusals start at or below" in sentence
    served = re.findall(
        r"(\d+)/s at (\d+ threads?, sending )?(\d+)/s", sentence.split("served ")[-1]
    )
    past = ordered[first:]
    assert len(served) >= len(past), sentence
    for p, (goodput, _, offered) in zip(past, served, strict=False):
        assert int(goodput) == round(p.throughput) and int(offered) == round(p.offered), sentence
    collapses = ordered[-1].throughput < (1 - 2 * TOLERANCE) * capacity
    assert ("collapses" in sentence) == collapses, sentence
    if "holds" in sentence:
        assert all(p.throughput >= (1 - 2 * TOLERANCE) * capacity for p in past)


def _at(point: Point, axis: str) -> str:
    if axis == "rate":
        return f"{point.offered:.0f}/s offered"
    threads = point.params[axis]
    return f"{threads} thread{'s' if threads != 1 else ''}, sending {point.offered:.0f}/s"


def assert_capacity(points: list[Point]) -> None:
    """The capacity the verdict quotes (the highest goodput) against the model's construction.

    Above: one instance at 10 ms a request serves at most 100/s (capacity.triton), and a
    window of T seconds counts beyond that only the requests begun before it: up to 8 in
    service (a batch) and as many answered just before. Below, a load served without refusals
    shows the capacity is at least what it served: its rate, within the Poisson count's three
    standard deviations and the same edge. What the host gives past the onset is not known by
    construction (on this shared host Triton stalls ~0.5 s between executions once refusing:
    goodput falls), so no floor is drawn from the construction there."""
    limit = triton(REFUSING)
    peak = max(points, key=lambda p: p.throughput)
    begun = 2 * MAX_BATCH
    most = limit.per_s + begun / peak.seconds
    assert peak.throughput <= most, (
        f"{peak.throughput:.1f}/s at {peak.label}; {limit.why}: {limit.per_s:.0f}/s by "
        f"construction, at most {most:.1f}/s with {begun} begun before the window"
    )
    for p in points:
        if p.refused or "rate" not in p.params:
            continue
        arrivals = p.offered * p.seconds
        least = (arrivals - 3 * math.sqrt(arrivals) - begun) / p.seconds
        assert peak.throughput >= least, f"{p.label} served all it was offered; {peak.label}"


@pytest.mark.triton
def test_an_open_loop_past_a_refusing_server(server: TritonServer, tmp_path: Path) -> None:
    out = tmp_path / "study.jsonl"
    results = _study(server, out, {"rate": [40, 80, 160, 320]}).run()
    print(results.summary())  # what a failure needs to be read
    assert results.status == "complete" and _end(out) == {
        "record": "end",
        "status": "complete",
        "message": "",
    }
    points = results.points
    assert [p.status for p in points] == ["ok"] * 4
    assert all(not p.errors for p in points), [p.errors for p in points]
    # what 320/s offered sends beyond the most the model serves is refused, not failed
    arrivals = 320 * points[-1].seconds
    sent = (arrivals - 3 * math.sqrt(arrivals)) / points[-1].seconds
    assert points[-1].refused_per_s >= sent - (triton(REFUSING).per_s + 2 * MAX_BATCH / SECONDS)
    assert {r for p in points for r in p.refused} == {"queue full"}
    (verdict,) = results.verdicts
    assert verdict.kind == "overload" and verdict.limit == REFUSING
    assert verdict.sentence.startswith(f"{REFUSING} refuses requests past its capacity")
    assert_claims(verdict, points, "rate")
    assert results.contradictions() == []  # the study's own falsification agrees
    assert_capacity(points)
    assert read_results(out).verdicts == results.verdicts


@pytest.mark.triton
def test_a_closed_loop_beyond_the_queue_is_refused(server: TritonServer, tmp_path: Path) -> None:
    """16 in flight against a batch of 8 in service and 4 waiting: the rest are refused."""
    out = tmp_path / "study.jsonl"
    results = _study(server, out, {"concurrency": [1, 16]}).run()
    print(results.summary())
    assert results.status == "complete" and _end(out)["status"] == "complete"
    low, high = results.points
    assert not low.refused and high.refused and not high.errors
    assert high.refused_per_s > high.throughput  # 16 threads hammer a queue of 4
    (verdict,) = verdicts(results.points)
    assert verdict.kind == "overload" and verdict.limit == REFUSING
    assert_claims(verdict, results.points, "concurrency")
    assert results.contradictions() == []
    assert_capacity(results.points)


@pytest.mark.triton
def test_refused_connections_from_a_ready_server_are_refusals(server: TritonServer) -> None:
    point = _failed_by_refused_connections()
    settle(point, server.http_url)
    assert point.status == "ok" and point.error == "" and not point.errors
    assert point.refused == {"connection refused": 50}


def test_refused_connections_with_nothing_ready_are_a_server_gone() -> None:
    point = _failed_by_refused_connections()
    settle(point, f"127.0.0.1:{free_port()}")
    assert point.status == "failed" and point.error.startswith(
        "the server is gone: connections refused, and 127.0.0.1:"
    )
    assert point.errors == {"ConnectionRefusedError": 50} and not point.refused


def _failed_by_refused_connections() -> Point:
    return Point(
        0,
        {"rate": 80},
        status="failed",
        error="stopped after 50 failed requests, most ConnectionRefusedError",
        errors={"ConnectionRefusedError": 50},
        error_samples={"ConnectionRefusedError": "[Errno 111] Connection refused"},
    )


@pytest.mark.triton
def test_a_refusing_server_killed_mid_sweep_ends_the_study(tmp_path: Path) -> None:
    """Refusals do not stop a point (many more than ``max_errors`` of them); a server killed
    during the next point does: its connections refused, its readiness gone."""
    out = tmp_path / "study.jsonl"
    with TritonServer(
        MODELS, model_control="explicit", load_models=(REFUSING,), log_path=tmp_path / "t.log"
    ) as own:
        sweep = _study(own, out, {"rate": [320, 320, 320]}, max_errors=50)

        def kill_during_the_second_point() -> None:
            wait_until(lambda: out.exists() and points_written(out) == 1, 60, "the first point")
            first = answered(own.http_url, REFUSING)
            wait_until(
                lambda: answered(own.http_url, REFUSING) > first, 30, "the second point's requests"
            )
            assert own.pid is not None
            os.killpg(own.pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_during_the_second_point, daemon=True)
        killer.start()
        with pytest.raises(StudyError) as caught:
            sweep.run()
        killer.join(5)
    message = str(caught.value)
    assert caught.value.point == "rate=320"
    assert "the server is gone: connections refused, and " in message, message
    results = read_results(out)
    assert [p.status for p in results.points] == ["ok", "failed"]
    assert sum(results.points[0].refused.values()) > 50  # refusals past max_errors: measured
    assert results.status == "failed" and _end(out)["status"] == "failed"
