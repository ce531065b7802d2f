"""Ray Serve requests as spans, on both ends of a ``DeploymentHandle`` call and of a batch.

The caller's side (``carry``): when a handle makes a request's metadata, the current trace
context and the time of the call are put on it, as the attribute ``_otelkit_carrier`` of the
``RequestMetadata`` object, which Serve pickles whole to the replica. Serve's own field
``tracing_context`` cannot carry it: Serve's router overwrites it with ``None`` unless Serve's
own tracing records a span.

The replica's side: ``HandleCall`` is one request a handle or Serve's gRPC proxy sent (a SERVER
span parented on the carried context or on the gRPC call's metadata, a ``queued`` span from
the call until the replica took it, the duration histogram); ``BatchCall`` is one
``@serve.batch`` call, linked to the span of every request in it. A request through Serve's HTTP
proxy is traced by the FastAPI integration's code (``otelkit.server.fastapi``: spec-exact
``traceparent``, HTTP server conventions), not here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind

from otelkit import semconv
from otelkit._core.deps.otel import RUNTIME_CONTEXT
from otelkit._core.guard import internal_error
from otelkit._core.hotmetrics import HOT
from otelkit._core.spans import LeanSpan, RecordingSpan, SpanRecorder, with_own_parent_id, with_span
from otelkit._propagation import extract, inject

__all__ = ["CARRIER", "BatchCall", "HandleCall", "Replica", "carry", "links_of", "nest"]

CARRIER = "_otelkit_carrier"  # the RequestMetadata attribute: (headers, time of the call in ns)
_RECORDER = SpanRecorder("otelkit.server.ray_serve", server=True)
_LABELS = (semconv.M_DEPLOYMENT, semconv.M_APPLICATION, semconv.M_METHOD, semconv.M_ERROR_TYPE)
_DURATION = HOT.histogram(semconv.RAY_SERVE_CALL_DURATION, _LABELS)
_runtime = RUNTIME_CONTEXT


class Replica:
    """Who serves: the deployment, replica and application of this process's replica."""

    __slots__ = ("application", "attributes", "deployment", "replica")

    def __init__(self, deployment: str, replica: str, application: str) -> None:
        self.deployment, self.replica, self.application = deployment, replica, application
        self.attributes = {
            semconv.RAY_SERVE_DEPLOYMENT: deployment,
            semconv.RAY_SERVE_REPLICA: replica,
            semconv.RAY_SERVE_APPLICATION: application,
        }

    @classmethod
    def current(cls) -> Replica:
        """This process's replica, as Serve's replica context names it."""
        from ray import serve

        context = serve.get_replica_context()
        return cls(context.deployment, context.replica_id.unique_id, context.app_name)


def carry(metadata: Any) -> None:
    """Put the caller's trace context and the time of the call on a handle's request."""
    try:
        headers: dict[str, str] = inject({})
        if headers:
            setattr(metadata, CARRIER, (headers, time.time_ns()))
    except Exception:
        internal_error("carrying the trace context over a DeploymentHandle call")


class HandleCall:
    """One request from a ``DeploymentHandle``, as the replica runs it."""

    __slots__ = ("method", "replica", "span", "start_s", "token")

    def __init__(self, replica: Replica, metadata: Any) -> None:
        carried = getattr(metadata, CARRIER, None)
        headers, sent_ns = carried if carried is not None else (_grpc_headers(metadata), 0)
        caller = extract(headers) if headers else Context()
        parent = nest(caller)
        self.replica, self.method = replica, str(getattr(metadata, "call_method", "__call__"))
        now_ns = time.time_ns()
        if sent_ns and trace.get_current_span(caller).get_span_context().is_valid:
            _queued(caller, sent_ns, now_ns, replica)
        name = f"{replica.deployment}.{self.method}"
        self.span = span = _RECORDER.start(name, SpanKind.SERVER, parent)
        if span.sampled:
            span.attributes.update(replica.attributes)
            span.attributes[semconv.RAY_SERVE_METHOD] = self.method
            if route := getattr(metadata, "route", ""):
                span.attributes[semconv.RAY_SERVE_ROUTE] = route
            context = with_span(span.context, parent)
        else:
            context = with_own_parent_id(parent)
        self.token = _runtime.attach(context)
        self.start_s = time.perf_counter()

    @classmethod
    def start(cls, replica: Replica | None, metadata: Any) -> HandleCall | None:
        """The call's span started and made current, or ``None`` if otelkit failed."""
        if replica is None:
            return None
        try:
            return cls(replica, metadata)
        except Exception:
            internal_error("starting a Ray Serve handle call's span")
            return None

    def finish(self, error: BaseException | None) -> None:
        """End the span, observe the duration; never raises."""
        seconds = time.perf_counter() - self.start_s
        try:
            _runtime.detach(self.token)
            kind = "" if error is None else type(error).__qualname__
            replica = self.replica
            series = _DURATION.series((replica.deployment, replica.application, self.method, kind))
            span = self.span
            if not span.sampled:
                series.observe(seconds)
                return
            if error is not None:
                span.record_error(error)
            series.observe(seconds, span.context.trace_id, span.context.span_id)
            span.end()
        except Exception:
            internal_error("ending a Ray Serve handle call's span")


def nest(parent: Context) -> Context:
    """The current context where its span continues ``parent``'s trace (Serve's own span of
    this request, when Serve's tracing is on: otelkit's span then nests in it), else
    ``parent``."""
    current = trace.get_current_span().get_span_context()
    wanted = trace.get_current_span(parent).get_span_context()
    if current.is_valid and wanted.is_valid and current.trace_id == wanted.trace_id:
        return RUNTIME_CONTEXT.get_current()
    return parent


def _grpc_headers(metadata: Any) -> dict[str, str]:
    """The trace context of a request through Serve's gRPC proxy: its gRPC metadata, which
    Serve hands the replica (the proxy runs no otelkit, so nothing was carried)."""
    context = getattr(metadata, "grpc_context", None)
    if context is None:
        return {}
    return {key: value for key, value in context.invocation_metadata() if isinstance(value, str)}


def _queued(parent: Context, sent_ns: int, now_ns: int, replica: Replica) -> None:
    """The wait from ``.remote()`` until this replica took the request, as a span."""
    span = _RECORDER.start(semconv.RAY_SERVE_QUEUE_SPAN, SpanKind.INTERNAL, parent)
    if not span.sampled:
        return
    span.attributes.update(replica.attributes)
    if isinstance(span, LeanSpan):  # the SDK's spans cannot start in the past once started
        span.start_ns = min(sent_ns, now_ns)
    span.end(now_ns)


def links_of(contexts: Sequence[Any]) -> list[Link]:
    """A link to the span current in each request's context (requests without one skipped)."""
    links = []
    for context in contexts:
        if context is None:
            continue
        span_context = trace.get_current_span(context).get_span_context()
        if span_context.is_valid:
            links.append(Link(span_context))
    return links


class BatchCall:
    """One ``@serve.batch`` call: a span under the first request, linked to every request."""

    __slots__ = ("span", "token")

    def __init__(self, function: str, contexts: Sequence[Any], replica: Replica | None) -> None:
        parent = next((c for c in contexts if c is not None), None) or Context()
        links = links_of(contexts)
        name = f"{semconv.RAY_SERVE_BATCH_SPAN} {function}"
        self.span: RecordingSpan = _RECORDER.start(name, SpanKind.INTERNAL, parent, links)
        if self.span.sampled:
            self.span.attributes[semconv.RAY_SERVE_BATCH_SIZE] = len(contexts)
            self.span.attributes.update(replica.attributes if replica else {})
            context = with_span(self.span.context, parent)
        else:
            context = with_own_parent_id(parent)
        self.token = _runtime.attach(context)

    @classmethod
    def start(
        cls, function: str, contexts: Sequence[Any], replica: Replica | None
    ) -> BatchCall | None:
        """The batch's span started and made current, or ``None`` if otelkit failed."""
        try:
            return cls(function, contexts, replica)
        except Exception:
            internal_error("starting a Ray Serve batch span")
            return None

    def lend(self, requests: Sequence[Any]) -> None:
        """Serve's tracing makes the first request's context current around the batch's
        function: each request carries the batch span's instead, so the function's spans nest
        in the batch's (a request's own context is read before, for the links)."""
        try:
            current = _runtime.get_current()
            for request in requests:
                if hasattr(request, "trace_context"):
                    request.trace_context = current
        except Exception:
            internal_error("handing a Ray Serve batch span to Serve's tracing")

    def finish(self, error: BaseException | None) -> None:
        """End the span; never raises."""
        try:
            _runtime.detach(self.token)
            if self.span.sampled:
                if error is not None:
                    self.span.record_error(error)
                self.span.end()
        except Exception:
            internal_error("ending a Ray Serve batch span")
