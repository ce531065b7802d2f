"""Stage overhead: a function decorated with ``otelkit.stage`` against the same bare function.

Both run interleaved, call by call, in one process, at 100 % sampling with the stage histogram
on and spans exported to OTLP-JSON-lines files (the embedded default), so the export worker's
share of the interpreter is in the figures. The work is a small numpy reduction (~2 us), a
stand-in for a stage body. The last line is JSON.

    python benchmarks/bench_stage.py [--calls 100000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import numpy as np

import otelkit

DATA = np.arange(64, dtype=np.float32)


def work() -> float:
    return float(DATA.sum())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000, help="interleaved pairs")
    args = parser.parse_args()
    traces = tempfile.mkdtemp(prefix="bench-stage-")
    telemetry = otelkit.configure(
        service_name="bench-stage", traces_dir=traces, sampler="always_on", prometheus_port=0,
        bsp_max_queue_size=200_000,
    )  # fmt: skip
    staged = otelkit.stage("bench", model="bench")(work)
    clock = time.perf_counter_ns
    bare_ns: list[int] = []
    staged_ns: list[int] = []
    for index in range(args.calls):
        order = ((work, bare_ns), (staged, staged_ns))
        for function, out in order if index % 2 else reversed(order):
            start = clock()
            function()
            out.append(clock() - start)
    telemetry.flush()
    stats = telemetry.stats()
    otelkit.shutdown()
    bare, stage = statistics.median(bare_ns) / 1e3, statistics.median(staged_ns) / 1e3
    print(f"bare median {bare:.2f} us, stage median {stage:.2f} us ({args.calls} pairs)")
    print(json.dumps({
        "calls": args.calls,
        "bare_median_us": round(bare, 2),
        "stage_median_us": round(stage, 2),
        "overhead_us": round(stage - bare, 2),
        "spans_exported": stats.get("exported", 0),
        "spans_dropped": sum(n for k, n in stats.items() if k.startswith("dropped")),
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
