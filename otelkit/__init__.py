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

from otelkit._errors import ConfigError, MissingExtraError, OtelkitError
from otelkit._instrumentation import instrument, uninstrument
from otelkit._propagation import extract, inject
from otelkit.server import stage
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
