"""``make bench-store``: the span store at a site's volume (issue 48), as a user runs it.

1. ``otelkit import`` of 1 M spans of OTLP JSON lines in the reference deployment's shape
   (``report_traces.py``) by both paths, taking turns, each run a process of its own into an
   empty store: the fast path (DuckDB, ``otelkit.analysis._fast_import``: what ``otelkit
   import`` does) and the Python path (``OTELKIT_IMPORT_ENGINE=python``); spans a second, CPU
   time and peak resident memory of each, their medians and ratio, and whether the two wrote
   the same segments (read back by pyarrow, row group by row group);
2. ``otelkit breakdown`` of those 1 M spans from the store, the Python path (``--engine python``:
   every span a Python object), the DuckDB path (``--engine duckdb``) and the compiled one
   (``--engine compiled``, what ``auto`` picks) side by side, taking turns; each run a process
   of its own started from the bare segments (no result kept between runs), its wall time, CPU
   time and peak resident memory; the compiled engine's first run, which compiles its code
   into numba's cache (emptied first), timed apart;
3. ``otelkit report`` of those 1 M spans, the streaming Python path (``--engine python``) and
   the columns (``--engine compiled``, what ``auto`` picks) side by side, taking turns, each a
   process of its own: wall time, CPU time, peak resident memory, and whether both pages count
   the same traces and spans;
4. ``otelkit breakdown --engine compiled`` and ``otelkit report --engine compiled`` of 10 M
   spans: the 1 M copied ten times with other trace ids (each copy a segment of its own),
   ``--rounds`` times each, taking turns, the medians.

Targets (issue 48): import at least 100 k spans/s; 10 M spans broken down in at most 20 s and
reported in at most 60 s, each within 1 GiB. The last line is JSON with every figure and a
verdict per target.
``--import-only`` stops after 1.

    python benchmarks/bench_store.py [--spans 1000000] [--copies 10] [--rounds 2] [--import-only]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]  # this tree's otelkit
import report_traces  # noqa: E402 - a sibling module, not a package

GROUP_BY = ["gnn_tracking.server", "gnn_tracking.option", "gnn_tracking.threads"]
ENGINES = ("python", "duckdb", "compiled")  # the breakdown's, side by side on the million


def _run(*arguments: str, engine: str | None = None) -> tuple[float, float, float, str]:
    """Wall seconds, CPU seconds, peak resident MiB and output of one otelkit command (an
    import by the path ``engine`` names, ``python`` or the default)."""
    command = [sys.executable, "-m", "otelkit.cli", *arguments]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OTELKIT_IMPORT_ENGINE", None)
    if engine is not None:
        env["OTELKIT_IMPORT_ENGINE"] = engine
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    output = process.stdout.read() if process.stdout else ""
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"{' '.join(arguments)} failed ({status}): {output[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, output


def _import(source: Path, store: Path, spans: int, engine: str) -> tuple[float, float, float]:
    """One import of ``source`` into an empty ``store`` by the path ``engine`` names (``fast``:
    what ``otelkit import`` does; ``python``): wall seconds, CPU seconds, peak MiB."""
    shutil.rmtree(store, ignore_errors=True)
    wall, cpu, mib, said = _run(
        "import",
        str(source),
        "--out",
        str(store),
        "--segment-spans",
        str(spans),
        engine="python" if engine == "python" else None,
    )
    print(f"import, {engine} path: {said.strip()}: {wall:.1f} s, {cpu:.1f} s CPU, {mib:.0f} MiB")
    return wall, cpu, mib


def _same_segments(ours: Path, theirs: Path) -> bool:
    """Whether two stores hold the same segments: names, schemas and rows, read back by
    pyarrow a row group at a time (both paths cut row groups of 65,536 rows)."""
    import pyarrow.parquet as pq

    names = sorted(p.name for p in ours.glob("*.parquet"))
    if names != sorted(p.name for p in theirs.glob("*.parquet")) or not names:
        return False
    for name in names:
        a, b = pq.ParquetFile(ours / name), pq.ParquetFile(theirs / name)
        if not a.schema_arrow.equals(b.schema_arrow, check_metadata=True):
            return False
        groups = range(a.num_row_groups)
        if [a.metadata.row_group(g).num_rows for g in groups] != [
            b.metadata.row_group(g).num_rows for g in range(b.num_row_groups)
        ]:
            return bool(a.read().equals(b.read()))  # cut otherwise: read whole
        if not all(a.read_row_group(g).equals(b.read_row_group(g)) for g in groups):
            return False
    return True


def _breakdown(store: Path, engine: str) -> tuple[float, float, float, str]:
    grouping = [item for key in GROUP_BY for item in ("--group-by", key)]
    root = ["--root", "reconstruct event"]
    return _run("breakdown", str(store), *root, "--engine", engine, *grouping)


def _report(store: Path, engine: str, out: Path) -> tuple[float, float, float, str]:
    grouping = [item for key in GROUP_BY for item in ("--group-by", key)]
    root = ["--root", "reconstruct event"]
    return _run("report", str(store), *root, "--engine", engine, *grouping, "--out", str(out))


def _counted(said: str) -> str:
    """``N traces, M spans`` of the report's line."""
    return said.split("MB, ", 1)[-1].rsplit(",", 1)[0]


def _copies(segment: Path, copies: int, out: Path) -> int:
    """``copies`` copies of ``segment``, each with its own trace ids, as segments in ``out``,
    written by a process of its own: a child forked from a benchmark holding DuckDB's memory
    would count it in its own peak (1.35 GiB against 0.75 measured alone)."""
    command = [sys.executable, __file__, "--copy-into", str(out), str(segment), str(copies)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return int(done.stdout.split()[-1])


def _write_copies(segment: Path, copies: int, out: Path) -> int:
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


def _machine() -> str:
    return f"{platform.node()} {os.cpu_count()} cores, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/otelkit-bench-store"))
    parser.add_argument("--import-only", action="store_true", help="stop after the imports")
    parser.add_argument("--copy-into", nargs=3, help=argparse.SUPPRESS)  # OUT SEGMENT COPIES
    args = parser.parse_args()
    if args.copy_into:
        out, segment, copies = args.copy_into
        print(_write_copies(Path(segment), int(copies), Path(out)))
        return
    args.work.mkdir(parents=True, exist_ok=True)

    source = args.work / f"reference-{args.spans}.jsonl"
    print(f"writing {args.spans} spans to {source} (kept for the next run)...", flush=True)
    spans = report_traces.write(args.spans, source)
    store, python_store = args.work / "store-1m", args.work / "store-1m-python"
    imports: dict[str, list[tuple[float, float, float]]] = {"fast": [], "python": []}
    for _ in range(args.rounds):  # taking turns: a change in the host's load hits both
        for engine, folder in (("fast", store), ("python", python_store)):
            imports[engine].append(_import(source, folder, spans, engine))
    same_segments = _same_segments(store, python_store)
    shutil.rmtree(python_store, ignore_errors=True)

    def import_medians(engine: str) -> dict[str, float]:
        wall, cpu, mib = (statistics.median(r[i] for r in imports[engine]) for i in range(3))
        return {
            "seconds": round(wall, 2),
            "spans_per_s": round(spans / wall),
            "cpu_s": round(cpu, 2),
            "peak_mib": round(mib),
        }

    fast, python = import_medians("fast"), import_medians("python")
    import_figures = {
        "spans": spans,
        "rounds": args.rounds,
        "fast": fast,
        "python": python,
        "fast_over_python_spans_per_s": round(fast["spans_per_s"] / python["spans_per_s"], 2),
        "same_segments": same_segments,
    }
    print(
        f"import: fast {fast['spans_per_s']} spans/s, Python {python['spans_per_s']} spans/s "
        f"({import_figures['fast_over_python_spans_per_s']}x), same segments: {same_segments}",
        flush=True,
    )
    import_verdicts = {
        "import_at_least_100k_spans_per_s": "met" if fast["spans_per_s"] >= 100_000 else "missed",
        "import_paths_write_the_same_segments": "met" if same_segments else "missed",
    }
    if args.import_only:
        print(
            json.dumps(
                {
                    "machine": _machine(),
                    "load_average": os.getloadavg()[0],
                    "import": import_figures,
                    "verdicts": import_verdicts,
                }
            )
        )
        return

    # the compiled engine's code is compiled on its first run on a machine and cached (numba's
    # cache, here a folder of the benchmark's own, emptied first): that run is timed apart
    cache = args.work / "numba-cache"
    shutil.rmtree(cache, ignore_errors=True)
    os.environ["NUMBA_CACHE_DIR"] = str(cache)
    first_wall, first_cpu, first_mib, _ = _breakdown(store, "compiled")
    print(f"compiled, first run (compiling): {first_wall:.1f} s, {first_mib:.0f} MiB", flush=True)
    runs: dict[str, list[tuple[float, float, float]]] = {e: [] for e in ENGINES}
    printed: dict[str, str] = {}
    for _ in range(args.rounds):
        for engine in runs:
            wall, cpu, mib, printed[engine] = _breakdown(store, engine)
            runs[engine].append((wall, cpu, mib))
            print(f"{engine}: {wall:.1f} s, {cpu:.1f} s CPU, {mib:.0f} MiB", flush=True)
    same = printed["python"] == printed["duckdb"] == printed["compiled"]

    pages: dict[str, list[tuple[float, float, float]]] = {"python": [], "compiled": []}
    counted: dict[str, str] = {}
    for _ in range(args.rounds):
        for engine in pages:
            wall, cpu, mib, said = _report(store, engine, args.work / f"report-{engine}.html")
            pages[engine].append((wall, cpu, mib))
            counted[engine] = _counted(said)
            print(f"report, {engine}: {wall:.1f} s, {cpu:.1f} s CPU, {mib:.0f} MiB", flush=True)
    same_counts = counted["python"] == counted["compiled"]

    large = args.work / f"store-{args.copies}x"
    large_spans = _copies(next(store.glob("*.parquet")), args.copies, large)
    large_runs: dict[str, list[tuple[float, float, float]]] = {"breakdown": [], "report": []}
    for _ in range(args.rounds):
        large_runs["breakdown"].append(_breakdown(large, "compiled")[:3])
        large_runs["report"].append(_report(large, "compiled", args.work / "report-large.html")[:3])
        for command, measured in large_runs.items():
            wall, _, mib = measured[-1]
            print(f"{command}, {large_spans} spans: {wall:.1f} s, {mib:.0f} MiB", flush=True)

    def medians(engine: str, measured: dict[str, list[Any]] = runs) -> dict[str, float]:
        wall, cpu, mib = (statistics.median(r[i] for r in measured[engine]) for i in range(3))
        return {"seconds": round(wall, 2), "cpu_s": round(cpu, 2), "peak_mib": round(mib)}

    large_breakdown, large_report = (medians(c, large_runs) for c in ("breakdown", "report"))

    figures = {
        "machine": _machine(),
        "load_average": os.getloadavg()[0],
        "import": import_figures,
        "breakdown_1m": {
            **{engine: medians(engine) for engine in ENGINES},
            "python_over_duckdb": round(
                medians("python")["seconds"] / medians("duckdb")["seconds"], 2
            ),
            "python_over_compiled": round(
                medians("python")["seconds"] / medians("compiled")["seconds"], 2
            ),
            "compiled_first_run": {
                "seconds": round(first_wall, 2),
                "cpu_s": round(first_cpu, 2),
                "peak_mib": round(first_mib),
            },
            "same_output": same,
            "rounds": args.rounds,
        },
        "report_1m": {
            **{engine: medians(engine, pages) for engine in pages},
            "python_over_compiled": round(
                medians("python", pages)["seconds"] / medians("compiled", pages)["seconds"], 2
            ),
            "same_counts": same_counts,
            "rounds": args.rounds,
        },
        "large": {
            "engine": "compiled",
            "spans": large_spans,
            "rounds": args.rounds,
            "breakdown": large_breakdown,
            "report": large_report,
        },
    }
    figures["verdicts"] = {
        **import_verdicts,
        "large_breakdown_at_most_20_s": "met" if large_breakdown["seconds"] <= 20 else "missed",
        "large_breakdown_within_1_gib": "met" if large_breakdown["peak_mib"] <= 1024 else "missed",
        "large_report_at_most_60_s": "met" if large_report["seconds"] <= 60 else "missed",
        "large_report_within_1_gib": "met" if large_report["peak_mib"] <= 1024 else "missed",
        "engines_print_the_same": "met" if same else "missed",
        "report_engines_count_the_same": "met" if same_counts else "missed",
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
