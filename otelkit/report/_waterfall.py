"""A trace as the page's waterfall draws it: spans in tree order, times relative to the trace.

Each span becomes one row: its depth in the tree, offset and duration in microseconds from the
trace's first span, its service, kind, status, attributes and events (Triton's ``QUEUE_START``,
``COMPUTE_START`` and the rest become marks on its bar). Keys are one letter because a report
carries thousands of spans and the page's size is a budget; ``page.js`` reads them.

Times are offsets, not epoch nanoseconds: JavaScript's numbers hold integers exactly only up to
2⁵³, and epoch nanoseconds are past 2⁶⁰.

>>> from otelkit.analysis import Span, SpanKind, build_traces
>>> root = Span("ab" * 16, "01" * 8, None, "event", SpanKind.INTERNAL, 1_000, 9_000)
>>> call = Span("ab" * 16, "02" * 8, "01" * 8, "infer", SpanKind.CLIENT, 2_000, 8_000)
>>> rows = encode_trace(build_traces([call, root])["ab" * 16], "all")["spans"]
>>> [(r["n"], r["l"], r["t"], r["d"]) for r in rows]
[('event', 0, 0.0, 8.0), ('infer', 1, 1.0, 6.0)]
"""

from __future__ import annotations

from typing import Any

from otelkit.analysis import Span, StatusCode, Trace

__all__ = ["encode_trace", "json_value"]

_MAX_VALUE_CHARS = 300  # an attribute longer than this (a tensor dump, say) is cut


def json_value(value: Any) -> str | int | float | bool | None:
    """An attribute value the page can show: scalars kept, the rest as (cut) text.

    >>> json_value(b"\\x00\\x01"), json_value([1, 2]), json_value(float("nan"))
    ("b'\\\\x00\\\\x01'", '[1, 2]', 'nan')
    """
    if isinstance(value, bool | int | str) or value is None:
        return value if not isinstance(value, str) else value[:_MAX_VALUE_CHARS]
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    return str(value)[:_MAX_VALUE_CHARS]


def _us(ns: int) -> float:
    return round(ns / 1e3, 1)


def _span_row(span: Span, depth: int, origin_ns: int) -> dict[str, Any]:
    status = ""
    if span.status_code == StatusCode.ERROR:
        status = f"error: {span.status_message}" if span.status_message else "error"
    return {
        "i": span.span_id,
        "p": span.parent_span_id or "",
        "n": span.name,
        "s": str(span.resource.get("service.name", "")),
        "k": span.kind.name.lower(),
        "l": depth,
        "t": _us(span.start_ns - origin_ns),
        "d": _us(span.duration_ns),
        "x": status,
        "a": {key: json_value(value) for key, value in span.attributes.items()},
        "e": [[event.name, _us(event.time_ns - origin_ns)] for event in span.events],
    }


def encode_trace(trace: Trace, group: str) -> dict[str, Any]:
    """The page's form of ``trace``: its id, group, start (epoch µs), length and span rows."""
    origin = min(span.start_ns for span in trace.spans.values())
    end = max(span.end_ns for span in trace.spans.values())
    return {
        "id": trace.trace_id,
        "g": group,
        "start_us": origin // 1000,
        "d": _us(end - origin),
        "spans": [_span_row(span, depth, origin) for depth, span in trace.walk()],
    }
