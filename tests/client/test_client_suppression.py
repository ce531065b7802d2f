"""``suppress_instrumentation()`` around a call: otelkit adds nothing to it, as contrib does.

Every OpenTelemetry contrib instrumentation checks the suppression key before it makes a span,
records a metric or injects a context; libraries and exporters set it so that their own calls
are not traced. An instrumented tritonclient call made under it runs as a bare one: no span,
no metrics, no ``traceparent`` (so Triton's spans do not join the caller's trace). The same
client outside the block is traced as usual, which each test checks in the same trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.instrumentation.utils import suppress_instrumentation

import otelkit
from otelkit import semconv
from otelkit.receiver import Receiver
from otelkit.testing import ReceiverCapture, wait_until
from otelkit.tritonserver import TritonServer
from tests.client.test_client import DATA, client_for, expected_tree, inputs, shape, telemetry
from tests.client.test_client_asyncio import aio_client, aio_inputs
from tests.core.test_telemetry import samples, scrape
from tests.support import joined_trace

pytestmark = pytest.mark.triton
__all__ = ["telemetry"]  # the fixture, shared with test_client
COUNT = f"{semconv.prometheus_name(semconv.CLIENT_DURATION)}_count"


@contextlib.contextmanager
def suppressed_by_plain_key() -> Iterator[None]:
    """The plain string key that older instrumentations set by hand (contrib still checks it)."""
    token = otel_context.attach(otel_context.set_value("suppress_instrumentation", True))
    try:
        yield
    finally:
        otel_context.detach(token)


def sync_infer(protocol: str) -> Callable[[Any], Any]:
    return lambda client: client.infer("identity_fp32", inputs(protocol)).as_numpy("OUTPUT0")


def http_async_infer(client: Any) -> Any:
    return client.async_infer("identity_fp32", inputs("http")).get_result().as_numpy("OUTPUT0")


def grpc_async_infer(client: Any) -> Any:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.async_infer(
        "identity_fp32", inputs("grpc"), lambda result, error: answers.put((result, error))
    )
    result, error = answers.get(timeout=10)
    assert error is None
    return result.as_numpy("OUTPUT0")


STYLES: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "http infer": ("http", sync_infer("http")),
    "grpc infer": ("grpc", sync_infer("grpc")),
    "http async_infer": ("http", http_async_infer),
    "grpc async_infer": ("grpc", grpc_async_infer),
}


def calls_counted(telemetry: otelkit.Telemetry, protocol: str) -> float:
    """Calls to ``identity_fp32`` over ``protocol`` in the client's duration histogram."""
    assert telemetry.prometheus_url is not None
    return sum(
        value
        for labels, value in samples(scrape(telemetry.prometheus_url), COUNT).items()
        if ("model", "identity_fp32") in labels and ("protocol", protocol) in labels
    )


def check_only_the_unsuppressed_call(
    run: Callable[[], None], protocol: str, spans: ReceiverCapture, telemetry: otelkit.Telemetry
) -> None:
    """``run`` makes, under one job span, a call under suppression and then a call outside it.
    The job's trace must be the tree of one call, and only one call per run counted."""
    before = calls_counted(telemetry, protocol)
    runs: list[str] = []

    def call() -> str:
        with trace.get_tracer("tests").start_as_current_span("job") as job:
            run()
        runs.append(f"{job.get_span_context().trace_id:032x}")
        return runs[-1]

    trace_id, _ = joined_trace(call, spans.receiver.out_dir, count=5)
    expected = expected_tree(protocol)

    # The marker: the unsuppressed call came last, so once its whole chain is in (the job,
    # which ends last here, and Triton's compute span under the call's span), what each
    # exporter sent before it (anything of the suppressed call) is in too.
    def marker_arrived() -> bool:
        return {expected[0], expected[-1]} <= set(shape(spans.trace(trace_id), trace_id))

    wait_until(marker_arrived, 15, "the job and the unsuppressed call's compute span")
    assert shape(spans.trace(trace_id), trace_id) == expected
    assert calls_counted(telemetry, protocol) - before == len(runs)


@pytest.mark.parametrize("style", sorted(STYLES))
@pytest.mark.parametrize("suppress", [suppress_instrumentation, suppressed_by_plain_key])
def test_a_suppressed_sync_call_runs_bare(
    style: str,
    suppress: Callable[[], contextlib.AbstractContextManager[None]],
    triton: TritonServer,
    otelkit_receiver: ReceiverCapture,
    telemetry: otelkit.Telemetry,
) -> None:
    protocol, infer = STYLES[style]
    with otelkit.instrument(client_for(protocol, triton)) as client:

        def run() -> None:
            with suppress():
                assert np.array_equal(infer(client), DATA)
            assert np.array_equal(infer(client), DATA)

        check_only_the_unsuppressed_call(run, protocol, otelkit_receiver, telemetry)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_suppressed_asyncio_call_runs_bare(
    protocol: str,
    triton: TritonServer,
    otelkit_receiver: ReceiverCapture,
    telemetry: otelkit.Telemetry,
) -> None:
    async def both() -> None:
        async with aio_client(protocol, triton) as client:
            with suppress_instrumentation():
                result = await client.infer("identity_fp32", aio_inputs(protocol))
                assert np.array_equal(result.as_numpy("OUTPUT0"), DATA)
            result = await client.infer("identity_fp32", aio_inputs(protocol))
            assert np.array_equal(result.as_numpy("OUTPUT0"), DATA)

    check_only_the_unsuppressed_call(
        lambda: asyncio.run(both()), protocol, otelkit_receiver, telemetry
    )


def test_a_stream_started_under_suppression_runs_bare(
    triton: TritonServer, otelkit_receiver: ReceiverCapture, telemetry: otelkit.Telemetry
) -> None:
    """Its requests, queued outside the block, get no spans either: the stream is bare."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with otelkit.instrument(grpcclient.InferenceServerClient(triton.grpc_url)) as client:

        def run() -> None:
            with suppress_instrumentation():
                client.start_stream(lambda result, error: answers.put((result, error)))
            for request_id in ("a", "b"):
                client.async_stream_infer("identity_fp32", inputs("grpc"), request_id=request_id)
            for _ in range(2):
                result, error = answers.get(timeout=10)
                assert error is None and np.array_equal(result.as_numpy("OUTPUT0"), DATA)
            client.stop_stream()
            assert np.array_equal(sync_infer("grpc")(client), DATA)

        check_only_the_unsuppressed_call(run, "grpc", otelkit_receiver, telemetry)


def test_a_request_queued_under_suppression_on_a_traced_stream_keeps_its_span(
    triton: TritonServer, receiver: Receiver, telemetry: otelkit.Telemetry
) -> None:
    """The stream already sent its context (Triton traces all its requests), and each request
    must wait for its response, else the next one's span would end at its response."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with otelkit.instrument(grpcclient.InferenceServerClient(triton.grpc_url)) as client:

        def run_stream() -> str:
            with trace.get_tracer("tests").start_as_current_span("job") as job:
                client.start_stream(lambda result, error: answers.put((result, error)))
                with suppress_instrumentation():
                    client.async_stream_infer("identity_fp32", inputs("grpc"), request_id="a")
                client.async_stream_infer("identity_fp32", inputs("grpc"), request_id="b")
                got = [answers.get(timeout=10) for _ in range(2)]
                client.stop_stream()
            assert [error for _, error in got] == [None, None]
            return f"{job.get_span_context().trace_id:032x}"

        # job + stream + 2 request spans + 3 Triton spans for each request
        _, spans = joined_trace(run_stream, receiver.out_dir, count=10)
    requests = {
        span.attributes[semconv.REQUEST_ID]: span
        for span in spans
        if span.kind.name == "CLIENT" and semconv.REQUEST_ID in span.attributes
    }
    assert sorted(requests) == ["a", "b"]
    assert all(span.status_code.name == "UNSET" for span in requests.values())
    assert requests["a"].end_ns <= requests["b"].end_ns  # each ended at its own response
