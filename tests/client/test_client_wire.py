"""A gRPC response's tensor bytes: the scan of the wire and the count from a result, against
protobuf's own parse, and the rebuilt ``ModelInfer`` of a real gRPC client (sync,
``async_infer`` and asyncio)."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpcclient
import tritonclient.http as httpclient
from opentelemetry.sdk.metrics.export import Sum
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

import otelkit
from otelkit import semconv
from otelkit._core import guard
from otelkit._core.hotmetrics import HOT
from otelkit._core.worker import LATER
from otelkit.analysis import Span, load_spans
from otelkit.client import _wire
from otelkit.client._call import CURRENT_CALL, MeteredCall
from otelkit.client._target import GRPC_TENSORS
from otelkit.receiver import Receiver
from otelkit.testing import ReceiverCapture
from otelkit.tritonserver import TritonServer
from tests.client.test_client_sampling import client_points

DATA = np.arange(8, dtype=np.float32).reshape(2, 4)


def response(
    *tensors: bytes | None, datatype: str = "FP32", **fields: Any
) -> service_pb2.ModelInferResponse:
    """A response with one output per tensor, shaped to hold it; ``None``: an output of ten
    elements without raw content (sent through shared memory)."""
    message = service_pb2.ModelInferResponse(**fields)
    for index, raw in enumerate(tensors):
        elements = 10 if raw is None else len(raw) // 4
        message.outputs.add(name=f"OUTPUT{index}", datatype=datatype, shape=[1, elements])
        if raw is not None:
            message.raw_output_contents.append(raw)
    return message


def parsed_counts(message: service_pb2.ModelInferResponse) -> tuple[int, int]:
    return sum(len(raw) for raw in message.raw_output_contents), len(message.outputs)


MESSAGES = pytest.mark.parametrize(
    "message",
    [
        response(np.arange(16, dtype=np.float32).tobytes()),
        response(b"\x00" * 600_000, b"\x01" * 132, model_name="m", model_version="7", id="req"),
        # a BYTES tensor as Triton sends it: two elements, each after its length
        response(b"\x05\x00\x00\x00hello\x03\x00\x00\x00abc", datatype="BYTES"),
        response(None, b"\x00" * 40),
        response(),
    ],
    ids=["16 floats", "600 kB and 132 B", "bytes tensor", "one output in shared memory", "empty"],
)


@MESSAGES
def test_the_scan_counts_what_protobuf_parses(message: service_pb2.ModelInferResponse) -> None:
    message.parameters["sequence_end"].bool_param = True
    assert _wire.wire_tensors(message.SerializeToString()) == parsed_counts(message)


@MESSAGES
def test_a_result_counts_what_the_wire_carried(message: service_pb2.ModelInferResponse) -> None:
    """A call whose bytes on the wire were not kept (not sampled, a future's, a stream's) is
    counted from its result: the same figures, shared memory and BYTES tensors included."""
    result = grpcclient.InferResult(message)
    assert GRPC_TENSORS.response(result) == parsed_counts(message)


def test_the_scan_skips_fields_it_does_not_know() -> None:
    """A newer server may send fields this tritonclient does not know: fixed64 (wire type 1),
    fixed32 (5), a varint and a field number above 15 (a two-byte key)."""
    message = response(b"\x00" * 300)
    unknown = bytes([0x09, *range(8), 0x15, *range(4), 0x18, 0x96, 0x01, 0xA2, 0x06, 0x02, 1, 2])
    raw = message.SerializeToString() + unknown
    assert len(service_pb2.ModelInferResponse.FromString(raw).outputs) == 1
    assert _wire.wire_tensors(raw) == (300, 1)


@pytest.mark.parametrize("raw", [b"\x32\x05abc", b"\x32", b"\x0b\x00", b"\x32\xff"])
def test_the_scan_refuses_bytes_that_are_not_a_message(raw: bytes) -> None:
    with pytest.raises((ValueError, IndexError)):
        _wire.wire_tensors(raw)


@pytest.fixture
def telemetry(receiver: Receiver) -> Iterator[otelkit.Telemetry]:
    yield otelkit.configure(
        service_name="wire-tests", traces_endpoint=receiver.traces_url, bsp_schedule_delay_ms=50
    )
    otelkit.shutdown()


def tensor(module: Any) -> list[Any]:
    found = module.InferInput("INPUT0", list(DATA.shape), "FP32")
    found.set_data_from_numpy(DATA)
    return [found]


@pytest.mark.triton
def test_a_grpc_client_counts_every_call_styles_tensor_bytes(
    triton: TritonServer, otelkit_receiver: ReceiverCapture, telemetry: otelkit.Telemetry
) -> None:
    """Sync ``infer``, ``async_infer`` and asyncio ``infer``: the spans carry the tensor bytes
    and outputs (counted on the wire, or from the future's result), the client phases in
    order; ``uninstrument`` gives the stub its own ``ModelInfer`` back."""
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    own, own_stream = client._client_stub.ModelInfer, client._client_stub.ModelStreamInfer
    otelkit.instrument(client)
    assert client._client_stub.ModelInfer is not own
    assert client._client_stub.ModelStreamInfer is not own_stream
    results: queue.Queue[Any] = queue.Queue()
    client.infer("identity_fp32", tensor(grpcclient), request_id="wire-sync")
    client.async_infer(
        "identity_fp32",
        tensor(grpcclient),
        lambda result, error: results.put((result, error)),
        request_id="wire-callback",
    )
    result, error = results.get(timeout=10)
    assert error is None and np.array_equal(result.as_numpy("OUTPUT0"), DATA)

    async def asyncio_call() -> None:
        async with otelkit.instrument(aiogrpcclient.InferenceServerClient(triton.grpc_url)) as aio:
            await aio.infer("identity_fp32", tensor(aiogrpcclient), request_id="wire-asyncio")

    asyncio.run(asyncio_call())
    otelkit.uninstrument(client)
    assert client._client_stub.ModelInfer is own
    assert client._client_stub.ModelStreamInfer is own_stream
    client.infer("identity_fp32", tensor(grpcclient))
    client.close()
    telemetry.flush()
    spans = request_spans(otelkit_receiver, {"wire-sync", "wire-callback", "wire-asyncio"})
    for span in spans:
        assert span.attributes[semconv.RESPONSE_BYTES] == DATA.nbytes
        assert span.attributes[semconv.OUTPUT_COUNT] == 1
        phases = [span.attributes[key] for key in (semconv.SERIALIZE_S, semconv.WIRE_S)]
        assert all(0 < seconds < span.duration_ns / 1e9 for seconds in phases), span.attributes


@contextlib.contextmanager
def grpc_infer(style: str, url: str) -> Iterator[Callable[..., Any]]:
    """The ``infer`` of an instrumented gRPC client: the sync client's, or the asyncio
    client's with each call awaited to its end on a loop of its own; after a first call that
    brings its channel up and makes its series, and whatever that call left to ``LATER``."""
    if style == "sync":
        with otelkit.instrument(grpcclient.InferenceServerClient(url)) as client:
            client.infer("identity_fp32", tensor(grpcclient))
            LATER.drain()
            yield client.infer
        return
    loop = asyncio.new_event_loop()

    async def made() -> Any:
        return otelkit.instrument(aiogrpcclient.InferenceServerClient(url))

    client = loop.run_until_complete(made())

    def infer(*args: Any, **kwargs: Any) -> Any:
        return loop.run_until_complete(client.infer(*args, **kwargs))

    try:
        infer("identity_fp32", tensor(grpcclient))
        LATER.drain()
        yield infer
    finally:
        loop.run_until_complete(client.close())
        loop.close()


Seen = tuple[list[Any], list[Any], list[Any]]


def unsampled_calls(style: str, url: str, count: int, counted: list[Any]) -> Seen:
    """``count`` calls of an instrumented gRPC client's ``infer`` (``grpc_infer``) with
    ``LATER``'s worker held. Returns their results, the last ``count`` items waiting in
    ``LATER`` and what ``counted`` held, as the calls returned."""
    with grpc_infer(style, url) as infer, LATER._lock:
        results = [infer("identity_fp32", tensor(grpcclient)) for _ in range(count)]
        return results, list(LATER.waiting)[-count:], list(counted)


@pytest.mark.triton
@pytest.mark.parametrize("style", ["sync", "asyncio"])
def test_unsampled_grpc_calls_count_their_tensor_bytes_off_the_callers_path(
    style: str, triton: TritonServer, tmp_path: Path
) -> None:
    """A call known not to be sampled as it starts is a ``MeteredCall``, never the current
    call (so its transport's hooks find none): its metrics wait in ``LATER`` with its result,
    whose tensor bytes are counted then, not before the call returns; no span. The asyncio
    client's ``infer`` takes the same short path."""
    otelkit.configure(service_name="wire-unsampled", traces_dir=str(tmp_path), sampler="always_off")
    walk = GRPC_TENSORS._output_bytes
    counted: list[Any] = []
    GRPC_TENSORS._output_bytes = lambda result: counted.append(result) or walk(result)
    try:
        before = client_sums()
        results, waiting, counted_by_then = unsampled_calls(style, triton.grpc_url, 3, counted)
        after = client_sums()
    finally:
        GRPC_TENSORS._output_bytes = walk
        otelkit.shutdown()
    assert len(counted_by_then) == 1 and counted[1:] == results  # the first call's, then these
    assert CURRENT_CALL.get() is None
    assert {type(item.__self__) for item in waiting} == {MeteredCall}
    assert {item.__func__ for item in waiting} == {MeteredCall._end}
    assert [item.__self__.result for item in waiting] == results
    for spec in (semconv.CLIENT_REQUEST_BYTES, semconv.CLIENT_RESPONSE_BYTES):
        assert after[spec.name] - before.get(spec.name, 0) == 4 * DATA.nbytes
    assert after[semconv.CLIENT_IN_FLIGHT.name] == before.get(semconv.CLIENT_IN_FLIGHT.name, 0)
    assert load_spans(tmp_path) == []


def test_a_call_returns_before_its_telemetry_ends(triton: TritonServer, tmp_path: Path) -> None:
    """Ending a call's span and metrics waits in ``LATER``, off the caller's path; a metric read
    and a flush end what waits first, and a span ended late still lasts as long as its call."""
    otelkit.configure(service_name="later", traces_dir=str(tmp_path))
    client = otelkit.instrument(grpcclient.InferenceServerClient(triton.grpc_url))
    took: list[float] = []
    try:
        client.infer("identity_fp32", tensor(grpcclient))  # channel up, series made
        before = client_sums()
        with LATER._lock:  # the worker cannot end them meanwhile
            for _ in range(3):
                start = time.perf_counter()
                client.infer("identity_fp32", tensor(grpcclient))
                took.append(time.perf_counter() - start)
            assert LATER.pending() == 3
            time.sleep(0.3)  # ended well after the calls
        after = client_sums()
        otelkit.flush()
    finally:
        client.close()
        otelkit.shutdown()
    assert after[semconv.CLIENT_IN_FLIGHT.name] == 0
    for spec in (semconv.CLIENT_REQUEST_BYTES, semconv.CLIENT_RESPONSE_BYTES):
        assert after[spec.name] - before[spec.name] == 3 * DATA.nbytes
    spans = sorted(load_spans(tmp_path), key=lambda span: span.start_ns)
    assert len(spans) == 4
    for span, seconds in zip(spans[1:], took, strict=True):
        assert 0 < span.duration_ns / 1e9 <= seconds  # not until it was ended


@pytest.mark.triton
def test_small_responses_are_counted_off_the_callers_path(triton: TritonServer) -> None:
    """A response up to ``KEEP_WIRE_BYTES`` waits with its call and is counted on the worker; a
    larger one is counted as it arrives (no call holds it); both reach the byte counters."""
    otelkit.configure(service_name="wire-kept", traces_exporter="none")
    client = otelkit.instrument(grpcclient.InferenceServerClient(triton.grpc_url))
    large = np.arange(_wire.KEEP_WIRE_BYTES // 4 + 1, dtype=np.float32).reshape(1, -1)
    big = grpcclient.InferInput("INPUT0", list(large.shape), "FP32").set_data_from_numpy(large)
    try:
        client.infer("identity_fp32", tensor(grpcclient))  # channel up, series made
        before = client_sums()
        with LATER._lock:
            client.infer("identity_fp32", tensor(grpcclient))
            client.infer("identity_fp32", [big])
            small_call, large_call = (item.__self__ for item in list(LATER.waiting)[-2:])
            assert small_call.counted is None and len(small_call.wire) > DATA.nbytes
            assert large_call.wire is None and large_call.counted == (large.nbytes, 1)
        after = client_sums()
    finally:
        client.close()
        otelkit.shutdown()
    name = semconv.CLIENT_RESPONSE_BYTES.name
    assert after[name] - before[name] == DATA.nbytes + large.nbytes


def client_sums() -> dict[str, float]:
    """The client's byte counters and calls in flight, each summed over its series."""
    sums = {}
    for metric in HOT.collect():
        if metric.name.startswith(f"{semconv.PREFIX}.client.") and isinstance(metric.data, Sum):
            sums[metric.name] = sum(point.value for point in metric.data.data_points)
    return sums


def request_spans(spans: ReceiverCapture, request_ids: set[str]) -> list[Span]:
    """The spans of the calls with these request ids, one each, once they have arrived."""
    found = spans.wait_for_spans(
        lambda s: s.attributes.get(semconv.REQUEST_ID) in request_ids, len(request_ids)
    )
    assert {span.attributes.get(semconv.REQUEST_ID) for span in found} == request_ids
    return found


def reused_input_calls(style: str, url: str) -> list[Any]:
    """Three calls of an instrumented gRPC client's ``infer`` (``grpc_infer``) with ``LATER``'s
    worker held: a batch of 2, then the same ``InferInput`` refilled with a batch of 5 (its
    tensors are the caller's to reuse once a call returns), then a request too large to keep
    (20 kB). Returns the calls waiting in ``LATER``, as they wait."""
    reused = grpcclient.InferInput("INPUT0", list(DATA.shape), "FP32")
    big = grpcclient.InferInput("INPUT0", [1, 5000], "FP32")
    big.set_data_from_numpy(np.zeros((1, 5000), dtype=np.float32))
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0")]
    with grpc_infer(style, url) as infer, LATER._lock:
        reused.set_data_from_numpy(DATA)
        infer("identity_fp32", [reused], outputs=outputs, request_id="batch-2")
        reused.set_shape([5, 4])
        reused.set_data_from_numpy(np.ones((5, 4), dtype=np.float32))
        infer("identity_fp32", [reused], outputs=outputs, request_id="batch-5")
        infer("identity_fp32", [big], outputs=outputs, request_id="big")
        return [item.__self__ for item in list(LATER.waiting)[-3:]]


@pytest.mark.triton
@pytest.mark.parametrize("style", ["sync", "asyncio"])
def test_a_sampled_grpc_call_reads_its_facts_from_its_own_request_off_the_callers_path(
    style: str, triton: TritonServer, otelkit_receiver: ReceiverCapture
) -> None:
    """A sampled gRPC call keeps the request message tritonclient built for it (a small one)
    and reads its input and output counts, request id and batch size from it when its
    telemetry ends, not from the caller's inputs as it starts: the span tells the call's own
    request even when the caller refilled its inputs before then. A request of more than
    16 kB is not kept: its facts are read as it starts."""
    otelkit.configure(service_name="wire-facts", traces_endpoint=otelkit_receiver.traces_url)
    try:
        calls = reused_input_calls(style, triton.grpc_url)
        otelkit.flush()
        spans = request_spans(otelkit_receiver, {"batch-2", "batch-5", "big"})
    finally:
        otelkit.shutdown()
    assert [call.facts is None for call in calls] == [True, True, False]  # waiting for requests
    assert [call.request for call in calls] == [None, None, None]  # let go once read
    by_id = {span.attributes[semconv.REQUEST_ID]: span.attributes for span in spans}
    assert {key: attributes[semconv.BATCH_SIZE] for key, attributes in by_id.items()} == {
        "batch-2": 2,
        "batch-5": 5,
        "big": 1,
    }
    for attributes in by_id.values():
        assert attributes[semconv.INPUT_COUNT] == 1 and attributes[semconv.OUTPUT_COUNT] == 1
        assert attributes[semconv.CALL_STYLE] == ("infer" if style == "sync" else "asyncio_infer")
    assert by_id["big"][semconv.REQUEST_BYTES] == 20_000


def answered(client: Any, protocol: str, model: str) -> tuple[Any, Any]:
    """The result and the error (one of them ``None``) of one ``async_infer`` of ``model``:
    gRPC's in its callback, HTTP's from the handle's ``get_result``."""
    module = grpcclient if protocol == "grpc" else httpclient
    if protocol == "grpc":
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.async_infer(
            model, tensor(module), lambda result, error: answers.put((result, error))
        )
        return answers.get(timeout=10)
    handle = client.async_infer(model, tensor(module))
    try:
        return handle.get_result(), None
    except InferenceServerException as error:
        return None, error


@pytest.mark.triton
@pytest.mark.parametrize(("protocol", "error_type"), [("grpc", "NOT_FOUND"), ("http", "404")])
def test_async_infer_not_sampled_takes_the_short_path(
    protocol: str, error_type: str, triton: TritonServer, tmp_path: Path
) -> None:
    """``async_infer`` of a call not sampled takes the short path too (a ``MeteredCall``: its
    metrics wait in ``LATER`` with its result, handed over in gRPC's callback or at HTTP's
    ``get_result``); the caller gets the result, or the client's error, and a failure is
    counted with its error type; nothing stays in flight, no span."""
    otelkit.configure(service_name="async-quiet", traces_dir=str(tmp_path), sampler="always_off")
    module = grpcclient if protocol == "grpc" else httpclient
    url = triton.grpc_url if protocol == "grpc" else triton.http_url
    try:
        with otelkit.instrument(module.InferenceServerClient(url)) as client:
            client.infer("identity_fp32", tensor(module))  # connection up, series made
            LATER.drain()
            before = client_sums()
            failures = client_points(semconv.CLIENT_ERRORS.name, "no_such_model", protocol)
            with LATER._lock:
                result, error = answered(client, protocol, "identity_fp32")
                waiting = list(LATER.waiting)[-1:]
            _, failure = answered(client, protocol, "no_such_model")
            LATER.drain()
            after = client_sums()
            failures_after = client_points(semconv.CLIENT_ERRORS.name, "no_such_model", protocol)
    finally:
        otelkit.shutdown()
    assert error is None and np.array_equal(result.as_numpy("OUTPUT0"), DATA)
    assert [type(item.__self__) for item in waiting] == [MeteredCall]
    assert waiting[0].__self__.result is result
    assert isinstance(failure, InferenceServerException)
    counted_before = failures[error_type].value if error_type in failures else 0
    assert failures_after[error_type].value == counted_before + 1
    sent, received = semconv.CLIENT_REQUEST_BYTES.name, semconv.CLIENT_RESPONSE_BYTES.name
    assert after[sent] - before[sent] == 2 * DATA.nbytes  # the failed request was sent too
    assert after[received] - before[received] == DATA.nbytes
    assert after[semconv.CLIENT_IN_FLIGHT.name] == before[semconv.CLIENT_IN_FLIGHT.name]
    assert load_spans(tmp_path) == []


def refused(span: Span) -> bool:
    """A client span of a call that tritonclient refused for a reserved request parameter."""
    return span.kind.name == "CLIENT" and "reserved parameter" in (span.status_message or "")


@pytest.mark.triton
def test_a_sampled_grpc_call_that_fails_before_its_request_is_built(
    triton: TritonServer, otelkit_receiver: ReceiverCapture
) -> None:
    """tritonclient refuses a reserved request parameter before it builds the request: the
    call's own exception reaches the caller, and its span says the failure and no request
    facts (there was no request to read them from), without an internal error of otelkit's."""
    otelkit.configure(service_name="wire-early", traces_endpoint=otelkit_receiver.traces_url)
    errors_before = guard.INTERNAL_ERRORS.total
    try:
        client = otelkit.instrument(grpcclient.InferenceServerClient(triton.grpc_url))
        with client, pytest.raises(InferenceServerException, match="reserved"):
            client.infer("identity_fp32", tensor(grpcclient), parameters={"priority": 1})
        otelkit.flush()
        found = otelkit_receiver.wait_for_spans(refused, timeout=10)
    finally:
        otelkit.shutdown()
    (span,) = found
    assert span.status_code.name == "ERROR"
    assert span.attributes[semconv.ERROR_TYPE] == "InferenceServerException"
    assert span.attributes[semconv.CALL_STYLE] == "infer"
    assert semconv.INPUT_COUNT not in span.attributes
    assert guard.INTERNAL_ERRORS.total == errors_before
