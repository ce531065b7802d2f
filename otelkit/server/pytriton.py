"""PyTriton: ``otelkit.stage`` spans inside an inference function, under PyTriton's own spans.

How PyTriton 0.7 traces, and what this module changes:

* With ``TritonConfig(trace_config=[...])``, Triton's ``InferRequest`` → model span continue in
  the Python-backend stub as ``python_backend_execute``. Its W3C context crosses PyTriton's
  IPC to the process that bound the function, where PyTriton starts
  ``proxy_inference_callable`` with the tracer given to ``set_telemetry_tracer`` (callable once
  per process) and keeps it on ``Request.span``; ``@batch`` adds ``pytriton-batch-decorator-span``.
* When no tracer is set, ``Triton.bind`` builds one from ``trace_config``: a second SDK provider
  installed as OpenTelemetry's global, with its own exporter, fighting ``otelkit.configure()``.
  ``install_tracer()`` gives PyTriton a tracer from otelkit's provider instead: one provider,
  one export pipeline, whether ``configure()`` runs before or after.
* PyTriton never makes ``proxy_inference_callable`` current: the function runs in an asyncio
  task on PyTriton's handler thread with an empty context, so stages would start new traces.
  ``traced()`` runs the function under the first request's span, with the model label set.

>>> from pytriton.decorators import batch
>>> from otelkit.server import pytriton as otp
>>> @otp.traced(model="gnn")       # outside @batch: it reads the requests' spans
... @batch
... def infer(hits):
...     with otelkit.stage("build_graph"):
...         graph = build(hits)
...     with otelkit.stage("classify"):
...         return {"scores": classify(graph)}
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext

from otelkit._core.extras import require
from otelkit._core.guard import internal_error
from otelkit._core.switch import SWITCH
from otelkit.server._stage import BATCH_LINKS, CURRENT_MODEL

__all__ = ["install_tracer", "traced"]

F = TypeVar("F", bound=Callable[..., Any])
logger = logging.getLogger("otelkit")

_SCOPE = "otelkit.server.pytriton"
_lock = threading.Lock()
_tracer: _PyTritonTracer | None = None  # the one handed to PyTriton (it takes one per process)


class _ContextSpan(NonRecordingSpan):
    """A non-recording span that also has the SDK span's ``context`` attribute.

    ``@batch`` reads ``request.span.context``, which only SDK spans have: with a no-op tracer
    (otelkit not configured yet, or shut down) or an unsampled span it would fail the request.
    """

    @property
    def context(self) -> SpanContext:
        return self.get_span_context()


class _PyTritonTracer(trace.Tracer):
    """otelkit's switching tracer, with spans PyTriton's code can always read."""

    def __init__(self) -> None:
        self._tracer = SWITCH.tracers.get_tracer(_SCOPE)

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        span = self._tracer.start_span(*args, **kwargs)
        return span if hasattr(span, "context") else _ContextSpan(span.get_span_context())

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return self._tracer.start_as_current_span(*args, **kwargs)


def install_tracer() -> bool:
    """Give PyTriton a tracer from otelkit's provider; ``True`` once it has otelkit's.

    Call it before ``Triton.bind`` (``traced`` does), else PyTriton installs a provider of its
    own. Idempotent. ``False`` when PyTriton already had another tracer: it keeps that one.

    >>> otelkit.server.pytriton.install_tracer()
    True
    """
    global _tracer
    telemetry = require("pytriton.proxy.telemetry", extra="pytriton", feature="PyTriton tracing")
    with _lock:
        if _tracer is not None:
            return telemetry.get_telemetry_tracer() is _tracer
        try:
            if telemetry.get_telemetry_tracer() is not None:
                logger.warning(
                    "otelkit: PyTriton already has a tracer; its spans keep going through it"
                )
                return False
            tracer = _PyTritonTracer()
            telemetry.set_telemetry_tracer(tracer)
            _tracer = tracer
            return True
        except Exception:
            internal_error("installing PyTriton's tracer")
            return False


def traced(*, model: str = "") -> Callable[[F], F]:
    """Run a PyTriton inference function under its requests' ``proxy_inference_callable`` span.

    Decorate the function PyTriton calls with the requests (outside ``@batch``); functions,
    methods, generators and ``async`` ones all work. Stages inside it nest under the first
    request's span; with several requests in the batch, the outermost stages also link to every
    request's span. ``model`` labels the stages' metrics. Also calls ``install_tracer()``.

    >>> @otelkit.server.pytriton.traced(model="gnn")
    ... @batch
    ... def infer(hits): ...
    """
    install_tracer()

    def decorate(function: F) -> F:
        return cast(F, functools.wraps(function)(_wrapper(function, model)))

    return decorate


def _wrapper(function: Callable[..., Any], model: str) -> Callable[..., Any]:
    """A wrapper of the same kind as ``function``: PyTriton picks how to call it by its kind."""
    if inspect.isasyncgenfunction(function):

        async def run_async_generator(*args: Any, **kwargs: Any) -> Any:
            with _Serving(args, kwargs, model):
                async for item in function(*args, **kwargs):
                    yield item

        return run_async_generator
    if inspect.isgeneratorfunction(function):

        def run_generator(*args: Any, **kwargs: Any) -> Any:
            with _Serving(args, kwargs, model):
                return (yield from function(*args, **kwargs))

        return run_generator
    if inspect.iscoroutinefunction(function):

        async def run_coroutine(*args: Any, **kwargs: Any) -> Any:
            with _Serving(args, kwargs, model):
                return await function(*args, **kwargs)

        return run_coroutine

    def run(*args: Any, **kwargs: Any) -> Any:
        with _Serving(args, kwargs, model):
            return function(*args, **kwargs)

    return run


class _Serving:
    """The context one call runs under: first request's span, model label, batch links.

    A generator's context stays current between its items too, while PyTriton's loop in the
    same asyncio task hands each item on: that code starts no spans.
    """

    __slots__ = ("_context", "_links", "_model", "_tokens")

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any], model: str) -> None:
        self._model = model
        self._context: Context | None = None
        self._links: Sequence[Link] = ()
        self._tokens: tuple[Any, Any, Any] = (None, None, None)
        try:
            # PyTriton passes the requests as the only argument; a method gets ``self`` first.
            requests = args[-1] if args else kwargs.get("requests", ())
            spans = [getattr(request, "span", None) for request in requests]
            valid = [s for s in spans if s is not None and s.get_span_context().is_valid]
            if valid:
                self._context = trace.set_span_in_context(valid[0])
            if len(valid) > 1:
                self._links = [Link(s.get_span_context()) for s in valid]
        except Exception:
            internal_error("reading PyTriton's request spans")

    def __enter__(self) -> None:
        model = CURRENT_MODEL.set(self._model) if self._model else None
        links = BATCH_LINKS.set(self._links) if self._links else None
        context = otel_context.attach(self._context) if self._context is not None else None
        self._tokens = (model, links, context)

    def __exit__(self, *exc_info: object) -> None:
        model, links, context = self._tokens
        try:
            if context is not None:
                otel_context.detach(context)
            if links is not None:
                BATCH_LINKS.reset(links)
            if model is not None:
                CURRENT_MODEL.reset(model)
        except Exception:  # a generator closed from another context: its tokens are foreign
            internal_error("leaving a PyTriton request's context")
