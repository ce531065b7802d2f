"""``otelkit report``: the command.

otelkit report demo-output/traces --group-by gnn_tracking.option --out report.html
otelkit report --source tempo://tempo:3200 --service sonic --since 1h --out report.html
otelkit report --study study.jsonl --out report.html  # a study: its traces, grouped by point
otelkit report --study study.jsonl --figures figures/   # a study's plots for a paper
"""

from __future__ import annotations

import argparse
import sys
import time

from otelkit.analysis._command import add_source_arguments, source_of
from otelkit.analysis._store import StoreError
from otelkit.report._report import Report

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="*",
        help="OTLP JSON trace files, or folders holding them at any depth "
        "(default with --study: the study's own traces)",
    )
    parser.add_argument(
        "--study",
        action="append",
        default=[],
        metavar="RESULTS",
        help="an `otelkit study` results file (repeatable); traces are grouped "
        "by its swept parameters unless --group-by says otherwise",
    )
    parser.add_argument("--out", default="report.html", help="the HTML file to write")
    parser.add_argument("--figures", metavar="DIR", help="also write each plot as PNG and SVG")
    parser.add_argument("--group-by", action="append", default=[], help="root attribute key")
    parser.add_argument("--root", default=None, help="only roots with this span name")
    parser.add_argument(
        "--max-spans",
        type=int,
        default=8000,
        help="spans of traces carried beyond each group's median, p99 and "
        "slowest (the trace-id box opens those; the page grows ~0.3 kB a span)",
    )
    parser.add_argument(
        "--grace-s",
        type=float,
        default=10.0,
        help="a trace is complete once the files' clock is this far past its "
        "last span (raise it for exporters that flush less often)",
    )
    parser.add_argument("--title", default="otelkit report")
    parser.add_argument(
        "--engine",
        choices=("auto", "compiled", "python"),
        default="auto",
        help="compiled: span store segments read as columns, each trace broken down in "
        "compiled code (numba), Python objects only for the traces the page draws, each "
        "group's views picked from every trace; python: every span streamed as a Python "
        "object; auto (default): compiled where every file is a segment and numba is installed",
    )
    add_source_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if not args.paths and not args.source and not args.study:
        print("otelkit report: give trace paths, --source, --study results, or a mix")
        return 2
    started = time.monotonic()
    traces: list[str] = []
    if args.paths or args.source:  # through the seam: a store's traces become segments first
        source = source_of(args, "report")
        if source is None:
            return 2
        # none found: the paths as given, which read as empty (not the study's own traces)
        traces = [str(path) for path in source.files] or list(args.paths)
        args.paths = [*args.paths, *source.imported]  # what the messages name
    try:
        report = Report.build(
            traces,
            args.study,
            group_by=args.group_by,
            root_name=args.root,
            max_spans=args.max_spans,
            grace_s=args.grace_s,
            engine=args.engine,
        )
    except (FileNotFoundError, StoreError) as error:
        print(f"otelkit report: {error}", file=sys.stderr)
        return 2
    if not report.facts.spans:
        where = " ".join(map(str, args.paths)) or "where the study's results file says"
        if not report.studies:
            # a page of nothing looks like a run that did nothing: say so, and write none
            print(
                f"otelkit report: no span read from {where} (no trace file, or only empty "
                "ones): no page written",
                file=sys.stderr,
            )
            return 1
        print(
            f"otelkit report: no span read from {where}: the page holds the study alone",
            file=sys.stderr,
        )
    report.title = args.title
    out = report.write_html(args.out)
    size = out.stat().st_size / 1e6
    print(
        f"report: {out.resolve()} ({size:.1f} MB, {report.facts.traces} traces, "
        f"{report.facts.spans} spans, {time.monotonic() - started:.1f} s)"
    )
    if args.figures:
        figures = report.write_figures(args.figures)
        print(f"figures: {len(figures)} files in {args.figures}")
    return 0
