"""The KServe v2 gRPC service of ``examples/gnn_tracking/serving/kserve_grpc.py`` on a real
grpcio server, called by the real ``tritonclient.grpc`` client (and by the raw generated stub
for the typed ``contents`` that client never sends).

Every answer is compared with numpy computing the same model in-process; the toy models are
the HTTP server's (``test_kserve``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from gnn_tracking.serving.kserve_grpc import KServeServicer, grpc_server
from tritonclient.grpc import service_pb2 as pb2
from tritonclient.grpc import service_pb2_grpc as pb2_grpc
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from otelkit.tritonserver import free_port
from tests.examples.test_kserve import MODELS, NUMERIC

NUMPY = {"BOOL": np.bool_, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
NUMPY |= {f"{s}INT{b}": f"{s.lower()}int{b}" for s in ("", "U") for b in (8, 16, 32, 64)}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    port = free_port()
    server = grpc_server(KServeServicer(MODELS, name="toys", version="7"), port, workers=4)
    yield f"127.0.0.1:{port}"
    server.stop(None)


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(url) as made:
        yield made


@pytest.fixture(scope="module")
def stub(url: str) -> Iterator[pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(url) as channel:
        yield pb2_grpc.GRPCInferenceServiceStub(channel)


def infer(
    client: grpcclient.InferenceServerClient,
    model: str,
    outputs: list[str] | None = None,
    **arrays: Any,
) -> dict[str, Any]:
    tensors = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    requested = None if outputs is None else [grpcclient.InferRequestedOutput(n) for n in outputs]
    result = client.infer(model, tensors, outputs=requested)
    names = outputs or [output.name for output in result.get_response().outputs]
    return {name: result.as_numpy(name) for name in names}


def test_health_metadata_and_configuration(client: grpcclient.InferenceServerClient) -> None:
    assert (client.is_server_live(), client.is_server_ready()) == (True, True)
    assert (client.is_model_ready("double"), client.is_model_ready("nope")) == (True, False)
    assert client.is_model_ready("versioned", "2") and not client.is_model_ready("versioned", "3")
    server = client.get_server_metadata(as_json=True)
    assert (server["name"], server["version"]) == ("toys", "7")
    metadata = client.get_model_metadata("versioned", as_json=True)
    assert metadata == {
        "name": "versioned",
        "versions": ["1", "2"],
        "platform": "python",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": ["-1", "3"]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": ["-1", "3"]}],
    }
    config = client.get_model_config("upper", as_json=True)["config"]
    assert (config["name"], config["input"][0]["data_type"], config["output"][0]["dims"]) == (
        "upper",
        "TYPE_STRING",
        ["-1"],
    )
    with pytest.raises(InferenceServerException, match="NOT_FOUND"):
        client.get_model_metadata("nope")


def test_answers_as_numpy(client: grpcclient.InferenceServerClient) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(infer(client, "double", x=x)["y"], x * 2)
    edges = np.array([[0, 1, 2], [3, 4, 5]], dtype=np.int64)
    assert np.array_equal(infer(client, "index", edges=edges)["flipped"], edges[::-1])
    stats = np.array([[1.5, -2.0], [0.0, 3.0]])
    got = infer(client, "stats", ["positive", "sum"], x=stats)
    assert np.array_equal(got["sum"], stats.sum(axis=1))
    assert np.array_equal(got["positive"], stats > 0)
    text = np.array([b"pixel", "str\u00edp".encode()], dtype=object)
    assert infer(client, "upper", text=text)["upper"].tolist() == [b"PIXEL", "STR\u00edP".encode()]
    assert np.array_equal(infer(client, "versioned", x=x)["y"], x + 2)  # the highest version


@pytest.mark.parametrize("datatype", NUMERIC)
def test_every_numeric_datatype_round_trips_raw(
    client: grpcclient.InferenceServerClient, datatype: str
) -> None:
    dtype = np.dtype(NUMPY[datatype])
    values = [0, 1, 1, 0] if datatype == "BOOL" else [0.5, 1, 7, 100]
    if dtype.kind in "iu":
        values = [int(np.iinfo(dtype).min), 0, 1, int(np.iinfo(dtype).max)]
    array = np.array(values, dtype=dtype)
    got = infer(client, f"identity_{datatype.lower()}", x=array)["y"]
    assert (got.dtype, got.tolist()) == (array.dtype, array.tolist())


def typed(name: str, datatype: str, shape: list[int], **contents: Any) -> pb2.ModelInferRequest:
    request = pb2.ModelInferRequest(model_name=name)
    tensor = request.inputs.add(name="x", datatype=datatype, shape=shape)
    for field, values in contents.items():
        getattr(tensor.contents, field).extend(values)
    return request


def raw_outputs(response: pb2.ModelInferResponse, dtype: str) -> list[Any]:
    return np.frombuffer(response.raw_output_contents[0], dtype=dtype).tolist()


def test_typed_contents_are_served_like_raw_ones(stub: pb2_grpc.GRPCInferenceServiceStub) -> None:
    cases = [
        ("identity_int8", "INT8", "int_contents", [-128, 5], "<i1"),
        ("identity_uint16", "UINT16", "uint_contents", [0, 65535], "<u2"),
        ("identity_int64", "INT64", "int64_contents", [-(2**63), 2**63 - 1], "<i8"),
        ("identity_uint64", "UINT64", "uint64_contents", [0, 2**64 - 1], "<u8"),
        ("identity_fp64", "FP64", "fp64_contents", [0.5, -1e300], "<f8"),
        ("identity_bool", "BOOL", "bool_contents", [True, False], "?"),
    ]
    for model, datatype, field, values, dtype in cases:
        response = stub.ModelInfer(typed(model, datatype, [2], **{field: values}))
        assert raw_outputs(response, dtype) == values, model
    response = stub.ModelInfer(typed("double", "FP32", [1, 3], fp32_contents=[1, 2, 3]))
    assert (list(response.outputs[0].shape), raw_outputs(response, "<f4")) == ([1, 3], [2, 4, 6])


def test_bad_requests_are_invalid_arguments_and_failures_internal(
    client: grpcclient.InferenceServerClient, stub: pb2_grpc.GRPCInferenceServiceStub
) -> None:
    x = np.ones((2, 3), dtype=np.float32)
    cases: dict[str, tuple[Any, str]] = {
        "unknown model": (lambda: infer(client, "nope", x=x), "NOT_FOUND"),
        "unknown version": (lambda: client.infer("double", [], model_version="9"), "NOT_FOUND"),
        "wrong datatype": (lambda: infer(client, "double", x=x.astype(np.float64)), "INVALID"),
        "wrong shape": (lambda: infer(client, "double", x=x.reshape(3, 2, 1)), "INVALID"),
        "unknown input": (lambda: infer(client, "double", z=x), "INVALID"),
        "unknown output": (lambda: infer(client, "double", ["z"], x=x), "INVALID"),
        "model raises": (lambda: infer(client, "fail", x=x), "INTERNAL"),
        "no output": (lambda: infer(client, "no_output", x=x), "INTERNAL"),
        "wrong output shape": (lambda: infer(client, "wrong_shape", x=x), "INTERNAL"),
        "wrong output type": (lambda: infer(client, "wrong_type", x=x), "INTERNAL"),
    }
    seen = {}
    for case, (call, _) in cases.items():
        with pytest.raises(InferenceServerException) as raised:
            call()
        seen[case] = str(raised.value.status()).removeprefix("StatusCode.")[: len(cases[case][1])]
    assert seen == {case: code for case, (_, code) in cases.items()}
    short = typed("double", "FP32", [1, 3], fp32_contents=[1, 2])
    fp16 = typed("identity_fp16", "FP16", [1], fp32_contents=[1])
    for request, message in ((short, "has 2 values"), (fp16, "raw_input_contents only")):
        with pytest.raises(grpc.RpcError) as error:
            stub.ModelInfer(request)
        assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert message in error.value.details()
    assert np.array_equal(infer(client, "double", x=x)["y"], x * 2)  # still serving


def test_a_stream_answers_each_request_and_goes_on_after_a_failure(
    client: grpcclient.InferenceServerClient,
) -> None:
    answers: list[Any] = []
    client.start_stream(callback=lambda result, error: answers.append(error or result))
    x = np.arange(3, dtype=np.float32).reshape(1, 3)
    for model in ("double", "fail", "double"):
        tensor = grpcclient.InferInput("x", [1, 3], "FP32")
        tensor.set_data_from_numpy(x)
        client.async_stream_infer(model, [tensor])
    client.stop_stream()
    assert len(answers) == 3
    assert answers[0].as_numpy("y").tolist() == [[0, 2, 4]]
    assert isinstance(answers[1], InferenceServerException) and "kaboom" in str(answers[1])
    assert answers[2].as_numpy("y").tolist() == [[0, 2, 4]]
