"""``make bench-report``: ``otelkit report``'s three scale targets (issue 30), as a user runs it.

1. the demo's traces (``demo-output/traces`` when ``make demo`` has run, else 10 k spans in its
   shape from ``report_traces.py``) to a report in at most 5 s, the command's wall time from
   its start (Python and imports included);
2. 1 M spans in the reference deployment's shape in at most 60 s, peak memory (the command's
   maximum resident set) within 1 GiB;
3. the demo's page at most 5 MB.

Each run is the ``otelkit report`` command in its own process. vl-convert's bundle of the Vega
libraries is built once per vl-convert version and cached (about 4 s, reported apart): it is
built before the timed runs. The last line is JSON with every figure and a verdict per target.

    python benchmarks/bench_report.py [--spans 1000000] [--work /tmp/otelkit-bench-report]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]  # this tree's otelkit
import report_traces  # noqa: E402 - a sibling module, not a package

DEMO_TRACES = ROOT / "demo-output" / "traces"
GROUP_BY = ["gnn_tracking.server", "gnn_tracking.option", "gnn_tracking.threads"]


def _report(traces: Path, out: Path) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak resident MiB of one ``otelkit report`` process (on a
    shared machine the CPU time says what the wall time would be with a core to itself)."""
    command = [
        sys.executable,
        "-m",
        "otelkit.cli",
        "report",
        str(traces),
        "--out",
        str(out),
        "--root",
        "reconstruct event",
    ]
    for key in GROUP_BY:
        command += ["--group-by", key]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    output = process.stdout.read() if process.stdout else ""
    if status != 0:
        raise SystemExit(f"otelkit report failed ({status}): {output}")
    print(output.strip())
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024  # maxrss in kB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--work", type=Path, default=Path("/tmp/otelkit-bench-report"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)

    from otelkit.report._page import vega_bundle

    started = time.perf_counter()
    vega_bundle()
    bundle_s = time.perf_counter() - started

    if DEMO_TRACES.is_dir():
        demo, source = DEMO_TRACES, "make demo's traces"
    else:
        demo = args.work / "demo-shaped-10k.jsonl"
        report_traces.write(10_000, demo)
        source = "10 k spans generated in the demo's shape"
    demo_s, demo_cpu, demo_mib = _report(demo, args.work / "demo.html")
    demo_mb = (args.work / "demo.html").stat().st_size / 1e6

    large = args.work / f"reference-{args.spans}.jsonl"
    print(f"writing {args.spans} spans to {large} (kept for the next run)...", flush=True)
    spans = report_traces.write(args.spans, large)
    large_s, large_cpu, large_mib = _report(large, args.work / "large.html")

    figures = {
        "machine": f"{platform.node()} {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average": os.getloadavg()[0],
        "bundle_build_s": round(bundle_s, 2),
        "demo": {
            "source": source,
            "seconds": round(demo_s, 2),
            "cpu_s": round(demo_cpu, 2),
            "peak_mib": round(demo_mib),
            "html_mb": round(demo_mb, 2),
        },
        "large": {
            "spans": spans,
            "seconds": round(large_s, 1),
            "cpu_s": round(large_cpu, 1),
            "peak_mib": round(large_mib),
            "input_mb": round(large.stat().st_size / 1e6),
        },
    }
    figures["verdicts"] = {
        "demo_at_most_5_s": "met" if demo_s <= 5 else "missed",
        "1m_spans_at_most_60_s": "met" if large_s <= 60 else "missed",
        "1m_spans_within_1_gib": "met" if large_mib <= 1024 else "missed",
        "demo_html_at_most_5_mb": "met" if demo_mb <= 5 else "missed",
    }
    # children's usage is process-wide: also say what this process itself held
    figures["bench_peak_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
