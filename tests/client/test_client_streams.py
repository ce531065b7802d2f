"""gRPC streams, sync and asyncio: a span for the stream, one CLIENT span per streamed request.

Triton takes a stream's trace context once, from its initial metadata, so its ``InferRequest``
spans hang under otelkit's stream span; each request's own CLIENT span is a child of the
caller's span and links to the stream span. Triton's model span names the request id.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aio_grpcclient
from opentelemetry import trace

import otelkit
from otelkit import semconv
from otelkit.analysis import Span, build_traces
from otelkit.receiver import Receiver
from otelkit.tritonserver import TritonServer
from tests.client.test_client import DATA, telemetry
from tests.support import joined_trace

pytestmark = pytest.mark.triton
__all__ = ["telemetry"]  # the fixture, shared with test_client
STREAM = semconv.RPC_METHOD_GRPC_STREAM_INFER
IDS = ["event-0", "event-1", "event-2"]


def stream_inputs(module: Any) -> list[Any]:
    tensor = module.InferInput("INPUT0", list(DATA.shape), "FP32")
    tensor.set_data_from_numpy(DATA)
    return [tensor]


def check_stream_trace(
    spans: list[Span], trace_id: str, ids: list[str], style: str, failed: dict[str, str]
) -> None:
    """job → stream span → Triton's spans per request; job → one CLIENT span per request."""
    tree = build_traces(spans)[trace_id]
    (job,) = tree.roots
    (stream,) = [s for s in tree.children(job) if s.name == STREAM]
    assert stream.kind.name == "CLIENT"
    assert stream.attributes[semconv.CALL_STYLE] == style
    assert stream.attributes[semconv.STREAM_REQUESTS] == len(ids)
    assert stream.attributes[semconv.STREAM_RESPONSES] == len(ids)
    requests = [s for s in tree.children(job) if s.name.startswith(f"{STREAM} ")]
    assert sorted(s.attributes[semconv.REQUEST_ID] for s in requests) == sorted(ids)
    for span in requests:
        assert span.kind.name == "CLIENT"
        assert [(link.trace_id, link.span_id) for link in span.links] == [
            (stream.trace_id, stream.span_id)
        ]
        request_id = str(span.attributes[semconv.REQUEST_ID])
        if request_id in failed:
            assert span.status_code.name == "ERROR"
            assert span.events[0].attributes["exception.message"].startswith(failed[request_id])
        else:
            assert span.status_code.name == "UNSET"
            assert span.attributes[semconv.RESPONSE_BYTES] == DATA.nbytes
        assert stream.start_ns <= span.start_ns <= span.end_ns <= stream.end_ns
    served = []
    for infer_request in tree.children(stream):
        assert infer_request.name == "InferRequest"
        (model,) = tree.children(infer_request)
        assert [s.name for s in tree.children(model)] == ["compute"]
        served.append(model.attributes["triton.request_id"])
    assert sorted(served) == sorted(i for i in ids if i not in failed)


def test_sync_stream_spans_per_request_joined_to_tritons(
    triton: TritonServer, receiver: Receiver, telemetry: otelkit.Telemetry
) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    # a request for a model that does not exist fails on its own; the stream goes on
    models = {"event-0": "identity_fp32", "event-1": "no_such_model", "event-2": "identity_fp32"}
    with otelkit.instrument(grpcclient.InferenceServerClient(triton.grpc_url)) as client:

        def run_stream() -> str:
            with trace.get_tracer("tests").start_as_current_span("job") as job:
                client.start_stream(lambda result, error: answers.put((result, error)))
                for request_id, model in models.items():
                    inputs = stream_inputs(grpcclient)
                    client.async_stream_infer(model, inputs, request_id=request_id)
                got = [answers.get(timeout=10) for _ in models]
                client.stop_stream()
            errors = [error for _, error in got if error is not None]
            assert len(errors) == 1 and "no_such_model" in str(errors[0])
            for result, _ in got:
                if result is not None:
                    assert np.array_equal(result.as_numpy("OUTPUT0"), DATA)
            return f"{job.get_span_context().trace_id:032x}"

        # job + stream + 3 request spans + 3 Triton spans for each of the 2 served requests
        trace_id, spans = joined_trace(run_stream, receiver.out_dir, count=11)
    failed = {"event-1": "Request for unknown model"}
    check_stream_trace(spans, trace_id, IDS, "stream", failed)


def test_a_stream_opened_with_its_callback_by_name_is_traced(
    triton: TritonServer, receiver: Receiver, telemetry: otelkit.Telemetry
) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with otelkit.instrument(grpcclient.InferenceServerClient(triton.grpc_url)) as client:

        def run_stream() -> str:
            with trace.get_tracer("tests").start_as_current_span("job") as job:
                client.start_stream(callback=lambda result, error: answers.put((result, error)))
                client.async_stream_infer(
                    "identity_fp32", stream_inputs(grpcclient), request_id="by-name"
                )
                result, error = answers.get(timeout=10)
                client.stop_stream()
            assert error is None and np.array_equal(result.as_numpy("OUTPUT0"), DATA)
            return f"{job.get_span_context().trace_id:032x}"

        # job + stream + the request's span + Triton's 3
        trace_id, spans = joined_trace(run_stream, receiver.out_dir, count=6, protocol="grpc")
    check_stream_trace(spans, trace_id, ["by-name"], "stream", {})


def test_a_request_left_unanswered_when_the_stream_is_cancelled_fails(
    triton: TritonServer, receiver: Receiver, telemetry: otelkit.Telemetry
) -> None:
    client = otelkit.instrument(grpcclient.InferenceServerClient(triton.grpc_url))
    with client, trace.get_tracer("tests").start_as_current_span("job") as job:
        client.start_stream(lambda result, error: None)
        client.async_stream_infer("sleep_fp32", stream_inputs(grpcclient), request_id="slow")
        client.stop_stream(cancel_requests=True)
    trace_id = f"{job.get_span_context().trace_id:032x}"
    spans = joined_trace(lambda: trace_id, receiver.out_dir, count=3, attempts=1)[1]
    (request,) = [s for s in spans if s.name == f"{STREAM} sleep_fp32"]
    assert request.status_code.name == "ERROR"
    assert request.attributes[semconv.ERROR_TYPE] in ("CANCELLED", "StreamClosedError")


def test_asyncio_stream_spans_per_request_joined_to_tritons(
    triton: TritonServer, receiver: Receiver, telemetry: otelkit.Telemetry
) -> None:
    async def run_stream() -> str:
        client = otelkit.instrument(aio_grpcclient.InferenceServerClient(triton.grpc_url))

        async def requests() -> AsyncIterator[dict[str, Any]]:
            for request_id in IDS:
                yield {
                    "model_name": "identity_fp32",
                    "inputs": stream_inputs(aio_grpcclient),
                    "request_id": request_id,
                }

        with trace.get_tracer("tests").start_as_current_span("job") as job:
            async for result, error in client.stream_infer(requests()):
                assert error is None
                assert np.array_equal(result.as_numpy("OUTPUT0"), DATA)
        await client.close()
        return f"{job.get_span_context().trace_id:032x}"

    trace_id, spans = joined_trace(
        lambda: asyncio.run(run_stream()), receiver.out_dir, count=2 + 2 * len(IDS) + 2 * len(IDS)
    )
    check_stream_trace(spans, trace_id, IDS, "asyncio_stream", failed={})
