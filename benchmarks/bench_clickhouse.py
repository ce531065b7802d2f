"""``make bench-clickhouse``: a site's ClickHouse ``otel_traces`` broken down with a copy and
without one (issue 48), on chDB, ClickHouse's engine in process.

1. ``otel_traces`` of a chDB database (the Collector exporter's DDL, as
   tests/analysis/test_clickhouse.py makes it) filled with N spans of the reference
   deployment's shape (``report_traces.py``, imported into a segment first), by a process of
   its own;
2. side by side, taking turns, each a process of its own: the copy (``otelkit import
   chdb://... --out store``, then ``otelkit breakdown store``, which picks the compiled engine)
   and the breakdown in place (``otelkit breakdown --source chdb://... --engine clickhouse``),
   its trees walked here (``--walk here``: ClickHouse selects and narrows the spans, the
   compiled engine walks them) and in ClickHouse (``--walk clickhouse``: the breakdown's
   queries run there): wall time, CPU time and peak resident memory of each (chDB's work
   included: it runs in the process), their medians, and whether all print the same breakdown;
3. the Arrow bytes each reads from ClickHouse: the spans whole (the copy), narrowed to what
   the breakdown reads (walked here), each root's components (walked in ClickHouse): what a
   site's network would carry.

chDB shares the process with its client: no network is crossed here, so the bytes are the
figure a remote ClickHouse turns into transfer time. The last line is JSON.

    python benchmarks/bench_clickhouse.py [--spans 1000000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]  # this tree's otelkit
import bench_store  # noqa: E402 - a sibling module, not a package
import report_traces  # noqa: E402

TABLE = "otel_traces"
ROOT_NAME = "reconstruct event"


def _fill(database: Path, segment: Path) -> int:
    """``TABLE`` in the chDB ``database``, of the exporter's DDL, filled from ``segment``."""
    import clickhouse_connect

    from tests.analysis.test_clickhouse import DDL

    client = clickhouse_connect.get_client(dsn=f"chdb://{database}")
    client.command(DDL.format(table=TABLE, duration="UInt64"))
    # the exporter's columns from the store's: events' attributes back into maps (their values
    # as JSON texts: the breakdown reads none of them, only their bytes count here)
    client.command(
        f"INSERT INTO {TABLE} (Timestamp, TraceId, SpanId, ParentSpanId, TraceState, SpanName, "
        "SpanKind, ServiceName, ResourceAttributes, ScopeName, ScopeVersion, SpanAttributes, "
        "Duration, StatusCode, StatusMessage, `Events.Timestamp`, `Events.Name`, "
        "`Events.Attributes`) SELECT Timestamp, TraceId, SpanId, ParentSpanId, '', SpanName, "
        "SpanKind, ServiceName, ResourceAttributes, ScopeName, '', SpanAttributes, Duration, "
        "StatusCode, StatusMessage, "
        "arrayMap(e -> fromUnixTimestamp64Nano(e.Timestamp), Events), "
        "arrayMap(e -> e.Name, Events), "
        "arrayMap(e -> CAST(JSONExtractKeysAndValuesRaw(assumeNotNull(e.AttributesJson)), "
        "'Map(String, String)'), Events) "
        f"FROM file('{segment}', Parquet)"
    )
    return int(client.query(f"SELECT count() FROM {TABLE}").result_rows[0][0])


def _bytes(database: Path) -> dict[str, int]:
    """The Arrow bytes of the spans read whole (the copy) and narrowed (walked here), and of
    the results of the breakdown's queries (walked in ClickHouse)."""
    import clickhouse_connect

    from otelkit.analysis import _clickhouse
    from otelkit.analysis._clickhouse import _described, _select

    dsn = f"chdb://{database}"
    client = clickhouse_connect.get_client(dsn=dsn)
    name, columns = _described(client, dsn, TABLE)
    read = {}
    for path, narrow in (("whole", None), ("narrowed", list(bench_store.GROUP_BY))):
        total = 0
        with client.query_arrow_stream(_select(columns, name, "", narrow=narrow)) as stream:
            for batch in stream:
                total += batch.nbytes
        read[path] = total
    counted = [0]

    class Counted:  # the client, its Arrow answers counted
        def __init__(self, client: Any) -> None:
            self.client = client

        def __getattr__(self, name: str) -> Any:
            return getattr(self.client, name)

        def query_arrow(self, *args: Any, **kwargs: Any) -> Any:
            table = self.client.query_arrow(*args, **kwargs)
            counted[0] += table.nbytes
            return table

    _clickhouse._client = lambda dsn: Counted(client)  # type: ignore[assignment]
    _clickhouse.breakdown_clickhouse(
        dsn, table=TABLE, group_by=bench_store.GROUP_BY, root_name=ROOT_NAME, engine="clickhouse"
    )
    read["results"] = counted[0]
    return read


def _child(*arguments: str) -> str:
    """This script run with ``arguments`` in a process of its own (chDB holds its database
    for the life of the process that opened it)."""
    done = subprocess.run(
        [sys.executable, __file__, *arguments], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(arguments)} failed: {done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def _grouping() -> list[str]:
    return [item for key in bench_store.GROUP_BY for item in ("--group-by", key)]


def _copy(dsn: str, store: Path) -> tuple[float, float, float, str]:
    """``otelkit import`` then ``otelkit breakdown``: the sum of both processes' figures (the
    larger peak), and the breakdown printed."""
    shutil.rmtree(store, ignore_errors=True)
    wall, cpu, mib, _ = bench_store._run("import", dsn, "--out", str(store))
    more = bench_store._run("breakdown", str(store), "--root", ROOT_NAME, *_grouping())
    return wall + more[0], cpu + more[1], max(mib, more[2]), more[3]


def _in_place(dsn: str, walk: str) -> tuple[float, float, float, str]:
    return bench_store._run(
        "breakdown",
        "--source",
        dsn,
        "--engine",
        "clickhouse",
        "--walk",
        walk,
        "--root",
        ROOT_NAME,
        *_grouping(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/otelkit-bench-clickhouse"))
    parser.add_argument("--fill", nargs=2, help=argparse.SUPPRESS)  # DATABASE SEGMENT
    parser.add_argument("--bytes", help=argparse.SUPPRESS)  # DATABASE
    args = parser.parse_args()
    if args.fill:
        print(_fill(Path(args.fill[0]), Path(args.fill[1])))
        return
    if args.bytes:
        print(json.dumps(_bytes(Path(args.bytes))))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    source = args.work / f"reference-{args.spans}.jsonl"
    print(f"writing {args.spans} spans to {source} (kept for the next run)...", flush=True)
    spans = report_traces.write(args.spans, source)
    segments = args.work / "segments"
    shutil.rmtree(segments, ignore_errors=True)
    bench_store._run("import", str(source), "--out", str(segments), "--segment-spans", str(spans))
    (segment,) = sorted(segments.glob("*.parquet"))
    database = args.work / "chdb"
    shutil.rmtree(database, ignore_errors=True)
    filled = int(_child("--fill", str(database), str(segment)))
    print(f"{TABLE}: {filled} spans in chDB at {database}", flush=True)
    dsn = f"chdb://{database}"
    runs: dict[str, list[tuple[float, float, float, str]]] = {
        "copy": [],
        "walked_here": [],
        "walked_in_clickhouse": [],
    }
    for _ in range(args.rounds):  # taking turns: a change in the host's load hits them all
        runs["copy"].append(_copy(dsn, args.work / "store"))
        runs["walked_here"].append(_in_place(dsn, "here"))
        runs["walked_in_clickhouse"].append(_in_place(dsn, "clickhouse"))
        for path, measured in runs.items():
            wall, cpu, mib, _ = measured[-1]
            print(f"{path}: {wall:.1f} s, {cpu:.1f} s CPU, {mib:.0f} MiB", flush=True)
    same = len({r[3] for measured in runs.values() for r in measured}) == 1
    read = json.loads(_child("--bytes", str(database)))

    def medians(path: str) -> dict[str, float]:
        wall, cpu, mib = (statistics.median(r[i] for r in runs[path]) for i in range(3))
        return {"seconds": round(wall, 2), "cpu_s": round(cpu, 2), "peak_mib": round(mib)}

    figures: dict[str, Any] = {
        "benchmark": "clickhouse",
        "machine": bench_store._machine(),
        "spans": filled,
        "rounds": args.rounds,
        **{path: medians(path) for path in runs},
        "same_breakdown": same,
        "arrow_bytes": read,
        "bytes_ratio": round(read["whole"] / read["narrowed"], 2),
        "results_bytes_ratio": round(read["whole"] / read["results"], 2),
    }
    seconds = {path: figures[path]["seconds"] for path in runs}
    for path in ("walked_here", "walked_in_clickhouse"):
        figures[f"seconds_ratio_{path}"] = round(seconds["copy"] / seconds[path], 2)
    print(
        f"copy {seconds['copy']} s, in place walked here {seconds['walked_here']} s, walked in "
        f"ClickHouse {seconds['walked_in_clickhouse']} s; ClickHouse's Arrow "
        f"{read['whole'] / 2**20:.0f} MiB whole, {read['narrowed'] / 2**20:.0f} MiB narrowed, "
        f"{read['results'] / 2**20:.0f} MiB of results; the same breakdown: {same}"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
