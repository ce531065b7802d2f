"""``otelkit.server.grpc``'s interceptor on a real grpcio server serving the KServe v2 gRPC
service (``gnn_tracking.serving.kserve_grpc``), called by the real ``tritonclient.grpc``.

Each behaviour is checked against the same servicer served without the interceptor: otelkit
must not change an answer or a status, for good requests, failing models or bad trace context.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from gnn_tracking.serving.kserve import ModelSpec, TensorSpec
from gnn_tracking.serving.kserve_grpc import KServeServicer, grpc_server
from numpy.typing import NDArray
from opentelemetry import trace
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2_grpc as pb2_grpc
from tritonclient.utils import InferenceServerException

import otelkit
from otelkit import _errors as errors
from otelkit import semconv
from otelkit._core.guard import INTERNAL_ERRORS
from otelkit.analysis import Span, SpanKind, StatusCode, build_traces
from otelkit.client import _call as client_call
from otelkit.receiver import Receiver
from otelkit.server import grpc as server_grpc
from otelkit.testing import ReceiverCapture, wait_until
from otelkit.tritonserver import free_port
from tests.core.test_propagation import INVALID_TRACEPARENTS
from tests.core.test_telemetry import scrape

SCOPE = "otelkit.server.grpc"
INFER = semconv.RPC_METHOD_GRPC_INFER
X = TensorSpec("x", "FP32", (-1, 3))
Y = TensorSpec("y", "FP32", (-1, 3))
DURATION = semconv.prometheus_name(semconv.RPC_SERVER_DURATION)


def double(inputs: dict[str, NDArray[Any]]) -> dict[str, NDArray[Any]]:
    with otelkit.stage("scale"), otelkit.stage("multiply"):
        return {"y": inputs["x"] * 2}


def fail(inputs: dict[str, NDArray[Any]]) -> dict[str, NDArray[Any]]:
    with otelkit.stage("scale"):
        raise ValueError("kaboom")


MODELS = [ModelSpec("double", (X,), (Y,), double), ModelSpec("fail", (X,), (Y,), fail)]


class BrokenServicer(KServeServicer):
    """A servicer with a bug: grpcio answers UNKNOWN."""

    def ServerMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
        raise RuntimeError("servicer bug")


@pytest.fixture(scope="module")
def telemetry(otelkit_receiver_server: Receiver) -> Iterator[otelkit.Telemetry]:
    yield otelkit.configure(
        service_name="grpc-tests",
        traces_endpoint=otelkit_receiver_server.traces_url,
        bsp_schedule_delay_ms=50,
        metrics_exporter="prometheus",
        prometheus_port=0,
    )
    otelkit.shutdown()


def serve(traced: bool) -> tuple[grpc.Server, int]:
    """The servicer on a real grpcio server, with otelkit's interceptor when ``traced``."""
    port = free_port()
    interceptors = [server_grpc.server_interceptor("127.0.0.1", port)] if traced else []
    return grpc_server(BrokenServicer(MODELS), port, interceptors=interceptors, workers=4), port


@pytest.fixture(scope="module")
def port(telemetry: otelkit.Telemetry) -> Iterator[int]:
    server, bound = serve(traced=True)
    yield bound
    server.stop(None)


@pytest.fixture(scope="module")
def plain_port(telemetry: otelkit.Telemetry) -> Iterator[int]:
    server, bound = serve(traced=False)
    yield bound
    server.stop(None)


def inputs() -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("x", [2, 3], "FP32")
    tensor.set_data_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    return [tensor]


def answer(port: int, model: str = "double", headers: dict[str, str] | None = None) -> Any:
    """The output, or the status and message of the error, of one plain tritonclient call."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        return client.infer(model, inputs(), headers=headers).as_numpy("y").tolist()
    except InferenceServerException as error:
        return (error.status(), error.message())
    finally:
        client.close()


def traced_call(port: int, model: str = "double") -> tuple[str, Any]:
    """One call of otelkit's instrumented client under a root span: its trace id, its answer."""
    client = otelkit.instrument(grpcclient.InferenceServerClient(f"127.0.0.1:{port}"))
    with trace.get_tracer("tests").start_as_current_span("event") as root:
        trace_id = f"{root.get_span_context().trace_id:032x}"
        try:
            result: Any = client.infer(model, inputs()).as_numpy("y").tolist()
        except InferenceServerException as error:
            result = (error.status(), error.message())
    client.close()
    otelkit.flush()
    return trace_id, result


def test_a_call_traces_client_server_and_stages_in_one_tree(
    port: int, plain_port: int, otelkit_receiver: ReceiverCapture
) -> None:
    trace_id, result = traced_call(port)
    assert result == answer(plain_port) == [[0, 2, 4], [6, 8, 10]]
    spans = otelkit_receiver.wait_for_trace(trace_id, 5)
    (tree,) = build_traces(spans).values()
    walked = [span for _, span in tree.walk()]
    assert [(depth, s.name, s.kind.name) for depth, s in tree.walk()] == [
        (0, "event", "INTERNAL"),
        (1, f"{INFER} double", "CLIENT"),
        (2, INFER, "SERVER"),
        (3, "scale", "INTERNAL"),
        (4, "multiply", "INTERNAL"),
    ]
    for parent, child in itertools.pairwise(walked):  # each inside its parent
        assert child.parent_span_id == parent.span_id
        assert parent.start_ns <= child.start_ns <= child.end_ns <= parent.end_ns, child.name
    server = walked[2]
    assert (server.scope, server.status_code) == (SCOPE, StatusCode.UNSET)
    assert server.attributes == {
        semconv.RPC_SYSTEM_NAME: "grpc",
        semconv.RPC_METHOD: INFER,
        semconv.RPC_RESPONSE_STATUS_CODE: "OK",
        semconv.SERVER_ADDRESS: "127.0.0.1",
        semconv.SERVER_PORT: port,
        semconv.CLIENT_ADDRESS: "127.0.0.1",
        semconv.CLIENT_PORT: server.attributes[semconv.CLIENT_PORT],  # the client's own
    }


def test_a_client_span_paused_as_it_starts_still_holds_its_server_span(
    port: int, otelkit_receiver: ReceiverCapture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread that loses the GIL (or its core) just after its call's span is made: the span
    still ends after the server's, its wall start read with the call's own clock."""
    recorder = client_call.RECORDER
    start = type(recorder).start

    def paused(self: Any, *args: Any, **kwargs: Any) -> Any:
        span = start(self, *args, **kwargs)
        if self is recorder:  # the client's: the server's spans start as they do
            time.sleep(0.02)  # longer than the whole call on loopback
        return span

    monkeypatch.setattr(type(recorder), "start", paused)
    trace_id, _ = traced_call(port)
    spans = otelkit_receiver.wait_for_trace(trace_id, 5)
    (tree,) = build_traces(spans).values()
    _, call, server, *_ = [span for _, span in tree.walk()]
    assert (call.kind, server.kind) == (SpanKind.CLIENT, SpanKind.SERVER)
    assert call.start_ns <= server.start_ns <= server.end_ns <= call.end_ns


def grpc_safe(value: str) -> bool:
    """Whether grpcio lets a client send ``value`` as metadata (printable ASCII only)."""
    return all(" " <= character <= "~" for character in value) and value == value.strip()


def test_a_malformed_traceparent_starts_a_fresh_trace_and_the_answer_is_the_same(
    port: int, plain_port: int, otelkit_receiver: ReceiverCapture
) -> None:
    trace_id, parent_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    cases = {}
    for case in INVALID_TRACEPARENTS:
        (value,) = case.values
        assert isinstance(value, str) and isinstance(case.id, str)
        value = value.replace("4bf92f3577b34da6a3ce929d0e0e4736", trace_id)
        if grpc_safe(value.replace("00f067aa0ba902b7", parent_id)):
            cases[case.id] = value.replace("00f067aa0ba902b7", parent_id)
    assert len(cases) >= 25  # the cases grpcio can carry
    expected = answer(plain_port)

    def infer_root(span: Span) -> bool:
        return (
            span.scope == SCOPE
            and span.attributes[semconv.RPC_METHOD] == INFER
            and span.parent_span_id is None
        )

    for case, value in cases.items():
        headers = {"traceparent": value, "tracestate": "rojo=1"}
        assert answer(port, headers=headers) == expected, case
    new = otelkit_receiver.wait_for_spans(infer_root, len(cases), timeout=10)
    assert len(new) == len(cases)  # a SERVER span each, each the root of a trace of its own
    assert len({s.trace_id for s in new}) == len(cases)
    assert trace_id not in {s.trace_id for s in new}


def duration_samples(telemetry: otelkit.Telemetry) -> list[Any]:
    assert telemetry.prometheus_url is not None
    exposition = scrape(telemetry.prometheus_url)
    families = {f.name: f for f in text_string_to_metric_families(exposition)}
    return list(families[DURATION].samples)


def test_the_duration_histogram_has_an_exemplar_with_the_trace_id(
    port: int, telemetry: otelkit.Telemetry
) -> None:
    trace_id, _ = traced_call(port)
    labels = {semconv.M_RPC_METHOD: INFER, semconv.M_RPC_STATUS: "OK"}
    samples: list[Any] = []

    def exemplars() -> list[str]:
        samples[:] = duration_samples(telemetry)
        return [
            s.exemplar.labels["trace_id"]
            for s in samples
            if s.name == f"{DURATION}_bucket" and s.labels.items() >= labels.items() and s.exemplar
        ]

    # the server observes the call once its answer is sent
    wait_until(lambda: trace_id in exemplars(), 5, f"an exemplar of trace {trace_id}")
    counts = [s.value for s in samples if s.name == f"{DURATION}_count" and s.labels == labels]
    assert counts and counts[0] >= 1


def test_a_failing_model_is_an_error_span_and_a_status_the_client_sees(
    port: int, plain_port: int, otelkit_receiver: ReceiverCapture
) -> None:
    trace_id, result = traced_call(port, "fail")
    assert result == answer(plain_port, "fail")
    assert result == ("StatusCode.INTERNAL", "model 'fail' failed: ValueError('kaboom')")
    spans = otelkit_receiver.wait_for_trace(trace_id, 4)
    (server,) = [s for s in spans if s.kind is SpanKind.SERVER]
    (stage,) = [s for s in spans if s.name == "scale"]
    assert (server.status_code, server.status_message) == (StatusCode.ERROR, result[1])
    assert server.attributes[semconv.ERROR_TYPE] == "INTERNAL"
    assert server.attributes[semconv.RPC_RESPONSE_STATUS_CODE] == "INTERNAL"
    assert (stage.parent_span_id, stage.attributes[semconv.ERROR_TYPE]) == (
        server.span_id,
        "ValueError",
    )
    # the caller's errors are not the server's; the server keeps serving
    missing_id, missing = traced_call(port, "nope")
    assert missing == answer(plain_port, "nope")
    assert missing[0] == "StatusCode.NOT_FOUND"
    (server,) = [s for s in otelkit_receiver.wait_for_trace(missing_id, 3) if s.scope == SCOPE]
    assert (server.status_code, server.attributes[semconv.RPC_RESPONSE_STATUS_CODE]) == (
        StatusCode.UNSET,
        "NOT_FOUND",
    )
    assert semconv.ERROR_TYPE not in server.attributes
    assert traced_call(port)[1] == [[0, 2, 4], [6, 8, 10]]


def test_a_handler_that_raises_is_unknown_with_its_exception_on_the_span(
    port: int, otelkit_receiver: ReceiverCapture
) -> None:
    trace_id, parent_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    with pytest.raises(InferenceServerException, match="UNKNOWN"):
        client.get_server_metadata(headers={"traceparent": f"00-{trace_id}-{parent_id}-01"})
    client.close()
    (server,) = otelkit_receiver.wait_for_trace(trace_id, 1)
    assert (server.name, server.parent_span_id, server.status_code) == (
        "inference.GRPCInferenceService/ServerMetadata",
        parent_id,
        StatusCode.ERROR,
    )
    assert server.attributes[semconv.ERROR_TYPE] == "RuntimeError"
    assert server.attributes[semconv.RPC_RESPONSE_STATUS_CODE] == "UNKNOWN"
    assert [event.name for event in server.events] == ["exception"]


def test_otelkit_failing_inside_the_interceptor_does_not_fail_the_rpc(
    port: int, plain_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(errors, "RAISE_INTERNAL_ERRORS", False)  # as in production

    def broken(*args: object) -> None:
        raise RuntimeError("otelkit bug")

    for name in ("extract", "observe"):
        caught = INTERNAL_ERRORS.total
        with monkeypatch.context() as patch:
            patch.setattr(server_grpc, name, broken)
            assert answer(port) == answer(plain_port) == [[0, 2, 4], [6, 8, 10]], name
        assert INTERNAL_ERRORS.total == caught + 1, name  # caught and counted, not raised


class AsyncServicer(pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """A grpc.aio servicer: ModelInfer in a stage, ServerMetadata aborting, ModelConfig raising."""

    def __init__(self) -> None:
        self.models = KServeServicer(MODELS)

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        with otelkit.stage("async_stage"):
            return self.models.infer(request)

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAVAILABLE, "draining")

    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        raise KeyError("servicer bug")


def test_the_asyncio_server_is_traced_alike(
    telemetry: otelkit.Telemetry, otelkit_receiver: ReceiverCapture
) -> None:
    ids = {name: (uuid.uuid4().hex, uuid.uuid4().hex[:16]) for name in ("infer", "abort", "raise")}

    def headers(name: str) -> dict[str, str]:
        trace_id, parent_id = ids[name]
        return {"traceparent": f"00-{trace_id}-{parent_id}-01"}

    async def scenario() -> list[Any]:
        port = free_port()
        server = grpc.aio.server(interceptors=[server_grpc.aio_server_interceptor(None, port)])
        pb2_grpc.add_GRPCInferenceServiceServicer_to_server(AsyncServicer(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        found: list[Any] = []
        async with aioclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
            tensor = aioclient.InferInput("x", [2, 3], "FP32")
            tensor.set_data_from_numpy(np.ones((2, 3), dtype=np.float32))
            result = await client.infer("double", [tensor], headers=headers("infer"))
            found.append(result.as_numpy("y").tolist())
            try:
                await client.get_server_metadata(headers=headers("abort"))
            except InferenceServerException as error:
                found.append(error.status())
            try:
                await client.get_model_config("double", headers=headers("raise"))
            except InferenceServerException as error:
                found.append(error.status())
        await server.stop(None)
        return found

    assert asyncio.run(scenario()) == [
        [[2.0] * 3] * 2,
        "StatusCode.UNAVAILABLE",
        "StatusCode.UNKNOWN",
    ]
    infer = otelkit_receiver.wait_for_trace(ids["infer"][0], 4)
    (abort,) = otelkit_receiver.wait_for_trace(ids["abort"][0], 1)
    (raised,) = otelkit_receiver.wait_for_trace(ids["raise"][0], 1)
    (tree,) = build_traces(infer).values()
    assert [(d, s.name, s.kind.name) for d, s in tree.walk()] == [
        (0, INFER, "SERVER"),
        (1, "async_stage", "INTERNAL"),
        (2, "scale", "INTERNAL"),
        (3, "multiply", "INTERNAL"),
    ]
    assert tree.roots[0].parent_span_id == ids["infer"][1]
    seen = {
        span.name.rsplit("/", 1)[1]: (
            span.status_code,
            span.attributes[semconv.RPC_RESPONSE_STATUS_CODE],
            span.attributes.get(semconv.ERROR_TYPE),
            [event.name for event in span.events],
        )
        for span in (abort, raised)
    }
    assert seen == {
        "ServerMetadata": (StatusCode.ERROR, "UNAVAILABLE", "UNAVAILABLE", []),
        "ModelConfig": (StatusCode.ERROR, "UNKNOWN", "KeyError", ["exception"]),
    }


def test_a_stream_is_one_span_with_the_stages_of_each_request_under_it(
    port: int, otelkit_receiver: ReceiverCapture
) -> None:
    trace_id, parent_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    answers: list[Any] = []
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    client.start_stream(
        callback=lambda result, error: answers.append(error or result.as_numpy("y").tolist()),
        headers={"traceparent": f"00-{trace_id}-{parent_id}-01"},
    )
    for model in ("double", "fail", "double"):
        client.async_stream_infer(model, inputs())
    client.stop_stream()
    client.close()
    assert answers[0] == answers[2] == [[0, 2, 4], [6, 8, 10]]
    assert isinstance(answers[1], InferenceServerException)
    spans = otelkit_receiver.wait_for_trace(trace_id, 6)
    (tree,) = build_traces(spans).values()
    assert [(d, s.name) for d, s in tree.walk()] == [
        (0, semconv.RPC_METHOD_GRPC_STREAM_INFER),
        (1, "scale"),
        (2, "multiply"),
        (1, "scale"),
        (1, "scale"),
        (2, "multiply"),
    ]
    (server,) = tree.roots
    # a failed request is an error message on the stream, which goes on: the stream is OK
    assert (server.parent_span_id, server.status_code) == (parent_id, StatusCode.UNSET)
    assert server.attributes[semconv.RPC_RESPONSE_STATUS_CODE] == "OK"
