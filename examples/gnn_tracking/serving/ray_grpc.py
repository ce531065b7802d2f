"""The KServe v2 gRPC service on Ray Serve's gRPC proxy, so that ``tritonclient.grpc`` calls
reach Ray Serve as they reach Triton.

Serve's proxy serves the service's methods when the proxy is started with
``grpc_options(port)``, and calls the ingress deployment's method of the same name (here from
``KServeGrpcMethods``) with the request message. One snag, worked around here: tritonclient's
generated messages name their module ``grpc_service_pb2`` (the ``.proto`` file's name), not
``tritonclient.grpc.service_pb2``, so pickling one between the proxy and a replica fails
(``Can't pickle <class 'grpc_service_pb2.ModelInferRequest'>: import of module
'grpc_service_pb2' failed``) unless that name is importable: importing this module makes it
so, in the proxy (which imports ``add_servicer``) and in the replica (whose class it defines).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import grpc
from ray.serve.config import gRPCOptions
from tritonclient.grpc import service_pb2, service_pb2_grpc

__all__ = ["SERVICER_FUNCTION", "KServeGrpcMethods", "add_servicer", "grpc_options"]

sys.modules.setdefault("grpc_service_pb2", service_pb2)

SERVICER_FUNCTION = f"{__name__}.add_servicer"


def add_servicer(servicer: Any, server: grpc.Server) -> None:
    """What Serve's proxy calls to learn the service's methods (``grpc_servicer_functions``)."""
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)


def grpc_options(port: int) -> gRPCOptions:
    """Serve's gRPC proxy on ``port``, serving ``inference.GRPCInferenceService``."""
    return gRPCOptions(port=port, grpc_servicer_functions=[SERVICER_FUNCTION])


class _Aborted(Exception):
    """Raised by ``_Context.abort``: Serve answers with the code set on its context."""


class _Context:
    """Serve's gRPC context as the ``grpc.ServicerContext`` that ``KServeServicer`` aborts on."""

    def __init__(self, serve_context: Any) -> None:
        self._serve_context = serve_context

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        self._serve_context.set_code(code)
        self._serve_context.set_details(details)
        raise _Aborted(details)


class KServeGrpcMethods:
    """The service's unary methods for an ingress deployment, answered by its
    ``grpc_servicer`` (a ``KServeServicer``) on a worker thread, where handle calls may block;
    the thread runs in a copy of the request's context, so spans nest as they do over HTTP."""

    grpc_servicer: Any

    async def _answer(self, method: str, request: Any, grpc_context: Any) -> Any:
        answer: Callable[[Any, Any], Any] = getattr(self.grpc_servicer, method)
        return await asyncio.to_thread(answer, request, _Context(grpc_context))

    async def ServerLive(self, request: Any, grpc_context: Any) -> Any:
        return await self._answer("ServerLive", request, grpc_context)

    async def ServerReady(self, request: Any, grpc_context: Any) -> Any:
        return await self._answer("ServerReady", request, grpc_context)

    async def ServerMetadata(self, request: Any, grpc_context: Any) -> Any:
        return await self._answer("ServerMetadata", request, grpc_context)

    async def ModelReady(self, request: Any, grpc_context: Any) -> Any:
        return await self._answer("ModelReady", request, grpc_context)

    async def ModelMetadata(self, request: Any, grpc_context: Any) -> Any:
        return await self._answer("ModelMetadata", request, grpc_context)

    async def ModelConfig(self, request: Any, grpc_context: Any) -> Any:
        return await self._answer("ModelConfig", request, grpc_context)

    async def ModelInfer(self, request: Any, grpc_context: Any) -> Any:
        return await self._answer("ModelInfer", request, grpc_context)
