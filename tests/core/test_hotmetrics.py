"""Hot instruments: exact under 256 threads, exported by both metric paths, zeroed after fork."""

from __future__ import annotations

import gzip
import http.server
import multiprocessing
import queue
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, NumberDataPoint
from opentelemetry.sdk.resources import Resource
from prometheus_client.openmetrics.parser import text_string_to_metric_families

import otelkit
from otelkit import semconv
from otelkit._core.hotmetrics import (
    HOT,
    CallSeries,
    CallSpecs,
    HistogramSeries,
    HotRegistry,
    with_hot_metrics,
)
from otelkit.export._processor import PullReader
from otelkit.export._prometheus import PrometheusEndpoint
from tests.core.test_telemetry import scrape

LABELS = (semconv.M_MODEL, semconv.M_SERVER)
BATCH = semconv.MetricSpec("tests.hot.batch", "histogram", "{item}", "Batch sizes.", (1, 8, 64))
DURATION = semconv.MetricSpec(
    "tests.hot.duration", "histogram", "s", "Calls.", semconv.DURATION_BUCKETS_S
)
BYTES = semconv.MetricSpec("tests.hot.sent", "counter", "By", "Bytes sent.")
IN_FLIGHT = semconv.MetricSpec("tests.hot.in_flight", "up_down_counter", "{request}", "Calls.")
CALLS = CallSpecs(  # metrics of their own: series of other tests outlive HOT.reset()
    semconv.MetricSpec(
        "tests.call.duration", "histogram", "s", "Calls.", semconv.DURATION_BUCKETS_S
    ),
    semconv.MetricSpec("tests.call.in_flight", "up_down_counter", "{request}", "In flight."),
    semconv.MetricSpec("tests.call.sent", "counter", "By", "Bytes sent."),
    semconv.MetricSpec("tests.call.received", "counter", "By", "Bytes received."),
)
SECOND = 1_000_000_000


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    HOT.reset()
    yield
    otelkit.shutdown()


GOLDEN = """\
# HELP target_info Resource of the process
# TYPE target_info gauge
target_info{service_name="golden"} 1.0
# HELP tests_hot_batch Batch sizes.
# TYPE tests_hot_batch histogram
tests_hot_batch_bucket{le="1.0",model="gnn",server="a:8001"} 1.0
tests_hot_batch_bucket{le="8.0",model="gnn",server="a:8001"} 3.0 # {span_id="00000000000000bb",trace_id="000000000000000000000000000000aa"} 8.0 1700000002.0
tests_hot_batch_bucket{le="64.0",model="gnn",server="a:8001"} 3.0
tests_hot_batch_bucket{le="+Inf",model="gnn",server="a:8001"} 4.0 # {span_id="00000000000000dd",trace_id="000000000000000000000000000000cc"} 100.0 1700000003.0
tests_hot_batch_count{model="gnn",server="a:8001"} 4.0
tests_hot_batch_sum{model="gnn",server="a:8001"} 115.0
tests_hot_batch_bucket{le="1.0",model="mlp",server="b:8001"} 0.0
tests_hot_batch_bucket{le="8.0",model="mlp",server="b:8001"} 0.0
tests_hot_batch_bucket{le="64.0",model="mlp",server="b:8001"} 1.0 # {span_id="0000000000000002",trace_id="00000000000000000000000000000001"} 32.0 1700000004.0
tests_hot_batch_bucket{le="+Inf",model="mlp",server="b:8001"} 1.0
tests_hot_batch_count{model="mlp",server="b:8001"} 1.0
tests_hot_batch_sum{model="mlp",server="b:8001"} 32.0
# HELP tests_hot_sent_bytes Bytes sent.
# TYPE tests_hot_sent_bytes counter
tests_hot_sent_bytes_total{model="gnn",server="a:8001"} 4096.0
# HELP tests_hot_in_flight Calls.
# TYPE tests_hot_in_flight gauge
tests_hot_in_flight{model="gnn",server="a:8001"} 1.0
# EOF
"""  # noqa: E501


def test_scrape_is_golden_with_each_bucket_newest_exemplar() -> None:
    ticks = iter(range(1_700_000_000 * SECOND, 1_800_000_000 * SECOND, SECOND))
    hot = HotRegistry(clock=lambda: next(ticks))
    reader = PullReader()
    provider = MeterProvider(metric_readers=[reader])
    endpoint = PrometheusEndpoint(reader, "127.0.0.1", 0, {"service.name": "golden"}, hot)
    try:
        gnn = hot.histogram(BATCH, LABELS).series(("gnn", "a:8001"))
        gnn.observe(1)  # on a bound: the bucket it closes, as in OpenTelemetry
        gnn.observe(6, 0x1, 0x2)
        gnn.observe(8, 0xAA, 0xBB)  # newer: replaces the exemplar of 6
        gnn.observe(100, 0xCC, 0xDD)
        hot.histogram(BATCH, LABELS).series(("mlp", "b:8001")).observe(32, 0x1, 0x2)
        hot.counter(BYTES, LABELS).series(("gnn", "a:8001")).add(4096)
        in_flight = hot.up_down_counter(IN_FLIGHT, LABELS).series(("gnn", "a:8001"))
        for step in (1, 1, -1):
            in_flight.add(step)
        assert scrape(endpoint.url) == GOLDEN
    finally:
        endpoint.close()
        provider.shutdown()


def test_configured_endpoint_serves_hot_metrics_under_their_semconv_names(tmp_path: Path) -> None:
    telemetry = otelkit.configure(
        traces_dir=str(tmp_path), prometheus_port=0, metrics_exporter="prometheus"
    )
    HOT.histogram(DURATION, LABELS).series(("gnn", "a:8001")).observe(0.003, 0xAB, 0xCD)
    HOT.counter(BYTES, LABELS).series(("gnn", "a:8001")).add(10)
    assert telemetry.prometheus_url is not None
    families = {f.name: f for f in text_string_to_metric_families(scrape(telemetry.prometheus_url))}
    duration = semconv.prometheus_name(DURATION)
    exemplars = [
        (s.labels["le"], s.exemplar.labels, s.exemplar.value)
        for s in families[duration].samples
        if s.exemplar is not None
    ]
    assert exemplars == [("0.005", {"trace_id": f"{0xAB:032x}", "span_id": f"{0xCD:016x}"}, 0.003)]
    sent = families[semconv.prometheus_name(BYTES).removesuffix("_total")].samples
    assert [(s.name, s.value) for s in sent] == [(semconv.prometheus_name(BYTES), 10.0)]


def test_no_increment_is_lost_under_256_threads() -> None:
    histogram = HOT.histogram(BATCH, LABELS).series(("gnn", "a:8001"))
    counter = HOT.counter(BYTES, LABELS).series(("gnn", "a:8001"))
    start = threading.Barrier(256)

    def work(thread: int) -> None:
        start.wait()
        for _ in range(1000):
            histogram.observe(2, thread + 1, 1)
            counter.add(3)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(256)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    points = {m.name: m.data.data_points[0] for m in HOT.collect()}
    batch, sent = points[BATCH.name], points[BYTES.name]
    assert isinstance(batch, HistogramDataPoint) and isinstance(sent, NumberDataPoint)
    assert (batch.count, batch.bucket_counts, batch.sum, sent.value) == (
        256_000,
        [0, 256_000, 0, 0],
        512e3,
        768_000,
    )


def test_reading_calls_in_flight_counts_no_call() -> None:
    """A call begins without the lock, on a count that every read also draws from: reads must
    discount themselves, and a reset (a forked child) starts from zero."""
    hot = HotRegistry()
    in_flight = hot.up_down_counter(IN_FLIGHT, LABELS).series(("gnn", "a:8001"))

    def value() -> float:
        (metric,) = hot.collect()
        (point,) = metric.data.data_points
        assert isinstance(point, NumberDataPoint)
        return point.value

    in_flight.begin()
    in_flight.begin()
    in_flight.add(-1)  # a stage or a call that ended
    assert [value() for _ in range(5)] == [1, 1, 1, 1, 1]
    in_flight.begin()
    assert value() == 2
    hot.reset()
    assert value() == 0
    in_flight.begin()
    assert [value() for _ in range(3)] == [1, 1, 1]


def test_a_call_series_changes_its_four_metrics_together_under_256_threads() -> None:
    calls = HOT.calls(CALLS, LABELS, ("tracking", "b:8001"))
    assert HOT.calls(CALLS, LABELS, ("tracking", "b:8001")) is calls  # clients share it
    start, ended = threading.Barrier(256), threading.Barrier(256)
    seen_in_flight: list[float] = []

    def work(thread: int) -> None:
        start.wait()
        calls.in_flight.begin()
        ended.wait()  # every call is in flight at once here
        if thread == 0:
            seen_in_flight.append(_points((CALLS.in_flight.name,))[0][1][0])
        ended.wait()
        calls.end(0.002, 10, 20, thread + 1, 7)
        for _ in range(999):
            calls.in_flight.begin()
            calls.end(0.002, 10, 20)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(256)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ours = {spec.name for spec in CALLS}
    points = {m.name: m.data.data_points[0] for m in HOT.collect() if m.name in ours}
    duration = points[CALLS.duration.name]
    assert isinstance(duration, HistogramDataPoint)
    assert seen_in_flight == [256]
    assert (duration.count, duration.sum) == (256_000, pytest.approx(512.0))
    assert {name: p.value for name, p in points.items() if isinstance(p, NumberDataPoint)} == {
        CALLS.in_flight.name: 0,
        CALLS.request_bytes.name: 2_560_000,
        CALLS.response_bytes.name: 5_120_000,
    }
    (exemplar,) = duration.exemplars  # the newest of the sampled calls, in its bucket
    assert exemplar.span_id == 7 and 1 <= exemplar.trace_id <= 256


def test_a_call_series_needs_series_of_its_own() -> None:
    hot = HotRegistry()
    hot.histogram(CALLS.duration, LABELS).series(("gnn", "a:8001"))  # created with its own lock
    with pytest.raises(ValueError, match="has a lock of its own"):
        hot.calls(CALLS, LABELS, ("gnn", "a:8001"))
    assert isinstance(hot.calls(CALLS, LABELS, ("embed", "a:8001")), CallSeries)


class _OtlpMetrics(http.server.BaseHTTPRequestHandler):
    received: queue.Queue[ExportMetricsServiceRequest]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.received.put(ExportMetricsServiceRequest.FromString(body))
        reply = ExportMetricsServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture
def otlp_server() -> Iterator[tuple[str, queue.Queue[ExportMetricsServiceRequest]]]:
    received: queue.Queue[ExportMetricsServiceRequest] = queue.Queue()
    handler = type("Handler", (_OtlpMetrics,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/metrics", received
    otelkit.shutdown()  # its last push must still find the server
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_otlp_push_delivers_hot_histograms_with_exemplars(
    tmp_path: Path, otlp_server: tuple[str, queue.Queue[ExportMetricsServiceRequest]]
) -> None:
    url, received = otlp_server
    otelkit.configure(
        service_name="hot-push",
        traces_dir=str(tmp_path),
        metrics_endpoint=url,
        metrics_exporter="otlp",
    )
    series = HOT.histogram(DURATION, LABELS).series(("gnn", "a:8001"))
    with trace.get_tracer("tests").start_as_current_span("call") as span:
        context = span.get_span_context()
        series.observe(0.003, context.trace_id, context.span_id)
    series.observe(0.02)
    assert otelkit.flush()
    request = received.get(timeout=5)
    (resource_metrics,) = request.resource_metrics
    service = {a.key: a.value.string_value for a in resource_metrics.resource.attributes}
    assert service["service.name"] == "hot-push"
    (ours,) = [s for s in resource_metrics.scope_metrics if s.scope.name == "otelkit"]
    (metric,) = [m for m in ours.metrics if m.name == DURATION.name]
    (point,) = metric.histogram.data_points
    assert (
        metric.unit,
        metric.histogram.aggregation_temporality,
        {a.key: a.value.string_value for a in point.attributes},
        list(point.explicit_bounds),
        list(point.bucket_counts),
        point.count,
        point.sum,
        (point.min, point.max),
        [(e.as_double, e.trace_id, e.span_id) for e in point.exemplars],
    ) == (
        "s",
        2,  # AGGREGATION_TEMPORALITY_CUMULATIVE
        {"model": "gnn", "server": "a:8001"},
        list(semconv.DURATION_BUCKETS_S),
        [0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        2,
        0.023,
        (0.003, 0.02),
        [(0.003, context.trace_id.to_bytes(16, "big"), context.span_id.to_bytes(8, "big"))],
    )


def test_hot_metrics_alone_make_a_resource_of_their_own() -> None:
    hot = HotRegistry()
    hot.counter(BYTES, LABELS).series(("gnn", "a:8001")).add(1)
    resource = Resource({"service.name": "alone"})
    data = with_hot_metrics(None, hot.collect(), resource)
    assert data is not None
    assert [
        (rm.resource, [(s.scope.name, [m.name for m in s.metrics]) for s in rm.scope_metrics])
        for rm in data.resource_metrics
    ] == [(resource, [("otelkit", [BYTES.name])])]


def _points(names: tuple[str, ...]) -> list[tuple[str, list[Any]]]:
    """What HOT would export of these metrics: a counter's values, a histogram's counts."""
    return sorted(
        (m.name, [getattr(p, "value", getattr(p, "count", None)) for p in m.data.data_points])
        for m in HOT.collect()
        if m.name in names
    )


def _report_in_child(histogram: HistogramSeries, conn: Connection) -> None:
    before = _points((BATCH.name, BYTES.name))
    histogram.observe(2)  # the parent held this series' lock when it forked
    conn.send((before, _points((BATCH.name,))))


def _call_in_child(calls: CallSeries, conn: Connection) -> None:
    calls.in_flight.begin()  # the parent held this call series' shared lock when it forked
    calls.end(0.5, 1, 2)
    conn.send(_points(tuple(spec.name for spec in CALLS)))


def test_forked_child_takes_a_call_series_lock_held_at_the_fork() -> None:
    calls = HOT.calls(CALLS, LABELS, ("tracking", "b:8001"))
    calls.in_flight.begin()
    calls.end(0.1, 100, 200)
    context = multiprocessing.get_context("fork")
    parent_end, child_end = context.Pipe()
    calls.duration._guard.lock.acquire()  # the one lock of all four series
    try:
        child = context.Process(target=_call_in_child, args=(calls, child_end))
        child.start()
    finally:
        calls.duration._guard.lock.release()
    assert parent_end.poll(20), "the child hung: it inherited a lock held at the fork"
    child.join(10)
    assert parent_end.recv() == [
        (CALLS.duration.name, [1]),
        (CALLS.in_flight.name, [0]),
        (CALLS.response_bytes.name, [2]),
        (CALLS.request_bytes.name, [1]),
    ]  # sorted by name
    assert child.exitcode == 0


def test_forked_child_starts_from_zero_with_the_series_it_holds() -> None:
    histogram = HOT.histogram(BATCH, LABELS).series(("gnn", "a:8001"))
    counter = HOT.counter(BYTES, LABELS).series(("gnn", "a:8001"))
    for _ in range(3):
        histogram.observe(2)
        counter.add(5)
    context = multiprocessing.get_context("fork")
    parent_end, child_end = context.Pipe()
    histogram._guard.lock.acquire()  # as if another thread were mid-observation at the fork
    try:
        child = context.Process(target=_report_in_child, args=(histogram, child_end))
        child.start()
    finally:
        histogram._guard.lock.release()
    assert parent_end.poll(20), "the child hung: it inherited a lock held at the fork"
    child.join(10)
    # an empty histogram is not exported; a counter at zero is
    assert parent_end.recv() == ([(BYTES.name, [0])], [(BATCH.name, [1])])
    assert child.exitcode == 0
    assert _points((BATCH.name, BYTES.name)) == [(BATCH.name, [3]), (BYTES.name, [15])]


def test_misuse_fails_at_definition() -> None:
    hot = HotRegistry()
    hot.histogram(BATCH, LABELS)
    with pytest.raises(ValueError, match="exists with labels"):
        hot.histogram(BATCH, (semconv.M_MODEL,))
    with pytest.raises(ValueError, match="is a counter, not a histogram"):
        hot.histogram(BYTES, LABELS)
    with pytest.raises(ValueError, match="are not values of"):
        hot.counter(BYTES, LABELS).series(("gnn",))
