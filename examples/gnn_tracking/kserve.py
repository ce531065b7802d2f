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
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import FastAPI, Request, Response
from numpy.typing import NDArray
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = ["ModelSpec", "TensorSpec", "create_app"]

_log = logging.getLogger(__name__)

# Little-endian as the protocol requires, whatever the host's byte order.
_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    **{f"UINT{bits}": np.dtype(f"<u{bits // 8}") for bits in (8, 16, 32, 64)},
    **{f"INT{bits}": np.dtype(f"<i{bits // 8}") for bits in (8, 16, 32, 64)},
    **{f"FP{bits}": np.dtype(f"<f{bits // 8}") for bits in (16, 32, 64)},
    "BYTES": np.dtype(object),
}
# The kinds of JSON values (as numpy infers them) that each datatype accepts in ``data``.
_JSON_KINDS = {"BOOL": "b", **{k: "iu" for k in _DTYPES if "INT" in k}, "FP16": "iuf"}
_JSON_KINDS |= {"FP32": "iuf", "FP64": "iuf"}
_KIND_NAMES = {"b": "boolean", "i": "integer", "u": "integer", "f": "float", "U": "string"}
_HEADER_LENGTH = "Inference-Header-Content-Length"
_ALIGNMENT = 64  # bytes, for the binary tensor data in a request body
_LENGTH = struct.Struct("<I")  # the 4-byte length before each element of a binary BYTES tensor


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model: ``TensorSpec("x", "FP32", (-1, 3))``; -1 is any size."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelSpec:
    """A model served by :func:`create_app`; ``infer`` maps input arrays to output arrays.

    ``ModelSpec("double", (TensorSpec("x", "FP32", (-1,)),), (TensorSpec("y", "FP32", (-1,)),),
    lambda inputs: {"y": inputs["x"] * 2})``
    """

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    infer: Callable[[dict[str, NDArray[Any]]], dict[str, NDArray[Any]]]
    version: str = "1"
    platform: str = "python"


class _ProtocolError(Exception):
    """A request the server answers with ``{"error": message}`` and ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _bad(message: str) -> _ProtocolError:
    return _ProtocolError(400, message)


# -- the models ----------------------------------------------------------------------------------


def _check_spec(model: ModelSpec) -> None:
    if not model.name or "/" in model.name or not model.version or "/" in model.version:
        raise ValueError(f"model {model.name!r} version {model.version!r}: both need a name")
    for kind, tensors in (("input", model.inputs), ("output", model.outputs)):
        names = [tensor.name for tensor in tensors]
        if len(set(names)) != len(names):
            raise ValueError(f"model {model.name!r} repeats an {kind} name: {names}")
        for tensor in tensors:
            if tensor.datatype not in _DTYPES:
                raise ValueError(
                    f"model {model.name!r} {kind} {tensor.name!r} has datatype "
                    f"{tensor.datatype!r}; use one of {sorted(_DTYPES)}"
                )
            if any(not isinstance(dim, int) or dim < -1 for dim in tensor.shape):
                raise ValueError(f"model {model.name!r} {kind} {tensor.name!r}: bad shape")


def _version_order(version: str) -> tuple[bool, int, str]:
    return version.isdigit(), int(version) if version.isdigit() else 0, version


class _Models:
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
        name = request.path_params["model_name"]
        version = request.path_params.get("model_version")
        versions = self._versions.get(name, {})
        if not version and versions:
            return versions[max(versions, key=_version_order)]
        if version in versions:
            return versions[version]
        # Triton's wording, so that clients matching on it behave the same.
        suffix = f" version {version}" if version else ""
        raise _ProtocolError(404, f"Request for unknown model: '{name}'{suffix} is not found")

    def metadata(self, model: ModelSpec) -> dict[str, Any]:
        def tensors(specs: tuple[TensorSpec, ...]) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in specs]

        return {
            "name": model.name,
            "versions": sorted(self._versions[model.name], key=_version_order),
            "platform": model.platform,
            "inputs": tensors(model.inputs),
            "outputs": tensors(model.outputs),
        }


def _check_shape(model: ModelSpec, spec: TensorSpec, shape: Sequence[int], status: int) -> None:
    """Raise unless ``shape`` fits; 400 for a request's input, 500 for an output of ``infer``."""
    if len(shape) != len(spec.shape) or any(
        want not in (-1, got) for want, got in zip(spec.shape, shape, strict=True)
    ):
        kind = "input" if status == 400 else "output"
        raise _ProtocolError(
            status,
            f"{kind} {spec.name!r} has shape {list(shape)}; model {model.name!r} expects "
            f"{list(spec.shape)} (-1: any size)",
        )


# -- request decoding ----------------------------------------------------------------------------


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
    raise _ProtocolError(415, f"unsupported Content-Encoding {encoding!r}; use gzip or deflate")


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


def _field(entry: dict[str, Any], key: str, kind: type, what: str) -> Any:
    value = entry.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise _bad(f"{what} needs '{key}' as a JSON {kind.__name__}, not {value!r}")
    return value


def _parameters(entry: dict[str, Any], what: str) -> dict[str, Any]:
    parameters = entry.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise _bad(f"{what} needs 'parameters' as a JSON object, not {parameters!r}")
    return parameters


def _shape_of(entry: dict[str, Any], what: str) -> list[int]:
    shape: list[int] = _field(entry, "shape", list, what)
    if any(not isinstance(dim, int) or isinstance(dim, bool) or dim < 0 for dim in shape):
        raise _bad(f"{what} has an invalid shape {shape}")
    return shape


def _from_binary(spec: TensorSpec, buffer: memoryview, shape: list[int]) -> NDArray[Any]:
    count = math.prod(shape)
    if spec.datatype == "BYTES":
        return _deserialize_bytes(spec, buffer, count).reshape(shape)
    dtype = _DTYPES[spec.datatype]
    if len(buffer) != count * dtype.itemsize:
        raise _bad(
            f"input {spec.name!r} of shape {shape} and datatype {spec.datatype} needs "
            f"{count * dtype.itemsize} bytes; its binary_data_size is {len(buffer)}"
        )
    array = np.frombuffer(buffer, dtype=dtype)
    # The first input starts aligned; one after an odd-sized input may not, so it is copied.
    return (array if array.flags.aligned else array.copy()).reshape(shape)


def _deserialize_bytes(spec: TensorSpec, buffer: memoryview, count: int) -> NDArray[Any]:
    array = np.empty(count, dtype=object)
    offset = 0
    for index in range(count):
        if offset + _LENGTH.size > len(buffer):
            raise _bad(f"input {spec.name!r}: its BYTES data ends at element {index} of {count}")
        (size,) = _LENGTH.unpack_from(buffer, offset)
        offset += _LENGTH.size
        if offset + size > len(buffer):
            raise _bad(f"input {spec.name!r}: BYTES element {index} runs past its data")
        array[index] = bytes(buffer[offset : offset + size])
        offset += size
    if offset != len(buffer):
        raise _bad(f"input {spec.name!r}: {len(buffer) - offset} bytes after {count} elements")
    return array


def _from_json(spec: TensorSpec, data: Any, shape: list[int]) -> NDArray[Any]:
    count, what = math.prod(shape), f"input {spec.name!r}"
    if not isinstance(data, list):
        raise _bad(f"{what}: 'data' must be a list, not {type(data).__name__}")
    if spec.datatype == "BYTES":
        flat = np.asarray(data, dtype=object).ravel()
        if any(not isinstance(item, str) for item in flat):
            raise _bad(f"{what}: BYTES 'data' must be a list of strings")
        raw = np.empty(len(flat), dtype=object)
        raw[:] = [item.encode() for item in flat]
    else:
        try:
            raw = np.asarray(data)
        except ValueError as exc:
            raise _bad(f"{what}: 'data' is not a regular array: {exc}") from exc
        if raw.dtype.kind in "fO" and "INT" in spec.datatype:
            raw = _exact_integers(spec, data, raw)
        if raw.size and raw.dtype.kind not in _JSON_KINDS[spec.datatype]:
            found = _KIND_NAMES.get(raw.dtype.kind, "mixed")
            raise _bad(f"{what}: 'data' holds {found} values, not {spec.datatype}")
    if raw.size != count:
        raise _bad(f"{what} has {raw.size} values in 'data'; its shape {shape} needs {count}")
    dtype = _DTYPES[spec.datatype]
    if raw.size and raw.dtype.kind in "iu" and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if int(raw.min()) < info.min or int(raw.max()) > info.max:
            raise _bad(f"{what}: a value in 'data' is outside {spec.datatype}")
    return raw.astype(dtype, copy=False).reshape(shape)


def _exact_integers(spec: TensorSpec, data: list[Any], raw: NDArray[Any]) -> NDArray[Any]:
    """``data`` as integers: numpy reads ``[0, 2**64 - 1]`` as float64, losing digits."""
    exact = np.asarray(data, dtype=object)
    if exact.shape != raw.shape or any(
        not isinstance(item, int) or isinstance(item, bool) for item in exact.flat
    ):
        return raw  # real floats, or a mix: rejected by the caller
    if exact.size and not 0 <= exact.min() <= exact.max() < 2**64:
        raise _bad(f"input {spec.name!r}: a value in 'data' is outside {spec.datatype}")
    return exact.astype(np.uint64)


def _decode_inputs(
    model: ModelSpec, header: dict[str, Any], binary: memoryview
) -> dict[str, NDArray[Any]]:
    specs = {spec.name: spec for spec in model.inputs}
    arrays: dict[str, NDArray[Any]] = {}
    offset = 0
    for entry in _field(header, "inputs", list, "the request"):
        if not isinstance(entry, dict):
            raise _bad(f"each of 'inputs' must be an object, not {entry!r}")
        name = _field(entry, "name", str, "each input")
        spec, what = specs.get(name), f"input {name!r}"
        if spec is None or name in arrays:
            raise _bad(f"{what} is unknown or repeated; model {model.name!r} takes {list(specs)}")
        if entry.get("datatype") != spec.datatype:
            raise _bad(
                f"{what} has datatype {entry.get('datatype')}; "
                f"model {model.name!r} expects {spec.datatype}"
            )
        shape = _shape_of(entry, what)
        _check_shape(model, spec, shape, 400)
        parameters = _parameters(entry, what)
        if "shared_memory_region" in parameters:
            raise _bad(f"{what}: shared memory is not supported by this server")
        if "binary_data_size" not in parameters:
            arrays[name] = _from_json(spec, entry.get("data"), shape)
            continue
        size = _field(parameters, "binary_data_size", int, what)
        if "data" in entry or size < 0 or offset + size > len(binary):
            raise _bad(
                f"{what} claims {size} bytes of binary data at offset {offset}; the body has "
                f"{len(binary) - offset} left (truncated?) and it must not also have 'data'"
            )
        arrays[name] = _from_binary(spec, binary[offset : offset + size], shape)
        offset += size
    if missing := [name for name in specs if name not in arrays]:
        raise _bad(f"model {model.name!r} needs inputs {missing}")
    if offset != len(binary):
        raise _bad(f"the body has {len(binary) - offset} bytes after the inputs' binary data")
    return arrays


def _requested_outputs(model: ModelSpec, header: dict[str, Any]) -> list[tuple[TensorSpec, bool]]:
    """Each output to return, and whether as binary data; none requested means all."""
    binary = _parameters(header, "the request").get("binary_data_output", False) is True
    entries = header.get("outputs") or []
    if not isinstance(entries, list) or any(not isinstance(entry, dict) for entry in entries):
        raise _bad("'outputs' must be a list of objects")
    if not entries:
        return [(spec, binary) for spec in model.outputs]
    specs = {spec.name: spec for spec in model.outputs}
    requested: dict[str, tuple[TensorSpec, bool]] = {}
    for entry in entries:
        name = _field(entry, "name", str, "each requested output")
        if name not in specs or name in requested:
            raise _bad(f"output {name!r} is unknown or repeated; model gives {list(specs)}")
        parameters = _parameters(entry, f"output {name!r}")
        if "shared_memory_region" in parameters or parameters.get("classification"):
            raise _bad(f"output {name!r}: shared memory and classification are not supported")
        requested[name] = (specs[name], parameters.get("binary_data", binary) is True)
    return list(requested.values())


# -- inference and response encoding -------------------------------------------------------------


def _run(model: ModelSpec, inputs: dict[str, NDArray[Any]]) -> dict[str, Any]:
    try:
        produced = model.infer(inputs)
    except Exception as exc:
        _log.exception("model %r failed", model.name)
        raise _ProtocolError(500, f"model {model.name!r} failed: {exc!r}") from exc
    if not isinstance(produced, dict):
        raise _ProtocolError(500, f"model {model.name!r} returned {type(produced).__name__}")
    return produced


def _output_array(model: ModelSpec, spec: TensorSpec, value: Any) -> NDArray[Any]:
    what = f"model {model.name!r} output {spec.name!r}"
    array = np.asarray(value)
    if spec.datatype == "BYTES":
        flat = array.ravel()
        if any(not isinstance(item, (bytes, str)) for item in flat):
            raise _ProtocolError(500, f"{what}: BYTES must hold bytes or str")
        encoded = np.empty(flat.size, dtype=object)
        encoded[:] = [item.encode() if isinstance(item, str) else item for item in flat]
        array = encoded.reshape(array.shape)
    elif not np.can_cast(array.dtype, _DTYPES[spec.datatype], "same_kind"):
        raise _ProtocolError(500, f"{what} is {array.dtype}, which is not {spec.datatype}")
    _check_shape(model, spec, array.shape, 500)
    return np.ascontiguousarray(array, dtype=_DTYPES[spec.datatype])


def _encode_output(array: NDArray[Any], spec: TensorSpec, binary: bool) -> tuple[Any, Any]:
    """The output's entry in the JSON header, and its binary data (None when in the entry)."""
    entry: dict[str, Any] = {"name": spec.name, "datatype": spec.datatype, "shape": [*array.shape]}
    data: bytes | NDArray[Any] | None = None
    if spec.datatype == "BYTES" and binary:
        data = b"".join(_LENGTH.pack(len(item)) + item for item in array.flat)
    elif spec.datatype == "BYTES":
        try:
            entry["data"] = [item.decode() for item in array.flat]
        except UnicodeDecodeError:
            raise _bad(f"output {spec.name!r} is not UTF-8; request it as binary data") from None
    elif binary:
        data = array  # its buffer joins the body without a copy of its own
    else:
        entry["data"] = array.ravel().tolist()
    if data is not None:
        entry["parameters"] = {
            "binary_data_size": len(data) if isinstance(data, bytes) else data.nbytes
        }
    return entry, data


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
    requested = _requested_outputs(model, header)
    produced = _run(model, _decode_inputs(model, header, binary))
    entries, buffers = [], []
    for spec, as_binary in requested:
        if spec.name not in produced:
            raise _ProtocolError(500, f"model {model.name!r} returned no output {spec.name!r}")
        entry, data = _encode_output(
            _output_array(model, spec, produced[spec.name]), spec, as_binary
        )
        entries.append(entry)
        buffers += [] if data is None else [data]
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
    if isinstance(exc, _ProtocolError):
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
    served = _Models(models)
    app = FastAPI(title=name, version=version)
    for handled in (_ProtocolError, StarletteHTTPException, Exception):
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
