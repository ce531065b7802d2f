"""Trace analysis: load OTLP JSON traces (otelkit's receiver, the Collector's file exporter).

>>> from otelkit.analysis import build_traces, load_spans
>>> traces = build_traces(load_spans("otelkit-traces"))  # doctest: +SKIP
"""

from __future__ import annotations

from otelkit.analysis import loader
from otelkit.analysis.loader import *  # noqa: F403 - the public names are loader's

# Built with `+=`, a form the typing spec lets type checkers follow into loader's list.
__all__: list[str] = []
__all__ += loader.__all__
