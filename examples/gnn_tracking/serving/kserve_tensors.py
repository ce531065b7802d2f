"""The tensor codec of the KServe v2 server in ``kserve``: arrays to and from the protocol's JSON.

``decode_inputs`` turns a request's JSON header and the binary tensor data after it into arrays
for ``infer``; ``encode_outputs`` turns the arrays it returns into the response's ``outputs`` and
binary data. Nothing here touches HTTP: ``kserve`` frames the bodies, compresses and routes.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "DATATYPES",
    "NUMPY_DTYPES",
    "ModelSpec",
    "ProtocolError",
    "TensorSpec",
    "check_shape",
    "decode_inputs",
    "encode_outputs",
    "from_binary",
    "output_array",
    "requested_outputs",
]

# Little-endian as the protocol requires, whatever the host's byte order.
NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    **{f"UINT{bits}": np.dtype(f"<u{bits // 8}") for bits in (8, 16, 32, 64)},
    **{f"INT{bits}": np.dtype(f"<i{bits // 8}") for bits in (8, 16, 32, 64)},
    **{f"FP{bits}": np.dtype(f"<f{bits // 8}") for bits in (16, 32, 64)},
    "BYTES": np.dtype(object),
}
# The kinds of JSON values (as numpy infers them) that each datatype accepts in ``data``.
_JSON_KINDS = {"BOOL": "b", **{k: "iu" for k in NUMPY_DTYPES if "INT" in k}, "FP16": "iuf"}
_JSON_KINDS |= {"FP32": "iuf", "FP64": "iuf"}
_KIND_NAMES = {"b": "boolean", "i": "integer", "u": "integer", "f": "float", "U": "string"}
_LENGTH = struct.Struct("<I")  # the 4-byte length before each element of a binary BYTES tensor
DATATYPES = tuple(NUMPY_DTYPES)  # "BOOL", "UINT8", ..., "FP64", "BYTES": the datatypes served


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


class ProtocolError(Exception):
    """A request the server answers with ``{"error": message}`` and ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _bad(message: str) -> ProtocolError:
    return ProtocolError(400, message)


def check_shape(model: ModelSpec, spec: TensorSpec, shape: Sequence[int], status: int) -> None:
    """Raise unless ``shape`` fits; 400 for a request's input, 500 for an output of ``infer``."""
    if len(shape) != len(spec.shape) or any(
        want not in (-1, got) for want, got in zip(spec.shape, shape, strict=True)
    ):
        kind = "input" if status == 400 else "output"
        raise ProtocolError(
            status,
            f"{kind} {spec.name!r} has shape {list(shape)}; model {model.name!r} expects "
            f"{list(spec.shape)} (-1: any size)",
        )


# -- decoding ------------------------------------------------------------------------------------


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


def from_binary(spec: TensorSpec, buffer: memoryview, shape: list[int]) -> NDArray[Any]:
    """The array of ``shape`` in ``buffer``, the tensor's bytes as the protocol lays them out
    (little-endian; BYTES elements each after a 4-byte length); 400 if they do not fit."""
    count = math.prod(shape)
    if spec.datatype == "BYTES":
        return _deserialize_bytes(spec, buffer, count).reshape(shape)
    dtype = NUMPY_DTYPES[spec.datatype]
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
    dtype = NUMPY_DTYPES[spec.datatype]
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


def decode_inputs(
    model: ModelSpec, header: dict[str, Any], binary: memoryview
) -> dict[str, NDArray[Any]]:
    """The inputs of the request whose JSON is ``header``, and whose tensor data is ``binary``.

    ``decode_inputs(model, {"inputs": [x]}, memoryview(b""))``, with ``x`` as
    ``{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 2]}``. Raises
    :class:`ProtocolError` (400) for what the model or the protocol does not accept.
    """
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
        check_shape(model, spec, shape, 400)
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
        arrays[name] = from_binary(spec, binary[offset : offset + size], shape)
        offset += size
    if missing := [name for name in specs if name not in arrays]:
        raise _bad(f"model {model.name!r} needs inputs {missing}")
    if offset != len(binary):
        raise _bad(f"the body has {len(binary) - offset} bytes after the inputs' binary data")
    return arrays


def requested_outputs(model: ModelSpec, header: dict[str, Any]) -> list[tuple[TensorSpec, bool]]:
    """Each output to return, and whether as binary data; none requested means all.

    ``requested_outputs(model, {"outputs": [{"name": "y"}]})`` is ``[(y_spec, False)]``.
    """
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


# -- encoding ------------------------------------------------------------------------------------


def encode_outputs(
    model: ModelSpec, requested: list[tuple[TensorSpec, bool]], produced: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[Any]]:
    """The response's ``outputs`` entries, and the binary data after its JSON: bytes or arrays.

    ``encode_outputs(model, requested_outputs(model, header), model.infer(inputs))``. Raises
    :class:`ProtocolError`: 500 for an output missing from ``produced`` or not fitting its spec,
    400 for a BYTES output asked for as JSON that is not UTF-8.
    """
    entries, buffers = [], []
    for spec, as_binary in requested:
        if spec.name not in produced:
            raise ProtocolError(500, f"model {model.name!r} returned no output {spec.name!r}")
        entry, data = _encode_output(
            output_array(model, spec, produced[spec.name]), spec, as_binary
        )
        entries.append(entry)
        buffers += [] if data is None else [data]
    return entries, buffers


def output_array(model: ModelSpec, spec: TensorSpec, value: Any) -> NDArray[Any]:
    """``value``, an output ``infer`` returned, as a contiguous array of its spec (BYTES as
    ``bytes``); 500 when its datatype or shape does not fit."""
    what = f"model {model.name!r} output {spec.name!r}"
    array = np.asarray(value)
    if spec.datatype == "BYTES":
        flat = array.ravel()
        if any(not isinstance(item, (bytes, str)) for item in flat):
            raise ProtocolError(500, f"{what}: BYTES must hold bytes or str")
        encoded = np.empty(flat.size, dtype=object)
        encoded[:] = [item.encode() if isinstance(item, str) else item for item in flat]
        array = encoded.reshape(array.shape)
    elif not np.can_cast(array.dtype, NUMPY_DTYPES[spec.datatype], "same_kind"):
        raise ProtocolError(500, f"{what} is {array.dtype}, which is not {spec.datatype}")
    check_shape(model, spec, array.shape, 500)
    return np.ascontiguousarray(array, dtype=NUMPY_DTYPES[spec.datatype])


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
