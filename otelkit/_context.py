"""The current OpenTelemetry ``Context``, read the short way where the runtime allows; and
OpenTelemetry's instrumentation suppressed for otelkit's own calls."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

from opentelemetry import context as otel_context
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, Context

__all__ = ["current_context", "instrumentation_suppressed"]


@contextlib.contextmanager
def instrumentation_suppressed() -> Iterator[None]:
    """Run the block with OpenTelemetry instrumentation suppressed: the context key that every
    contrib instrumentation (gRPC, requests, urllib3, ...) checks before it makes a span or
    injects a context. The SDK's own processors export this way; so do otelkit's, lest an
    instrumented HTTP or gRPC library trace every export, and export that span in turn."""
    token = otel_context.attach(otel_context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
    try:
        yield
    finally:
        otel_context.detach(token)


def _context_reader() -> Callable[[], Context]:
    """``opentelemetry.context.get_current``, minus three calls where the runtime allows.

    The default runtime context keeps the current ``Context`` in one ``ContextVar``; reading
    it directly costs a fraction of the API's call chain. Any other runtime goes the API way.
    """
    runtime = getattr(otel_context, "_RUNTIME_CONTEXT", None)
    variable = getattr(runtime, "_current_context", None)
    if isinstance(variable, contextvars.ContextVar):
        read: Callable[[], Context] = variable.get
        return read
    return otel_context.get_current


current_context = _context_reader()
