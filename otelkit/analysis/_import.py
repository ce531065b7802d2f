"""``otelkit import``: trace files into the span store's Parquet segments (``_store``).

otelkit import ./otelkit-traces collector/traces.jsonl.gz --out ./span-store
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from otelkit.analysis._clickhouse import SCHEMES, import_clickhouse
from otelkit.analysis._loader import iter_spans, trace_files
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
        help="trace files, or folders holding them; or a ClickHouse holding the Collector's "
        "otel_traces: clickhouse://user:password@host:8123/database (chdb:///path: chDB's)",
    )
    parser.add_argument("--out", required=True, help="the store's folder")
    parser.add_argument("--table", default="otel_traces", help="ClickHouse: the spans' table")
    parser.add_argument(
        "--since", type=float, default=None, help="ClickHouse: traces from this Unix time (s)"
    )
    parser.add_argument(
        "--until", type=float, default=None, help="ClickHouse: traces before this Unix time (s)"
    )
    parser.add_argument(
        "--service",
        action="append",
        default=[],
        help="ClickHouse: traces with a span of this service (repeatable)",
    )
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
    databases = [p for p in args.paths if p.startswith(SCHEMES)]
    if databases:
        return _from_clickhouse(args, databases)
    try:
        sources = [p for p in trace_files(*args.paths) if not p.name.endswith(SUFFIX)]
        spans = iter_spans(*sources)
        out = Path(args.out)
        first = len(list(out.glob(f"spans-*{SUFFIX}"))) if out.is_dir() else 0
        total = segments = 0
        while True:  # a segment's spans stream into it: an import holds a row group at most
            target = out / f"spans-{first + segments:05d}{SUFFIX}"
            written = write_segment(itertools.islice(spans, args.segment_spans), target)
            if not written:
                target.unlink()
                break
            total += written
            segments += 1
            if written < args.segment_spans:
                break
    except (FileNotFoundError, StoreError, OSError) as error:
        print(f"otelkit import: {error}", file=sys.stderr)
        return 2
    print(f"{total} spans from {len(sources)} files into {segments} segments in {out}")
    return 0 if total else 1


def _from_clickhouse(args: argparse.Namespace, databases: list[str]) -> int:
    if len(databases) != len(args.paths):
        print("otelkit import: a ClickHouse source is imported alone", file=sys.stderr)
        return 2
    total = segments = 0
    try:
        for dsn in databases:
            spans, written = import_clickhouse(
                dsn,
                args.out,
                table=args.table,
                since_ns=None if args.since is None else int(args.since * 1e9),
                until_ns=None if args.until is None else int(args.until * 1e9),
                services=args.service,
                segment_spans=args.segment_spans,
            )
            total, segments = total + spans, segments + written
    except (StoreError, OSError) as error:
        print(f"otelkit import: {error}", file=sys.stderr)
        return 2
    print(f"{total} spans from {args.table} into {segments} segments in {args.out}")
    return 0 if total else 1
