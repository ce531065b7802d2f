"""otelkit.instrument(client) against a real tritonserver: joined spans, metrics, errors."""

from __future__ import annotations

import logging
import queue
import socket
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry import trace
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

import otelkit
from otelkit import semconv
from otelkit._core import guard
from otelkit._core.worker import LATER
from otelkit.analysis import Span, build_traces, load_spans
from otelkit.client import _call
from otelkit.receiver import Receiver
from otelkit.tritonserver import TritonServer
from tests.core.test_telemetry import samples, scrape
from tests.paths import MODELS
from tests.support import joined_trace, wait_for_trace

pytestmark = pytest.mark.triton
MODULES = {"http": httpclient, "grpc": grpcclient}
DATA = np.arange(8, dtype=np.float32).reshape(2, 4)


@pytest.fixture
def telemetry(receiver: Receiver) -> Iterator[otelkit.Telemetry]:
    yield otelkit.configure(
        service_name="client-tests",
        traces_endpoint=receiver.traces_url,
        bsp_schedule_delay_ms=50,
        bsp_max_queue_size=200_000,
        metrics_exporter="prometheus",
        prometheus_port=0,
    )
    otelkit.uninstrument()
    otelkit.shutdown()


def client_for(protocol: str, triton: TritonServer, **kwargs: Any) -> Any:
    url = triton.http_url if protocol == "http" else triton.grpc_url
    return MODULES[protocol].InferenceServerClient(url, **kwargs)


def inputs(protocol: str, data: np.ndarray = DATA) -> list[Any]:
    tensor = MODULES[protocol].InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return [tensor]


def traced(fn: Any) -> tuple[str, str, Any]:
    """Run ``fn`` under a parent span; its trace id, span id and result."""
    with trace.get_tracer("tests").start_as_current_span("job") as job:
        result = fn()
        context = job.get_span_context()
    return f"{context.trace_id:032x}", f"{context.span_id:016x}", result


def shape(spans: list[Span], trace_id: str) -> list[tuple[int, str, str]]:
    tree = build_traces(spans)[trace_id]
    return [(depth, span.name, str(span.resource["service.name"])) for depth, span in tree.walk()]


def expected_tree(protocol: str, model: str = "identity_fp32") -> list[tuple[int, str, str]]:
    method = semconv.RPC_METHOD_GRPC_INFER if protocol == "grpc" else semconv.RPC_METHOD_HTTP_INFER
    return [
        (0, "job", "client-tests"),
        (1, f"{method} {model}", "client-tests"),
        (2, "InferRequest", "triton-tests"),
        (3, model, "triton-tests"),
        (4, "compute", "triton-tests"),
    ]


def client_span(spans: list[Span]) -> Span:
    (span,) = [s for s in spans if s.kind.name == "CLIENT"]
    return span


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_infer_span_is_the_parent_of_tritons_spans(
    protocol: str, triton: TritonServer, receiver: Receiver, telemetry: otelkit.Telemetry
) -> None:
    caller_headers = {"x-experiment": "cms"}
    with client_for(protocol, triton) as client:
        assert otelkit.instrument(client) is client
        assert otelkit.instrument(client) is client  # twice changes nothing
        results = []

        def call() -> str:
            trace_id, _, result = traced(
                lambda: client.infer("identity_fp32", inputs(protocol), headers=caller_headers)
            )
            results.append(result)
            return trace_id

        trace_id, spans = joined_trace(call, receiver.out_dir, count=5)
    assert np.array_equal(results[-1].as_numpy("OUTPUT0"), DATA)
    assert caller_headers == {"x-experiment": "cms"}  # the caller's dict is never written
    assert shape(spans, trace_id) == expected_tree(protocol)
    span = client_span(spans)
    port = int((triton.http_url if protocol == "http" else triton.grpc_url).rsplit(":", 1)[1])
    timing = {k: v for k, v in span.attributes.items() if k.startswith("otelkit.client.")}
    connect = timing.pop(semconv.CONNECT_S, 0.0)  # within wire_s: a call that opened its connection
    assert set(timing) == {semconv.SERIALIZE_S, semconv.WIRE_S, semconv.DESERIALIZE_S}
    assert 0 <= connect < timing[semconv.WIRE_S]
    # the phases split the call's own clock, so they add up to the span's duration
    assert sum(timing.values()) == pytest.approx(span.duration_ns / 1e9, abs=1e-9)
    assert {k: v for k, v in span.attributes.items() if not k.startswith("otelkit.client.")} == {
        semconv.RPC_SYSTEM_NAME: "grpc" if protocol == "grpc" else "kserve_v2_http",
        semconv.RPC_METHOD: span.name.split(" ")[0],
        semconv.SERVER_ADDRESS: "127.0.0.1",
        semconv.SERVER_PORT: port,
        semconv.MODEL_NAME: "identity_fp32",
        semconv.PROTOCOL: protocol,
        semconv.CALL_STYLE: "infer",
        semconv.INPUT_COUNT: 1,
        semconv.OUTPUT_COUNT: 1,
        semconv.BATCH_SIZE: 2,
        semconv.REQUEST_BYTES: DATA.nbytes,
        semconv.RESPONSE_BYTES: DATA.nbytes,
    }


def test_a_call_that_opens_its_connection_says_how_long_that_took(
    triton: TritonServer, receiver: Receiver, telemetry: otelkit.Telemetry
) -> None:
    """A new HTTP client's first call resolves the server's name and connects (geventhttpclient
    makes connections as calls need them): ``otelkit.client.connect_s``, within its wire time,
    which the breakdown takes out of the network. The next call reuses the connection."""
    client = otelkit.instrument(client_for("http", triton))
    try:
        first, _, _ = traced(lambda: client.infer("identity_fp32", inputs("http")))
        second, _, _ = traced(lambda: client.infer("identity_fp32", inputs("http")))
    finally:
        client.close()
    spans = {t: client_span(wait_for_trace(receiver.out_dir, t, count=2)) for t in (first, second)}
    opened, reused = spans[first].attributes, spans[second].attributes
    assert 0 < opened[semconv.CONNECT_S] < opened[semconv.WIRE_S]
    assert semconv.CONNECT_S not in reused and reused[semconv.WIRE_S] > 0
    otelkit.uninstrument(client)
    pool = client._client_stub._connection_pool
    assert pool._create_socket.__func__ is type(pool)._create_socket  # its own again


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_client_that_sends_no_context_keeps_its_spans_and_metrics(
    protocol: str, triton: TritonServer, receiver: Receiver, telemetry: otelkit.Telemetry
) -> None:
    """``otelkit.instrument(client, send_context=False)``: the call's span is as complete as
    ever (phases, bytes, a child of the job), but no context reaches Triton, whose own spans
    (it traces every request here) start a trace of their own; the caller's headers are still
    never written. A second ``instrument`` with ``send_context=True`` sends it again."""
    caller_headers = {"x-experiment": "cms"}
    with client_for(protocol, triton) as client:
        assert otelkit.instrument(client, send_context=False) is client
        quiet_trace, job_id, result = traced(
            lambda: client.infer("identity_fp32", inputs(protocol), headers=caller_headers)
        )
        assert np.array_equal(result.as_numpy("OUTPUT0"), DATA)
        otelkit.instrument(client, send_context=True)
        # Triton's spans of the first call have come by the time those of the second have
        joined, spans = joined_trace(
            lambda: traced(lambda: client.infer("identity_fp32", inputs(protocol)))[0],
            receiver.out_dir,
            count=5,
        )
    assert caller_headers == {"x-experiment": "cms"}
    assert shape(spans, joined) == expected_tree(protocol)
    quiet = wait_for_trace(receiver.out_dir, quiet_trace, count=2)
    assert shape(quiet, quiet_trace) == expected_tree(protocol)[:2]
    span = client_span(quiet)
    assert span.parent_span_id == job_id
    assert {semconv.SERIALIZE_S, semconv.WIRE_S, semconv.DESERIALIZE_S} <= set(span.attributes)
    assert span.attributes[semconv.RESPONSE_BYTES] == DATA.nbytes


def test_send_context_applies_to_one_client_only() -> None:
    with pytest.raises(TypeError, match=r"otelkit.instrument\(client, send_context=False\)"):
        otelkit.instrument(send_context=False)


def test_http_async_infer_span_ends_at_get_result(
    triton: TritonServer, receiver: Receiver, telemetry: otelkit.Telemetry
) -> None:
    with otelkit.instrument(client_for("http", triton, concurrency=2)) as client:
        trace_id, _, result = traced(
            lambda: client.async_infer("identity_fp32", inputs("http")).get_result()
        )
    assert np.array_equal(result.as_numpy("OUTPUT0"), DATA)
    spans = wait_for_trace(receiver.out_dir, trace_id, count=5)
    assert shape(spans, trace_id) == expected_tree("http")
    assert client_span(spans).attributes[semconv.CALL_STYLE] == "async_infer"


def test_grpc_async_infer_span_ends_in_the_callback(
    triton: TritonServer, receiver: Receiver, telemetry: otelkit.Telemetry
) -> None:
    done: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with otelkit.instrument(client_for("grpc", triton)) as client:

        def call() -> str:
            trace_id, _, _ = traced(
                lambda: client.async_infer(
                    "identity_fp32", inputs("grpc"), lambda result, error: done.put((result, error))
                )
            )
            result, error = done.get(timeout=10)
            assert error is None
            assert np.array_equal(result.as_numpy("OUTPUT0"), DATA)
            return trace_id

        trace_id, spans = joined_trace(call, receiver.out_dir, count=5)
    assert shape(spans, trace_id) == expected_tree("grpc")
    span = client_span(spans)
    assert span.attributes[semconv.CALL_STYLE] == "async_infer"
    assert span.attributes[semconv.RESPONSE_BYTES] == DATA.nbytes


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


FAILURES = [  # protocol, model, client options, call options, exception, error.type
    ("http", "no_such_model", {}, {}, InferenceServerException, "404"),
    ("grpc", "no_such_model", {}, {}, InferenceServerException, "NOT_FOUND"),
    (
        "grpc",
        "sleep_fp32",
        {},
        {"client_timeout": 0.1},
        InferenceServerException,
        "DEADLINE_EXCEEDED",
    ),
    ("http", "sleep_fp32", {"network_timeout": 0.1}, {}, TimeoutError, "TimeoutError"),
]


@pytest.mark.parametrize(
    ("protocol", "model", "options", "call_options", "exception", "error_type"), FAILURES
)
def test_failures_give_an_error_span_and_the_original_exception(
    protocol: str,
    model: str,
    options: dict[str, Any],
    call_options: dict[str, Any],
    exception: type[BaseException],
    error_type: str,
    triton: TritonServer,
    receiver: Receiver,
    telemetry: otelkit.Telemetry,
) -> None:
    def call(client: Any) -> BaseException:
        with pytest.raises(exception) as caught:
            client.infer(model, inputs(protocol), **call_options)
        return caught.value

    with client_for(protocol, triton, **options) as bare:
        bare_error = call(bare)
    with otelkit.instrument(client_for(protocol, triton, **options)) as client:
        trace_id, _, error = traced(lambda: call(client))
    assert type(error) is type(bare_error)
    assert str(error) == str(bare_error)
    spans = wait_for_trace(receiver.out_dir, trace_id, count=2, timeout=10)
    span = client_span(spans)
    assert span.status_code.name == "ERROR"
    assert span.attributes[semconv.ERROR_TYPE] == error_type
    (event,) = span.events
    assert event.name == "exception"
    assert event.attributes["exception.type"] == exception.__qualname__
    assert event.attributes["exception.message"] == str(error)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_server_down_gives_an_error_span_and_the_original_exception_type(
    protocol: str, receiver: Receiver, telemetry: otelkit.Telemetry
) -> None:
    url = f"127.0.0.1:{closed_port()}"
    module = MODULES[protocol]

    def call() -> BaseException:
        client = otelkit.instrument(module.InferenceServerClient(url))
        try:
            client.infer("identity_fp32", inputs(protocol))
        except Exception as error:
            return error
        finally:
            client.close()
        raise AssertionError("a call to a closed port succeeded")

    trace_id, _, error = traced(call)
    bare = module.InferenceServerClient(url)
    try:
        bare.infer("identity_fp32", inputs(protocol))
    except Exception as bare_error:
        assert type(error) is type(bare_error)
    finally:
        bare.close()
    span = client_span(wait_for_trace(receiver.out_dir, trace_id, count=2, timeout=10))
    assert span.status_code.name == "ERROR"
    assert semconv.ERROR_TYPE in span.attributes


def test_results_unchanged_when_the_collector_is_dead(triton: TritonServer) -> None:
    telemetry = otelkit.configure(
        service_name="dead-collector",
        endpoint=f"http://127.0.0.1:{closed_port()}",
        export_timeout_ms=100,
        bsp_schedule_delay_ms=10,
    )
    try:
        with otelkit.instrument(client_for("grpc", triton)) as client:
            for _ in range(5):
                result = client.infer("identity_fp32", inputs("grpc"))
                assert np.array_equal(result.as_numpy("OUTPUT0"), DATA)
        telemetry.flush(timeout_s=5)
        assert telemetry.stats()["exported"] == 0
        assert telemetry.stats().get("dropped_export_failed", 0) == 5
    finally:
        otelkit.shutdown()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_failure_inside_otelkit_never_reaches_the_call(
    protocol: str,
    triton: TritonServer,
    telemetry: otelkit.Telemetry,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """otelkit's own code failing where a call starts, where its headers are made and where
    its telemetry ends (on the worker): every call returns its result, each failure is
    counted on the health metric and each place is logged once."""
    monkeypatch.setattr("otelkit._errors.RAISE_INTERNAL_ERRORS", False)  # as for a user
    monkeypatch.setattr("otelkit._core.guard.INTERNAL_ERRORS", guard.InternalErrors())

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("otelkit bug")

    places = [(type(_call.RECORDER), "start"), (_call, "headers_for"), (_call, "_describe")]
    client = otelkit.instrument(client_for(protocol, triton))
    with caplog.at_level(logging.ERROR, logger="otelkit"):
        for holder, name in places:
            with monkeypatch.context() as patch:
                patch.setattr(holder, name, broken)
                for _ in range(2):
                    result = client.infer("identity_fp32", inputs(protocol), headers={"x-a": "b"})
                    assert np.array_equal(result.as_numpy("OUTPUT0"), DATA)
                LATER.drain()
    client.close()
    assert guard.INTERNAL_ERRORS.total == 2 * len(places)
    assert [record.getMessage().split(";")[0] for record in caplog.records] == [
        "otelkit: telemetry failed while starting a client span for infer",
        "otelkit: telemetry failed while injecting trace context",
        "otelkit: telemetry failed while ending a call's span and metrics",
    ]
    assert telemetry.prometheus_url is not None
    exposition = scrape(telemetry.prometheus_url)
    name = semconv.prometheus_name(semconv.TELEMETRY_INTERNAL_ERRORS)
    assert samples(exposition, name) == {(): 2.0 * len(places)}
    in_flight = [
        value
        for labels, value in samples(
            exposition, semconv.prometheus_name(semconv.CLIENT_IN_FLIGHT)
        ).items()
        if (semconv.M_PROTOCOL, protocol) in labels
    ]
    assert in_flight and set(in_flight) == {0}  # a call whose span failed to start never began


def test_uninstrument_restores_the_client(
    triton: TritonServer, telemetry: otelkit.Telemetry
) -> None:
    with client_for("grpc", triton) as client:
        infer = client.infer
        otelkit.instrument(client)
        assert client.infer != infer
        otelkit.uninstrument(client)
        assert client.infer == infer
        before = telemetry.stats()["exported"]
        client.infer("identity_fp32", inputs("grpc"))
        telemetry.flush()
        assert telemetry.stats()["exported"] == before


def test_class_instrumentation_traces_every_new_client(
    triton: TritonServer, receiver: Receiver, telemetry: otelkit.Telemetry
) -> None:
    assert sorted(otelkit.instrument()) == [
        "tritonclient.grpc",
        "tritonclient.grpc.aio",
        "tritonclient.http",
        "tritonclient.http.aio",
    ]
    with client_for("http", triton) as client:
        trace_id, _, _ = traced(lambda: client.infer("identity_fp32", inputs("http")))
    assert shape(wait_for_trace(receiver.out_dir, trace_id, count=5), trace_id) == expected_tree(
        "http"
    )


def test_duration_histogram_carries_the_trace_id_as_exemplar(
    triton: TritonServer, telemetry: otelkit.Telemetry
) -> None:
    with otelkit.instrument(client_for("grpc", triton)) as client:
        trace_id, _, _ = traced(lambda: client.infer("identity_fp32", inputs("grpc")))
    assert telemetry.prometheus_url is not None
    name = f"{semconv.prometheus_name(semconv.CLIENT_DURATION)}_bucket"
    exemplar_ids = {
        sample.exemplar.labels["trace_id"]
        for family in text_string_to_metric_families(scrape(telemetry.prometheus_url))
        for sample in family.samples
        if sample.name == name and sample.exemplar and sample.labels["model"] == "identity_fp32"
    }
    assert trace_id in exemplar_ids


def test_each_model_version_has_its_own_series(
    triton: TritonServer, telemetry: otelkit.Telemetry
) -> None:
    """Calls naming a version and calls leaving it to the server are counted apart (the
    client keys its series by model alone for the latter)."""
    assert telemetry.prometheus_url is not None
    url = telemetry.prometheus_url
    name = f"{semconv.prometheus_name(semconv.CLIENT_DURATION)}_count"

    def counts() -> Counter[str]:
        found: Counter[str] = Counter()
        for family in text_string_to_metric_families(scrape(url)):
            for sample in family.samples:
                labels = sample.labels
                if sample.name == name and labels[semconv.M_PROTOCOL] == "grpc":
                    found[labels[semconv.M_MODEL_VERSION]] += int(sample.value)
        return found

    before = counts()
    with otelkit.instrument(client_for("grpc", triton)) as client:
        for version in ("", "1", "1", ""):
            client.infer("identity_fp32", inputs("grpc"), model_version=version)
        client.infer("identity_fp32", inputs("grpc"))
    assert counts() - before == {"": 3, "1": 2}


@pytest.fixture(scope="module")
def untraced_triton() -> Iterator[TritonServer]:
    """A tritonserver with its tracing off.

    Triton 2.51 (the nvidia-pytriton 0.7.0 bundle) crashes within seconds when hundreds of
    concurrent gRPC requests carry a ``traceparent``, even from a bare tritonclient with no
    otelkit: its gRPC carrier reads metadata past its end (a ``strlen`` on a gRPC
    ``string_ref``). The thread-safety of otelkit's client is what this test checks.
    """
    with TritonServer(MODELS) as server:
        yield server


def test_256_threads_share_one_client_one_span_per_call(
    untraced_triton: TritonServer, receiver: Receiver, telemetry: otelkit.Telemetry
) -> None:
    triton = untraced_triton
    threads, calls = 256, 100
    tracer = trace.get_tracer("tests")
    with otelkit.instrument(client_for("grpc", triton)) as client:

        def worker(index: int) -> str:
            with tracer.start_as_current_span(f"worker-{index}") as parent:
                for _ in range(calls):
                    client.infer("identity_fp32", inputs("grpc", DATA[:1]))
                return f"{parent.get_span_context().span_id:016x}"

        with ThreadPoolExecutor(threads) as pool:
            parents = list(pool.map(worker, range(threads)))
    telemetry.flush(timeout_s=60)
    stats = telemetry.stats()
    assert stats == {"exported": stats["exported"], "queued": 0, "in_export": 0}  # none dropped
    wanted = set(parents)
    ours = [
        s
        for s in load_spans(receiver.out_dir)
        if s.span_id in wanted or (s.kind.name == "CLIENT" and s.parent_span_id in wanted)
    ]
    workers = {s.span_id: s for s in ours if s.name.startswith("worker-")}
    clients = [s for s in ours if s.kind.name == "CLIENT"]
    assert set(workers) == set(parents)
    assert len(clients) == threads * calls
    per_parent: dict[str, int] = {}
    for span in clients:
        assert span.trace_id == workers[span.parent_span_id].trace_id
        per_parent[span.parent_span_id] = per_parent.get(span.parent_span_id, 0) + 1
    assert set(per_parent.values()) == {calls}
