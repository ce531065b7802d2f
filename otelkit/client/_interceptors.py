"""Where OpenTelemetry's own instrumentations hook into tritonclient's transports: gRPC
channels with interceptors, and ``aiohttp`` sessions with trace configs.

``opentelemetry-bootstrap`` installs ``opentelemetry-instrumentation-grpc`` wherever grpcio is,
and ``-aiohttp-client`` wherever aiohttp is; under ``opentelemetry-instrument`` their hooks are
on every channel and every session a program opens, tritonclient's too. Left alone, each would
give a Triton call a second CLIENT span and replace the ``traceparent`` otelkit sends with its
own span's, a root of another trace (otelkit's span is not the current OpenTelemetry span:
making it so costs every call), so that Triton's spans would leave otelkit's trace; a call
otelkit did not sample would send a context sampled on its own, which Triton traces (see
``_call.with_trace_context``).

So where such hooks are, otelkit's inference calls run with OpenTelemetry instrumentation
suppressed, the context key that every contrib instrumentation checks: one CLIENT span per
call, otelkit's, and the context otelkit decided on reaches Triton. The hooks themselves still
run (a user's credentials, retries); a channel or a session without any pays nothing, and the
client's other requests (model control, health) stay theirs to trace.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from otelkit._core.context import instrumentation_suppressed

# whether a channel's calls pass interceptors: grpcio's private attributes, guarded there
from otelkit._core.deps.grpcio import intercepted

__all__ = ["Suppressed", "infer_suppressed", "intercepted", "session_traced"]


def _suppressed(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, run with OpenTelemetry instrumentation suppressed in the current context
    (an asyncio call's task copies it as it is created, inside the call)."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        with instrumentation_suppressed():
            return function(*args, **kwargs)

    return run


def session_traced(session: Any) -> bool:
    """Whether requests of ``session`` (an ``aiohttp.ClientSession``, or ``None`` where the
    client keeps none that otelkit finds) pass trace configs; ``True`` for a session that
    does not tell (an aiohttp without ``trace_configs``): suppressing costs it nothing."""
    if session is None:
        return False
    configs = getattr(session, "trace_configs", None)
    return True if configs is None else bool(configs)


def infer_suppressed(post: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """An asyncio HTTP client's ``_post`` whose inference requests (to ``…/infer``) run with
    OpenTelemetry instrumentation suppressed; its other requests run as they are."""

    async def post_infer_suppressed(*args: Any, **kwargs: Any) -> Any:
        uri = kwargs["request_uri"] if "request_uri" in kwargs else args[0] if args else ""
        if not str(uri).endswith("/infer"):
            return await post(*args, **kwargs)
        with instrumentation_suppressed():
            return await post(*args, **kwargs)

    return post_infer_suppressed


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
