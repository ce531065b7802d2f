"""Trace analysis: load OTLP JSON traces (otelkit's receiver, the Collector's file exporter) and
split each into where its time went (client, network, load balancer, server queue, stages).

>>> from otelkit.analysis import breakdown, build_traces, format_breakdowns, load_spans
>>> traces = build_traces(load_spans("otelkit-traces"))  # doctest: +SKIP
>>> print(format_breakdowns(breakdown(traces, group_by=["otelkit.option"])))  # doctest: +SKIP
"""

from __future__ import annotations

from otelkit.analysis._breakdown import (
    Breakdown,
    SlowestStage,
    answered_by,
    breakdown,
    format_breakdowns,
    group_key,
    trace_components,
)
from otelkit.analysis._loader import (
    Span,
    SpanEvent,
    SpanKind,
    SpanLink,
    StatusCode,
    Trace,
    build_traces,
    iter_spans,
    load_spans,
    trace_files,
)
from otelkit.analysis._source import Selection, SpanSource, open_source

__all__ = [
    "Breakdown",
    "Selection",
    "SlowestStage",
    "Span",
    "SpanEvent",
    "SpanKind",
    "SpanLink",
    "SpanSource",
    "StatusCode",
    "Trace",
    "answered_by",
    "breakdown",
    "build_traces",
    "format_breakdowns",
    "group_key",
    "iter_spans",
    "load_spans",
    "open_source",
    "trace_components",
    "trace_files",
]
