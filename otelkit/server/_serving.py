"""What every server integration does around a request: its SERVER span made current, the
span's name and status set once the outcome is known, the duration observed with its exemplar.

Shared by the HTTP (``otelkit.server.fastapi``) and gRPC (``otelkit.server.grpc``) servers, so
that both follow a caller's trace, name their spans and file their exemplars the same way.
"""

from __future__ import annotations

from opentelemetry.context import Context
from opentelemetry.trace import Status, StatusCode

from otelkit._core.deps.otel import RUNTIME_CONTEXT
from otelkit._core.hotmetrics import HistogramSeries
from otelkit._core.spans import LeanSpan, RecordingSpan, SdkSpan, with_own_parent_id, with_span

__all__ = ["enter", "leave", "observe", "rename", "set_error_status"]

_current_context = RUNTIME_CONTEXT


def enter(span: RecordingSpan, parent: Context) -> object:
    """Make ``span`` current for the request's handler; the token ``leave`` takes.

    A request not sampled still passes the caller's trace on to stages and calls downstream,
    under a span id of this service's own (Trace Context Level 2).
    """
    context = with_span(span.context, parent) if span.sampled else with_own_parent_id(parent)
    return _current_context.attach(context)


def leave(token: object) -> None:
    """Undo ``enter``."""
    _current_context.detach(token)  # the Token that enter returned


def observe(series: HistogramSeries, seconds: float, span: RecordingSpan) -> None:
    """Count ``seconds``; a sampled span's ids become its bucket's exemplar."""
    if span.sampled:
        series.observe(seconds, span.context.trace_id, span.context.span_id)
    else:
        series.observe(seconds)


def rename(span: RecordingSpan, name: str) -> None:
    """Rename a span whose name was known only after it started (an HTTP route)."""
    if isinstance(span, LeanSpan):
        span.name = name
    elif isinstance(span, SdkSpan):
        span._span.update_name(name)


def set_error_status(span: RecordingSpan, description: str | None = None) -> None:
    """Mark ``span`` failed without an exception to record (a 5xx answer, a gRPC status)."""
    status = Status(StatusCode.ERROR, description)
    if isinstance(span, LeanSpan):
        span.status = status
    elif isinstance(span, SdkSpan):
        span._span.set_status(status)
