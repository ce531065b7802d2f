"""A KServe v2 (Open Inference Protocol) HTTP server for Python models, in FastAPI.

The same ``tritonclient.http.InferenceServerClient`` code calls a real Triton or this server::

    import numpy as np
    import uvicorn

    double = ModelSpec(
        name="double",
        inputs=(TensorSpec("x", "FP32", (-1, 3)),),
        outputs=(TensorSpec("y", "FP32", (-1, 3)),),
        infer=lambda inputs: {"y": inputs["x"] * 2},
    )
    uvicorn.run(create_app([double]), port=8000)

Served: health, server and model metadata, model readiness and inference, for every numeric
datatype, ``BOOL`` and ``BYTES``; tensors as JSON ``data`` or with the binary tensor data
extension, in any mix; ``gzip``/``deflate`` request bodies (``Content-Encoding``) and responses
(``Accept-Encoding``). Not served: shared memory, classification outputs, ``BF16``, sequence
batching and model control (their parameters are refused, or ignored where harmless).

Binary inputs reach ``infer`` as writable, aligned arrays over the request body, which is copied
once when read, as any server does; ``infer`` runs in Starlette's thread pool under a copy of
the request's context, so an OpenTelemetry span that a middleware started is current inside it.

This module holds the model registry, the HTTP bodies (framing, compression), the routes and
``create_app``; the tensor codec (datatypes, inputs, outputs) is in ``kserve_tensors``.
"""

from __future__ import annotations

import gzip
import json
import logging
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from fastapi import FastAPI, Request, Response
from numpy.typing import NDArray
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from gnn_tracking.serving.kserve_tensors import (
    DATATYPES,
    ModelSpec,
    ProtocolError,
    TensorSpec,
    decode_inputs,
    encode_outputs,
    requested_outputs,
)

__all__ = ["ModelRegistry", "ModelSpec", "TensorSpec", "create_app", "run_model"]

_log = logging.getLogger(__name__)

_HEADER_LENGTH = "Inference-Header-Content-Length"
_ALIGNMENT = 64  # bytes, for the binary tensor data in a request body


def _bad(message: str) -> ProtocolError:
    return ProtocolError(400, message)


# -- the models ----------------------------------------------------------------------------------


def _check_spec(model: ModelSpec) -> None:
    if not model.name or "/" in model.name or not model.version or "/" in model.version:
        raise ValueError(f"model {model.name!r} version {model.version!r}: both need a name")
    for kind, tensors in (("input", model.inputs), ("output", model.outputs)):
        names = [tensor.name for tensor in tensors]
        if len(set(names)) != len(names):
            raise ValueError(f"model {model.name!r} repeats an {kind} name: {names}")
        for tensor in tensors:
            if tensor.datatype not in DATATYPES:
                raise ValueError(
                    f"model {model.name!r} {kind} {tensor.name!r} has datatype "
                    f"{tensor.datatype!r}; use one of {sorted(DATATYPES)}"
                )
            if any(not isinstance(dim, int) or dim < -1 for dim in tensor.shape):
                raise ValueError(f"model {model.name!r} {kind} {tensor.name!r}: bad shape")


def _version_order(version: str) -> tuple[bool, int, str]:
    return version.isdigit(), int(version) if version.isdigit() else 0, version


class ModelRegistry:
    """The served models by name and version; no version means the highest."""

    def __init__(self, models: Sequence[ModelSpec]) -> None:
        self._versions: dict[str, dict[str, ModelSpec]] = {}
        for model in models:
            _check_spec(model)
            versions = self._versions.setdefault(model.name, {})
            if model.version in versions:
                raise ValueError(f"model {model.name!r} version {model.version!r} is given twice")
            versions[model.version] = model

    def find(self, request: Request) -> ModelSpec:
        """The model a request's path names."""
        return self.lookup(
            request.path_params["model_name"], request.path_params.get("model_version")
        )

    def lookup(self, name: str, version: str | None) -> ModelSpec:
        """``name`` at ``version``, the highest when none; ``ProtocolError`` 404 when unknown."""
        versions = self._versions.get(name, {})
        if not version and versions:
            return versions[max(versions, key=_version_order)]
        if version in versions:
            return versions[version]
        # Triton's wording, so that clients matching on it behave the same.
        suffix = f" version {version}" if version else ""
        raise ProtocolError(404, f"Request for unknown model: '{name}'{suffix} is not found")

    def versions(self, name: str) -> list[str]:
        """The versions served of model ``name``, lowest first."""
        return sorted(self._versions[name], key=_version_order)

    def metadata(self, model: ModelSpec) -> dict[str, Any]:
        """The model's KServe v2 metadata, as JSON."""

        def tensors(specs: tuple[TensorSpec, ...]) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in specs]

        return {
            "name": model.name,
            "versions": self.versions(model.name),
            "platform": model.platform,
            "inputs": tensors(model.inputs),
            "outputs": tensors(model.outputs),
        }


# -- request bodies ------------------------------------------------------------------------------


def _decompress(chunks: list[bytes], encoding: str | None) -> list[bytes]:
    coding = (encoding or "identity").strip().lower()
    if coding == "identity":
        return chunks
    body = b"".join(chunks)
    try:
        if coding == "gzip":
            return [gzip.decompress(body)]
        if coding == "deflate":  # HTTP's deflate is zlib-wrapped; some clients send it raw
            try:
                return [zlib.decompress(body)]
            except zlib.error:
                return [zlib.decompress(body, -zlib.MAX_WBITS)]
    except (OSError, EOFError, zlib.error) as exc:
        raise _bad(f"the request body is not valid {coding} data: {exc}") from exc
    raise ProtocolError(415, f"unsupported Content-Encoding {encoding!r}; use gzip or deflate")


def _aligned(chunks: list[bytes], size: int, start: int) -> memoryview:
    """The body in one writable buffer, copied once, where offset ``start`` is 64-byte aligned.

    Inputs are then views that ``infer`` may write to and that torch takes without a warning.
    """
    buffer = np.empty(size + _ALIGNMENT, dtype=np.uint8)
    skip = -(buffer.ctypes.data + start) % _ALIGNMENT
    body = buffer.data[skip : skip + size]
    offset = 0
    for chunk in chunks:
        body[offset : offset + len(chunk)] = chunk
        offset += len(chunk)
    return body


def _split_body(
    chunks: list[bytes], header_length: str | None
) -> tuple[dict[str, Any], memoryview]:
    """The request's JSON header, and the binary tensor data after it."""
    size = sum(len(chunk) for chunk in chunks)
    try:
        length = size if header_length is None else int(header_length)
    except ValueError:
        raise _bad(f"{_HEADER_LENGTH} must be an integer, not {header_length!r}") from None
    if not 0 <= length <= size:
        raise _bad(f"{_HEADER_LENGTH} {length} is outside the body's {size} bytes")
    if length == size:
        body, text = memoryview(b""), b"".join(chunks)
    else:
        body = _aligned(chunks, size, length)
        text = body[:length].tobytes()
    try:
        header = json.loads(text)
    except ValueError as exc:  # UnicodeDecodeError included
        raise _bad(f"the request's JSON header is malformed: {exc}") from exc
    if not isinstance(header, dict):
        raise _bad("the request's JSON header must be an object")
    return header, body[length:]


# -- inference and the response ------------------------------------------------------------------


def run_model(model: ModelSpec, inputs: dict[str, NDArray[Any]]) -> dict[str, Any]:
    """``model.infer(inputs)``; a model that raises or returns no dict is a 500, logged."""
    try:
        produced = model.infer(inputs)
    except Exception as exc:
        _log.exception("model %r failed", model.name)
        raise ProtocolError(500, f"model {model.name!r} failed: {exc!r}") from exc
    if not isinstance(produced, dict):
        raise ProtocolError(500, f"model {model.name!r} returned {type(produced).__name__}")
    return produced


def _accepted(coding: str, accept: str | None) -> bool:
    """Whether ``Accept-Encoding`` lists ``coding`` with a non-zero quality."""
    for item in (accept or "").split(","):
        name, *parameters = item.split(";")
        if name.strip().lower() == coding:
            q = [p.split("=", 1)[1] for p in parameters if p.strip().lower().startswith("q=")]
            try:
                return not q or float(q[0]) > 0
            except ValueError:
                return False
    return False


def _serve(model: ModelSpec, chunks: list[bytes], headers: dict[str, str | None]) -> Response:
    """One inference request, off the event loop: decode, infer, encode."""
    header, binary = _split_body(
        _decompress(chunks, headers["content-encoding"]), headers[_HEADER_LENGTH.lower()]
    )
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise _bad(f"the request 'id' must be a string, not {request_id!r}")
    requested = requested_outputs(model, header)
    produced = run_model(model, decode_inputs(model, header, binary))
    entries, buffers = encode_outputs(model, requested, produced)
    response: dict[str, Any] = {"model_name": model.name, "model_version": model.version}
    response |= {"id": request_id} if request_id is not None else {}
    encoded = json.dumps(response | {"outputs": entries}, separators=(",", ":")).encode()
    extra = {_HEADER_LENGTH: str(len(encoded))} if buffers else {}
    content = b"".join([encoded, *buffers])
    for coding, compress in (("gzip", gzip.compress), ("deflate", zlib.compress)):
        if _accepted(coding, headers["accept-encoding"]):
            content, extra = compress(content, 6), extra | {"Content-Encoding": coding}
            break
    media_type = "application/octet-stream" if buffers else "application/json"
    return Response(content, headers=extra, media_type=media_type)


# -- the app -------------------------------------------------------------------------------------


def _json(content: Any, status: int = 200) -> Response:
    return Response(json.dumps(content), status, media_type="application/json")


async def _error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, ProtocolError):
        return _json({"error": exc.message}, exc.status)
    if isinstance(exc, StarletteHTTPException):
        return _json({"error": str(exc.detail)}, exc.status_code)
    _log.error("kserve: %s %s failed", request.method, request.url.path, exc_info=exc)
    return _json({"error": f"internal server error: {exc!r}"}, 500)


def create_app(
    models: Sequence[ModelSpec], *, name: str = "kserve-python", version: str = "1"
) -> FastAPI:
    """A FastAPI app serving ``models`` over the KServe v2 HTTP protocol under ``/v2``.

    ``uvicorn.run(create_app([double]), port=8000)``, then
    ``tritonclient.http.InferenceServerClient("localhost:8000").infer("double", inputs)``.
    Raises ValueError for an invalid spec (unknown datatype, repeated name or version).
    """
    served = ModelRegistry(models)
    app = FastAPI(title=name, version=version)
    for handled in (ProtocolError, StarletteHTTPException, Exception):
        app.add_exception_handler(handled, _error)
    server = {"name": name, "version": version, "extensions": ["binary_tensor_data"]}

    async def healthy(request: Request) -> Response:
        return Response(status_code=200)

    async def server_metadata(request: Request) -> Response:
        return _json(server)

    async def model_metadata(request: Request) -> Response:
        return _json(served.metadata(served.find(request)))

    async def model_ready(request: Request) -> Response:
        served.find(request)
        return Response(status_code=200)

    async def infer(request: Request) -> Response:
        model = served.find(request)
        chunks = [chunk async for chunk in request.stream()]  # joined in _serve, off the loop
        keys = ("content-encoding", "accept-encoding", _HEADER_LENGTH.lower())
        headers = {key: request.headers.get(key) for key in keys}
        # run_in_threadpool copies the request's contextvars (its OpenTelemetry context).
        return await run_in_threadpool(_serve, model, chunks, headers)

    app.add_api_route("/v2/health/live", healthy, methods=["GET"])
    app.add_api_route("/v2/health/ready", healthy, methods=["GET"])
    app.add_api_route("/v2", server_metadata, methods=["GET"])
    for path in ("/v2/models/{model_name}", "/v2/models/{model_name}/versions/{model_version}"):
        app.add_api_route(path, model_metadata, methods=["GET"])
        app.add_api_route(f"{path}/ready", model_ready, methods=["GET"])
        app.add_api_route(f"{path}/infer", infer, methods=["POST"])
    return app
