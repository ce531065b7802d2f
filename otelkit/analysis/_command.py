"""``otelkit breakdown``: where the time of traced requests goes, from trace files or the
span store (by DuckDB where every file is a segment).

otelkit breakdown ./otelkit-traces --group-by gnn_tracking.option --root "reconstruct event"
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from otelkit.analysis._breakdown import breakdown, format_breakdowns
from otelkit.analysis._loader import build_traces, load_spans, trace_files
from otelkit.analysis._store import SUFFIX

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", help="OTLP JSON files, or folders holding them")
    parser.add_argument("--group-by", action="append", default=[], help="root attribute key")
    parser.add_argument("--root", default=None, help="only roots with this span name")
    parser.add_argument(
        "--engine",
        choices=("auto", "duckdb", "python"),
        default="auto",
        help="duckdb: SQL over span store segments (otelkit import), no Python object per "
        "span; python: every span read into Python; auto (default): duckdb where every "
        "file is a segment and DuckDB is installed",
    )


def _engine(args: argparse.Namespace, files: list[Path]) -> str:
    """The engine that breaks ``files`` down ("" and a message printed: none can)."""
    segments = bool(files) and all(path.name.endswith(SUFFIX) for path in files)
    if args.engine == "python" or (args.engine == "auto" and not segments):
        return "python"
    if not segments:
        print(
            "otelkit breakdown: --engine duckdb reads span store segments only "
            "(otelkit import converts trace files into them)",
            file=sys.stderr,
        )
        return ""
    try:
        import duckdb  # noqa: F401
    except ImportError:
        if args.engine == "auto":
            return "python"
        print(
            "otelkit breakdown: DuckDB is not installed: pip install 'otelkit[store]'",
            file=sys.stderr,
        )
        return ""
    return "duckdb"


def run(args: argparse.Namespace) -> int:
    try:
        files = trace_files(*args.paths)  # once: a folder holding none is warned of once
    except FileNotFoundError as error:
        print(f"otelkit breakdown: {error}", file=sys.stderr)
        return 2
    engine = _engine(args, files)
    if not engine:
        return 2
    if engine == "duckdb":
        from otelkit.analysis._sql import breakdown_store

        found = breakdown_store(files, args.group_by, args.root)
        if not found.spans:
            print(f"otelkit breakdown: no span read from {' '.join(args.paths)}", file=sys.stderr)
            return 1
        print(format_breakdowns(found.groups, labels=args.group_by) or "no complete traces found")
        return 0
    spans = load_spans(*files)
    if not spans:
        where = " ".join(args.paths)
        print(
            f"otelkit breakdown: no span read from {where} (no trace file, or only empty ones)",
            file=sys.stderr,
        )
        return 1
    traces = build_traces(spans)
    groups = breakdown(traces.values(), group_by=args.group_by, root_name=args.root)
    print(format_breakdowns(groups, labels=args.group_by) or "no complete traces found")
    return 0
