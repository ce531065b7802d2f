"""The asyncio clients (``tritonclient.http.aio``, ``tritonclient.grpc.aio``) against Triton."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc.aio as aio_grpcclient
import tritonclient.http.aio as aio_httpclient
from opentelemetry import trace

import otelkit
from otelkit import semconv
from otelkit.analysis import load_spans
from otelkit.receiver import Receiver
from otelkit.tritonserver import TritonServer
from tests.client.test_client import DATA, client_span, expected_tree, shape, telemetry
from tests.support import joined_trace

pytestmark = pytest.mark.triton
__all__ = ["telemetry"]  # the fixture, shared with test_client
AIO = {"http": aio_httpclient, "grpc": aio_grpcclient}


def aio_client(protocol: str, triton: TritonServer) -> Any:
    url = triton.http_url if protocol == "http" else triton.grpc_url
    return otelkit.instrument(AIO[protocol].InferenceServerClient(url))


def aio_inputs(protocol: str, data: np.ndarray = DATA) -> list[Any]:
    tensor = AIO[protocol].InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return [tensor]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_asyncio_infer_span_is_the_parent_of_tritons_spans(
    protocol: str, triton: TritonServer, receiver: Receiver, telemetry: otelkit.Telemetry
) -> None:
    async def call() -> str:
        client = aio_client(protocol, triton)
        try:
            with trace.get_tracer("tests").start_as_current_span("job") as job:
                result = await client.infer("identity_fp32", aio_inputs(protocol))
        finally:
            await client.close()
        assert np.array_equal(result.as_numpy("OUTPUT0"), DATA)
        return f"{job.get_span_context().trace_id:032x}"

    trace_id, spans = joined_trace(lambda: asyncio.run(call()), receiver.out_dir, count=5)
    assert shape(spans, trace_id) == expected_tree(protocol)
    span = client_span(spans)
    assert span.attributes[semconv.CALL_STYLE] == "asyncio_infer"
    assert span.attributes[semconv.PROTOCOL] == protocol
    assert span.attributes[semconv.REQUEST_BYTES] == DATA.nbytes
    assert span.attributes[semconv.RESPONSE_BYTES] == DATA.nbytes
    assert set(span.attributes) >= {semconv.SERIALIZE_S, semconv.WIRE_S, semconv.DESERIALIZE_S}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_asyncio_tasks_keep_their_own_parents(
    protocol: str, triton: TritonServer, receiver: Receiver, telemetry: otelkit.Telemetry
) -> None:
    tasks = 32
    tracer = trace.get_tracer("tests")

    async def one(client: Any, index: int) -> tuple[str, str]:
        with tracer.start_as_current_span(f"task-{index}") as parent:
            await asyncio.sleep(0)  # let the other tasks interleave with this one
            data = np.full((1, 4), index, dtype=np.float32)
            result = await client.infer("identity_fp32", aio_inputs(protocol, data))
            assert np.array_equal(result.as_numpy("OUTPUT0"), data)
        context = parent.get_span_context()
        return f"{context.trace_id:032x}", f"{context.span_id:016x}"

    async def run() -> list[tuple[str, str]]:
        client = aio_client(protocol, triton)
        try:
            return await asyncio.gather(*(one(client, i) for i in range(tasks)))
        finally:
            await client.close()

    parents = asyncio.run(run())
    otelkit.flush()  # the client's spans are at the receiver once the flush returns
    spans = load_spans(receiver.out_dir)
    for trace_id, parent_id in parents:
        clients = [s for s in spans if s.trace_id == trace_id and s.kind.name == "CLIENT"]
        assert [s.parent_span_id for s in clients] == [parent_id]
