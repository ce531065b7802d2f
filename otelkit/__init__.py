"""otelkit: see where the time goes in inference as a service, per request and for the fleet.

>>> import otelkit
>>> otelkit.configure(service_name="tracking-client")   # OTEL_* / OTELKIT_* env vars work too
>>> client = otelkit.instrument(tritonclient.grpc.InferenceServerClient("gpu-node:8001"))
>>> otelkit.inject(headers)                              # W3C traceparent, tracestate, baggage
>>> @otelkit.stage("frnn")                              # server side: a span + histogram per run
... def build_graph(points): ...

The whole public API is listed in ``__all__``; everything else is private or in a named
subpackage (``otelkit.analysis``, ``otelkit.semconv``, ``otelkit.receiver``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from otelkit._errors import ConfigError, MissingExtraError, OtelkitError
from otelkit._propagation import extract, inject
from otelkit.server import stage

if TYPE_CHECKING:
    from otelkit._instrumentation import instrument, uninstrument
    from otelkit.telemetry import Telemetry, configure, flush, shutdown

__all__ = [
    "ConfigError",
    "MissingExtraError",
    "OtelkitError",
    "Telemetry",
    "configure",
    "extract",
    "flush",
    "inject",
    "instrument",
    "shutdown",
    "stage",
    "uninstrument",
]

# A Triton Python-backend instance or a PyTriton worker may only time stages: it should not
# import the SDK's providers, the exporters and their clients (requests, protobuf,
# prometheus_client) that configure() and instrument() bring. They come with the first use of
# one of these names, which then stays in the module's namespace.
_TELEMETRY = frozenset({"Telemetry", "configure", "flush", "shutdown"})
_INSTRUMENTATION = frozenset({"instrument", "uninstrument"})


def __getattr__(name: str) -> Any:
    if name in _TELEMETRY:
        from otelkit import telemetry

        value = getattr(telemetry, name)
    elif name in _INSTRUMENTATION:
        from otelkit import _instrumentation

        value = getattr(_instrumentation, name)
    else:
        raise AttributeError(f"module 'otelkit' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
