"""Trace analysis: load OTLP JSON traces (otelkit's receiver, the Collector's file exporter).

>>> from otelkit.analysis import build_traces, load_spans
>>> traces = build_traces(load_spans("otelkit-traces"))  # doctest: +SKIP
"""

from __future__ import annotations

from otelkit.analysis.loader import (
    Span,
    SpanEvent,
    SpanKind,
    SpanLink,
    StatusCode,
    Trace,
    build_traces,
    load_spans,
)

__all__ = [
    "Span",
    "SpanEvent",
    "SpanKind",
    "SpanLink",
    "StatusCode",
    "Trace",
    "build_traces",
    "load_spans",
]
