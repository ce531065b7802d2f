"""The private parts of ``opentelemetry-instrumentation-grpc`` that otelkit's gRPC server
interceptors build on (``otelkit.server.grpc``).

otelkit subclasses the contrib package's server interceptors
(``opentelemetry.instrumentation.grpc._server.OpenTelemetryServerInterceptor``, and
``_aio_server``'s asyncio twin), which wrap every kind of method handler, and overrides two
of their private methods, ``_set_remote_context`` and ``_start_span``. When a release moves
those modules or renames those methods, ``server_interceptor_bases`` gives a pass-through
interceptor instead, with one log line: RPCs are answered, untraced by otelkit, rather than
every one failing in the contrib's code.
"""

from __future__ import annotations

import importlib
from typing import Any

from otelkit._core.deps import degraded

__all__ = [
    "OVERRIDDEN",
    "PassThroughAioInterceptor",
    "PassThroughInterceptor",
    "server_interceptor_bases",
]

_DISTRIBUTION = "opentelemetry-instrumentation-grpc"
#: The contrib's private methods otelkit overrides, which its ``intercept_service`` calls.
OVERRIDDEN = ("_set_remote_context", "_start_span")
_INSTEAD = "serves RPCs through a pass-through interceptor: untraced by otelkit, still answered"


class PassThroughInterceptor:
    """A ``grpc.ServerInterceptor`` that hands every RPC to its handler untouched."""

    def __init__(self, tracer: Any = None, filter_: Any = None) -> None:
        del tracer, filter_  # the contrib's arguments, taken so that subclasses need not know

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        return continuation(handler_call_details)


class PassThroughAioInterceptor(PassThroughInterceptor):
    """The ``grpc.aio.ServerInterceptor`` twin of ``PassThroughInterceptor``."""

    async def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        return await continuation(handler_call_details)


def _missing(module: str, name: str) -> str | None:
    """What of the contrib's interceptor class otelkit does not find where it expects it,
    with the methods otelkit overrides; ``None`` when all is there."""
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return module
    if not isinstance(found, type):
        return f"{module}.{name}"
    for method in (*OVERRIDDEN, "intercept_service"):
        if not callable(getattr(found, method, None)):
            return f"{module}.{name}.{method}"
    return None


def server_interceptor_bases(grpc: Any) -> tuple[type, type]:
    """The classes otelkit's sync and asyncio server interceptors extend: the contrib's, or
    pass-through interceptors (of ``grpc``'s public base classes) where the contrib's shape
    changed, said in one log line."""
    sync = ("opentelemetry.instrumentation.grpc._server", "OpenTelemetryServerInterceptor")
    aio = ("opentelemetry.instrumentation.grpc._aio_server", "OpenTelemetryAioServerInterceptor")
    missing = [gone for gone in (_missing(*sync), _missing(*aio)) if gone is not None]
    if missing:
        degraded(_DISTRIBUTION, " and ".join(missing), _INSTEAD)
        return (
            type("PassThroughInterceptor", (PassThroughInterceptor, grpc.ServerInterceptor), {}),
            type(
                "PassThroughAioInterceptor",
                (PassThroughAioInterceptor, grpc.aio.ServerInterceptor),
                {},
            ),
        )
    bases: tuple[type, type] = (
        getattr(importlib.import_module(sync[0]), sync[1]),
        getattr(importlib.import_module(aio[0]), aio[1]),
    )
    return bases
