"""``otelkit breakdown``: where the time of traced requests goes, from trace files, the span
store (in compiled code, or by DuckDB, where every file is a segment), or a site's trace store
(``_source``).

otelkit breakdown ./otelkit-traces --group-by gnn_tracking.option --root "reconstruct event"
otelkit breakdown --source jaeger://jaeger:16685 --service sonic --since 2h --root "event"
"""

from __future__ import annotations

import argparse
import importlib
import sys

from otelkit.analysis._breakdown import breakdown, format_breakdowns
from otelkit.analysis._loader import build_traces, load_spans
from otelkit.analysis._sampling import Sampling, sampling_of_segments
from otelkit.analysis._source import Selection, SpanSource, _redacted, open_source, parse_time
from otelkit.analysis._store import StoreError

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="*", help="trace files or span store segments, or folders holding them"
    )
    add_source_arguments(parser)
    parser.add_argument("--group-by", action="append", default=[], help="root attribute key")
    parser.add_argument("--root", default=None, help="only roots with this span name")
    parser.add_argument(
        "--engine",
        choices=("auto", "compiled", "duckdb", "python", "clickhouse"),
        default="auto",
        help="compiled: span store segments (otelkit import) read as columns, each trace "
        "broken down in compiled code (numba), no Python object per span; duckdb: the same "
        "as SQL queries; python: every span read into Python; auto (default): compiled where "
        "every file is a segment and numba is installed, else duckdb, else python; "
        "clickhouse: one --source clickhouse://... read without a copy (see --walk)",
    )
    parser.add_argument(
        "--walk",
        choices=("auto", "clickhouse", "here"),
        default="auto",
        help="with --engine clickhouse, where the traces' trees are walked: clickhouse: the "
        "breakdown's queries run in ClickHouse (25.8 or newer), only each root's components "
        "come back; here: ClickHouse selects the traces and narrows each span to what the "
        "breakdown reads, and they are walked here (compiled, else DuckDB); auto (default): "
        "in ClickHouse where the server runs the queries, else here",
    )


def add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    """What a trace store is searched for: a time window, services, ClickHouse's table."""
    parser.add_argument(
        "--since",
        default=None,
        help="a store's traces with a span from this time: Unix seconds, ago (15m, 2h, 1d) or "
        "ISO 8601 (Jaeger and Tempo default to the last hour)",
    )
    parser.add_argument("--until", default=None, help="... and before this time (default: now)")
    parser.add_argument(
        "--service",
        action="append",
        default=[],
        help="a store's traces with a span of this service (repeatable; Jaeger needs one)",
    )
    parser.add_argument("--table", default="otel_traces", help="ClickHouse: the spans' table")


def selection_of(args: argparse.Namespace) -> Selection:
    """The selection ``add_selection_arguments`` read (ValueError: a time that is none)."""
    since = None if args.since is None else int(parse_time(args.since) * 1e9)
    until = None if args.until is None else int(parse_time(args.until) * 1e9)
    return Selection(since, until, tuple(args.service))


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """``--source`` and the selection pushed down to a trace store (breakdown and report)."""
    parser.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="URL",
        help="a trace store (repeatable): clickhouse://user:password@host:8123/database, "
        "jaeger://host:16685 (gRPC) or jaeger+http://host:16686, tempo://host:3200; "
        "or a file or folder, as the positional paths",
    )
    add_selection_arguments(parser)
    parser.add_argument(
        "--cache",
        default=None,
        help="where a store's traces are kept as segments "
        "(default: $OTELKIT_STORE_CACHE or ~/.cache/otelkit/stores)",
    )
    parser.add_argument(
        "--refresh", action="store_true", help="fetch a store's traces again, cached or not"
    )


def source_of(args: argparse.Namespace, command: str) -> SpanSource | None:
    """The spans ``args`` name (positional paths and ``--source``), a store's selection pushed
    down; None, with the reason on stderr, where they cannot be read."""
    try:
        return open_source(
            [*args.paths, *args.source],
            selection_of(args),
            cache=args.cache,
            refresh=args.refresh,
            table=args.table,
        )
    except (FileNotFoundError, StoreError, ValueError, OSError) as error:
        print(f"otelkit {command}: {error}", file=sys.stderr)
        return None


def _engine(args: argparse.Namespace, source: SpanSource) -> str:
    """The engine that breaks ``source`` down ("" and a message printed: none can)."""
    segments = source.segments_only
    if args.engine == "python" or (args.engine == "auto" and not segments):
        return "python"
    if not segments:
        print(
            f"otelkit breakdown: --engine {args.engine} reads span store segments only "
            "(otelkit import converts trace files into them)",
            file=sys.stderr,
        )
        return ""
    for engine, module in (("compiled", "numba"), ("duckdb", "duckdb")):
        if args.engine not in ("auto", engine):
            continue
        try:
            importlib.import_module(module)
        except ImportError:
            if args.engine == "auto":
                continue
            print(
                f"otelkit breakdown: {module} is not installed: pip install 'otelkit[store]'",
                file=sys.stderr,
            )
            return ""
        return engine
    return "python"


def run(args: argparse.Namespace) -> int:
    if not args.paths and not args.source:
        print("otelkit breakdown: give trace paths, --source, or both", file=sys.stderr)
        return 2
    if args.walk != "auto" and args.engine != "clickhouse":
        print("otelkit breakdown: --walk is for --engine clickhouse", file=sys.stderr)
        return 2
    if args.engine == "clickhouse":
        return _in_clickhouse(args)
    source = source_of(args, "breakdown")  # files listed once: an empty folder warned of once
    if source is None:
        return 2
    engine = _engine(args, source)
    if not engine:
        return 2
    where = " ".join([*args.paths, *source.imported])
    if engine in ("compiled", "duckdb"):
        from otelkit.analysis._columns import breakdown_columns
        from otelkit.analysis._sql import breakdown_store

        reader = breakdown_columns if engine == "compiled" else breakdown_store
        found = reader(source.files, args.group_by, args.root)
        if not found.spans:
            print(f"otelkit breakdown: no span read from {where}", file=sys.stderr)
            return 1
        print(format_breakdowns(found.groups, labels=args.group_by) or "no complete traces found")
        _say_sampling(found.sampling or sampling_of_segments(source.files))
        return 0
    spans = load_spans(*source.files)
    if not spans:
        print(
            f"otelkit breakdown: no span read from {where} (no trace file, or only empty ones)",
            file=sys.stderr,
        )
        return 1
    traces = build_traces(spans)
    groups = breakdown(traces.values(), group_by=args.group_by, root_name=args.root)
    print(format_breakdowns(groups, labels=args.group_by) or "no complete traces found")
    _say_sampling(Sampling().update(spans))
    return 0


def _in_clickhouse(args: argparse.Namespace) -> int:
    """The breakdown of one ClickHouse source, read where it is (``breakdown_clickhouse``)."""
    from otelkit.analysis._clickhouse import SCHEMES, breakdown_clickhouse

    if args.paths or len(args.source) != 1 or not args.source[0].startswith(SCHEMES):
        print(
            "otelkit breakdown: --engine clickhouse reads one --source clickhouse://... "
            "and no local paths",
            file=sys.stderr,
        )
        return 2
    if args.cache is not None or args.refresh:
        print(
            "otelkit breakdown: --engine clickhouse reads the table where it is, with no "
            "copy: --cache and --refresh are for a store's traces fetched here",
            file=sys.stderr,
        )
        return 2
    try:
        selection = selection_of(args)
        found = breakdown_clickhouse(
            args.source[0],
            table=args.table,
            since_ns=selection.since_ns,
            until_ns=selection.until_ns,
            services=selection.services,
            group_by=args.group_by,
            root_name=args.root,
            engine=args.walk,
        )
    except (StoreError, ValueError) as error:
        print(f"otelkit breakdown: {error}", file=sys.stderr)
        return 2
    if not found.spans:
        print(f"otelkit breakdown: no span read from {_redacted(args.source[0])}", file=sys.stderr)
        return 1
    print(format_breakdowns(found.groups, labels=args.group_by) or "no complete traces found")
    _say_sampling(found.sampling or Sampling())
    return 0


def _say_sampling(sampling: Sampling) -> None:
    """How the traces were chosen, where their spans say it: a tail-sampled store's
    percentiles run high."""
    for line in sampling.lines():
        print(line)
