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
        self._per_model: dict[tuple[str, str], _PerModel] = {}

    def per_model(self, model: str, version: str) -> _PerModel:
        """What every call to one model shares: its metric series, span name and attributes."""
        found = self._per_model.get((model, version))
        if found is None:
            found = self._per_model[(model, version)] = _PerModel(self, model, version)
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


class _PerModel:
    """Built once per (client, model, version), so that a call only looks it up."""

    __slots__ = ("attributes", "duration", "in_flight", "labels", "request_bytes",
                 "response_bytes", "span_name")  # fmt: skip

    def __init__(self, target: ClientTarget, model: str, version: str) -> None:
        self.labels = (model, version, target.server, target.protocol)
        self.duration = HOT.histogram(semconv.CLIENT_DURATION, _LABELS).series(self.labels)
        self.request_bytes = HOT.counter(semconv.CLIENT_REQUEST_BYTES, _LABELS).series(self.labels)
        self.response_bytes = HOT.counter(semconv.CLIENT_RESPONSE_BYTES, _LABELS).series(
            self.labels
        )
        self.in_flight = HOT.up_down_counter(semconv.CLIENT_IN_FLIGHT, _LABELS).series(self.labels)
        self.span_name = f"{target.method} {model}"
        self.attributes: dict[str, Any] = {
            semconv.RPC_SYSTEM_NAME: target.system,
            semconv.RPC_METHOD: target.method,
            semconv.SERVER_ADDRESS: target.server_address,
            semconv.MODEL_NAME: model,
            semconv.PROTOCOL: target.protocol,
        }
        if target.server_port is not None:
            self.attributes[semconv.SERVER_PORT] = target.server_port
        if version:
            self.attributes[semconv.MODEL_VERSION] = version


class Call:
    """One inference request in flight."""

    __slots__ = ("per", "received_ns", "request_bytes", "response_bytes", "sent_ns", "span",
                 "start")  # fmt: skip

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
        self.per = per = target.per_model(model, version)
        self.sent_ns = self.received_ns = 0
        self.request_bytes = self.response_bytes = -1
        self.span = span = _RECORDER.start(per.span_name, SpanKind.CLIENT)
        if span.sampled:  # an unsampled call pays for none of the attributes
            attributes = span.attributes
            attributes.update(per.attributes)
            attributes[semconv.CALL_STYLE] = style
            attributes[semconv.INPUT_COUNT] = len(inputs)
            if request_id:
                attributes[semconv.REQUEST_ID] = request_id
            if outputs:
                attributes[semconv.OUTPUT_COUNT] = len(outputs)
            if inputs:
                shape = inputs[0].shape()
                if shape:
                    attributes[semconv.BATCH_SIZE] = int(shape[0])
        per.in_flight.add(1)
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
        span, per = self.span, self.per
        per.in_flight.add(-1)
        if self.request_bytes >= 0:
            per.request_bytes.add(self.request_bytes)
        if self.response_bytes >= 0:
            per.response_bytes.add(self.response_bytes)
        if error is not None:
            labels = (*per.labels, error_type(error))
            HOT.counter(semconv.CLIENT_ERRORS, _ERROR_LABELS).series(labels).add(1)
        seconds = (end - self.start) / 1e9
        if not span.sampled:
            per.duration.observe(seconds)
            return
        context = span.context
        per.duration.observe(seconds, context.trace_id, context.span_id)
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
