"""Ray Serve deployments traced end to end: HTTP ingress, handle calls, batches, the queue.

``otelkit.instrument(deployment)`` lands here (extra ``ray``)::

    @serve.deployment
    class Embed: ...

    app = otelkit.instrument(Ingress).bind(otelkit.instrument(Embed).bind())

Each replica of an instrumented deployment sets otelkit up once, from the environment, before
the deployment's constructor runs; that environment (``OTEL_*`` and ``OTELKIT_*`` variables,
the driver's and those given) reaches the replica through the deployment's runtime
environment (``runtime_env``). Setting up installs, once per process, the hooks that give:

- a request through Serve's HTTP proxy a SERVER span parented on its ``traceparent``, with
  the HTTP server conventions and ``http.server.request.duration`` (the FastAPI integration's
  code; a FastAPI ingress that ``otelkit.instrument`` also wrapped adds no second span);
- a ``DeploymentHandle.remote()`` call the caller's context, so the called replica's SERVER
  span, a span of the time the request waited before the replica took it, and the stage
  spans inside join the caller's trace;
- a request through Serve's gRPC proxy a SERVER span on the ingress replica, parented on the
  ``traceparent`` in the call's gRPC metadata;
- an ``@serve.batch`` call one span linked to every request of the batch.

The hooks wrap Serve's own methods (``DeploymentHandle._init_router_and_get_metadata``,
the replica's ``call_user_method`` and ``_call_http_entrypoint``, the batch queue's
``_process_batch_inner``) and are checked against Ray 2.60; a release that renames one leaves
that hook out with one log line, and serving goes on.

Serve's proxy runs no deployment code, so none of the above sees it. Serve's own tracing does:
``ray.init(runtime_env=runtime_env(..., serve_tracing=True))`` turns it on with otelkit as its
exporter (``serve_span_processors``), in the proxy too, which reads its tracing from the
job's environment alone. Serve's spans of the proxy, the router's choice of a replica and the
replica then join the caller's trace, and otelkit's spans of the request nest in Serve's: the
breakdown names the proxy, the router and each replica (``otelkit.analysis``).
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from otelkit._core.deps import ray as ray_private
from otelkit._core.guard import internal_error
from otelkit.server._ray_calls import BatchCall, HandleCall, Replica, carry, nest
from otelkit.server.fastapi import HttpServerRequest

__all__ = [
    "instrument_deployment",
    "runtime_env",
    "serve_span_processors",
    "setup",
    "uninstrument_deployment",
]

logger = logging.getLogger("otelkit")
_lock = threading.Lock()
_installed = False
_replica: Replica | None = None
_ENV_PREFIXES = ("OTEL_", "OTELKIT_")
_SERVICE_NAME = "ray-serve"  # unless OTEL_SERVICE_NAME or OTELKIT_SERVICE_NAME names it
#: Serve's own tracing through otelkit: its exporter, and no request traced unless its caller
#: sampled it (Serve samples the rest at this ratio)
_SERVE_TRACING = {
    "RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH": f"{__name__}.serve_span_processors",
    "RAY_SERVE_TRACING_SAMPLING_RATIO": "0",
}


def runtime_env(
    env_vars: Mapping[str, str] | None = None, *, serve_tracing: bool = False
) -> dict[str, Any]:
    """A Ray runtime environment carrying otelkit's configuration to replicas: this process's
    ``OTEL_*`` and ``OTELKIT_*`` variables, then ``env_vars``.

    ``serve_tracing``: Serve's own tracing on, with otelkit as its exporter
    (``serve_span_processors``), for requests whose caller sampled them. Give it to the job,
    ``ray.init(runtime_env=runtime_env(..., serve_tracing=True))``: Serve's proxy reads its
    tracing from its environment alone, and the job's reaches it.

    >>> runtime_env({"OTEL_SERVICE_NAME": "tracking"})["env_vars"]["OTEL_SERVICE_NAME"]
    'tracking'
    """
    env = {key: value for key, value in os.environ.items() if key.startswith(_ENV_PREFIXES)}
    if serve_tracing:
        env |= _SERVE_TRACING
    return {"env_vars": env | dict(env_vars or {})}


def setup(**options: Any) -> None:
    """Set otelkit up in this Serve process (once; ``options``: ``configure()``'s, where it is
    not yet configured) and install the Serve hooks (once)."""
    global _installed, _replica
    from otelkit import telemetry

    with _lock:
        if telemetry.current() is None:
            named = "OTEL_SERVICE_NAME" in os.environ or "OTELKIT_SERVICE_NAME" in os.environ
            telemetry.configure(service_name=None if named else _SERVICE_NAME, **options)
        if _replica is None:
            try:
                _replica = Replica.current()
            except Exception:  # not in a replica (the driver): handles only
                logger.debug("otelkit: no Ray Serve replica context in this process")
        if _installed:
            return
        _installed = True
    _install_hooks()


def serve_span_processors() -> list[Any]:
    """Serve's tracing exporter (``RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH``): otelkit set up
    in each Serve process from its environment, the proxy's included. Serve then records its
    own spans of the proxy, the router and the replicas on otelkit's provider (the global one,
    which Serve's own cannot replace), sampled and exported as otelkit's: no processor of its
    own is needed. In the proxy, where the environment names no sampler, a request that comes
    with a trace context follows its caller's decision, and one without is traced at Serve's
    ratio (``RAY_SERVE_TRACING_SAMPLING_RATIO``); a replica samples as otelkit's configuration
    says, as it did without Serve's tracing."""
    try:
        options: dict[str, Any] = {}
        if "OTEL_TRACES_SAMPLER" not in os.environ and not _in_replica():
            ratio = float(os.environ.get("RAY_SERVE_TRACING_SAMPLING_RATIO", "0.01"))
            options = {"sampler": "parentbased_traceidratio", "sampler_arg": ratio}
        setup(**options)
    except Exception:
        internal_error("setting otelkit up as Ray Serve's tracing exporter")
    return []


def _in_replica() -> bool:
    try:
        Replica.current()
    except Exception:
        return False
    return True


def instrument_deployment(deployment: Any, env_vars: Mapping[str, str] | None = None) -> Any:
    """``deployment`` (a class deployment) with otelkit set up in each of its replicas.

    >>> app = instrument_deployment(Ingress).bind(instrument_deployment(Embed).bind())
    """
    cls = deployment.func_or_class
    if not isinstance(cls, type):
        raise TypeError(
            f"otelkit.instrument: {deployment.name} is a function deployment; "
            "instrument class deployments (@serve.deployment on a class)"
        )
    if getattr(cls, "_otelkit_traced", False):
        return deployment
    options = dict(deployment.ray_actor_options or {})
    env = dict(options.get("runtime_env") or {})
    env["env_vars"] = runtime_env(env_vars)["env_vars"] | dict(env.get("env_vars") or {})
    options["runtime_env"] = env
    return deployment.options(func_or_class=_traced(cls), ray_actor_options=options)


def uninstrument_deployment(deployment: Any) -> Any:
    """``deployment`` as it was before ``instrument_deployment`` (replicas already running keep
    their hooks until the application is deployed again)."""
    cls = deployment.func_or_class
    if not getattr(cls, "_otelkit_traced", False):
        return deployment
    return deployment.options(func_or_class=cls.__bases__[0])


def _traced(cls: type) -> type:
    """A subclass of ``cls`` whose constructor first sets otelkit up in the replica."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _setup_guarded()
        cls.__init__(self, *args, **kwargs)  # type: ignore[misc]

    async def __async_init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _setup_guarded()
        await cls.__init__(self, *args, **kwargs)  # type: ignore[misc]

    # a @serve.ingress class has an async constructor, and its subclasses must too
    constructor: Any = cls.__init__  # type: ignore[misc]
    init = __async_init__ if inspect.iscoroutinefunction(constructor) else __init__
    namespace = {"__init__": init, "_otelkit_traced": True, "__module__": cls.__module__}
    traced = type(cls.__name__, (cls,), namespace)
    traced.__qualname__ = cls.__qualname__
    traced.__doc__ = cls.__doc__
    return traced


def _setup_guarded() -> None:
    try:
        setup()
    except Exception:
        internal_error("setting otelkit up in a Ray Serve replica")


# -- the hooks ------------------------------------------------------------------------------


def _install_hooks() -> None:
    handle = ray_private.serve_class("ray.serve.handle", "DeploymentHandle")
    if handle is not None:
        _hook(handle, "_init_router_and_get_metadata", _carrying)
    wrapper = ray_private.serve_class("ray.serve._private.replica", "UserCallableWrapper")
    run_user_code = None if wrapper is None else wrapper.__dict__.get("_run_user_code")
    for name, traced in (("call_user_method", _handle_call), ("_call_http_entrypoint", _http)):
        if wrapper is None:
            break
        inner = getattr(wrapper.__dict__.get(name), "__wrapped__", None)
        if run_user_code is None or inner is None:
            logger.warning("otelkit: Ray Serve's replica has no %s to trace; not traced", name)
            continue
        # Serve's own decorator around ours: ours then runs where the user's code runs
        setattr(wrapper, name, run_user_code(functools.wraps(inner)(traced(inner))))
    batch_queue = ray_private.serve_class("ray.serve.batching", "_BatchQueue")
    if batch_queue is not None:
        _hook(batch_queue, "_process_batch_inner", _batch)


def _hook(owner: type, name: str, wrap: Callable[[Any], Any]) -> None:
    original = getattr(owner, name, None)  # defined on the class or a base
    if original is None:
        logger.warning("otelkit: Ray Serve has no %s.%s; not traced", owner.__name__, name)
        return
    setattr(owner, name, functools.wraps(original)(wrap(original)))


def _carrying(original: Callable[..., Any]) -> Callable[..., Any]:
    def init_router_and_get_metadata(self: Any) -> Any:
        router, metadata = original(self)
        carry(metadata)
        return router, metadata

    return init_router_and_get_metadata


def _handle_call(inner: Callable[..., Any]) -> Callable[..., Any]:
    async def call_user_method(self: Any, metadata: Any, args: Any, kwargs: Any) -> Any:
        call = HandleCall.start(_replica, metadata)
        if call is None:
            return await inner(self, metadata, args, kwargs)
        try:
            result = await inner(self, metadata, args, kwargs)
        except BaseException as error:
            call.finish(error)
            raise
        call.finish(None)
        return result

    return call_user_method


class _ServeRoutes:
    """A Serve request's route: the app's route prefix, then the FastAPI route if one matched."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix.rstrip("/")

    def template(self, route: Any) -> str:
        inner = str(getattr(route, "path_format", "")) if route is not None else ""
        return (self._prefix + inner) or "/"


def _http(inner: Callable[..., Any]) -> Callable[..., Any]:
    async def call_http_entrypoint(
        self: Any, method: Any, scope: Any, receive: Any, send: Any
    ) -> Any:
        request = HttpServerRequest.start(scope, nest) if scope.get("type") == "http" else None
        if request is None:  # a websocket, or otelkit failed
            return await inner(self, method, scope, receive, send)
        if request.span.sampled and _replica is not None:
            request.span.attributes.update(_replica.attributes)
        routes = _ServeRoutes(str(scope.get("root_path", "")))

        async def send_with_status(message: Any) -> None:
            if message["type"] == "http.response.start":
                request.status = message["status"]
            await send(message)

        try:
            result = await inner(self, method, scope, receive, send_with_status)
        except BaseException as error:
            request.finish(scope, error, routes)
            raise
        request.finish(scope, None, routes)
        return result

    return call_http_entrypoint


def _batch(original: Callable[..., Any]) -> Callable[..., Any]:
    async def process_batch_inner(self: Any, func: Any, batch: Any) -> Any:
        contexts = [getattr(request, "trace_context", None) for request in batch]
        name = str(getattr(self, "_function_name", getattr(func, "__name__", "batch")))
        call = BatchCall.start(name, contexts, _replica)
        if call is not None:
            call.lend(batch)
        try:
            result = await original(self, func, batch)
        except BaseException as error:
            if call is not None:
                call.finish(error)
            raise
        if call is not None:
            call.finish(None)
        return result

    return process_batch_inner
