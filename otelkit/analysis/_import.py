"""``otelkit import``: trace files into the span store's Parquet segments (``_store``).

otelkit import ./otelkit-traces collector/traces.jsonl.gz --out ./span-store
otelkit import jaeger://jaeger:16685 --service sonic --since 2h --out ./span-store
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path

from otelkit.analysis._command import add_selection_arguments, selection_of
from otelkit.analysis._fast_import import import_files
from otelkit.analysis._loader import iter_spans, trace_files
from otelkit.analysis._source import import_store, is_store
from otelkit.analysis._store import SUFFIX, StoreError, write_segment

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Convert trace files (OTLP JSON lines, plain or gzipped: otelkit's receiver's, the "
        "Collector's file exporter's) into zstd Parquet segments of otelkit's span store, "
        "which breakdown, report and study read as they read JSON, parsed once."
    )
    parser.add_argument(
        "paths",
        nargs="+",
        help="trace files, or folders holding them; or a trace store: a ClickHouse holding "
        "the Collector's otel_traces, clickhouse://user:password@host:8123/database "
        "(chdb:///path: chDB's), Jaeger v2, jaeger://host:16685 (gRPC) or "
        "jaeger+http://host:16686, Tempo, tempo://host:3200",
    )
    parser.add_argument("--out", required=True, help="the store's folder")
    add_selection_arguments(parser)
    parser.add_argument(
        "--segment-spans",
        type=int,
        default=1_000_000,
        help="spans a segment holds at most (default: 1,000,000)",
    )


def run(args: argparse.Namespace) -> int:
    if args.segment_spans < 1:
        print("otelkit import: --segment-spans must be at least 1", file=sys.stderr)
        return 2
    stores = [p for p in args.paths if is_store(p)]
    if stores:
        return _from_stores(args, stores)
    try:
        sources = [p for p in trace_files(*args.paths) if not p.name.endswith(SUFFIX)]
        out = Path(args.out)
        if _fast():
            # DuckDB reads each file it can show it reads as the Python path does (the same
            # rows), the Python path the others (_fast_import)
            result = import_files(sources, out, args.segment_spans)
            total, segments = result.spans, len(result.segments)
            if result.fallback:
                print(
                    f"otelkit import: {len(result.fallback)} of {len(sources)} files read by "
                    "the Python path (slower), not DuckDB: "
                    + "; ".join(f"{path}: {why}" for path, why in result.fallback.items()),
                    file=sys.stderr,
                )
        else:
            total, segments = _python(sources, out, args.segment_spans)
    except (FileNotFoundError, StoreError, OSError) as error:
        print(f"otelkit import: {error}", file=sys.stderr)
        return 2
    print(f"{total} spans from {len(sources)} files into {segments} segments in {out}")
    return 0 if total else 1


def _fast() -> bool:
    """Whether the fast path reads local files: DuckDB and pyarrow installed, and not turned
    off (``OTELKIT_IMPORT_ENGINE=python``: the Python path reads every file)."""
    import importlib.util

    if os.environ.get("OTELKIT_IMPORT_ENGINE", "auto").lower() == "python":
        return False
    return all(importlib.util.find_spec(name) is not None for name in ("duckdb", "pyarrow"))


def _python(sources: list[Path], out: Path, segment_spans: int) -> tuple[int, int]:
    """The Python path: every span a ``Span`` and a dict on its way to Parquet; the spans
    and segments written."""
    spans = iter_spans(*sources)
    first = len(list(out.glob(f"spans-*{SUFFIX}"))) if out.is_dir() else 0
    total = segments = 0
    while True:  # a segment's spans stream into it: an import holds a row group at most
        target = out / f"spans-{first + segments:05d}{SUFFIX}"
        written = write_segment(itertools.islice(spans, segment_spans), target)
        if not written:
            target.unlink()
            break
        total += written
        segments += 1
        if written < segment_spans:
            break
    return total, segments


def _from_stores(args: argparse.Namespace, stores: list[str]) -> int:
    if len(stores) != len(args.paths):
        print("otelkit import: a trace store is imported alone", file=sys.stderr)
        return 2
    total = segments = left_out = capped = partial = 0
    try:
        selection = selection_of(args)
        for url in stores:
            found = import_store(
                url, args.out, selection, segment_spans=args.segment_spans, table=args.table
            )
            total, segments = total + found.spans, segments + found.segments
            left_out, capped = left_out + found.left_out, capped + found.capped
            partial += found.partial
    except (StoreError, OSError, ValueError) as error:
        print(f"otelkit import: {error}", file=sys.stderr)
        return 2
    print(f"{total} spans into {segments} segments in {args.out}")
    if left_out:
        print(f"{left_out} traces found but left out (not fetched whole)", file=sys.stderr)
    if partial:
        print(
            f"{partial} traces written partial: a span's parent is not among its spans",
            file=sys.stderr,
        )
    if capped:
        print(
            f"{capped} searches returned their limit at the smallest window: traces beyond it "
            "were not seen",
            file=sys.stderr,
        )
    return 0 if total else 1
