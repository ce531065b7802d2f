"""The truth table of ``otelkit study``'s verdicts: deployments on a real Triton whose limit is
known by construction (tests/study/truth/behaviour.py), each swept from light load to past its
limit. Each asserts the verdict's kind and the resource it names, that the plateau the
bottleneck law predicts (m / D) is within 15 % of the one measured (for a process under one GIL,
that cannot keep its core busy, between it and 1 / 0.8 of it),
and both plateaus against the limit the deployment has by construction, read from its models'
configurations (tests/study/truth/capacity.py), within bounds that say where they come from.

One tritonserver serves every model of tests/study/truth/models for the whole module; its
traces and the models' stage spans go to a fixed port that each study's receiver takes in turn.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind

import otelkit
from otelkit.study import (
    Endpoint,
    Load,
    ModelCalls,
    Remote,
    Study,
    StudyResults,
    Tracing,
    Triton,
    Workload,
)
from otelkit.study._capacity import other_use
from otelkit.study._point import Point
from otelkit.study._verdicts import Verdict, verdicts
from otelkit.tritonserver import TritonServer, free_port
from tests.paths import MODELS, TESTS
from tests.study.conftest import kserve_app
from tests.study.truth.capacity import (
    TICKS,
    Capacity,
    batches,
    host_cores,
    model,
    python_process,
    replicas,
    triton,
)
from tests.study.truth.work import spin
from tests.support import LocalRay

pytestmark = pytest.mark.triton

TRUTH = TESTS / "study" / "truth"
WITHIN = 0.15  # the bound on the predicted plateau against the measured one


@dataclass(frozen=True)
class TruthServer:
    server: TritonServer
    receiver_port: int

    def remote(self) -> Remote:
        return Remote(self.server.http_url, metrics_url=self.server.metrics_url)


@pytest.fixture(scope="module")
def truth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TruthServer]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/traces"
    files = tmp_path_factory.mktemp("truth")
    env = {
        "OTELKIT_TRUTH_LOCK": str(files / "match.lock"),
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    # every request that carries a context is traced (the study's sampled share), no other
    with TritonServer(
        TRUTH / "models",
        trace_url=url,
        trace_rate=1_000_000,
        env=env,
        log_path=files / "tritonserver.log",
    ) as server:
        yield TruthServer(server, port)


def study(
    truth: TruthServer,
    tmp_path: Path,
    *,
    model: str | None = None,
    request: Workload | None = None,
    sweep: Mapping[str, list[Any]],
    traced: bool = True,
    seconds: float = 2.0,
    repeats: int = 1,
) -> StudyResults:
    tracing = Tracing(per_second=20, port=truth.receiver_port) if traced else None
    return Study(
        model=model,
        request=request,
        server=truth.remote(),
        load=Load(seconds=seconds, warmup_s=0.5, repeats=repeats),
        sweep=dict(sweep),
        tracing=tracing,
        out=tmp_path / "study.jsonl",
        progress=False,
    ).run()


def only(results: StudyResults) -> Verdict:
    (verdict,) = results.verdicts
    print(results.summary())  # what a failure needs to be read
    # no printed claim contradicts a measured point
    assert results.contradictions() == []
    return verdict


def assert_predicted(verdict: Verdict, results: StudyResults) -> None:
    measured = max(p.throughput for p in results.points)
    assert verdict.plateau_per_s == pytest.approx(measured)
    assert verdict.predicted_per_s is not None
    assert verdict.predicted_per_s == pytest.approx(measured, rel=WITHIN), verdict.sentence


def assert_predicted_one_process(verdict: Verdict, results: StudyResults) -> None:
    """The plateau a process under one GIL allows, where the process cannot keep its core busy
    (its threads hand the GIL over; the host's other processes take a core in turn): never below
    what was measured. How far above is the process's U at the plateau (m / D over X is 1 / U,
    read 0.80 to 0.88 on 2-core hosts), the host's and not the study's: the prediction is held to
    the limit by construction instead (``assert_constructed``)."""
    measured = max(p.throughput for p in results.points)
    assert verdict.plateau_per_s == pytest.approx(measured)
    predicted = verdict.predicted_per_s
    assert predicted is not None, verdict.sentence
    assert measured <= predicted, verdict.sentence


def cores_reading(point: Point) -> tuple[float, float]:
    """The host's cores at ``point`` as the study reads them from /proc/stat: the cores not kept
    busy before the load (m) and the CPU a request took of them (D, seconds)."""
    host = point.host
    assert host is not None and host.busy_cores is not None, point.label
    # the study's own reading of the host's other use: a reading before the point as high as
    # the point's busy cores was a transient (CI, fde9055: D read 0 without this rule)
    idle = other_use(point)
    return host.cores - idle, (host.busy_cores - idle) / point.throughput


def assert_predicted_cores(verdict: Verdict, results: StudyResults) -> None:
    """The cores' capacity is m / D from /proc/stat, less the host's idle use, each read at one
    of the points (D at the lowest, where nothing waits, unless a lower demand was measured; m
    where throughput peaks): derived here from the points' own readings, it must never fall
    below what was measured. How far it stands above the plateau is 1 / U* at the plateau, the
    host's and not the study's (0.68 to 0.89 for the payloads here; 0.90 in a CI run of the
    busy instances, whose demand also grew 10 % from one request in flight to eight)."""
    assert verdict.predicted_per_s is not None and verdict.plateau_per_s is not None
    m, d = zip(*map(cores_reading, results.points), strict=True)
    least, most = min(m) / max(d), max(m) / min(d)
    assert least * 0.99 <= verdict.predicted_per_s <= most * 1.01, (m, d, verdict.sentence)
    # at U 1.00 the prediction from the peak's demand is the plateau itself, up to rounding
    assert verdict.predicted_per_s >= verdict.plateau_per_s * (1 - 1e-9), verdict.sentence


def assert_constructed(
    capacity: Capacity, results: StudyResults, verdict: Verdict | None = None
) -> None:
    """The plateau measured, and the one ``verdict`` predicted, against the limit the deployment
    has by construction (tests/study/truth/capacity.py), so that an error moving both alike
    fails.

    The sweep must first reach past the limit: a closed loop of c requests in flight, each taking
    at least ``capacity.request_s``, can carry c / request_s (Little's law), and an open loop its
    rate; at twice the limit the resource at the limit is kept busy, so the plateau is its own
    and not the load's.

    Above, a measured plateau counts the requests that complete within its window of T
    seconds: those begun there were wholly served there, at most the limit times T of them, so
    it exceeds the limit only by the requests begun before, over T. The predicted may exceed
    it by /proc's ticks (``TICKS``). Below, each case's floor says where it comes from
    (``capacity.least_why``)."""
    loads = [p.params for p in results.points]
    if "rate" in loads[0]:
        offered = max(load["rate"] for load in loads)
        reach = f"{offered:g}/s offered"
        assert capacity.partway is not None, "an open loop's backlog has no bound"
        # those in service at the limit when the window opened, and as many served just before
        # whose responses were still on their way (their transit varies by less than a service)
        begun = 2 * capacity.partway
    else:
        begun = max(load["concurrency"] for load in loads)
        offered = begun / capacity.request_s
        reach = f"{begun} in flight of {capacity.request_s * 1e3:g} ms each: {offered:.0f}/s"
    limit = f"{capacity.why}: {capacity.per_s:.1f}/s by construction"
    assert offered >= 2 * capacity.per_s, f"the sweep reaches {reach}, not twice {limit}"
    peak = max(results.points, key=lambda p: p.throughput)
    most = capacity.per_s + begun / peak.seconds
    floor = f"at least {capacity.least_per_s:.1f}/s, {capacity.least_why}"
    assert capacity.least_per_s <= peak.throughput <= most, (
        f"measured {peak.throughput:.1f}/s at {peak.label}; {limit}, so at most {most:.1f}/s "
        f"(with {begun} requests begun before its {peak.seconds:.1f} s window), {floor}"
    )
    if verdict is None:
        return
    predicted = verdict.predicted_per_s
    assert predicted is not None, verdict.sentence
    assert capacity.least_per_s <= predicted <= capacity.per_s * (1 + TICKS), (
        f"predicted {predicted:.1f}/s; {limit}, so at most {capacity.per_s * (1 + TICKS):.1f}/s "
        f"(CPU times in /proc's ticks), {floor}: {verdict.sentence}"
    )


def test_the_limits_by_construction_are_the_configurations() -> None:
    """What capacity.py reads from the models' config.pbtxt is what their comments state."""
    cores = host_cores()
    limits = {
        name: (round(c.per_s, 1), round(c.least_per_s, 1), c.partway, round(c.request_s * 1e3))
        for name, c in (
            (name, triton(name))
            for name in ("saturated", "pipeline", "locked", "cores", "pool2", "pool3")
        )
    }
    assert limits == {
        "saturated": (100.0, 83.3, 1, 10),
        "pipeline": (66.7, 58.8, 1, 18),  # step_slow's 1 / 15 ms, not step_fast's 2 / 3 ms
        "locked": (166.7, 142.9, 1, 8),  # match's 1 / 6 ms hold, not 4 instances / 8 ms
        # the host's cores / 10 ms, or its 4 instances' 4 / 10 ms on 4 cores or more
        "cores": (min(100.0 * cores, 400.0), min(60.0 * cores, 240.0), 4, 10),
        "pool2": (100.0, 95.2, 2, 20),  # 2 tokens / 20 ms, not 4 instances / 20 ms
        "pool3": (150.0, 142.9, 3, 22),  # 3 tokens / 20 ms, not 6 instances / 22 ms
    }


def test_a_models_busy_instance_is_saturated(truth: TruthServer, tmp_path: Path) -> None:
    results = study(truth, tmp_path, model="saturated", sweep={"concurrency": [1, 4]})
    verdict = only(results)
    assert (verdict.kind, verdict.resource, verdict.limit) == (
        "saturated",
        "instances",
        "saturated",
    )
    assert_predicted(verdict, results)
    assert_constructed(triton("saturated"), results, verdict)


def test_the_slow_step_of_an_ensemble_is_saturated(truth: TruthServer, tmp_path: Path) -> None:
    results = study(truth, tmp_path, model="pipeline", sweep={"concurrency": [1, 4]})
    verdict = only(results)
    assert (verdict.kind, verdict.resource, verdict.limit) == (
        "saturated",
        "instances",
        "step_slow",
    )
    assert_predicted(verdict, results)
    assert_constructed(triton("pipeline"), results, verdict)


def test_a_stage_under_a_lock_every_instance_shares_is_named(
    truth: TruthServer, tmp_path: Path
) -> None:
    results = study(truth, tmp_path, model="locked", sweep={"concurrency": [1, 8]})
    verdict = only(results)
    assert (verdict.kind, verdict.resource, verdict.limit) == ("contended", "lock", "match")
    assert "more instances will not help" in verdict.change
    assert_predicted(verdict, results)
    assert_constructed(triton("locked"), results, verdict)


@pytest.mark.parametrize(
    ("name", "k", "sweep"), [("pool2", 2, [1, 8]), ("pool3", 3, [1, 12])], ids=["2", "3"]
)
def test_a_stage_that_holds_one_of_k_is_named_with_its_k(
    truth: TruthServer, tmp_path: Path, name: str, k: int, sweep: list[int]
) -> None:
    """The stage's time grows with load while X . hold at the plateau is near k: something
    serving k at a time, named with k and its capacity k / hold; the what-if of more tokens
    lifts it to the next limit."""
    results = study(truth, tmp_path, model=name, sweep={"concurrency": sweep})
    verdict = only(results)
    assert (verdict.kind, verdict.resource, verdict.limit) == ("contended", "pool", "gpu")
    assert f"serves {k} requests at a time" in verdict.sentence
    assert "more instances will not help" in verdict.change
    assert "--set gpu.parallelism=" in verdict.change
    assert_predicted(verdict, results)
    assert_constructed(triton(name), results, verdict)
    (more,) = results.predict([f"gpu.parallelism={k + 1}"])
    (same,) = results.predict([])
    assert same.points[-1].limit == f"gpu ({k} at a time)", same.points[-1]
    # one more token: k + 1 / 20 ms, or what the instances or the host allow first
    assert more.points[-1].throughput > (1 + WITHIN) * same.points[-1].throughput


def test_without_traces_a_pool_is_named_on_its_model(truth: TruthServer, tmp_path: Path) -> None:
    results = study(truth, tmp_path, model="pool2", sweep={"concurrency": [1, 8]}, traced=False)
    verdict = only(results)
    # its compute grows with load, X . compute near 2; the compute holds Triton's own time
    # besides the hold, so it bounds the hold from above and the capacity from below only
    assert (verdict.kind, verdict.resource, verdict.limit) == ("contended", "pool", "pool2")
    assert "serves 2 requests at a time" in verdict.sentence
    assert "2 allow at least" in verdict.sentence
    assert verdict.predicted_per_s is None
    assert_constructed(triton("pool2"), results)


def test_more_busy_instances_than_cores_names_the_cores(truth: TruthServer, tmp_path: Path) -> None:
    results = study(truth, tmp_path, model="cores", sweep={"concurrency": [1, 8]})
    verdict = only(results)
    assert (verdict.kind, verdict.resource) == ("contended", "cores")
    assert "more instances will not help" in verdict.change
    # the busy instances' limit by construction bounds the prediction from above and below
    assert_predicted_cores(verdict, results)
    assert_constructed(triton("cores"), results, verdict)


CLIENT_WORK_S = 0.015


class BusyClient(Workload):
    """15 ms of Python work in the client before each call of ``light``: the GIL caps it."""

    axes = ()
    model = "light"

    def __init__(self) -> None:
        self.calls = ModelCalls("light")

    def open(
        self, params: Mapping[str, Any], endpoint: Endpoint, *, traced: bool, ready_s: float
    ) -> None:
        self.calls.open(params, endpoint, traced=traced, ready_s=ready_s)

    def __call__(self, index: int) -> None:
        spin(CLIENT_WORK_S)
        self.calls(index)

    def close(self) -> None:
        self.calls.close()


def test_a_client_limited_by_its_own_cpu_is_named(truth: TruthServer, tmp_path: Path) -> None:
    results = study(truth, tmp_path, request=BusyClient(), sweep={"concurrency": [1, 4]})
    verdict = only(results)
    assert (verdict.kind, verdict.resource) == ("client", "client")
    assert "more threads" in verdict.change
    assert_predicted_one_process(verdict, results)
    alone_s = CLIENT_WORK_S + triton("light").request_s
    assert_constructed(python_process(CLIENT_WORK_S, "the client's", alone_s), results, verdict)


@pytest.fixture
def payload_server(tmp_path: Path) -> Iterator[TruthServer]:
    """A tritonserver of its own for the 8 MB payloads, untraced: tritonserver 2.51 once
    aborted under them here ("corrupted double-linked list", SIGABRT, then its crash handler
    hung), and the module's server must outlive that for the tests after this one."""
    with TritonServer(
        TRUTH / "models",
        model_control="explicit",
        load_models=["payload"],
        env={"OTELKIT_TRUTH_LOCK": str(tmp_path / "match.lock")},
        log_path=tmp_path / "tritonserver.log",
    ) as server:
        yield TruthServer(server, free_port())
        assert server.failure() is None, server.log_tail(20)


def test_payloads_of_megabytes_are_limited_where_they_are_moved(
    payload_server: TruthServer, tmp_path: Path
) -> None:
    # 8 MB each way a request over HTTP on loopback: the copies (the client's deserialising,
    # the kernel's loopback TCP, into and out of the stub) are CPU. Runs here put the cores at
    # U* 0.68 to 0.84: the verdict names the cores when they are at their limit, else the
    # transfer itself, with no plateau predicted. The cores' plateau is not asserted within 15 %:
    # the kernel's time a request grows with load (docs/study.md: 22 -> 24.5 ms of CPU from 1 to
    # 8 in flight), which a prediction from the lowest point cannot see.
    calls = ModelCalls("payload", free_dim=2_000_000, pool=2)
    results = study(
        payload_server, tmp_path, request=calls, sweep={"concurrency": [1, 4]}, traced=False
    )
    verdict = only(results)
    assert results.points[0].payload_bytes == (8_000_000, 8_000_000)
    # untraced, the study cannot tell the transfer from the model's own work: the model's time
    # doubling while no measured resource is full is a wait for an unmeasured one (the kernel's
    # copies), the busier of the two that copy named beside it; or the two together, both at
    # their limit; or the cores alone
    assert (verdict.kind, verdict.resource) in (
        ("network", "transfer"),
        ("contended", "cores"),
        ("contended", "unmeasured"),
        ("undecided", "undecided"),
    )
    if verdict.kind == "undecided":
        # the two that do the copying, at their limit within their pooled noise (U* 0.77 and
        # 0.77 in a run here): both named, with what would separate them
        assert verdict.limit is not None
        assert set(verdict.limit.split(" or ")) == {"the host's 2 cores", "the client's CPU"}
        assert "--set client.processes=2" in verdict.sentence
    elif verdict.resource == "unmeasured":
        # the copies are the kernel's CPU (on the cores) and the client's deserialising (its
        # CPU): the busier of the two is named as the busiest measured, whichever it is (a CI
        # run read the client's CPU at U* 0.60 beside the cores' 0.54, the first point's idle
        # use read 0.56 cores as the fixture's fresh tritonserver settled)
        busiest = verdict.evidence[0]
        assert busiest.key in ("host cores", "client cpu"), verdict.evidence
        assert f"the busiest measured is {busiest.name}" in verdict.sentence
        assert verdict.predicted_per_s is None
    elif verdict.resource == "transfer":
        assert "8.0 MB sent and 8.0 MB received" in verdict.sentence
        assert verdict.predicted_per_s is None
    else:
        # no construction bounds the kernel's copies: the prediction is held to its derivation
        assert_predicted_cores(verdict, results)
    # told of a link that loopback's throughput puts at U 0.95 at the peak, the same figures
    # name the link, its plateau predicted as the link's rate over 8 MB a request; where the
    # cores read within their windows' noise of it (U* 0.68-0.88 in runs here), both are named
    peak = max(p.throughput for p in results.points)
    gbps = peak * 8_000_000 * 8 / 0.95 / 1e9
    (told,) = verdicts([replace(p, link_gbps=gbps) for p in results.points])
    if told.kind == "undecided":
        assert told.limit is not None and "the network" in told.limit, told.sentence
        assert "cores" in told.limit, told.sentence
    else:
        assert (told.kind, told.resource) == ("network", "network"), told.sentence
    assert told.predicted_per_s == pytest.approx(gbps * 1e9 / (8_000_000 * 8))
    # told of 1 Gb/s (8 MB in 64 ms, at most 15.6 requests/s), the data refute the link: it
    # carried several times that rate, so it is not named, and the sentence says why
    (slow,) = verdicts([replace(p, link_gbps=1.0) for p in results.points])
    assert slow.resource != "network"
    assert "the network (1 Gb/s) is not named" in slow.sentence
    assert "carried more than the rate the study was told" in slow.sentence


def test_an_open_loop_offered_beyond_capacity_is_saturated(
    truth: TruthServer, tmp_path: Path
) -> None:
    # Past capacity an open loop's requests in flight grow all through the point (about 110
    # more a second: a thread each). A CI host lost 12 % of the instance's time in one 2-s
    # point (U 0.88: 78 requests/s against 91 predicted) while its requests waited in the
    # client (backlog 350 ms, the server's queue 453 ms) where runs here, hogs on both cores
    # included, read a backlog of 2 to 110 ms and a queue of 740 ms: the client's hundreds of
    # threads fed the server slower than it served. Three repeats of a second each grow the
    # threads for 1.5 s, not 2.5, and their mean holds a state of the host that lasts one
    # (the study's own remedy, docs/study.md)
    results = study(
        truth,
        tmp_path,
        model="saturated",
        sweep={"rate": [40.0, 200.0]},
        seconds=1.0,
        repeats=3,
    )
    verdict = only(results)
    assert (verdict.kind, verdict.limit) == ("saturated", "saturated")
    assert "offered" in verdict.sentence
    assert_predicted(verdict, results)
    assert_constructed(triton("saturated"), results, verdict)


def test_a_demand_that_falls_as_batches_fill_is_read_at_the_peak(
    truth: TruthServer, tmp_path: Path
) -> None:
    """An execution costs 8 ms whatever its batch: a request's demand falls from 8 ms alone to
    2 ms in full batches of 4. The capacity from the lowest point (1 / 8 ms) would lie below the
    throughput measured; the one from the peak's demand is the batches' (4 / 8 ms).

    16 in flight keep three batches waiting behind the one executing: at 8, the client's
    turnaround of a finished batch (its threads on a busy 2-core host) left the instance idle
    18 % of the time in CI (367/s, "still rising"), a plateau not reached."""
    results = study(truth, tmp_path, model="amortised", sweep={"concurrency": [1, 16]})
    verdict = only(results)
    assert (verdict.kind, verdict.resource, verdict.limit) == (
        "saturated",
        "instances",
        "amortised",
    )
    assert "the demand at the peak: it fell from" in verdict.sentence
    (row,) = [e for e in verdict.evidence if e.key == "model amortised"]
    assert row.peak_ms < 0.5 * row.low_ms  # batches of 3 or more at the peak
    assert_predicted(verdict, results)
    assert_constructed(batches("amortised"), results, verdict)


def test_dynamic_batching_under_light_load_is_the_batchers_wait(
    truth: TruthServer, tmp_path: Path
) -> None:
    results = study(truth, tmp_path, model="batched", sweep={"concurrency": [1, 2]})
    verdict = only(results)
    assert verdict.kind == "batching"
    delay_ms = model("batched").max_queue_delay_s * 1e3
    assert f"{delay_ms:g} ms max_queue_delay" in verdict.sentence


def test_the_docs_sub_millisecond_example_contradicts_none_of_its_points(tmp_path: Path) -> None:
    """docs/study.md's own example: ``identity_fp32`` (0.2 ms a request) over 1 and 2 instances
    and 1, 2 and 4 threads, on a Triton the study launches. Which resource caps it on this
    2-core host differs from run to run (docs/study.md); what holds in every run is that no
    verdict quotes a capacity below a throughput the study measured, a plateau its knee
    refutes, a resource beyond its parallelism, or a "will not help" that more instances
    refuted: the recorded verdicts of tests/study/data did all of these."""
    results = Study(
        model="identity_fp32",
        server=Triton(MODELS),
        load=Load(seconds=2.0, warmup_s=0.5),
        sweep={"instances": [1, 2], "concurrency": [1, 2, 4]},
        tracing=Tracing(per_second=20),
        out=tmp_path / "study.jsonl",
        progress=False,
    ).run()
    print(results.summary())
    assert results.status == "complete"
    assert [v.kind for v in results.verdicts if v.kind == "failed"] == []
    assert len(results.verdicts) == 5  # along threads at 1 and 2 instances, along instances at 3
    assert results.contradictions() == []


@pytest.fixture(scope="module")
def gil_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """tests/study/truth/gil_app.py: one Python process, 5 ms of CPU a request."""
    with kserve_app("tests.study.truth.gil_app", tmp_path_factory.mktemp("gil") / "log") as url:
        yield url


def test_a_python_servers_own_gil_is_named(gil_server: str, tmp_path: Path) -> None:
    from tests.study.truth.gil_app import WORK_S

    results = Study(
        model="busy",
        server=Remote(gil_server),
        load=Load(seconds=2.0, warmup_s=0.5),
        sweep={"concurrency": [1, 4]},
        out=tmp_path / "study.jsonl",
        progress=False,
    ).run()
    verdict = only(results)
    assert (verdict.kind, verdict.resource) == ("contended", "gil")
    assert "more server processes" in verdict.change
    assert_predicted_one_process(verdict, results)
    assert_constructed(python_process(WORK_S, "the server's"), results, verdict)


class Posts(Workload):
    """A JSON POST to the server's root under a CLIENT span, its trace context in the headers
    (as an instrumented HTTP client sends it)."""

    axes = ()

    def open(
        self, params: Mapping[str, Any], endpoint: Endpoint, *, traced: bool, ready_s: float
    ) -> None:
        self.url = f"http://{endpoint.url('http')}/"

    def __call__(self, index: int) -> None:
        headers = {"content-type": "application/json"}
        with trace.get_tracer("truth").start_as_current_span("POST", kind=SpanKind.CLIENT):
            otelkit.inject(headers)
            request = urllib.request.Request(self.url, b'{"x": [1.0]}', headers, method="POST")
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()


def test_ray_serve_replicas_of_a_cpu_bound_deployment_are_saturated(
    ray_local: LocalRay, tmp_path: Path
) -> None:
    from otelkit.study import RayServe
    from tests.study.truth.ray_busy import WORK_S, busy_app

    results = Study(
        request=Posts(),
        server=RayServe(busy_app, name="truth-ray"),
        # One replica's spin on the host's 2 cores holds them at U 0.6, Ray's idle load with
        # it, beside the replica's 0.9: 4 s makes each U*'s interval about 0.05 here, where
        # 2 s gave 0.07 to 0.09 (0.10 and 0.16 on a CI host, which could not separate them)
        load=Load(seconds=4.0, warmup_s=0.5),
        sweep={"instances": [1], "concurrency": [1, 4]},
        tracing=Tracing(per_second=20),
        out=tmp_path / "study.jsonl",
        progress=False,
    ).run()
    verdict = next(v for v in results.verdicts if v.axis == "concurrency")
    print(results.summary())
    assert (verdict.kind, verdict.resource, verdict.limit) == ("saturated", "instances", "Busy")
    assert results.points[-1].parallelism == {"Busy": 1}
    assert_predicted_one_process(verdict, results)
    assert_constructed(replicas(1, WORK_S, "Busy"), results, verdict)


def test_without_traces_a_busy_instance_is_still_saturated(
    truth: TruthServer, tmp_path: Path
) -> None:
    results = study(truth, tmp_path, model="saturated", sweep={"concurrency": [1, 4]}, traced=False)
    verdict = only(results)
    assert (verdict.kind, verdict.limit) == ("saturated", "saturated")
    assert_predicted(verdict, results)
    assert_constructed(triton("saturated"), results, verdict)


def test_without_traces_a_lock_is_named_as_a_wait_inside_the_model(
    truth: TruthServer, tmp_path: Path
) -> None:
    results = study(truth, tmp_path, model="locked", sweep={"concurrency": [1, 8]}, traced=False)
    verdict = only(results)
    # Triton's counters see the model's compute grow, not which part of it waits: the model is
    # named, and more instances are not advised; no plateau can be predicted from the lowest
    # point without the stages' split (docs/study.md)
    assert (verdict.kind, verdict.limit) == ("contended", "locked")
    assert "more instances will not help" in verdict.change
    assert_constructed(triton("locked"), results)
