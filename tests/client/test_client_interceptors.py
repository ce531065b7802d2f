"""otelkit beside OpenTelemetry's own gRPC and aiohttp instrumentations, which hook into every
channel and every ``aiohttp`` session.

``opentelemetry-bootstrap`` installs ``opentelemetry-instrumentation-grpc`` wherever grpcio is,
and ``-aiohttp-client`` wherever aiohttp is (``tritonclient.http.aio``'s transport), so a user
of ``opentelemetry-instrument`` has their hooks on tritonclient's channel or session. Each call
must still give one CLIENT span, otelkit's, with Triton's spans under it, and carry the context
otelkit decided on (none for a call not sampled); the hooks still run.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aio_grpcclient
import tritonclient.http.aio as aio_httpclient
from aiohttp import TraceConfig, TraceRequestStartParams
from opentelemetry import trace
from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorClient, GrpcInstrumentorClient

import otelkit
from otelkit.analysis import load_spans
from otelkit.receiver import Receiver
from otelkit.tritonserver import TritonServer
from tests.client.test_client import (
    DATA,
    client_span,
    expected_tree,
    inputs,
    shape,
    telemetry,
    traced,
)
from tests.client.test_client_asyncio import aio_inputs
from tests.client.test_client_streams import IDS, check_stream_trace, stream_inputs
from tests.support import joined_trace

pytestmark = pytest.mark.triton
__all__ = ["telemetry"]  # the fixture, shared with test_client
CONTRIB_SPAN = "/inference.GRPCInferenceService/ModelInfer"  # the name contrib gives its span
AIOHTTP_SCOPE = "opentelemetry.instrumentation.aiohttp_client"


class _Recorder(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """A user's own interceptor: notes the metadata each call leaves the client with."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self.seen.append(dict(details.metadata or ()))
        return continuation(details, request)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        self.seen.append(dict(details.metadata or ()))
        return continuation(details, requests)


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Recorder]:
    """Channels opened meanwhile pass OpenTelemetry's gRPC interceptor (sync and asyncio), then
    a recorder of what goes on the wire: the order ``opentelemetry-instrument`` gives them
    when a library (here the test) wraps ``grpc.insecure_channel`` itself."""
    found = _Recorder()
    plain = grpc.insecure_channel
    monkeypatch.setattr(
        grpc, "insecure_channel", lambda *a, **k: grpc.intercept_channel(plain(*a, **k), found)
    )
    sync, aio = GrpcInstrumentorClient(), GrpcAioInstrumentorClient()
    sync.instrument()
    aio.instrument()
    try:
        yield found
    finally:
        sync.uninstrument()
        aio.uninstrument()


def test_one_span_per_call_joined_to_tritons_through_opentelemetrys_interceptor(
    triton: TritonServer, receiver: Receiver, telemetry: otelkit.Telemetry, recorder: _Recorder
) -> None:
    """``infer`` and ``async_infer``: the tree is the one without the interceptor, and the
    context that left the client, after every interceptor, is otelkit's span's."""
    done: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with otelkit.instrument(grpcclient.InferenceServerClient(triton.grpc_url)) as client:

        def infer() -> Any:
            return client.infer("identity_fp32", inputs("grpc"))

        def async_infer() -> Any:
            client.async_infer(
                "identity_fp32", inputs("grpc"), lambda result, error: done.put((result, error))
            )
            result, error = done.get(timeout=10)
            assert error is None
            return result

        for call in (infer, async_infer):

            def run(call: Callable[[], Any] = call) -> str:
                trace_id, _, result = traced(call)
                assert np.array_equal(result.as_numpy("OUTPUT0"), DATA)
                return trace_id

            trace_id, spans = joined_trace(run, receiver.out_dir, count=5)
            assert shape(spans, trace_id) == expected_tree("grpc"), call.__name__
            sent = recorder.seen[-1]["traceparent"].split("-")  # flags: sampled, random id
            assert sent == ["00", trace_id, client_span(spans).span_id, "03"], call.__name__
    assert [s for s in load_spans(receiver.out_dir) if s.name == CONTRIB_SPAN] == []


def test_a_call_not_sampled_sends_no_context_through_opentelemetrys_interceptor(
    triton: TritonServer, receiver: Receiver, telemetry: otelkit.Telemetry, recorder: _Recorder
) -> None:
    """Triton traces every request that carries a context: the interceptor must not add one
    to a call otelkit did not sample, nor to a stream."""
    otelkit.configure(
        service_name="client-tests", traces_endpoint=receiver.traces_url, sampler="always_off"
    )
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with otelkit.instrument(grpcclient.InferenceServerClient(triton.grpc_url)) as client:
        results = [client.infer("identity_fp32", inputs("grpc")) for _ in range(3)]
        client.start_stream(lambda result, error: answers.put((result, error)))
        client.async_stream_infer("identity_fp32", stream_inputs(grpcclient))
        assert answers.get(timeout=10)[1] is None
        client.stop_stream()
    assert all(np.array_equal(r.as_numpy("OUTPUT0"), DATA) for r in results)
    assert len(recorder.seen) == 4  # three calls and a stream, each through the interceptors
    assert [m for m in recorder.seen if "traceparent" in m] == []


def test_asyncio_calls_and_streams_through_opentelemetrys_interceptor(
    triton: TritonServer, receiver: Receiver, telemetry: otelkit.Telemetry, recorder: _Recorder
) -> None:
    tracer = trace.get_tracer("tests")

    async def infer() -> str:
        client = otelkit.instrument(aio_grpcclient.InferenceServerClient(triton.grpc_url))
        assert client._channel._unary_unary_interceptors  # OpenTelemetry's, on this channel
        with tracer.start_as_current_span("job") as job:
            result = await client.infer("identity_fp32", stream_inputs(aio_grpcclient))
        assert np.array_equal(result.as_numpy("OUTPUT0"), DATA)
        await client.close()
        return f"{job.get_span_context().trace_id:032x}"

    trace_id, spans = joined_trace(lambda: asyncio.run(infer()), receiver.out_dir, count=5)
    assert shape(spans, trace_id) == expected_tree("grpc")

    async def stream() -> str:
        client = otelkit.instrument(aio_grpcclient.InferenceServerClient(triton.grpc_url))

        async def requests() -> AsyncIterator[dict[str, Any]]:
            for request_id in IDS:
                yield {
                    "model_name": "identity_fp32",
                    "inputs": stream_inputs(aio_grpcclient),
                    "request_id": request_id,
                }

        with tracer.start_as_current_span("job") as job:
            async for _, error in client.stream_infer(requests()):
                assert error is None
        await client.close()
        return f"{job.get_span_context().trace_id:032x}"

    trace_id, spans = joined_trace(
        lambda: asyncio.run(stream()), receiver.out_dir, count=2 + 4 * len(IDS)
    )
    check_stream_trace(spans, trace_id, IDS, "asyncio_stream", failed={})
    assert [s for s in load_spans(receiver.out_dir) if s.name.startswith("/inference.")] == []


class _SentHeaders:
    """A trace config of the user's, run after OpenTelemetry's: notes each request's path and
    the headers it leaves the client with."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.config = TraceConfig()
        self.config.on_request_start.append(self._start)
        self.config.freeze()

    async def _start(self, session: Any, context: Any, params: TraceRequestStartParams) -> None:
        self.seen.append((params.url.path, dict(params.headers)))


async def aio_http_client(triton: TritonServer) -> tuple[Any, _SentHeaders]:
    """An instrumented ``tritonclient.http.aio`` client whose session OpenTelemetry's aiohttp
    instrumentation traces (it was on when the session was made), and the headers it sends."""
    client = otelkit.instrument(aio_httpclient.InferenceServerClient(triton.http_url))
    configs = client._stub._trace_configs
    assert [c for c in configs if getattr(c, "_is_instrumented_by_opentelemetry", False)]
    sent = _SentHeaders()
    configs.append(sent.config)  # after OpenTelemetry's, as a session's own ones would not be
    return client, sent


@pytest.fixture
def aiohttp_instrumented() -> Iterator[None]:
    instrumentor = AioHttpClientInstrumentor()
    instrumentor.instrument()
    try:
        yield
    finally:
        instrumentor.uninstrument()


def shape_root(spans: list[Any]) -> Any:
    (root,) = [s for s in spans if s.name == "job"]
    return root


def test_asyncio_http_calls_through_opentelemetrys_aiohttp_instrumentation(
    triton: TritonServer,
    receiver: Receiver,
    telemetry: otelkit.Telemetry,
    aiohttp_instrumented: None,
) -> None:
    """The trace is the one without OpenTelemetry's aiohttp instrumentation, the context that
    left the client is otelkit's span's, and the client's other requests stay traced by it."""
    tracer = trace.get_tracer("tests")
    sent: list[_SentHeaders] = []

    async def infer() -> str:
        client, headers = await aio_http_client(triton)
        sent.append(headers)
        with tracer.start_as_current_span("job") as job:
            result = await client.infer("identity_fp32", aio_inputs("http"))
            settings = await client.get_log_settings()
            verbose = {"log_verbose_level": settings["log_verbose_level"]}
            await client.update_log_settings(verbose)  # a POST that is not an inference
        assert np.array_equal(result.as_numpy("OUTPUT0"), DATA)
        await client.close()
        return f"{job.get_span_context().trace_id:032x}"

    # job, otelkit's span, Triton's three, and OpenTelemetry's spans of the two other requests
    trace_id, spans = joined_trace(lambda: asyncio.run(infer()), receiver.out_dir, count=7)
    mine = [s for s in spans if s.scope != AIOHTTP_SCOPE]
    assert shape(mine, trace_id) == expected_tree("http")
    theirs = [s for s in spans if s.scope == AIOHTTP_SCOPE]
    assert sorted(s.name for s in theirs) == ["GET", "POST"]
    assert {s.parent_span_id for s in theirs} == {shape_root(mine).span_id}
    (path, headers), *others = sent[-1].seen
    assert path.endswith("/identity_fp32/infer")
    assert headers["traceparent"].split("-") == ["00", trace_id, client_span(mine).span_id, "03"]
    assert [p for p, _ in others] == ["/v2/logging", "/v2/logging"]


def test_an_asyncio_http_call_not_sampled_sends_no_context_through_opentelemetrys_aiohttp(
    triton: TritonServer,
    receiver: Receiver,
    telemetry: otelkit.Telemetry,
    aiohttp_instrumented: None,
) -> None:
    otelkit.configure(
        service_name="client-tests", traces_endpoint=receiver.traces_url, sampler="always_off"
    )

    async def infer() -> _SentHeaders:
        client, sent = await aio_http_client(triton)
        results = [await client.infer("identity_fp32", aio_inputs("http")) for _ in range(3)]
        assert all(np.array_equal(r.as_numpy("OUTPUT0"), DATA) for r in results)
        await client.close()
        return sent

    sent = asyncio.run(infer())
    assert len(sent.seen) == 3
    assert [h for _, h in sent.seen if "traceparent" in h] == []
