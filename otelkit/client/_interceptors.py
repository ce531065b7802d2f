"""gRPC channels with interceptors, OpenTelemetry's own gRPC instrumentation among them.

``opentelemetry-bootstrap`` installs ``opentelemetry-instrumentation-grpc`` wherever grpcio is,
and under ``opentelemetry-instrument`` its interceptor wraps every channel a program opens,
tritonclient's too. Left alone, it would give each Triton call a second CLIENT span and
replace the ``traceparent`` otelkit sends with its own span's, a root of another trace
(otelkit's span is not the current OpenTelemetry span: making it so costs every call), so
that Triton's spans would leave otelkit's trace; a call otelkit did not sample would send a
context sampled on its own, which Triton traces (see ``_call.with_trace_context``).

So on a channel with interceptors otelkit's transport calls run with OpenTelemetry
instrumentation suppressed, the context key that every contrib instrumentation checks: one
CLIENT span per call, otelkit's, and the context otelkit decided on reaches Triton. The
interceptors themselves still run (a user's credentials, retries); a channel without any pays
nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from otelkit._context import instrumentation_suppressed

__all__ = ["Suppressed", "channel_target", "intercepted"]

_INTERCEPTOR_LISTS = ("_unary_unary_interceptors", "_unary_stream_interceptors",
                      "_stream_unary_interceptors", "_stream_stream_interceptors")  # fmt: skip


def intercepted(channel: Any) -> bool:
    """Whether calls on ``channel`` (a sync or an asyncio gRPC channel) pass interceptors."""
    if hasattr(channel, "_interceptor"):  # grpc.intercept_channel's wrapper
        return True
    return any(getattr(channel, name, None) for name in _INTERCEPTOR_LISTS)  # grpc.aio's


def channel_target(channel: Any) -> str:
    """The target ``channel`` connects to, found under the wrappers interceptors put around
    it (``AttributeError`` for something that is not a gRPC channel)."""
    for _ in range(16):
        channel = channel._channel
        target = getattr(channel, "target", None)
        if target is not None:
            target = target() if callable(target) else target
            return target.decode() if isinstance(target, bytes) else str(target)
    raise AttributeError("no gRPC channel target under 16 wrappers")


def _suppressed(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, run with OpenTelemetry instrumentation suppressed in the current context
    (an asyncio call's task copies it as it is created, inside the call)."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        with instrumentation_suppressed():
            return function(*args, **kwargs)

    return run


class Suppressed:
    """A multicallable (a stub's ``ModelInfer`` or ``ModelStreamInfer``) whose calls, futures
    and ``with_call`` run with OpenTelemetry instrumentation suppressed; anything else is the
    multicallable's."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with instrumentation_suppressed():
            return self._inner(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        return _suppressed(found) if name in ("future", "with_call") else found
