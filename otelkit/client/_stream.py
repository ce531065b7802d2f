"""gRPC streaming: a CLIENT span for the stream, and one CLIENT span per streamed request.

Triton (2.51) reads the trace context of a stream once, from the stream's initial metadata,
and makes every request of the stream a child of it; a per-request context cannot reach the
server. So otelkit opens a span for the stream itself and sends its context when the stream
starts: Triton's ``InferRequest`` spans hang under it. Each request gets its own CLIENT span
from the call that queues it to its response: a child of the caller's current span, linked to
the stream span, or a child of the stream span when the caller has no span. Responses are
matched to requests by request id, oldest first among equal ids (Triton answers a stream's
requests in order per model instance; give request ids when several instances serve it).

Sync clients: ``start_stream`` / ``async_stream_infer`` / ``stop_stream``. Asyncio clients:
``stream_infer`` over an async iterator of request dicts.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind

from otelkit import semconv
from otelkit._core.context import is_suppressed
from otelkit._core.deps import tritonclient as triton_private
from otelkit._core.guard import internal_error
from otelkit._core.spans import error_type, with_span
from otelkit.client._begin import TargetOf, headers_index, with_headers
from otelkit.client._call import RECORDER, Call, with_trace_context
from otelkit.client._interceptors import Suppressed, intercepted
from otelkit.client._target import ClientTarget
from otelkit.client._transport import swap_back, swap_in

__all__ = [
    "StreamCalls",
    "attach_stream_transport",
    "detach_stream_transport",
    "traced_aio_stream_infer",
    "traced_async_stream_infer",
    "traced_start_stream",
    "traced_stop_stream",
]

_STREAM = "_otelkit_stream"
_OPENING = "_otelkit_opening_stream"
_FINAL = "triton_final_response"


class StreamClosedError(Exception):
    """Recorded on a streamed request whose response never came before the stream closed."""


class StreamCalls:
    """One stream: its span, and the calls of its requests that wait for a response."""

    def __init__(self, target: ClientTarget, style: str) -> None:
        self.style = style
        self.send_context = target.send_context  # the stream's own, as it opens
        self.target = target.with_method(semconv.RPC_METHOD_GRPC_STREAM_INFER)
        self.span = span = RECORDER.start(semconv.RPC_METHOD_GRPC_STREAM_INFER, SpanKind.CLIENT)
        self.sampled = span.sampled
        if span.sampled:
            stream_target = self.target
            span.attributes.update(
                {
                    semconv.RPC_SYSTEM_NAME: stream_target.system,
                    semconv.RPC_METHOD: stream_target.method,
                    semconv.SERVER_ADDRESS: stream_target.server_address,
                    semconv.PROTOCOL: stream_target.protocol,
                    semconv.CALL_STYLE: style,
                }
            )
            if stream_target.server_port is not None:
                span.attributes[semconv.SERVER_PORT] = stream_target.server_port
        self._links = (Link(span.context),) if span.sampled else ()
        self._context = with_span(span.context)
        self._pending: dict[str, deque[Call]] = {}
        self._lock = threading.Lock()
        self._answering: tuple[str, bool] | None = None
        self.requests = self.responses = 0

    def note(self, raw: Any) -> None:
        """The raw gRPC response that tritonclient turns into the next callback's arguments.

        An error response reaches the callback as an exception without the request id; the
        raw response still has it. tritonclient hands each response to the callback before it
        reads the next one, so the last noted response is the one being answered.
        """
        try:
            response = raw.infer_response
            final = response.parameters.get(_FINAL)
            self._answering = (response.id, final is None or final.bool_param)
        except Exception:
            self._answering = None

    def headers(self, caller: Mapping[str, str] | None) -> dict[str, str]:
        """The headers that open the stream: the caller's plus the stream span's context (a
        copy of the caller's alone when the client sends none)."""
        if not self.send_context:
            return dict(caller) if caller else {}
        return with_trace_context(caller, self.span.context)

    def begin(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call | None:
        """Start the call of one streamed request (``async_stream_infer``'s arguments), even
        where the caller suppressed instrumentation: a traced stream's server traces all its
        requests, and each must wait for its response so that responses find their
        requests."""
        try:
            request_id = (args[4] if len(args) > 4 else kwargs.get("request_id")) or ""
            own_parent = trace.get_current_span().get_span_context().is_valid
            call = Call(
                self.target,
                args,
                kwargs,
                self.style,
                context=None if own_parent else self._context,
                links=self._links if own_parent else (),
            )
            with self._lock:
                self._pending.setdefault(request_id, deque()).append(call)
                self.requests += 1
            return call
        except Exception:
            internal_error("starting a streamed request's span")
            return None

    def failed_to_queue(self, call: Call, error: BaseException) -> None:
        with self._lock:
            for waiting in self._pending.values():
                if call in waiting:
                    waiting.remove(call)
                    break
        call.finish(error)

    def response(self, result: Any, error: BaseException | None) -> None:
        """One response off the stream: end the call it answers (unless more are to come)."""
        try:
            answering, self._answering = self._answering, None
            request_id, final = answering if answering is not None else (None, True)
            if not final:
                return  # a decoupled model's partial response: the request goes on
            call = self._take(request_id)
            if call is not None:
                call.received()
                call.finish(error, result)
            elif error is not None and self.sampled:
                self.span.record_error(error)
        except Exception:
            internal_error("ending a streamed request's span")

    def _take(self, request_id: str | None) -> Call | None:
        with self._lock:
            self.responses += 1
            waiting = self._pending.get(request_id) if request_id is not None else None
            if not waiting:  # a response that names no waiting request: the oldest one
                waiting = min(
                    (queue for queue in self._pending.values() if queue),
                    key=lambda queue: queue[0].start,
                    default=None,
                )
            return waiting.popleft() if waiting else None

    def close(self, error: BaseException | None = None) -> None:
        """The stream ended: requests still waiting fail, and the stream span ends."""
        try:
            with self._lock:
                left = [call for queue in self._pending.values() for call in queue]
                self._pending.clear()
            for call in left:
                call.finish(error or StreamClosedError("the stream closed before the response"))
            if self.sampled:
                attributes = self.span.attributes
                attributes[semconv.STREAM_REQUESTS] = self.requests
                attributes[semconv.STREAM_RESPONSES] = self.responses
                if error is not None:
                    self.span.record_error(error)
                    attributes[semconv.ERROR_TYPE] = error_type(error)
            self.span.end()
        except Exception:
            internal_error("ending a stream span")


class _Watched:
    """The stream's gRPC response iterator (sync or asyncio): each raw response is noted."""

    def __init__(self, inner: Any, stream: StreamCalls) -> None:
        self._inner = inner
        self._stream = stream
        self._async: Any = None

    def __iter__(self) -> _Watched:
        return self

    def __next__(self) -> Any:
        raw = next(self._inner)
        self._stream.note(raw)
        return raw

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        if self._async is None:
            self._async = self._inner.__aiter__()
        raw = await self._async.__anext__()
        self._stream.note(raw)
        return raw

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def attach_stream_transport(client: Any) -> bool:
    """Watch ``ModelStreamInfer``'s responses for the stream that is being opened; ``False``
    (nothing changed) where this tritonclient has no stub or channel where otelkit looks."""
    stub, channel = triton_private.stub(client), triton_private.channel(client)
    if stub is None or channel is None:
        return False
    original = stub.ModelStreamInfer
    if intercepted(channel):
        original = Suppressed(original)

    def model_stream_infer(*args: Any, **kwargs: Any) -> Any:
        responses = original(*args, **kwargs)
        stream: StreamCalls | None = client.__dict__.get(_OPENING)
        return _Watched(responses, stream) if stream is not None else responses

    swap_in(client, stub, "ModelStreamInfer", model_stream_infer)
    return True


def detach_stream_transport(client: Any) -> None:
    stub = triton_private.stub(client)
    if stub is not None:
        swap_back(client, stub, "ModelStreamInfer")


def _opening(client: Any, stream: StreamCalls, start: Callable[[], Any]) -> Any:
    """Run ``start`` (the client's own stream start) with ``stream`` as the one it opens."""
    client.__dict__[_OPENING] = stream
    try:
        return start()
    except BaseException as error:
        stream.close(error)
        raise
    finally:
        client.__dict__.pop(_OPENING, None)


def _open(target_of: TargetOf, client: Any, style: str) -> StreamCalls | None:
    """The stream's calls; ``None`` (the stream runs bare) when the caller suppressed
    instrumentation or telemetry failed."""
    try:
        return None if is_suppressed() else StreamCalls(target_of(client), style)
    except Exception:
        internal_error("starting a stream span")
        return None


def _stream_opener(
    style: str,
    adapt: Callable[[StreamCalls, Any], Any],
    started: Callable[[Any, StreamCalls, Any], Any],
) -> Callable[[TargetOf, Callable[..., Any]], Any]:
    """A wrapper for a method that opens a stream: ``start_stream`` or asyncio ``stream_infer``.

    The stream span opens first and its context goes in the stream's headers; ``adapt`` turns
    the method's first argument (the callback, or the request iterator) into the traced one;
    ``started`` gets the client, the stream and what the method returned.
    """

    def traced(target_of: TargetOf, original: Callable[..., Any]) -> Any:
        index = headers_index(original) - 1  # after the first argument
        first_name = list(inspect.signature(original).parameters)[1]  # after self

        @functools.wraps(original)
        def open_stream(self: Any, *args: Any, **kwargs: Any) -> Any:
            stream = _open(target_of, self, style)
            if stream is None:
                return original(self, *args, **kwargs)
            # the callback (or request iterator) comes by position or by its name
            by_name = not args and first_name in kwargs
            kwargs = dict(kwargs)
            first = kwargs.pop(first_name) if by_name else args[0]
            rest = args if by_name else args[1:]
            if stream.sampled:
                rest, kwargs = with_headers(stream, index, rest, kwargs)
            traced_first = adapt(stream, first)
            if by_name:
                kwargs[first_name] = traced_first
                call = lambda: original(self, *rest, **kwargs)  # noqa: E731
            else:
                call = lambda: original(self, traced_first, *rest, **kwargs)  # noqa: E731
            return started(self, stream, _opening(self, stream, call))

        return open_stream

    return traced


def _traced_callback(stream: StreamCalls, callback: Any) -> Callable[[Any, Any], None]:
    def traced_callback(result: Any, error: Any) -> None:
        stream.response(result, error)
        callback(result=result, error=error)

    return traced_callback


def _stream_started(client: Any, stream: StreamCalls, returned: Any) -> Any:
    client.__dict__[_STREAM] = stream
    return returned


traced_start_stream = _stream_opener("stream", _traced_callback, _stream_started)
"""``start_stream``: open the stream span; the callback ends the requests' spans."""


def traced_async_stream_infer(target_of: TargetOf, original: Callable[..., Any]) -> Any:
    """``async_stream_infer``: one span per request, ended by the stream's callback."""

    @functools.wraps(original)
    def async_stream_infer(self: Any, *args: Any, **kwargs: Any) -> Any:
        stream: StreamCalls | None = self.__dict__.get(_STREAM)
        call = stream.begin(args, kwargs) if stream is not None else None
        try:
            return original(self, *args, **kwargs)
        except BaseException as error:
            if stream is not None and call is not None:
                stream.failed_to_queue(call, error)
            raise

    return async_stream_infer


def traced_stop_stream(target_of: TargetOf, original: Callable[..., Any]) -> Any:
    """``stop_stream`` (also behind ``close``): the stream span ends once the stream is down."""

    @functools.wraps(original)
    def stop_stream(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        finally:
            stream: StreamCalls | None = self.__dict__.pop(_STREAM, None)
            if stream is not None:
                stream.close()

    return stop_stream


class TracedResponses:
    """The asyncio stream's response iterator: each response ends its request's span."""

    def __init__(self, inner: Any, stream: StreamCalls) -> None:
        self._inner = inner
        self._stream = stream

    def __aiter__(self) -> TracedResponses:
        return self

    async def __anext__(self) -> tuple[Any, Any]:
        try:
            result, error = await self._inner.__anext__()
        except StopAsyncIteration:
            self._stream.close()
            raise
        except BaseException as failure:
            self._stream.close(failure)
            raise
        self._stream.response(result, error)
        return result, error

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def _traced_requests(inputs: Any, stream: StreamCalls) -> AsyncIterator[Any]:
    async for request in inputs:
        if isinstance(request, dict) and "model_name" in request and "inputs" in request:
            stream.begin((), request)
        yield request


traced_aio_stream_infer = _stream_opener(
    "asyncio_stream",
    lambda stream, inputs: _traced_requests(inputs, stream),
    lambda client, stream, responses: TracedResponses(responses, stream),
)
"""asyncio gRPC ``stream_infer``: the request dicts start spans, the responses end them."""
