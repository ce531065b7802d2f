"""gRPC servers in Python: one SERVER span and one duration observation per RPC.

    server = grpc.server(ThreadPoolExecutor(8), interceptors=[server_interceptor()])
    server = grpc.aio.server(interceptors=[aio_server_interceptor()])  # or on asyncio

The interceptor is ``opentelemetry-instrumentation-grpc``'s server interceptor, which wraps
every kind of method handler (unary and streaming, either way) and the servicer context. Two
of its parts are otelkit's own: the incoming context is read by otelkit's spec-exact W3C
propagation (Trace Context Level 1 and 2, baggage; a malformed ``traceparent`` starts a new
trace) instead of the global propagator, and the span is otelkit's lean span with the current
RPC server conventions (``rpc.system.name``, ``rpc.method`` as ``Service/Method``,
``rpc.response.status_code``, ``error.type``, ``server.*``, ``client.*``) where the contrib
package still writes the older ones. While the handler runs the span is the current context,
so ``otelkit.stage`` spans nest under it.

The status is read from the servicer context once the handler returns: whatever set it
(``abort``, ``set_code``, ``abort_with_status``) is seen, and a handler that raised is
``UNKNOWN``, as grpcio answers it. As the conventions say, only the codes that mean the server
failed (``UNKNOWN``, ``DEADLINE_EXCEEDED``, ``UNIMPLEMENTED``, ``INTERNAL``, ``UNAVAILABLE``,
``DATA_LOSS``) mark a server span failed; a bad request (``INVALID_ARGUMENT``, ``NOT_FOUND``)
is the caller's error.

Needs ``pip install 'otelkit[grpc]'``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote

from opentelemetry.trace import SpanKind

from otelkit import semconv
from otelkit._core.deps.grpc_instrumentation import server_interceptor_bases
from otelkit._core.extras import require
from otelkit._core.guard import internal_error
from otelkit._core.hotmetrics import HOT
from otelkit._core.spans import RecordingSpan, SpanRecorder
from otelkit._propagation import extract
from otelkit.server._serving import enter, leave, observe, set_error_status

grpc = require("grpc", extra="grpc", feature="otelkit.server.grpc")
# the contrib package, for its missing-extra message; its private parts: deps.grpc_instrumentation
require("opentelemetry.instrumentation.grpc", extra="grpc", feature="otelkit.server.grpc")
_ContribInterceptor: Any
_ContribAioInterceptor: Any
_ContribInterceptor, _ContribAioInterceptor = server_interceptor_bases(grpc)

__all__ = [
    "AioServerInterceptor",
    "ServerInterceptor",
    "aio_server_interceptor",
    "server_interceptor",
]

_RECORDER = SpanRecorder("otelkit.server.grpc", server=True)
_DURATION = HOT.histogram(semconv.RPC_SERVER_DURATION, (semconv.M_RPC_METHOD, semconv.M_RPC_STATUS))
_SERVER = SpanKind.SERVER
_ABORT = grpc.aio.AbortError
_SERVER_ERRORS = frozenset(semconv.RPC_SERVER_ERROR_CODES)


class _Ignored:
    """What the contrib interceptor takes for its span: otelkit reads the outcome itself."""

    def set_attribute(self, key: str, value: object) -> None:
        """The contrib's ``rpc.grpc.status_code``: read from the servicer context instead."""

    def set_status(self, status: object) -> None:
        """Set at the end, from the status code, by the RPC conventions."""

    def record_exception(self, error: BaseException) -> None:
        """Recorded at the end, when the exception leaves the handler."""

    def __getattr__(self, name: str) -> Any:
        """Any other span method a newer contrib release calls: ignored too, rather than an
        ``AttributeError`` in every RPC."""
        if name.startswith("__"):
            raise AttributeError(name)
        return _ignore


def _ignore(*args: object, **kwargs: object) -> None:
    """What the contrib's other span calls do here: nothing (otelkit reads the outcome)."""


_IGNORED = _Ignored()


class _Rpc:
    """One RPC in flight: its span, the context made current for it, its start time."""

    __slots__ = ("method", "span", "start_s", "token")

    def __init__(self, interceptor: _Overrides, method: str, context: Any) -> None:
        self.method = method.removeprefix("/")
        parent = extract(context.invocation_metadata() or ())
        self.span = span = _RECORDER.start(self.method, _SERVER, parent)
        if span.sampled:
            _request_attributes(span.attributes, self.method, interceptor, context.peer())
        self.token = enter(span, parent)
        self.start_s = time.perf_counter()

    def finish(self, context: Any, error: BaseException | None) -> None:
        """End the span and observe the duration; never raises."""
        seconds = time.perf_counter() - self.start_s
        try:
            leave(self.token)
            code = context.code()  # None until set: OK unless the handler raised
            status = code.name if code is not None else ("UNKNOWN" if error else "OK")
            span = self.span
            if span.sampled:
                _response_attributes(span, status, error, context)
            observe(_DURATION.series((self.method, status)), seconds, span)
            span.end()
        except Exception:
            internal_error("ending a gRPC server span")


def _request_attributes(
    attributes: dict[str, Any], method: str, interceptor: _Overrides, peer: str
) -> None:
    attributes[semconv.RPC_SYSTEM_NAME] = semconv.RPC_SYSTEM_TRITON_GRPC
    attributes[semconv.RPC_METHOD] = method
    if interceptor.server_address:
        attributes[semconv.SERVER_ADDRESS] = interceptor.server_address
    if interceptor.server_port is not None:
        attributes[semconv.SERVER_PORT] = interceptor.server_port
    # grpcio names the peer "ipv4:127.0.0.1:57284", "ipv6:%5B::1%5D:57284" or "unix:path"
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        host, _, port = unquote(address).rpartition(":")
        attributes[semconv.CLIENT_ADDRESS] = host.removeprefix("[").removesuffix("]")
        if port.isdigit():
            attributes[semconv.CLIENT_PORT] = int(port)


def _response_attributes(
    span: RecordingSpan, status: str, error: BaseException | None, context: Any
) -> None:
    span.attributes[semconv.RPC_RESPONSE_STATUS_CODE] = status
    # abort raises a bare Exception (grpc.aio: AbortError) once the code is set: no error of
    # the handler's own
    if error is not None and type(error) is not Exception and not isinstance(error, _ABORT):
        span.record_error(error)
    if status in _SERVER_ERRORS:  # the exception's class, when one was raised, says more
        span.attributes.setdefault(semconv.ERROR_TYPE, status)
        details = context.details()
        set_error_status(span, details.decode() if isinstance(details, bytes) else details)


class _Overrides:
    """The two parts of the contrib interceptors that otelkit replaces (see the module)."""

    server_address: str | None
    server_port: int | None

    # Both take what a newer contrib release may add to its calls (``*_more``) and ignore it.
    @contextmanager
    def _set_remote_context(
        self, servicer_context: Any, *_more: Any, **_named: Any
    ) -> Iterator[None]:
        yield  # the parent is read in _start_span, by otelkit's propagation

    @contextmanager
    def _start_span(
        self, handler_call_details: Any, context: Any, *_more: Any, **_named: Any
    ) -> Iterator[_Ignored]:
        try:
            rpc: _Rpc | None = _Rpc(self, handler_call_details.method or "", context)
        except Exception:
            internal_error("starting a gRPC server span")
            rpc = None
        try:
            yield _IGNORED
        except BaseException as error:
            if rpc is not None:
                rpc.finish(context, error)
            raise
        if rpc is not None:
            rpc.finish(context, None)


class ServerInterceptor(_Overrides, _ContribInterceptor):  # type: ignore[misc]
    """``opentelemetry-instrumentation-grpc``'s server interceptor with otelkit's context
    extraction, spans and duration histogram (see the module). Make one with
    ``server_interceptor()``."""

    def __init__(self, server_address: str | None = None, server_port: int | None = None) -> None:
        super().__init__(tracer=None)  # spans come from otelkit's recorder, not a tracer
        self.server_address = server_address
        self.server_port = server_port


def server_interceptor(
    server_address: str | None = None, server_port: int | None = None
) -> ServerInterceptor:
    """An interceptor tracing and timing every RPC of a ``grpc.server`` it is given to.

    ``server_address`` and ``server_port``: the name clients call the server by, for the
    spans' ``server.*`` attributes (grpcio does not tell a handler which address it serves).

    >>> from concurrent.futures import ThreadPoolExecutor
    >>> interceptor = server_interceptor("gpu-node", 8001)
    >>> server = grpc.server(ThreadPoolExecutor(2), interceptors=[interceptor])
    >>> _ = server.stop(None)
    """
    return ServerInterceptor(server_address, server_port)


class AioServerInterceptor(_Overrides, _ContribAioInterceptor):  # type: ignore[misc]
    """The ``grpc.aio`` twin of ``ServerInterceptor``: the contrib package's asyncio
    interceptor with the same otelkit parts. Make one with ``aio_server_interceptor()``."""

    def __init__(self, server_address: str | None = None, server_port: int | None = None) -> None:
        super().__init__(tracer=None)
        self.server_address = server_address
        self.server_port = server_port


def aio_server_interceptor(
    server_address: str | None = None, server_port: int | None = None
) -> AioServerInterceptor:
    """``server_interceptor`` for a ``grpc.aio.server``.

    >>> interceptor = aio_server_interceptor("gpu-node", 8001)  # grpc.aio.server(interceptors=...)
    """
    return AioServerInterceptor(server_address, server_port)
