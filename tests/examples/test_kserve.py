"""The KServe v2 server of ``examples/gnn_tracking/kserve.py`` on a real uvicorn, called by the
real ``tritonclient.http`` client (and by raw HTTP for bodies that client never sends).

Every answer is compared with numpy computing the same model in-process.
"""

from __future__ import annotations

import contextvars
import gzip
import http.client
import json
import logging
import struct
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from numpy.typing import NDArray
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanContext
from starlette.types import ASGIApp, Receive, Scope, Send
from tritonclient.utils import InferenceServerException, np_to_triton_dtype, triton_to_np_dtype

from tests.paths import EXAMPLES as EXAMPLES_DIR
from tests.server.test_fastapi import serving

EXAMPLES = str(EXAMPLES_DIR)
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)

from gnn_tracking.serving.kserve import ModelSpec, TensorSpec, create_app  # noqa: E402

Arrays = dict[str, NDArray[Any]]
NUMERIC = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"]
NUMERIC += ["FP16", "FP32", "FP64"]

# -- the toy models and their numpy twins ----------------------------------------------------


def double(inputs: Arrays) -> Arrays:
    return {"y": inputs["x"] * 2}


def index(inputs: Arrays) -> Arrays:
    return {"flipped": inputs["edges"][::-1]}  # a strided view: the server must make it contiguous


def stats(inputs: Arrays) -> Arrays:
    return {"sum": inputs["x"].sum(axis=1), "positive": inputs["x"] > 0}


def upper(inputs: Arrays) -> Arrays:
    return {"upper": np.array([text.upper() for text in inputs["text"].flat], dtype=object)}


def identity(inputs: Arrays) -> Arrays:
    return {"y": inputs["x"]}


def fail(inputs: Arrays) -> Arrays:
    raise ValueError("kaboom")


def model(
    name: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    infer: Callable[[Arrays], Arrays],
    version: str = "1",
) -> ModelSpec:
    return ModelSpec(name, tuple(inputs), tuple(outputs), infer, version=version)


X3 = TensorSpec("x", "FP32", (-1, 3))
MODELS = [
    model("double", [X3], [TensorSpec("y", "FP32", (-1, 3))], double),
    model(
        "index",
        [TensorSpec("edges", "INT64", (2, -1))],
        [TensorSpec("flipped", "INT64", (2, -1))],
        index,
    ),
    model(
        "stats",
        [TensorSpec("x", "FP64", (-1, -1))],
        [TensorSpec("sum", "FP64", (-1,)), TensorSpec("positive", "BOOL", (-1, -1))],
        stats,
    ),
    model(
        "upper", [TensorSpec("text", "BYTES", (-1,))], [TensorSpec("upper", "BYTES", (-1,))], upper
    ),
    model("fail", [X3], [TensorSpec("y", "FP32", (-1, 3))], fail),
    model("no_output", [X3], [TensorSpec("y", "FP32", (-1, 3))], lambda inputs: {}),
    model("wrong_shape", [X3], [TensorSpec("y", "FP32", (-1, 3))], lambda i: {"y": i["x"].T}),
    model("wrong_type", [X3], [TensorSpec("y", "INT32", (-1, 3))], double),
    model("versioned", [X3], [TensorSpec("y", "FP32", (-1, 3))], lambda i: {"y": i["x"] + 1}, "1"),
    model("versioned", [X3], [TensorSpec("y", "FP32", (-1, 3))], lambda i: {"y": i["x"] + 2}, "2"),
    *(
        model(
            f"identity_{t.lower()}",
            [TensorSpec("x", t, (-1,))],
            [TensorSpec("y", t, (-1,))],
            identity,
        )
        for t in NUMERIC
    ),
]

# -- the context a middleware sets, as OpenTelemetry's ASGI middleware would -----------------

TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="none")
TRACER = TracerProvider().get_tracer(__name__)
STARTED: dict[str, tuple[SpanContext, int]] = {}  # tenant: (span started, event-loop thread)
SEEN: dict[str, tuple[str, SpanContext, int]] = {}  # tenant: what infer saw, and its thread
ENTERED, RELEASE = threading.Event(), threading.Event()


class TenantMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tenant = dict(scope.get("headers", [])).get(b"x-tenant", b"").decode()
        if not tenant:
            await self.app(scope, receive, send)
            return
        with TRACER.start_as_current_span("request") as span:
            TENANT.set(tenant)
            STARTED[tenant] = (span.get_span_context(), threading.get_ident())
            await self.app(scope, receive, send)


def observe(inputs: Arrays) -> Arrays:
    current = trace.get_current_span().get_span_context()
    SEEN[TENANT.get()] = (TENANT.get(), current, threading.get_ident())
    return {"y": inputs["x"]}


def layout(inputs: Arrays) -> Arrays:
    """Doubles ``x`` in place: inputs are writable and aligned, whatever precedes them."""
    arrays = inputs.values()
    inputs["x"] *= 2
    flags = [[a.flags.writeable, a.flags.aligned, a.ctypes.data % 8 == 0] for a in arrays]
    return {"y": inputs["x"], "flags": np.array(flags)}


def wait(inputs: Arrays) -> Arrays:
    ENTERED.set()
    assert RELEASE.wait(10), "the test never released the model"
    return {"y": inputs["x"]}


MODELS += [
    model("observe", [X3], [TensorSpec("y", "FP32", (-1, 3))], observe),
    model("wait", [X3], [TensorSpec("y", "FP32", (-1, 3))], wait),
    model(
        "layout",
        [TensorSpec("mask", "BOOL", (-1,)), TensorSpec("x", "FP64", (-1,))],
        [TensorSpec("y", "FP64", (-1,)), TensorSpec("flags", "BOOL", (2, 3))],
        layout,
    ),
]

# -- server, clients, helpers ----------------------------------------------------------------


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    app = create_app(MODELS, name="toy", version="0.1")
    app.add_middleware(TenantMiddleware)
    with serving(app) as bound:
        yield bound


@pytest.fixture(scope="module")
def client(port: int) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(f"127.0.0.1:{port}") as connected:
        yield connected


def send(port: int, method: str, path: str, body: bytes = b"", **headers: str) -> tuple[int, Any]:
    """A raw request, for bodies tritonclient never sends; the status and the JSON answer."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, body, headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def call(
    client: httpclient.InferenceServerClient,
    name: str,
    arrays: Arrays,
    binary_in: bool | dict[str, bool] = True,
    binary_out: bool | dict[str, bool] = True,
    outputs: Sequence[str] | None = None,
    **options: Any,
) -> httpclient.InferResult:
    """``infer`` on ``name``; each tensor binary or JSON as a bool or a per-name dict says."""

    def pick(choice: bool | dict[str, bool], tensor: str) -> bool:
        return choice if isinstance(choice, bool) else choice[tensor]

    inputs = []
    for tensor, array in arrays.items():
        sent = httpclient.InferInput(tensor, list(array.shape), np_to_triton_dtype(array.dtype))
        inputs.append(sent.set_data_from_numpy(array, binary_data=pick(binary_in, tensor)))
    requested = [httpclient.InferRequestedOutput(o, pick(binary_out, o)) for o in outputs or []]
    return client.infer(name, inputs, outputs=requested or None, **options)


def table(arrays: dict[str, Any]) -> dict[str, tuple[str, tuple[int, ...], list[Any]]]:
    """Arrays as comparable values: dtype, shape and elements."""
    return {name: (str(a.dtype), a.shape, a.tolist()) for name, a in arrays.items()}


def received(result: httpclient.InferResult, names: Sequence[str]) -> dict[str, Any]:
    return table({name: result.as_numpy(name) for name in names})


RNG = np.random.default_rng(7)
CASES: list[tuple[str, Arrays, Callable[[Arrays], Arrays]]] = [
    ("double", {"x": RNG.normal(size=(5, 3)).astype(np.float32)}, double),
    ("double", {"x": np.zeros((0, 3), np.float32)}, double),
    ("index", {"edges": RNG.integers(-(2**40), 2**40, size=(2, 7))}, index),
    ("index", {"edges": np.zeros((2, 0), np.int64)}, index),
    ("stats", {"x": RNG.normal(size=(4, 6))}, stats),
    ("stats", {"x": np.zeros((0, 6))}, stats),
]
MODES: dict[str, tuple[bool, bool | dict[str, bool]]] = {  # binary_in, binary_out
    "binary": (True, True),
    "json": (False, False),
    "binary-in-json-out": (True, False),
    "json-in-binary-out": (False, True),
    "mixed-outputs": (True, {"y": False, "flipped": True, "sum": True, "positive": False}),
}


# -- inference -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("name", "arrays", "twin"), CASES)
def test_answers_as_numpy(
    client: httpclient.InferenceServerClient,
    mode: str,
    name: str,
    arrays: Arrays,
    twin: Callable[[Arrays], Arrays],
) -> None:
    expected = twin(arrays)
    binary_in, binary_out = MODES[mode]
    result = call(client, name, arrays, binary_in, binary_out, outputs=list(expected))
    assert received(result, list(expected)) == table(expected)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", NUMERIC)
def test_every_datatype_round_trips(
    client: httpclient.InferenceServerClient, datatype: str, binary: bool
) -> None:
    dtype = np.dtype(triton_to_np_dtype(datatype))
    if dtype.kind == "b":
        values = np.array([True, False, True])
    elif dtype.kind in "iu":
        values = np.array([np.iinfo(dtype).min, 0, 3, np.iinfo(dtype).max], dtype)
    else:
        values = np.array([-1.5, 0, np.finfo(dtype).max], dtype)
    name = f"identity_{datatype.lower()}"
    result = call(client, name, {"x": values}, binary, binary, outputs=["y"])
    assert received(result, ["y"]) == table({"y": values})


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_bytes(client: httpclient.InferenceServerClient, binary: bool) -> None:
    texts = np.array([b"pixel", b"", "straw \u00e9".encode(), b"track"], dtype=object)
    result = call(client, "upper", {"text": texts}, binary, binary, outputs=["upper"])
    # Binary BYTES come back as bytes, JSON ones as str: tritonclient's own convention.
    uppers = [text.upper() for text in texts]
    expected = uppers if binary else [text.decode() for text in uppers]
    assert result.as_numpy("upper").tolist() == expected


@pytest.mark.parametrize("odd", [1, 3], ids=["after 1 byte", "after 3 bytes"])
def test_binary_inputs_are_writable_and_aligned(
    client: httpclient.InferenceServerClient, odd: int
) -> None:
    arrays = {"mask": np.ones(odd, bool), "x": np.arange(5.0)}
    result = call(client, "layout", arrays, outputs=["y", "flags"])
    assert received(result, ["y", "flags"]) == table(
        {"y": np.arange(5.0) * 2, "flags": np.ones((2, 3), bool)}
    )


def test_subset_of_outputs_and_request_id(client: httpclient.InferenceServerClient) -> None:
    x = RNG.normal(size=(3, 2))
    result = call(client, "stats", {"x": x}, outputs=["positive"], binary_out=False, request_id="7")
    assert result.get_response() == {
        "id": "7",
        "model_name": "stats",
        "model_version": "1",
        "outputs": [
            {
                "name": "positive",
                "datatype": "BOOL",
                "shape": [3, 2],
                "data": (x > 0).ravel().tolist(),
            }
        ],
    }


def test_no_outputs_requested_returns_all_as_binary(
    client: httpclient.InferenceServerClient,
) -> None:
    x = RNG.normal(size=(2, 5))
    result = call(client, "stats", {"x": x})  # tritonclient then asks for binary_data_output
    assert result.get_response() == {
        "model_name": "stats",
        "model_version": "1",
        "outputs": [
            {
                "name": "sum",
                "datatype": "FP64",
                "shape": [2],
                "parameters": {"binary_data_size": 16},
            },
            {
                "name": "positive",
                "datatype": "BOOL",
                "shape": [2, 5],
                "parameters": {"binary_data_size": 10},
            },
        ],
    }
    assert received(result, ["sum", "positive"]) == table(stats({"x": x}))


def test_versions(client: httpclient.InferenceServerClient) -> None:
    x = np.ones((1, 3), np.float32)
    answers = {v: call(client, "versioned", {"x": x}, model_version=v) for v in ("", "1", "2")}
    assert {
        version: (answer.get_response()["model_version"], answer.as_numpy("y").tolist())
        for version, answer in answers.items()
    } == {"": ("2", [[3, 3, 3]]), "1": ("1", [[2, 2, 2]]), "2": ("2", [[3, 3, 3]])}


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request_and_response(
    client: httpclient.InferenceServerClient, algorithm: str
) -> None:
    x = RNG.normal(size=(50, 3)).astype(np.float32)
    options = {"request_compression_algorithm": algorithm}
    options["response_compression_algorithm"] = algorithm
    for binary in (True, False):
        result = call(client, "double", {"x": x}, binary, binary, outputs=["y"], **options)
        assert received(result, ["y"]) == table(double({"x": x}))


# -- metadata and readiness ------------------------------------------------------------------


def test_metadata_and_readiness(client: httpclient.InferenceServerClient) -> None:
    assert client.get_server_metadata() == {
        "name": "toy",
        "version": "0.1",
        "extensions": ["binary_tensor_data"],
    }
    stats_metadata = {
        "name": "stats",
        "versions": ["1"],
        "platform": "python",
        "inputs": [{"name": "x", "datatype": "FP64", "shape": [-1, -1]}],
        "outputs": [
            {"name": "sum", "datatype": "FP64", "shape": [-1]},
            {"name": "positive", "datatype": "BOOL", "shape": [-1, -1]},
        ],
    }
    assert client.get_model_metadata("stats") == stats_metadata
    assert client.get_model_metadata("stats", "1") == stats_metadata
    assert client.get_model_metadata("versioned", "1")["versions"] == ["1", "2"]
    assert [client.is_server_live(), client.is_server_ready()] == [True, True]
    ready = [("stats", ""), ("stats", "1"), ("stats", "2"), ("nope", ""), ("versioned", "2")]
    assert [client.is_model_ready(name, version) for name, version in ready] == [
        True,
        True,
        False,
        False,
        True,
    ]


# -- errors ----------------------------------------------------------------------------------


def failure(action: Callable[[], object]) -> tuple[str | None, str]:
    with pytest.raises(InferenceServerException) as caught:
        action()
    return caught.value.status(), caught.value.message()


def test_errors_through_tritonclient(client: httpclient.InferenceServerClient) -> None:
    x = np.ones((2, 3), np.float32)
    assert failure(lambda: call(client, "nope", {"x": x})) == (
        "404",
        "Request for unknown model: 'nope' is not found",
    )
    assert failure(lambda: call(client, "double", {"x": x}, model_version="9")) == (
        "404",
        "Request for unknown model: 'double' version 9 is not found",
    )
    assert failure(lambda: client.get_model_metadata("nope")) == (
        "404",
        "Request for unknown model: 'nope' is not found",
    )
    assert failure(lambda: call(client, "double", {"x": x.astype(np.float64)})) == (
        "400",
        "input 'x' has datatype FP64; model 'double' expects FP32",
    )
    assert failure(lambda: call(client, "double", {"x": np.ones((2, 4), np.float32)})) == (
        "400",
        "input 'x' has shape [2, 4]; model 'double' expects [-1, 3] (-1: any size)",
    )
    assert failure(lambda: call(client, "double", {"x": x}, outputs=["z"])) == (
        "400",
        "output 'z' is unknown or repeated; model gives ['y']",
    )
    assert failure(lambda: call(client, "double", {"z": x})) == (
        "400",
        "input 'z' is unknown or repeated; model 'double' takes ['x']",
    )
    assert failure(lambda: call(client, "no_output", {"x": x})) == (
        "500",
        "model 'no_output' returned no output 'y'",
    )
    assert failure(lambda: call(client, "wrong_shape", {"x": x})) == (
        "500",
        "output 'y' has shape [3, 2]; model 'wrong_shape' expects [-1, 3] (-1: any size)",
    )
    assert failure(lambda: call(client, "wrong_type", {"x": x})) == (
        "500",
        "model 'wrong_type' output 'y' is float32, which is not INT32",
    )


def test_a_failing_model_answers_500_and_the_server_goes_on(
    client: httpclient.InferenceServerClient, caplog: pytest.LogCaptureFixture
) -> None:
    x = np.ones((2, 3), np.float32)
    with caplog.at_level(logging.ERROR, logger="gnn_tracking.serving.kserve"):
        assert failure(lambda: call(client, "fail", {"x": x})) == (
            "500",
            "model 'fail' failed: ValueError('kaboom')",
        )
    logged = [(r.getMessage(), r.exc_info and r.exc_info[0]) for r in caplog.records]
    assert logged == [("model 'fail' failed", ValueError)]
    assert call(client, "double", {"x": x}).as_numpy("y").tolist() == (x * 2).tolist()


def infer_body(inputs: list[dict[str, Any]], binary: bytes = b"") -> tuple[bytes, dict[str, str]]:
    header = json.dumps({"inputs": inputs}).encode()
    return header + binary, {"Inference-Header-Content-Length": str(len(header))}


FLOATS = np.arange(6, dtype=np.float32).tobytes()
X_BINARY: dict[str, Any] = {"name": "x", "datatype": "FP32", "shape": [2, 3]}
X_BINARY["parameters"] = {"binary_data_size": 24}
TRUNCATED = infer_body([X_BINARY], FLOATS[:20])
GZIPPED = (gzip.compress(TRUNCATED[0]), TRUNCATED[1] | {"Content-Encoding": "gzip"})
RAW_ERRORS: dict[str, tuple[bytes, dict[str, str], int, str]] = {
    "truncated binary": (
        *TRUNCATED,
        400,
        "input 'x' claims 24 bytes of binary data at offset 0; the body has 20 left "
        "(truncated?) and it must not also have 'data'",
    ),
    "truncated binary, gzipped": (
        *GZIPPED,
        400,
        "input 'x' claims 24 bytes of binary data at offset 0; the body has 20 left "
        "(truncated?) and it must not also have 'data'",
    ),
    "trailing bytes": (
        *infer_body([X_BINARY], FLOATS + b"\0"),
        400,
        "the body has 1 bytes after the inputs' binary data",
    ),
    "header length past the body": (
        b"{}",
        {"Inference-Header-Content-Length": "3"},
        400,
        "Inference-Header-Content-Length 3 is outside the body's 2 bytes",
    ),
    "header length not a number": (
        b"{}",
        {"Inference-Header-Content-Length": "two"},
        400,
        "Inference-Header-Content-Length must be an integer, not 'two'",
    ),
    "not JSON": (
        b"{inputs",
        {},
        400,
        "the request's JSON header is malformed: Expecting property name enclosed in double "
        "quotes: line 1 column 2 (char 1)",
    ),
    "no inputs": (b"{}", {}, 400, "the request needs 'inputs' as a JSON list, not None"),
    "missing input": (
        *infer_body([]),
        400,
        "model 'double' needs inputs ['x']",
    ),
    "too few values": (
        *infer_body([{"name": "x", "datatype": "FP32", "shape": [2, 3], "data": [1, 2]}]),
        400,
        "input 'x' has 2 values in 'data'; its shape [2, 3] needs 6",
    ),
    "strings for FP32": (
        *infer_body([{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": ["a", "b", "c"]}]),
        400,
        "input 'x': 'data' holds string values, not FP32",
    ),
    "ragged data": (
        *infer_body([{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [[1, 2], [3]]}]),
        400,
        "input 'x': 'data' is not a regular array: setting an array element with a sequence. "
        "The requested array has an inhomogeneous shape after 1 dimensions. The detected shape "
        "was (2,) + inhomogeneous part.",
    ),
    "negative dimension": (
        *infer_body([{"name": "x", "datatype": "FP32", "shape": [-1, 3], "data": []}]),
        400,
        "input 'x' has an invalid shape [-1, 3]",
    ),
    "shared memory": (
        *infer_body(
            [
                X_BINARY
                | {"parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 24}}
            ]
        ),
        400,
        "input 'x': shared memory is not supported by this server",
    ),
    "unsupported encoding": (
        b"{}",
        {"Content-Encoding": "br"},
        415,
        "unsupported Content-Encoding 'br'; use gzip or deflate",
    ),
    "corrupt gzip": (
        b"not gzip",
        {"Content-Encoding": "gzip"},
        400,
        "the request body is not valid gzip data: Not a gzipped file (b'no')",
    ),
}


@pytest.mark.parametrize("case", RAW_ERRORS)
def test_malformed_requests_answer_400(port: int, case: str) -> None:
    body, headers, status, message = RAW_ERRORS[case]
    answer = send(port, "POST", "/v2/models/double/infer", body, **headers)
    assert answer == (status, {"error": message})


def vector(datatype: str, data: list[Any]) -> dict[str, Any]:
    return {"name": "x", "datatype": datatype, "shape": [len(data)], "data": data}


TEXT = {"name": "text", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 11}}
VALUE_ERRORS: dict[str, tuple[str, tuple[bytes, dict[str, str]], str]] = {
    "float for INT64": (
        "identity_int64",
        infer_body([vector("INT64", [1, 1.5])]),
        "input 'x': 'data' holds float values, not INT64",
    ),
    "300 for UINT8": (
        "identity_uint8",
        infer_body([vector("UINT8", [0, 300])]),
        "input 'x': a value in 'data' is outside UINT8",
    ),
    "-1 for UINT64": (
        "identity_uint64",
        infer_body([vector("UINT64", [-1, 2**64 - 1])]),
        "input 'x': a value in 'data' is outside UINT64",
    ),
    "2**64 for UINT64": (
        "identity_uint64",
        infer_body([vector("UINT64", [0, 2**64])]),
        "input 'x': a value in 'data' is outside UINT64",
    ),
    "1 for BOOL": (
        "identity_bool",
        infer_body([vector("BOOL", [True, 1])]),
        "input 'x': 'data' holds integer values, not BOOL",
    ),
    "number for BYTES": (
        "upper",
        infer_body([{"name": "text", "datatype": "BYTES", "shape": [1], "data": [1]}]),
        "input 'text': BYTES 'data' must be a list of strings",
    ),
    "BYTES element past its data": (
        "upper",
        infer_body([TEXT], struct.pack("<I", 2) + b"ab" + struct.pack("<I", 9) + b"a"),
        "input 'text': BYTES element 1 runs past its data",
    ),
}


@pytest.mark.parametrize("case", VALUE_ERRORS)
def test_values_must_fit_the_datatype(port: int, case: str) -> None:
    name, (body, headers), message = VALUE_ERRORS[case]
    answer = send(port, "POST", f"/v2/models/{name}/infer", body, **headers)
    assert answer == (400, {"error": message})


def test_unknown_routes_answer_in_the_protocol_form(port: int) -> None:
    answers = [send(port, "GET", "/v2/nothing"), send(port, "GET", "/v2/models/double/infer")]
    assert answers == [
        (404, {"error": "Not Found"}),
        (405, {"error": "Method Not Allowed"}),
    ]


# -- concurrency and context -----------------------------------------------------------------


def test_infer_sees_the_request_context_in_a_worker_thread(
    client: httpclient.InferenceServerClient,
) -> None:
    x = np.ones((1, 3), np.float32)
    for tenant in ("alice", "bob"):
        call(client, "observe", {"x": x}, headers={"x-tenant": tenant})
    seen = {tenant: (name, span) for tenant, (name, span, _) in SEEN.items()}
    assert seen == {
        "alice": ("alice", STARTED["alice"][0]),
        "bob": ("bob", STARTED["bob"][0]),
    }
    assert all(SEEN[t][2] != STARTED[t][1] for t in SEEN), "infer ran on the event loop"


def test_the_event_loop_serves_while_infer_runs(
    client: httpclient.InferenceServerClient, port: int
) -> None:
    x = {"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}
    body = json.dumps({"inputs": [x]}).encode()
    answers: list[tuple[int, Any]] = []
    blocked = threading.Thread(
        target=lambda: answers.append(send(port, "POST", "/v2/models/wait/infer", body))
    )
    blocked.start()
    try:
        assert ENTERED.wait(10), "the request never reached the model"
        assert client.is_server_live() and client.get_model_metadata("wait")["name"] == "wait"
        assert not answers
    finally:
        RELEASE.set()
        blocked.join(10)
    assert [status for status, _ in answers] == [200]


# -- misuse ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("models", "message"),
    [
        (
            [model("m", [TensorSpec("x", "BF16", (-1,))], [], double)],
            "model 'm' input 'x' has datatype 'BF16'; use one of",
        ),
        ([MODELS[0], MODELS[0]], "model 'double' version '1' is given twice"),
        ([model("m", [X3, X3], [], double)], "model 'm' repeats an input name: ['x', 'x']"),
    ],
)
def test_invalid_specs_fail_at_create_app(models: list[ModelSpec], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        create_app(models)
    assert str(caught.value).startswith(message)
