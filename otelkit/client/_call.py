"""One inference call as the client sees it: its CLIENT span, its phases, its metrics.

Shared by every tritonclient flavour. A call starts before the request is built and ends when
the result is in the caller's hands; the transport wrappers stamp when the request left
(``sent``) and when the response came back (``received``), which splits the call into client
serialisation, the wire and the server, and client deserialisation.

Telemetry never breaks inference: every step here is guarded, the user's call runs outside the
guard and its exceptions pass through untouched.
"""

from __future__ import annotations

import contextvars
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.trace import SpanKind

from otelkit import semconv
from otelkit._hotmetrics import HOT
from otelkit._spans import SpanRecorder
from otelkit.propagation import headers_for

__all__ = ["CURRENT_CALL", "Call", "ClientTarget", "internal_error"]

logger = logging.getLogger("otelkit")
CURRENT_CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar(
    "otelkit_current_call", default=None
)
_RECORDER = SpanRecorder("otelkit.client")
_RAISE_INTERNAL = os.environ.get("OTELKIT_RAISE_INTERNAL_ERRORS", "") == "1"
_logged_internal = False


def internal_error(where: str) -> None:
    """Log a failure of otelkit's own code once; re-raise it when tests ask for that."""
    global _logged_internal
    if _RAISE_INTERNAL:
        raise
    if not _logged_internal:
        _logged_internal = True
        logger.exception("otelkit: telemetry failed in %s; the inference call is unaffected", where)


def error_type(error: BaseException) -> str:
    """A low-cardinality name for a failure: the gRPC status or HTTP code, else the class."""
    status = getattr(error, "status", None)
    code = status() if callable(status) else None
    if code:
        return str(code).removeprefix("StatusCode.")
    return type(error).__qualname__


class ClientTarget:
    """Everything per instrumented client: where it calls, and its metric series per model."""

    def __init__(self, protocol: str, url: str, system: str, method: str) -> None:
        host, _, port = (
            url.rpartition(":") if "://" not in url else url.split("://", 1)[1].rpartition(":")
        )
        self.server_address = host or url
        self.server_port = int(port) if port.isdigit() else None
        self.server = f"{self.server_address}:{port}" if port else self.server_address
        self.protocol = protocol
        self.system = system
        self.method = method
        self._series: dict[tuple[str, str], tuple[Any, Any, Any, Any]] = {}

    def series(self, model: str, version: str) -> tuple[Any, Any, Any, Any]:
        """Duration, request bytes, response bytes and in-flight series of one model."""
        key = (model, version)
        found = self._series.get(key)
        if found is None:
            labels = (model, version, self.server, self.protocol)
            found = (
                HOT.histogram(semconv.CLIENT_DURATION, _LABELS).series(labels),
                HOT.counter(semconv.CLIENT_REQUEST_BYTES, _LABELS).series(labels),
                HOT.counter(semconv.CLIENT_RESPONSE_BYTES, _LABELS).series(labels),
                HOT.up_down_counter(semconv.CLIENT_IN_FLIGHT, _LABELS).series(labels),
            )
            self._series[key] = found
        return found

    def begin(self, *args: Any) -> Call | None:
        """Start a ``Call(self, *args)``; ``None`` if telemetry failed (the call then runs bare)."""
        try:
            return Call(self, *args)
        except Exception:
            internal_error("starting a client span")
            return None


_LABELS = (semconv.M_MODEL, semconv.M_MODEL_VERSION, semconv.M_SERVER, semconv.M_PROTOCOL)
_ERROR_LABELS = (*_LABELS, semconv.M_ERROR_TYPE)


class Call:
    """One inference request in flight."""

    __slots__ = ("_duration", "_in_flight", "_request_bytes", "_response_bytes", "model",
                 "received_ns", "request_bytes", "response_bytes", "sent_ns", "span", "start",
                 "target", "version")  # fmt: skip

    def __init__(
        self,
        target: ClientTarget,
        model: str,
        version: str,
        request_id: str,
        inputs: Sequence[Any],
        outputs: Sequence[Any] | None,
        style: str,
    ) -> None:
        self.target = target
        self.model = model
        self.version = version
        self.sent_ns = self.received_ns = 0
        self.request_bytes = self.response_bytes = -1
        self._duration, self._request_bytes, self._response_bytes, self._in_flight = target.series(
            model, version
        )
        attributes = {
            semconv.RPC_SYSTEM_NAME: target.system,
            semconv.RPC_METHOD: target.method,
            semconv.SERVER_ADDRESS: target.server_address,
            semconv.MODEL_NAME: model,
            semconv.PROTOCOL: target.protocol,
            semconv.CALL_STYLE: style,
            semconv.INPUT_COUNT: len(inputs),
        }
        if target.server_port is not None:
            attributes[semconv.SERVER_PORT] = target.server_port
        if version:
            attributes[semconv.MODEL_VERSION] = version
        if request_id:
            attributes[semconv.REQUEST_ID] = request_id
        if outputs:
            attributes[semconv.OUTPUT_COUNT] = len(outputs)
        if inputs:
            shape = inputs[0].shape()
            if shape:
                attributes[semconv.BATCH_SIZE] = int(shape[0])
        self.span = _RECORDER.start(f"{target.method} {model}", SpanKind.CLIENT, attributes)
        self._in_flight.add(1)
        self.start = time.perf_counter_ns()

    def headers(self, caller: Mapping[str, str] | None) -> dict[str, str]:
        """The caller's headers, untouched, plus the trace context of this call's span.

        An unsampled call sends no ``traceparent``: Triton traces every request that carries
        a context, whatever its own sampling rate (triton-inference-server/server#8474).
        """
        merged = dict(caller) if caller else {}
        try:
            if self.span.sampled:
                for name, value in headers_for(self.span.context):
                    for existing in [k for k in merged if k.lower() == name]:
                        del merged[existing]
                    merged[name] = value
        except Exception:
            internal_error("injecting trace context")
        return merged

    def sent(self) -> None:
        self.sent_ns = time.perf_counter_ns()

    def received(self) -> None:
        self.received_ns = time.perf_counter_ns()

    def finish(self, error: BaseException | None = None, outputs: int = -1) -> None:
        """End the span and record the metrics; never raises."""
        try:
            self._finish(error, outputs)
        except Exception:
            internal_error("ending a client span")

    def _finish(self, error: BaseException | None, outputs: int) -> None:
        end = time.perf_counter_ns()
        span = self.span
        self._in_flight.add(-1)
        if self.request_bytes >= 0:
            self._request_bytes.add(self.request_bytes)
        if self.response_bytes >= 0:
            self._response_bytes.add(self.response_bytes)
        if error is not None:
            kind = error_type(error)
            labels = (self.model, self.version, self.target.server, self.target.protocol, kind)
            HOT.counter(semconv.CLIENT_ERRORS, _ERROR_LABELS).series(labels).add(1)
        seconds = (end - self.start) / 1e9
        if not span.sampled:
            self._duration.observe(seconds)
            return
        context = span.context
        self._duration.observe(seconds, context.trace_id, context.span_id)
        attributes = span.attributes
        if self.sent_ns:
            attributes[semconv.SERIALIZE_S] = (self.sent_ns - self.start) / 1e9
            if self.received_ns:
                attributes[semconv.WIRE_S] = (self.received_ns - self.sent_ns) / 1e9
                attributes[semconv.DESERIALIZE_S] = (end - self.received_ns) / 1e9
        if self.request_bytes >= 0:
            attributes[semconv.REQUEST_BYTES] = self.request_bytes
        if self.response_bytes >= 0:
            attributes[semconv.RESPONSE_BYTES] = self.response_bytes
        if outputs >= 0 and semconv.OUTPUT_COUNT not in attributes:
            attributes[semconv.OUTPUT_COUNT] = outputs
        if error is not None:
            span.record_error(error)
            attributes[semconv.ERROR_TYPE] = error_type(error)
        span.end()
