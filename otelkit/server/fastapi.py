"""FastAPI and Starlette apps: one SERVER span and one duration observation per HTTP request.

``otelkit.instrument(app)`` lands here. The span follows OpenTelemetry's HTTP server
conventions, is parented on the request's ``traceparent`` (read by otelkit's spec-exact
propagation: a malformed one starts a new trace) and is the current context while the handler
runs, so ``otelkit.stage`` spans in ``async def`` and ``def`` handlers nest under it (Starlette
runs a ``def`` handler in a thread with a copy of the request's context).

Why a pure ASGI middleware: ``BaseHTTPMiddleware`` costs a task and a stream per request and
does not carry context changes into streaming bodies. Why outermost, around Starlette's
``ServerErrorMiddleware``: the span then records the status actually sent, a custom 500 handler
included. It is put there by wrapping the app's ``build_middleware_stack`` (and the stack
already built, if the app has started), which ``add_middleware`` cannot do after start-up.

FastAPI 0.165 and later trace and meter requests natively whenever a global provider is set,
which ``otelkit.configure()`` does: for an app instrumented here that native tracing and
metering is switched off (in the app's settings, and for FastAPI apps mounted in it through
the scope key FastAPI itself uses to that end), as FastAPI does beside OpenTelemetry's ASGI
middleware, so that each request has one SERVER span and one ``http.server.request.duration``.
For the same reason, OpenTelemetry's own ASGI middleware in the app's stack (which
``opentelemetry-instrumentation-fastapi`` puts there, for every app under
``opentelemetry-instrument``) is bypassed while otelkit instruments the app, and put back by
``uninstrument_app``: it would add a span, two ``http send`` spans and its own request
metrics to each request otelkit already traces.

A route under a ``Mount`` gets the mount's template as prefix: ``/tenants/{tenant}/infer``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from opentelemetry.context import Context
from opentelemetry.trace import SpanKind
from starlette.applications import Starlette
from starlette.routing import BaseRoute, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from otelkit import semconv
from otelkit._core.guard import internal_error
from otelkit._core.hotmetrics import HOT
from otelkit._core.spans import RecordingSpan, SpanRecorder
from otelkit._propagation import extract
from otelkit.server._serving import enter, leave, observe, rename, set_error_status

__all__ = ["ServerSpanMiddleware", "instrument_app", "uninstrument_app"]

AppT = TypeVar("AppT", bound=Starlette)

_RECORDER = SpanRecorder("otelkit.server.fastapi", server=True)
_LABELS = (semconv.M_HTTP_METHOD, semconv.M_HTTP_ROUTE, semconv.M_HTTP_STATUS)
_DURATION = HOT.histogram(semconv.HTTP_SERVER_DURATION, _LABELS)
_SERVER = SpanKind.SERVER
# Methods outside the conventions' list become "_OTHER": clients choose them, labels must not.
_KNOWN_METHODS = frozenset(
    ("CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "QUERY", "TRACE")
)
_DEFAULT_PORTS = {"http": 80, "https": 443}
_INSTALLED = "_otelkit_server_spans"  # the app attribute holding its _Installation
_SEEN = "otelkit.server_span"  # scope key: a mounted instrumented app adds no second span
_NATIVE_OFF = {"tracing": False, "metrics": False}
# FastAPI's own way (for its ``exclude`` option) to keep mounted FastAPI apps from tracing
_NATIVE_SCOPE_KEY = "fastapi.telemetry"
# OpenTelemetry's ASGI middleware, known by name: otelkit does not depend on its package
_CONTRIB_MIDDLEWARE = ("opentelemetry.instrumentation.asgi", "OpenTelemetryMiddleware")
_STACK_DEPTH = 64  # middlewares walked at most, below otelkit's, looking for it


class _Routes:
    """Route templates of one app, mount prefixes included, found once per route object."""

    def __init__(self, app: Starlette) -> None:
        self._app = app
        # keyed by id(): Starlette routes define __eq__ and are unhashable; the route is kept
        # in the value so that its id cannot be reused by another object
        self._found: dict[int, tuple[BaseRoute, str]] = {}

    def template(self, route: Any) -> str:
        """``route``'s path template from the app's root; ``""`` when nothing matched."""
        if not isinstance(route, BaseRoute):
            return ""
        found = self._found.get(id(route))
        if found is not None and found[0] is route:
            return found[1]
        template = _search(self._app.routes, route, "")
        if template is None:  # not reachable from the app (a foreign router): no prefix known
            template = getattr(route, "path_format", "")
        self._found[id(route)] = (route, template)
        return template


def _search(routes: Iterable[BaseRoute], wanted: BaseRoute, prefix: str) -> str | None:
    for route in routes:
        if route is wanted:
            return prefix + str(getattr(route, "path_format", ""))
        if isinstance(route, Mount):
            inner = prefix + route.path_format.removesuffix("/{path}")
            found = _search(route.routes, wanted, inner)
            if found is not None:
                return found
    return None


class _Installation:
    """What ``instrument_app`` changed on one app, so that ``uninstrument_app`` can undo it."""

    def __init__(self, app: Starlette) -> None:
        self.active = True
        self.routes = _Routes(app)
        self.build = app.build_middleware_stack
        self.native: dict[str, Any] | None = None
        self.bypassed: list[tuple[Any, Any]] = []  # (middleware, the contrib one it called)

    def wrap(self, stack: ASGIApp) -> ServerSpanMiddleware:
        """``stack`` under otelkit's middleware, with OpenTelemetry's ASGI middleware in it
        bypassed (each middleware that called one calls the app it wrapped)."""
        outer = ServerSpanMiddleware(stack, self)
        holder: Any = outer
        for _ in range(_STACK_DEPTH):
            inner = getattr(holder, "app", None)
            if inner is None:
                break
            kind = type(inner)
            if (kind.__module__, kind.__name__) == _CONTRIB_MIDDLEWARE:
                holder.app = inner.app
                self.bypassed.append((holder, inner))
            else:
                holder = inner
        return outer

    def restore(self) -> None:
        """Put back what ``wrap`` bypassed."""
        for holder, contrib in reversed(self.bypassed):
            holder.app = contrib
        self.bypassed.clear()


class ServerSpanMiddleware:
    """Pure ASGI middleware: a SERVER span, current while the app runs, around each request."""

    def __init__(self, app: ASGIApp, installation: _Installation) -> None:
        self.app = app  # ``app``, as Starlette's middlewares name it, so stacks can be walked
        self._installation = installation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _SEEN in scope or not self._installation.active:
            await self.app(scope, receive, send)
            return
        request = HttpServerRequest.start(scope)
        if request is None:
            await self.app(scope, receive, send)
            return

        marked = request.span.sampled  # the breakdown's cuts: only on a span exported

        async def send_with_status(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                request.status = message["status"]
                if marked:
                    request.span.add_event(semconv.HTTP_RESPONSE_STARTED)
            await send(message)
            if marked and kind == "http.response.body" and not message.get("more_body"):
                request.span.add_event(semconv.HTTP_RESPONSE_SENT)

        async def receive_marked() -> Message:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body"):
                request.span.add_event(semconv.HTTP_REQUEST_RECEIVED)
            return message

        try:
            await self.app(scope, receive_marked if marked else receive, send_with_status)
        except BaseException as error:
            request.finish(scope, error, self._installation.routes)
            raise
        request.finish(scope, None, self._installation.routes)


class RouteTemplates(Protocol):
    """What names a request's route for its span and histogram (Ray Serve has its own)."""

    def template(self, route: Any) -> str:
        """The route template of the matched ``route`` object (``""`` when none matched)."""


class HttpServerRequest:
    """One request in flight: its span, the context made current for it, its start time.

    Shared by the ASGI middleware here and Ray Serve's HTTP ingress (``ray_serve``)."""

    __slots__ = ("method", "span", "start_s", "status", "token")

    def __init__(self, scope: Scope, nest: Callable[[Context], Context] | None = None) -> None:
        scope[_SEEN] = True
        scope.setdefault(_NATIVE_SCOPE_KEY, None)
        method = scope.get("method", "")
        self.method = method if method in _KNOWN_METHODS else "_OTHER"
        parent = extract(scope.get("headers") or ())
        parent = parent if nest is None else nest(parent)
        self.span = span = _RECORDER.start(_span_method(self.method), _SERVER, parent)
        self.status = 0
        if span.sampled:
            _request_attributes(scope, self.method, span.attributes)
        self.token = enter(span, parent)
        self.start_s = time.perf_counter()

    @classmethod
    def start(
        cls, scope: Scope, nest: Callable[[Context], Context] | None = None
    ) -> HttpServerRequest | None:
        """The request's span started and made current (``None`` if otelkit failed); ``nest``
        may put it under a span of the server's own around it, in the same trace."""
        try:
            return cls(scope, nest)
        except Exception:
            internal_error("starting an HTTP server span")
            return None

    def finish(self, scope: Scope, error: BaseException | None, routes: RouteTemplates) -> None:
        """End the span and observe the duration; never raises."""
        seconds = time.perf_counter() - self.start_s
        try:
            leave(self.token)
            route = routes.template(scope.get("route"))
            # no response started: Starlette's error middleware or the server answers 500
            status = self.status or 500
            span = self.span
            if span.sampled:
                _response_attributes(span, self.method, route, status, error)
            observe(_DURATION.series((self.method, route, str(status))), seconds, span)
            span.end()
        except Exception:
            internal_error("ending an HTTP server span")


def _span_method(method: str) -> str:
    return "HTTP" if method == "_OTHER" else method


def _request_attributes(scope: Scope, method: str, attributes: dict[str, Any]) -> None:
    attributes[semconv.HTTP_REQUEST_METHOD] = method
    attributes[semconv.URL_PATH] = scope.get("path", "")
    scheme = scope.get("scheme", "http")
    attributes[semconv.URL_SCHEME] = scheme
    if version := scope.get("http_version"):
        attributes[semconv.NETWORK_PROTOCOL_VERSION] = version
    if client := scope.get("client"):
        attributes[semconv.CLIENT_ADDRESS] = client[0]
    address, port = _server(scope, scheme)
    if address:
        attributes[semconv.SERVER_ADDRESS] = address
    if port is not None:
        attributes[semconv.SERVER_PORT] = port


def _server(scope: Scope, scheme: str) -> tuple[str | None, int | None]:
    """The server the client addressed: the Host header's, else the socket's."""
    for key, value in scope.get("headers") or ():
        if key == b"host":  # ASGI header names are lowercase
            host = value.decode("latin-1")
            if host.startswith("["):  # an IPv6 literal: [::1]:8000
                address, _, rest = host[1:].partition("]")
                port = rest.removeprefix(":")
            else:
                address, _, port = host.partition(":")
            return address, int(port) if port.isdigit() else _DEFAULT_PORTS.get(scheme)
    server = scope.get("server")
    return (server[0], server[1]) if server else (None, None)


def _response_attributes(
    span: RecordingSpan, method: str, route: str, status: int, error: BaseException | None
) -> None:
    attributes = span.attributes
    attributes[semconv.HTTP_RESPONSE_STATUS_CODE] = status
    if route:
        attributes[semconv.HTTP_ROUTE] = route
        rename(span, f"{_span_method(method)} {route}")
    if error is not None:
        span.record_error(error)
    elif status >= 500:  # 4xx are the client's errors, not the server's (HTTP conventions)
        attributes[semconv.ERROR_TYPE] = str(status)
        set_error_status(span)


def instrument_app(app: AppT) -> AppT:
    """Trace every HTTP request ``app`` serves; a second call changes nothing.

    Works before and after the app has started. For FastAPI, use ``otelkit.instrument(app)``.

    >>> app = otelkit.instrument(FastAPI())
    """
    if app.__dict__.get(_INSTALLED) is not None:
        return app
    installation = _Installation(app)
    build = installation.build

    def build_middleware_stack() -> ASGIApp:
        return installation.wrap(build())

    app.__dict__["build_middleware_stack"] = build_middleware_stack
    if app.middleware_stack is not None:  # started: wrap the stack as it is, rebuild nothing
        app.middleware_stack = installation.wrap(app.middleware_stack)
    native = app.__dict__.get("_telemetry")  # FastAPI >= 0.165's native telemetry settings
    if isinstance(native, dict) and _NATIVE_OFF.keys() <= native.keys():
        installation.native = {key: native[key] for key in _NATIVE_OFF}
        native.update(_NATIVE_OFF)
    app.__dict__[_INSTALLED] = installation
    return app


def uninstrument_app(app: AppT) -> AppT:
    """Undo ``instrument_app``: requests in flight finish traced, later ones are not traced."""
    installation: _Installation | None = app.__dict__.pop(_INSTALLED, None)
    if installation is None:
        return app
    installation.active = False  # a stack someone wrapped further keeps ours, now inert
    installation.restore()
    app.__dict__.pop("build_middleware_stack", None)
    stack = app.middleware_stack
    if isinstance(stack, ServerSpanMiddleware) and stack._installation is installation:
        app.middleware_stack = stack.app
    native = app.__dict__.get("_telemetry")
    if installation.native is not None and isinstance(native, dict):
        native.update(installation.native)
    return app
