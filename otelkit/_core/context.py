"""The current OpenTelemetry ``Context``, read the short way where the runtime allows;
OpenTelemetry's instrumentation suppressed for otelkit's own calls, and whether a caller has
suppressed it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry import context as otel_context
from opentelemetry.context import Context

from otelkit._core.deps.otel import SUPPRESS_INSTRUMENTATION_KEY, context_reader

__all__ = ["SUPPRESSED_KEYS", "current_context", "instrumentation_suppressed", "is_suppressed"]

# What ``opentelemetry.instrumentation.utils.suppress_instrumentation()`` sets, and what every
# contrib instrumentation checks before it makes a span, records a metric or injects a
# context: the API's key, and the plain string that older instrumentations set by hand.
SUPPRESSED_KEYS = (SUPPRESS_INSTRUMENTATION_KEY, "suppress_instrumentation")


@contextlib.contextmanager
def instrumentation_suppressed() -> Iterator[None]:
    """Run the block with OpenTelemetry instrumentation suppressed: the context key that every
    contrib instrumentation (gRPC, requests, urllib3, ...) checks before it makes a span or
    injects a context. The SDK's own processors export this way; so do otelkit's, lest an
    instrumented HTTP or gRPC library trace every export, and export that span in turn."""
    token = otel_context.attach(otel_context.set_value(SUPPRESS_INSTRUMENTATION_KEY, True))
    try:
        yield
    finally:
        otel_context.detach(token)


# The default runtime keeps the current ``Context`` in one ``ContextVar``; reading it directly
# costs a fraction of the API's call chain (``deps.otel.context_reader``).
current_context = context_reader()


def is_suppressed(context: Context | None = None) -> bool:
    """Whether the caller runs with OpenTelemetry instrumentation suppressed (``context``: the
    current one when not given); otelkit then adds no telemetry to the calls it starts."""
    found = current_context() if context is None else context
    return any(found.get(key) for key in SUPPRESSED_KEYS)
