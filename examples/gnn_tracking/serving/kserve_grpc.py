"""The KServe v2 gRPC inference service (``inference.GRPCInferenceService``) for Python models.

The same ``tritonclient.grpc.InferenceServerClient`` code calls a real Triton or this server;
CMSSW's SONIC clients speak only this protocol. The models are the ``ModelSpec`` objects the
HTTP server (``kserve``) serves::

    servicer = KServeServicer([double], name="doubler")
    server = grpc_server(servicer, 8001)  # started; server.stop(5) to end it

Served: server and model liveness, readiness and metadata, model configuration (what
tritonclient asks before it infers), ``ModelInfer`` with tensors in ``raw_input_contents`` or
in typed ``contents`` (FP16 only raw, as in Triton), outputs always raw, and
``ModelStreamInfer`` (each response after its request; a failed request is an
``error_message``, the stream goes on). Not served: shared memory, statistics, repository and
trace control (grpcio answers ``UNIMPLEMENTED``). Errors are gRPC status codes, as Triton's:
``INVALID_ARGUMENT`` for a bad request, ``NOT_FOUND`` for an unknown model, ``INTERNAL`` for a
model that failed; the server keeps serving.

``KServeServicer.infer`` maps one ``ModelInferRequest`` to its ``ModelInferResponse`` with no
gRPC context, for servers that route the messages themselves (Ray Serve's gRPC proxy).
The SERVER span is the interceptor's business (``otelkit.server.grpc``); with ``stages=True``
decoding the request's tensors and encoding the answer are stages too (``decode``, ``encode``),
as a server marks its own work, so that the breakdown does not leave them in ``server other``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import grpc
import numpy as np
from numpy.typing import NDArray
from tritonclient.grpc import model_config_pb2 as config_pb2
from tritonclient.grpc import service_pb2 as pb2
from tritonclient.grpc import service_pb2_grpc as pb2_grpc

import otelkit
from gnn_tracking.serving.kserve import ModelRegistry, run_model
from gnn_tracking.serving.kserve_tensors import (
    NUMPY_DTYPES,
    ModelSpec,
    ProtocolError,
    TensorSpec,
    check_shape,
    from_binary,
    output_array,
)

__all__ = ["DECODE", "ENCODE", "KServeServicer", "grpc_server"]

DECODE, ENCODE = "decode", "encode"  # the stages around the model: its tensors in and out

_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND}
# The typed field of ``InferTensorContents`` each datatype travels in (FP16 has none).
_CONTENTS = {"BOOL": "bool_contents", "INT64": "int64_contents", "UINT64": "uint64_contents"}
_CONTENTS |= {f"INT{bits}": "int_contents" for bits in (8, 16, 32)}
_CONTENTS |= {f"UINT{bits}": "uint_contents" for bits in (8, 16, 32)}
_CONTENTS |= {"FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}
_LENGTH = struct.Struct("<I")
_UNLIMITED = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
Reply = TypeVar("Reply")


@contextmanager
def _no_stage(name: str, **options: Any) -> Iterator[None]:
    yield


def _bad(message: str) -> ProtocolError:
    return ProtocolError(400, message)


def _answer(context: grpc.ServicerContext, answer: Callable[[], Reply]) -> Reply:
    try:
        return answer()
    except ProtocolError as error:
        _abort(context, error)


def _abort(context: grpc.ServicerContext, error: ProtocolError) -> NoReturn:
    context.abort(_CODES.get(error.status, grpc.StatusCode.INTERNAL), error.message)
    raise AssertionError("grpc's abort raises")  # for the type checker


def _from_contents(spec: TensorSpec, contents: Any, shape: list[int]) -> NDArray[Any]:
    field = _CONTENTS.get(spec.datatype)
    if field is None:
        raise _bad(f"input {spec.name!r}: {spec.datatype} travels in raw_input_contents only")
    values = getattr(contents, field)
    if len(values) != math.prod(shape):
        raise _bad(f"input {spec.name!r} has {len(values)} values; its shape {shape} needs more")
    dtype = NUMPY_DTYPES[spec.datatype]
    if spec.datatype == "BYTES":
        array = np.empty(len(values), dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    if values and dtype.kind in "iu":  # int_contents carry INT8 and INT16 in 32 bits
        info = np.iinfo(dtype)
        if min(values) < info.min or max(values) > info.max:
            raise _bad(f"input {spec.name!r}: a value is outside {spec.datatype}")
    return np.array(list(values), dtype=dtype).reshape(shape)


def decode_request(model: ModelSpec, request: pb2.ModelInferRequest) -> dict[str, NDArray[Any]]:
    """The input arrays of ``request``; ``ProtocolError`` (400) for what the model refuses."""
    specs = {spec.name: spec for spec in model.inputs}
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise _bad(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs")
    arrays: dict[str, NDArray[Any]] = {}
    for index, tensor in enumerate(request.inputs):
        spec, what = specs.get(tensor.name), f"input {tensor.name!r}"
        if spec is None or tensor.name in arrays:
            raise _bad(f"{what} is unknown or repeated; model {model.name!r} takes {list(specs)}")
        if tensor.datatype != spec.datatype:
            raise _bad(f"{what} is {tensor.datatype}; model {model.name!r} expects {spec.datatype}")
        shape = list(tensor.shape)
        check_shape(model, spec, shape, 400)
        if "shared_memory_region" in tensor.parameters:
            raise _bad(f"{what}: shared memory is not supported by this server")
        if raw:  # copied once, so that the model gets writable arrays, as over HTTP
            arrays[tensor.name] = from_binary(spec, memoryview(bytearray(raw[index])), shape)
        else:
            arrays[tensor.name] = _from_contents(spec, tensor.contents, shape)
    if missing := [name for name in specs if name not in arrays]:
        raise _bad(f"model {model.name!r} needs inputs {missing}")
    return arrays


def _requested(model: ModelSpec, request: pb2.ModelInferRequest) -> list[TensorSpec]:
    specs = {spec.name: spec for spec in model.outputs}
    names = [output.name for output in request.outputs]
    if len(set(names)) != len(names) or any(name not in specs for name in names):
        raise _bad(
            f"outputs {names} are unknown or repeated; model {model.name!r} gives {list(specs)}"
        )
    for output in request.outputs:
        if "shared_memory_region" in output.parameters or "classification" in output.parameters:
            raise _bad(
                f"output {output.name!r}: shared memory and classification are not supported"
            )
    return [specs[name] for name in names] if names else list(model.outputs)


def _raw(array: NDArray[Any], spec: TensorSpec) -> bytes:
    if spec.datatype == "BYTES":
        return b"".join(_LENGTH.pack(len(item)) + item for item in array.flat)
    return array.tobytes()


def _tensors(specs: Sequence[TensorSpec]) -> list[pb2.ModelMetadataResponse.TensorMetadata]:
    return [
        pb2.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype, shape=t.shape)
        for t in specs
    ]


def _data_type(datatype: str) -> int:
    return int(
        config_pb2.DataType.Value("TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}")
    )


class KServeServicer(pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """The KServe v2 gRPC service over ``models``; add it with ``grpc_server`` or with
    ``add_GRPCInferenceServiceServicer_to_server``. Raises ValueError for an invalid spec.
    ``stages``: decode and encode each request's tensors in ``otelkit.stage`` spans."""

    def __init__(
        self,
        models: Sequence[ModelSpec],
        *,
        name: str = "kserve-python",
        version: str = "1",
        stages: bool = False,
    ) -> None:
        self.models = ModelRegistry(models)
        self.name, self.version = name, version
        self._stage = otelkit.stage if stages else _no_stage

    def ServerLive(self, request: Any, context: grpc.ServicerContext) -> pb2.ServerLiveResponse:
        return pb2.ServerLiveResponse(live=True)

    def ServerReady(self, request: Any, context: grpc.ServicerContext) -> pb2.ServerReadyResponse:
        return pb2.ServerReadyResponse(ready=True)

    def ServerMetadata(
        self, request: Any, context: grpc.ServicerContext
    ) -> pb2.ServerMetadataResponse:
        return pb2.ServerMetadataResponse(name=self.name, version=self.version, extensions=[])

    def ModelReady(
        self, request: pb2.ModelReadyRequest, context: grpc.ServicerContext
    ) -> pb2.ModelReadyResponse:
        try:  # an unknown model is not ready, as Triton answers it
            self.models.lookup(request.name, request.version)
        except ProtocolError:
            return pb2.ModelReadyResponse(ready=False)
        return pb2.ModelReadyResponse(ready=True)

    def ModelMetadata(
        self, request: pb2.ModelMetadataRequest, context: grpc.ServicerContext
    ) -> pb2.ModelMetadataResponse:
        def metadata() -> pb2.ModelMetadataResponse:
            model = self.models.lookup(request.name, request.version)
            return pb2.ModelMetadataResponse(
                name=model.name,
                versions=self.models.versions(model.name),
                platform=model.platform,
                inputs=_tensors(model.inputs),
                outputs=_tensors(model.outputs),
            )

        return _answer(context, metadata)

    def ModelConfig(
        self, request: pb2.ModelConfigRequest, context: grpc.ServicerContext
    ) -> pb2.ModelConfigResponse:
        def configuration() -> pb2.ModelConfigResponse:
            model = self.models.lookup(request.name, request.version)
            tensors = [
                [kind(name=t.name, data_type=_data_type(t.datatype), dims=t.shape) for t in specs]
                for kind, specs in (
                    (config_pb2.ModelInput, model.inputs),
                    (config_pb2.ModelOutput, model.outputs),
                )
            ]
            config = config_pb2.ModelConfig(
                name=model.name, backend=model.platform, input=tensors[0], output=tensors[1]
            )
            return pb2.ModelConfigResponse(config=config)

        return _answer(context, configuration)

    def ModelInfer(
        self, request: pb2.ModelInferRequest, context: grpc.ServicerContext
    ) -> pb2.ModelInferResponse:
        return _answer(context, lambda: self.infer(request))

    def ModelStreamInfer(
        self, requests: Iterator[pb2.ModelInferRequest], context: grpc.ServicerContext
    ) -> Iterator[pb2.ModelStreamInferResponse]:
        for request in requests:
            try:
                yield pb2.ModelStreamInferResponse(infer_response=self.infer(request))
            except ProtocolError as error:
                yield pb2.ModelStreamInferResponse(error_message=error.message)

    def infer(self, request: pb2.ModelInferRequest) -> pb2.ModelInferResponse:
        """One inference, without gRPC: ``ProtocolError`` for a bad request or a failed model."""
        model = self.models.lookup(request.model_name, request.model_version)
        requested = _requested(model, request)
        with self._stage(DECODE, gpu=False):
            inputs = decode_request(model, request)
        produced = run_model(model, inputs)
        with self._stage(ENCODE, gpu=False):
            response = pb2.ModelInferResponse(
                model_name=model.name, model_version=model.version, id=request.id
            )
            for spec in requested:
                if spec.name not in produced:
                    why = f"model {model.name!r} returned no output {spec.name!r}"
                    raise ProtocolError(500, why)
                array = output_array(model, spec, produced[spec.name])
                response.outputs.add(name=spec.name, datatype=spec.datatype, shape=array.shape)
                response.raw_output_contents.append(_raw(array, spec))
        return response


def grpc_server(
    servicer: KServeServicer,
    port: int,
    *,
    host: str = "127.0.0.1",
    interceptors: Sequence[grpc.ServerInterceptor] = (),
    workers: int = 8,
) -> grpc.Server:
    """``servicer`` served on ``host:port``, started; ``server.stop(grace)`` ends it.

    Messages of any size are accepted, as tritonclient sends them (grpcio's limit is 4 MB).
    """
    server = grpc.server(
        ThreadPoolExecutor(workers, thread_name_prefix="kserve-grpc"),
        interceptors=list(interceptors),
        options=_UNLIMITED,
    )
    pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"{host}:{port}")
    server.start()
    return server
