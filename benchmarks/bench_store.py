"""``make bench-store``: the span store at a site's volume (issue 48), as a user runs it.

1. ``otelkit import`` of 1 M spans of OTLP JSON lines in the reference deployment's shape
   (``report_traces.py``): spans a second;
2. ``otelkit breakdown`` of those 1 M spans from the store, the Python path (``--engine python``:
   every span a Python object) and the DuckDB path (``--engine duckdb``) side by side, taking
   turns; each run a process of its own started from the bare segments (no result kept
   between runs), its wall time, CPU time and peak resident memory;
3. ``otelkit breakdown --engine duckdb`` of 10 M spans: the 1 M copied ten times with other
   trace ids (each copy a segment of its own).

Targets (issue 48): import at least 100 k spans/s; 10 M spans broken down in at most 20 s,
within 1 GiB. The last line is JSON with every figure and a verdict per target.

    python benchmarks/bench_store.py [--spans 1000000] [--copies 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]  # this tree's otelkit
import report_traces  # noqa: E402 - a sibling module, not a package

GROUP_BY = ["gnn_tracking.server", "gnn_tracking.option", "gnn_tracking.threads"]


def _run(*arguments: str) -> tuple[float, float, float, str]:
    """Wall seconds, CPU seconds, peak resident MiB and output of one otelkit command."""
    command = [sys.executable, "-m", "otelkit.cli", *arguments]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    output = process.stdout.read() if process.stdout else ""
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"{' '.join(arguments)} failed ({status}): {output[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, output


def _breakdown(store: Path, engine: str) -> tuple[float, float, float, str]:
    grouping = [item for key in GROUP_BY for item in ("--group-by", key)]
    root = ["--root", "reconstruct event"]
    return _run("breakdown", str(store), *root, "--engine", engine, *grouping)


def _copies(segment: Path, copies: int, out: Path) -> int:
    """``copies`` copies of ``segment``, each with its own trace ids, as segments in ``out``."""
    import duckdb

    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.parquet"):
        old.unlink()
    connection = duckdb.connect()
    total = 0
    for copy in range(copies):
        target = out / f"spans-{copy:05d}.parquet"
        # the generator's trace ids start with eight hex digits of its copy number, well
        # below 2^24: the first two are free for this copy's
        connection.execute(
            f"COPY (SELECT * REPLACE (printf('%02x', {copy}) || substr(TraceId, 3) AS TraceId)"
            f" FROM read_parquet('{segment}')) TO '{target}'"
            " (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 65536)"
        )
        total += connection.execute(f"SELECT count(*) FROM '{target}'").fetchone()[0]
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/otelkit-bench-store"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)

    source = args.work / f"reference-{args.spans}.jsonl"
    print(f"writing {args.spans} spans to {source} (kept for the next run)...", flush=True)
    spans = report_traces.write(args.spans, source)
    store = args.work / "store-1m"
    for old in store.glob("*.parquet"):
        old.unlink()
    import_s, import_cpu, import_mib, said = _run(
        "import", str(source), "--out", str(store), "--segment-spans", str(spans)
    )
    print(said.strip(), flush=True)

    runs: dict[str, list[tuple[float, float, float]]] = {"python": [], "duckdb": []}
    printed: dict[str, str] = {}
    for _ in range(args.rounds):
        for engine in runs:
            wall, cpu, mib, printed[engine] = _breakdown(store, engine)
            runs[engine].append((wall, cpu, mib))
            print(f"{engine}: {wall:.1f} s, {cpu:.1f} s CPU, {mib:.0f} MiB", flush=True)
    same = printed["python"] == printed["duckdb"]

    large = args.work / f"store-{args.copies}x"
    large_spans = _copies(next(store.glob("*.parquet")), args.copies, large)
    large_wall, large_cpu, large_mib, _ = _breakdown(large, "duckdb")
    print(f"duckdb, {large_spans} spans: {large_wall:.1f} s, {large_mib:.0f} MiB", flush=True)

    def medians(engine: str) -> dict[str, float]:
        wall, cpu, mib = (statistics.median(r[i] for r in runs[engine]) for i in range(3))
        return {"seconds": round(wall, 2), "cpu_s": round(cpu, 2), "peak_mib": round(mib)}

    figures = {
        "machine": f"{platform.node()} {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average": os.getloadavg()[0],
        "import": {
            "spans": spans,
            "seconds": round(import_s, 2),
            "cpu_s": round(import_cpu, 2),
            "spans_per_s": round(spans / import_s),
            "peak_mib": round(import_mib),
        },
        "breakdown_1m": {
            "python": medians("python"),
            "duckdb": medians("duckdb"),
            "python_over_duckdb": round(
                medians("python")["seconds"] / medians("duckdb")["seconds"], 2
            ),
            "same_output": same,
            "rounds": args.rounds,
        },
        "breakdown_large": {
            "spans": large_spans,
            "seconds": round(large_wall, 1),
            "cpu_s": round(large_cpu, 1),
            "peak_mib": round(large_mib),
        },
    }
    figures["verdicts"] = {
        "import_at_least_100k_spans_per_s": "met" if spans / import_s >= 100_000 else "missed",
        "large_breakdown_at_most_20_s": "met" if large_wall <= 20 else "missed",
        "large_breakdown_within_1_gib": "met" if large_mib <= 1024 else "missed",
        "engines_print_the_same": "met" if same else "missed",
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
