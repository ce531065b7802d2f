"""The private names of ``opentelemetry-api`` and ``opentelemetry-sdk`` that otelkit reads.

Each is read once, at import or where it is used; a name gone from a newer release degrades
to the public API with one log line (``degraded``), never an exception:

- ``opentelemetry.context._RUNTIME_CONTEXT`` (attach, detach and read the current context
  without the API's wrappers): else the API's ``attach``, ``detach``, ``get_current``;
- its ``_current_context`` ``ContextVar`` (the current context in one read): else the
  runtime's ``get_current``;
- ``opentelemetry.trace.propagation._SPAN_KEY`` and
  ``opentelemetry.context._SUPPRESS_INSTRUMENTATION_KEY`` (looked up in a ``Context``
  directly): else the same keys, found by asking the public API to set them;
- ``TracerProvider._active_span_processor`` (otelkit's lean spans end into it): else spans
  start through the SDK's tracer, slower, with the same content;
- ``TracerProvider._update_resource`` or ``_resource`` (a forked child's ``process.pid``):
  else the child's spans keep the parent's resource.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context

from otelkit._core.deps import degraded

__all__ = [
    "RUNTIME_CONTEXT",
    "SPAN_KEY",
    "SUPPRESS_INSTRUMENTATION_KEY",
    "RuntimeContext",
    "active_span_processor",
    "context_reader",
    "merge_resource",
]

_API = "opentelemetry-api"
_SDK = "opentelemetry-sdk"


class RuntimeContext(Protocol):
    """What otelkit calls on OpenTelemetry's runtime context."""

    def attach(self, context: Context) -> object: ...

    def detach(self, token: Any) -> None: ...

    def get_current(self) -> Context: ...


class _PublicRuntime:
    """The API's functions in place of the runtime's methods: a call or two more each."""

    def attach(self, context: Context) -> object:
        return otel_context.attach(context)

    def detach(self, token: Any) -> None:
        otel_context.detach(token)

    def get_current(self) -> Context:
        return otel_context.get_current()


def _runtime_context(module: Any = otel_context) -> RuntimeContext:
    runtime: RuntimeContext | None = getattr(module, "_RUNTIME_CONTEXT", None)
    if runtime is None or not all(
        callable(getattr(runtime, name, None)) for name in ("attach", "detach", "get_current")
    ):
        degraded(
            _API,
            "opentelemetry.context._RUNTIME_CONTEXT",
            "attaches and reads contexts through opentelemetry.context's functions (slower)",
        )
        return _PublicRuntime()
    return runtime


#: Attach, detach and read the current context (the runtime's own methods where it has them).
RUNTIME_CONTEXT: RuntimeContext = _runtime_context()


def context_reader(runtime: object = RUNTIME_CONTEXT) -> Callable[[], Context]:
    """The fastest reader of the current ``Context``: the default runtime's ``ContextVar``,
    else the runtime's ``get_current``. Any other runtime (``OTEL_PYTHON_CONTEXT``) goes its
    own way, quietly."""
    variable = getattr(runtime, "_current_context", None)
    if isinstance(variable, contextvars.ContextVar):
        read: Callable[[], Context] = variable.get
        return read
    if type(runtime).__name__ == "ContextVarsRuntimeContext":
        degraded(
            _API,
            "ContextVarsRuntimeContext._current_context",
            "reads the current context through the runtime's get_current (slower)",
        )
    get_current: Callable[[], Context] = getattr(runtime, "get_current", otel_context.get_current)
    return get_current


def _key_set_by(context: Context) -> str:
    """The one key the public API added to an empty context."""
    return next(iter(context))


def _span_key(module: Any = None) -> str:
    if module is None:
        from opentelemetry.trace import propagation as module
    key = getattr(module, "_SPAN_KEY", None)
    if isinstance(key, str):
        return key
    degraded(
        _API,
        "opentelemetry.trace.propagation._SPAN_KEY",
        "finds the span key through trace.set_span_in_context",
    )
    return _key_set_by(trace.set_span_in_context(trace.INVALID_SPAN, Context()))


def _suppress_key(module: Any = otel_context) -> str:
    key = getattr(module, "_SUPPRESS_INSTRUMENTATION_KEY", None)
    if isinstance(key, str):
        return key
    try:
        from opentelemetry.instrumentation.utils import suppress_instrumentation
    except ImportError:
        instead = "sees instrumentation suppressed by the plain 'suppress_instrumentation' key only"
        degraded(_API, "opentelemetry.context._SUPPRESS_INSTRUMENTATION_KEY", instead)
        return "suppress_instrumentation"
    degraded(
        _API,
        "opentelemetry.context._SUPPRESS_INSTRUMENTATION_KEY",
        "finds the key through opentelemetry.instrumentation.utils.suppress_instrumentation",
    )
    before = set(otel_context.get_current())
    with suppress_instrumentation():
        added = [k for k in otel_context.get_current() if k not in before]
    return added[0] if added else "suppress_instrumentation"


#: The key of the current span in a ``Context``.
SPAN_KEY: str = _span_key()
#: The key that ``suppress_instrumentation()`` sets in a ``Context``.
SUPPRESS_INSTRUMENTATION_KEY: str = _suppress_key()


def active_span_processor(provider: object) -> Any | None:
    """The SDK ``TracerProvider``'s span processor (all of its processors in one), or ``None``:
    spans then start through the SDK's tracer."""
    processor = getattr(provider, "_active_span_processor", None)
    if processor is None or not callable(getattr(processor, "on_end", None)):
        degraded(
            _SDK,
            "TracerProvider._active_span_processor",
            "starts its spans through the SDK's tracer (slower; the same spans)",
        )
        return None
    return processor


def merge_resource(provider: Any, addition: Any) -> bool:
    """Merge ``addition`` into an SDK ``TracerProvider``'s resource (a forked child's
    ``process.pid``): the SDK's own ``_update_resource`` (which its tracers follow), else its
    ``_resource``. ``False`` when it has neither: the spans keep the resource they had."""
    update = getattr(provider, "_update_resource", None)
    if callable(update):
        update(addition)
        return True
    if hasattr(provider, "_resource"):
        provider._resource = provider.resource.merge(addition)
        return True
    degraded(
        _SDK,
        "TracerProvider._update_resource and _resource",
        "leaves a forked child's spans with its parent's resource (process.pid)",
    )
    return False
