"""Wrappers for the synchronous tritonclient clients: HTTP and gRPC, ``infer`` and ``async_infer``.

The wrappers take the user's arguments as they are and, for a sampled call only, add the trace
headers to a copy of the caller's headers (tritonclient itself writes into the dict it is
given) and make it the current call (``CURRENT_CALL``). The transport call (HTTP ``_post``,
gRPC ``ModelInfer``) is wrapped per client to stamp when the current call's request left and
its response came back; over gRPC it also hands the call the response's bytes on the wire.
An unsampled call is not the current call: the transport hooks find none and do nothing.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from otelkit._core.guard import internal_error
from otelkit._core.worker import LATER
from otelkit.client._call import (
    CURRENT_CALL,
    GRPC_TENSORS,
    TARGET,
    Call,
    ClientTarget,
    InstrumentationSuppressed,
    Opened,
    end_quietly,
    end_unsampled,
    open_call,
)
from otelkit.client._interceptors import Suppressed, intercepted
from otelkit.client._wire import KEEP_WIRE_BYTES, counted_on_wire

__all__ = [
    "Transport",
    "attach_http_transport",
    "attach_model_infer",
    "detach_http_transport",
    "detach_model_infer",
    "stamp",
    "swap_back",
    "swap_in",
    "traced_grpc_async_infer",
    "traced_http_async_infer",
    "traced_infer",
]


_MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
_OWN = "_otelkit_own"  # + the name of a replaced transport attribute: the client's own one


def _headers_index(method: Callable[..., Any]) -> int:
    """Position of ``headers`` among the positional arguments after ``self``."""
    names = list(inspect.signature(method).parameters)
    return names.index("headers") - 1


def _begin(
    target_of: Callable[[Any], ClientTarget],
    client: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    style: str,
) -> Call | Opened | None:
    """What one request starts with: its ``Call``; for a call known not to be sampled before a
    span is asked for (``open_call``), only what ``open_call`` found (its metrics need nothing
    else: ``end_quietly``); ``None`` if instrumentation is suppressed or telemetry failed (the
    call then runs bare)."""
    try:
        opened = open_call(client.__dict__.get(TARGET) or target_of(client), args, kwargs)
        if opened[2] == 0:
            return opened
        # a gRPC call here goes through the rebuilt ModelInfer, which hands it its request
        grpc = opened[0].tensors is GRPC_TENSORS
        return Call(opened, args, kwargs, style, handed_request=grpc)
    except InstrumentationSuppressed:
        return None
    except Exception:
        internal_error(f"starting a client span for {style}")
        return None


_CLOCK = time.perf_counter_ns


def _run_quietly(
    opened: Opened,
    original: Callable[..., Any],
    client: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[Any, int]:
    """The client's own call, for a call not sampled (``opened``): what it returned, and when
    it started; a failure is ended (``end_quietly``) and re-raised, the very same object."""
    opened[0].calls.in_flight.begin()
    start = _CLOCK()
    try:
        return original(client, *args, **kwargs), start
    except BaseException as error:
        end_quietly(opened, start, None, error)
        raise


class _Traced(Protocol):
    def headers(self, caller: Mapping[str, str] | None) -> dict[str, str]: ...


def _with_headers(
    call: _Traced, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments with ``headers`` (at ``index`` or by keyword) replaced by ``call``'s."""
    if len(args) > index:
        return (*args[:index], call.headers(args[index]), *args[index + 1 :]), kwargs
    kwargs["headers"] = call.headers(kwargs.get("headers"))
    return args, kwargs


def _enter(
    call: Call, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], contextvars.Token[Call | None]]:
    """A sampled call's trace headers in the arguments; it becomes the current call, for its
    transport's stamps. Returns the arguments and the token to reset."""
    args, kwargs = _with_headers(call, index, args, kwargs)
    return args, kwargs, CURRENT_CALL.set(call)


def traced_infer(target_of: Callable[[Any], ClientTarget], original: Callable[..., Any]) -> Any:
    """``infer``: one CLIENT span from the call to its result.

    A call known not to be sampled before a span is asked for (``open_call``: the usual one
    under ``always_off`` or a trace id ratio, with no span current) takes a short path: no
    ``Call``, no span, two clock readings, and its metrics recorded by ``LATER``. This is the
    hottest path otelkit has; everything else goes through ``Call``."""
    index = _headers_index(original)
    clock, partial = time.perf_counter_ns, functools.partial
    waiting, limit = LATER.waiting, LATER.limit

    @functools.wraps(original)
    def infer(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = _begin(target_of, self, args, kwargs, "infer")
        if call is None:
            return original(self, *args, **kwargs)
        if isinstance(call, tuple):  # not sampled: metrics only
            result, start = _run_quietly(call, original, self, args, kwargs)
            # end_quietly, inline: a frame less measured 0.25 us on the caller's path here
            ended = partial(end_unsampled, call[0], start, clock(), call[1], result)
            if len(waiting) < limit:
                waiting.append(ended)
            else:
                LATER.add(ended)
            return result
        token = None
        if call.sampled:
            args, kwargs, token = _enter(call, index, args, kwargs)
        try:
            result = original(self, *args, **kwargs)
        except BaseException as error:
            call.finish(error)
            raise
        finally:
            if token is not None:
                CURRENT_CALL.reset(token)
        call.finish(None, result)
        return result

    return infer


Transport = Callable[..., Any]


def stamp(original: Any) -> Transport:
    """A transport callable (HTTP ``_post``, gRPC ``ModelInfer``) that stamps, for the sampled
    call in progress, when the request left and when the response came back.

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


def _serializer(original: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    current = CURRENT_CALL.get
    clock = time.perf_counter_ns

    def serialize(request: Any) -> bytes:
        raw = original(request)
        call = current()
        if call is not None:
            call.sent_ns = clock()
            if call.facts is None:  # the call reads its facts from its request, later
                call.request = request
        return raw

    return serialize


def _deserializer(original: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """Parse with ``original``; first, for the current call (a sampled one), stamp *received*
    and keep the bytes on the wire, or count their tensors now when they are many (``_wire``).
    A call not sampled, or a future's (parsed on gRPC's thread), is counted from its result."""
    current = CURRENT_CALL.get
    clock = time.perf_counter_ns
    keep = KEEP_WIRE_BYTES

    def deserialize(raw: bytes) -> Any:
        call = current()
        if call is not None:
            call.received_ns = clock()
            if len(raw) <= keep:
                call.wire = raw  # counted when the call's telemetry ends, off the caller's path
            else:
                call.counted = counted_on_wire(raw)  # None: the result's shapes will tell
        return original(raw)

    return deserialize


def attach_model_infer(client: Any) -> None:
    """Rebuild a gRPC client's ``ModelInfer`` (sync or asyncio) on its channel, with a
    serialiser that stamps *sent* for the sampled call in progress once its request is bytes
    (and hands it the request message, when it reads its facts from it: ``Call``),
    and a deserialiser that stamps *received* before parsing and hands it the bytes on the
    wire (``_wire``). Serialising and parsing are the stub's own functions.

    The sync serialiser runs in the caller's thread, the asyncio ones in the call's task
    (which copied the caller's context), so ``CURRENT_CALL`` is the call they serve; a future's
    response is parsed on gRPC's thread, and ``async_infer``'s callback stamps it instead.
    On a channel with interceptors, its calls run with OpenTelemetry's instrumentation
    suppressed (``_interceptors``).
    """
    stub = client._client_stub
    serialize, parse = _model_infer_codec(stub.ModelInfer)
    rebuilt = client._channel.unary_unary(
        _MODEL_INFER, _serializer(serialize), _deserializer(parse), _registered_method=True
    )
    if intercepted(client._channel):
        rebuilt = Suppressed(rebuilt)
    swap_in(client, stub, "ModelInfer", rebuilt)


def _model_infer_codec(own: Any) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    """The stub's own functions that serialise ``ModelInfer``'s request and parse its response:
    the multicallable's, or, when an interceptor hides them, the ones tritonclient's stub was
    built with."""
    serialize = getattr(own, "_request_serializer", None)
    parse = getattr(own, "_response_deserializer", None)
    if serialize is None or parse is None:
        from tritonclient.grpc import service_pb2

        request, response = service_pb2.ModelInferRequest, service_pb2.ModelInferResponse
        return request.SerializeToString, response.FromString
    return serialize, parse


def detach_model_infer(client: Any) -> None:
    """Give a gRPC client its stub's own ``ModelInfer`` back."""
    swap_back(client, client._client_stub, "ModelInfer")


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


def attach_http_transport(client: Any, stamped: Callable[[Any], Transport] = stamp) -> None:
    swap_in(client, client, "_post", stamped(client._post))


def detach_http_transport(client: Any) -> None:
    swap_back(client, client, "_post")


def traced_grpc_async_infer(
    target_of: Callable[[Any], ClientTarget], original: Callable[..., Any]
) -> Any:
    """gRPC ``async_infer``: the span ends when the callback gets the result or the error; a
    call known not to be sampled takes ``traced_infer``'s short path, ended in its callback."""
    index = _headers_index(original)
    clock = time.perf_counter_ns

    @functools.wraps(original)
    def async_infer(
        self: Any, model_name: str, inputs: Any, callback: Any, *args: Any, **kwargs: Any
    ) -> Any:
        begun = _begin(target_of, self, (model_name, inputs, *args), kwargs, "async_infer")
        if begun is None:
            return original(self, model_name, inputs, callback, *args, **kwargs)
        if isinstance(begun, tuple):  # not sampled: metrics only
            opened = begun
            opened[0].calls.in_flight.begin()
            start = clock()

            def ended(result: Any, error: Any) -> None:
                end_quietly(opened, start, result, error)
                callback(result=result, error=error)

            try:
                return original(self, model_name, inputs, ended, *args, **kwargs)
            except BaseException as error:
                end_quietly(opened, start, None, error)
                raise
        call = begun

        def done(result: Any, error: Any) -> None:
            call.received()
            call.finish(error, result)
            callback(result=result, error=error)

        token = None
        if call.sampled:
            args, kwargs, token = _enter(call, index - 3, args, kwargs)
        try:
            return original(self, model_name, inputs, done, *args, **kwargs)
        except BaseException as error:
            call.finish(error)
            raise
        finally:
            if token is not None:
                CURRENT_CALL.reset(token)

    return async_infer


End = Callable[[Any, "BaseException | None"], None]  # a call's end: its result, or its error


class TracedAsyncRequest:
    """HTTP ``async_infer``'s handle: the call ends (``end``) when ``get_result`` returns or
    raises."""

    def __init__(self, inner: Any, end: End) -> None:
        self._inner = inner
        self._end: End | None = end

    def get_result(self, block: bool = True, timeout: float | None = None) -> Any:
        end, self._end = self._end, None
        try:
            result = self._inner.get_result(block=block, timeout=timeout)
        except BaseException as error:
            if end is not None:
                end(None, error)
            raise
        if end is not None:
            end(result, None)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def traced_http_async_infer(
    target_of: Callable[[Any], ClientTarget], original: Callable[..., Any]
) -> Any:
    """HTTP ``async_infer``: the span ends at the handle's ``get_result``; a call known not to
    be sampled takes ``traced_infer``'s short path, ended there too."""
    index = _headers_index(original)

    @functools.wraps(original)
    def async_infer(self: Any, *args: Any, **kwargs: Any) -> Any:
        begun = _begin(target_of, self, args, kwargs, "async_infer")
        if begun is None:
            return original(self, *args, **kwargs)
        if isinstance(begun, tuple):  # not sampled: metrics only
            handle, start = _run_quietly(begun, original, self, args, kwargs)
            return TracedAsyncRequest(handle, functools.partial(end_quietly, begun, start))
        call = begun
        if call.sampled:
            args, kwargs = _with_headers(call, index, args, kwargs)
        try:
            handle = original(self, *args, **kwargs)
        except BaseException as error:
            call.finish(error)
            raise
        return TracedAsyncRequest(handle, lambda result, error: call.finish(error, result))

    return async_infer
