"""``otelkit report``: one self-contained HTML page of traces and study results, and figures.

The page holds the breakdown per group with its checks, a study's plots and verdicts, a trace
waterfall (the median, p99 and slowest trace of each group, or any trace by its id) and the
run's facts; scripts, styles and data inline, so it opens anywhere with nothing fetched.

>>> from otelkit.report import Report
>>> report = Report.build(traces=["demo-output/traces"], group_by=["gnn_tracking.option"],
...                       studies=["study.jsonl"])  # doctest: +SKIP
>>> report.write_html("report.html"), report.write_figures("figures")  # doctest: +SKIP

From the shell: ``otelkit report demo-output/traces --study study.jsonl --out report.html``.
"""

from __future__ import annotations

from otelkit.report._report import Report

__all__ = ["Report"]
