"""The transport hooks: where a sampled call records when its request left and its response
came back.

Each instrumented client's transport is replaced per client: HTTP's ``_post`` (sync or
asyncio) by a function that stamps around it (``stamp``, ``stamp_async``); gRPC's
``ModelInfer`` by one rebuilt on the client's channel with a serialiser and a deserialiser that
record the call's request message and its response's bytes (``attach_model_infer``). Every
hook finds the call it serves as the current call (``CURRENT_CALL``), which only a sampled one
is: for a call not sampled they find none and do nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from otelkit._core.deps import grpcio
from otelkit._core.deps import tritonclient as triton_private
from otelkit.client._call import CURRENT_CALL
from otelkit.client._interceptors import Suppressed, intercepted

__all__ = [
    "Transport",
    "attach_http_transport",
    "attach_model_infer",
    "detach_http_transport",
    "detach_model_infer",
    "stamp",
    "stamp_async",
    "swap_back",
    "swap_in",
]

Transport = Callable[..., Any]
_MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
_OWN = "_otelkit_own"  # + the name of a replaced transport attribute: the client's own one


def stamp(original: Any) -> Transport:
    """A transport callable (HTTP ``_post``) that stamps, for the sampled call in progress,
    when the request left and when the response came back.

    A plain function, not an object with ``__call__``: every call goes through it, sampled or
    not. (gRPC clients stamp in their (de)serialiser instead: ``attach_model_infer``.)
    """
    current = CURRENT_CALL.get

    def stamped(*args: Any, **kwargs: Any) -> Any:
        call = current()
        if call is None:
            return original(*args, **kwargs)
        call.sent()
        result = original(*args, **kwargs)
        call.received()
        return result

    return stamped


def stamp_async(original: Any) -> Transport:
    """``stamp`` for an awaited transport call, stamping the call of this task."""
    current = CURRENT_CALL.get

    async def stamped(*args: Any, **kwargs: Any) -> Any:
        call = current()
        if call is None:
            return await original(*args, **kwargs)
        call.sent()
        result = await original(*args, **kwargs)
        call.received()
        return result

    return stamped


def _serializer(original: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    current = CURRENT_CALL.get

    def serialize(request: Any) -> bytes:
        raw = original(request)
        call = current()
        if call is not None:
            call.sent(request)
        return raw

    return serialize


def _deserializer(original: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """Parse with ``original``; first, for the current call (a sampled one), record that the
    response came back, with its bytes on the wire. A call not sampled, or a future's (parsed
    on gRPC's thread), is counted from its result."""
    current = CURRENT_CALL.get

    def deserialize(raw: bytes) -> Any:
        call = current()
        if call is not None:
            call.received(raw)
        return original(raw)

    return deserialize


def attach_model_infer(client: Any) -> bool:
    """Rebuild a gRPC client's ``ModelInfer`` (sync or asyncio) on its channel, with a
    serialiser that tells the sampled call in progress its request left once it is bytes (and
    hands it the request message), and a deserialiser that tells it its response came back
    before parsing it (and hands it the bytes on the wire). Serialising and parsing are the
    stub's own functions.

    The sync serialiser runs in the caller's thread, the asyncio ones in the call's task
    (which copied the caller's context), so ``CURRENT_CALL`` is the call they serve; a future's
    response is parsed on gRPC's thread, and ``async_infer``'s callback stamps it instead.
    On a channel with interceptors, its calls run with OpenTelemetry's instrumentation
    suppressed (``_interceptors``). ``False`` (nothing changed) where this tritonclient has
    no stub or channel where otelkit looks (``deps.tritonclient``).
    """
    stub, channel = triton_private.stub(client), triton_private.channel(client)
    if stub is None or channel is None:
        return False
    serialize, parse = _model_infer_codec(stub.ModelInfer)
    rebuilt = grpcio.unary_unary(
        channel, _MODEL_INFER, _serializer(serialize), _deserializer(parse)
    )
    if intercepted(channel):
        rebuilt = Suppressed(rebuilt)
    swap_in(client, stub, "ModelInfer", rebuilt)
    return True


def _model_infer_codec(own: Any) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    """The stub's own functions that serialise ``ModelInfer``'s request and parse its response:
    the multicallable's, or, when an interceptor hides them, the ones tritonclient's stub was
    built with."""
    codec = grpcio.multicallable_codec(own)
    if codec is None:
        from tritonclient.grpc import service_pb2

        request, response = service_pb2.ModelInferRequest, service_pb2.ModelInferResponse
        return request.SerializeToString, response.FromString
    return codec


def detach_model_infer(client: Any) -> None:
    """Give a gRPC client its stub's own ``ModelInfer`` back."""
    stub = triton_private.stub(client)
    if stub is not None:
        swap_back(client, stub, "ModelInfer")


def timed_connect(original: Any) -> Transport:
    """A connection pool's ``_create_socket`` that tells the sampled call in progress how long
    resolving the server's name and connecting to it took (``Call.connected``)."""
    current = CURRENT_CALL.get

    def connect(*args: Any, **kwargs: Any) -> Any:
        call = current()
        if call is None:
            return original(*args, **kwargs)
        start = time.perf_counter_ns()
        try:
            return original(*args, **kwargs)
        finally:
            call.connected(time.perf_counter_ns() - start)

    return connect


def attach_http_transport(client: Any, stamped: Callable[[Any], Transport] = stamp) -> bool:
    """Stamp an HTTP client's ``_post`` (``stamped``: how; ``stamp_async`` for asyncio), and
    time the new connections of a sync client's pool; ``False`` (nothing changed) where this
    tritonclient has no ``_post``."""
    post = triton_private.http_post(client)
    if post is None:
        return False
    swap_in(client, client, "_post", stamped(post))
    if stamped is stamp:
        pool = triton_private.connection_pool(client)
        if pool is not None:
            swap_in(client, pool, "_create_socket", timed_connect(pool._create_socket))
    return True


def detach_http_transport(client: Any) -> None:
    swap_back(client, client, "_post")
    if _OWN + "_create_socket" in client.__dict__:  # attach found the pool: it is there
        swap_back(client, triton_private.connection_pool(client), "_create_socket")


def swap_in(client: Any, holder: Any, name: str, replacement: Any) -> None:
    """Set ``holder.name`` (``holder``: the client or its stub) to ``replacement``, keeping the
    one it replaces in the client for ``swap_back``."""
    client.__dict__[_OWN + name] = getattr(holder, name)
    setattr(holder, name, replacement)


def swap_back(client: Any, holder: Any, name: str) -> None:
    """Undo ``swap_in``; nothing when it was not done."""
    own = client.__dict__.pop(_OWN + name, None)
    if own is not None:
        setattr(holder, name, own)
