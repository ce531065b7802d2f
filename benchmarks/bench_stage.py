"""Stage overhead: ``otelkit.stage`` and OpenTelemetry's own SDK around the same function, against
the bare function.

Three variants run interleaved in one process: the bare function; the function decorated with
``otelkit.stage``; and the function inside the OpenTelemetry SDK's
``tracer.start_as_current_span`` with its duration recorded in an SDK histogram, what a user
writes by hand (same labels as the stage's). They take turns in short blocks (``--block``
calls each, each variant first in turn), so that drift of the machine touches all three
alike; not call by call, since a call right after the SDK's runs on caches that the SDK's far
larger code has just evicted, which would charge otelkit's stage (and the bare function) for
OpenTelemetry's footprint: ``--block 1`` shows it. Sampling is 100 %, the
stage histogram is on, and both spans go through the same pipeline, exported to
OTLP-JSON-lines files (the embedded default), so the export worker's share of the interpreter
is in the figures. The work is a small numpy reduction, a stand-in for a stage body.

Each overhead is a difference of medians with its 95 % interval (``medians``); the ratio is
otelkit's overhead over OpenTelemetry's. The last line is JSON, with a verdict on each target:
at most 8 us per stage, at most 0.4 of OpenTelemetry's own cost.

    python benchmarks/bench_stage.py [--calls 100000] [--block 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from medians import difference_interval, verdict  # benchmarks/, this script's directory

import otelkit

DATA = np.arange(64, dtype=np.float32)
STAGE_US, RATIO = 8.0, 0.4  # the targets


def work() -> float:
    return float(DATA.sum())


def with_sdk(telemetry: otelkit.Telemetry) -> Callable[[], float]:
    """``work`` as a user times it with OpenTelemetry's SDK alone: a span, current while it
    runs, and a histogram record of its duration, on the providers ``configure`` built."""
    tracer = telemetry.tracer_provider.get_tracer("bench-stage")
    histogram = telemetry.meter_provider.get_meter("bench-stage").create_histogram(
        "bench.stage.duration", unit="s"
    )
    labels = {"model": "bench", "stage": "bench"}
    clock = time.perf_counter

    def traced() -> float:
        start = clock()
        with tracer.start_as_current_span("bench"):
            result = work()
        histogram.record(clock() - start, labels)
        return result

    return traced


def interleave(variants: list[Callable[[], Any]], calls: int, block: int) -> list[list[int]]:
    """Per-call times (ns) of each variant, ``calls`` of each, in blocks of ``block`` calls
    that take turns, each variant first in turn."""
    clock = time.perf_counter_ns
    times: list[list[int]] = [[] for _ in variants]
    count = len(variants)
    for index in range(-(-calls // block)):
        for turn in range(count):
            which = (index + turn) % count
            function, out = variants[which], times[which]
            for _ in range(block):
                start = clock()
                function()
                out.append(clock() - start)
    return [out[:calls] for out in times]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000, help="calls of each variant")
    parser.add_argument("--block", type=int, default=8, help="calls of one variant in a row")
    args = parser.parse_args()
    traces = tempfile.mkdtemp(prefix="bench-stage-")
    telemetry = otelkit.configure(
        service_name="bench-stage",
        traces_dir=traces,
        sampler="always_on",
        prometheus_port=0,
        bsp_max_queue_size=400_000,
    )
    staged = otelkit.stage("bench", model="bench")(work)
    variants = [work, staged, with_sdk(telemetry)]
    interleave(variants, max(1000, args.calls // 20), args.block)  # warm every path
    bare_ns, stage_ns, sdk_ns = interleave(variants, args.calls, args.block)
    telemetry.flush()
    stats = telemetry.stats()
    otelkit.shutdown()
    bare, stage, sdk = (statistics.median(ns) / 1e3 for ns in (bare_ns, stage_ns, sdk_ns))
    overhead, sdk_overhead = stage - bare, sdk - bare
    ratio = overhead / sdk_overhead
    stage_interval = difference_interval([n / 1e3 for n in bare_ns], [n / 1e3 for n in stage_ns])[0]
    sdk_interval = difference_interval([n / 1e3 for n in bare_ns], [n / 1e3 for n in sdk_ns])[0]
    # the ratio's interval, bounded by those of its two overheads (conservative)
    ratio_interval = (stage_interval[0] / sdk_interval[1], stage_interval[1] / sdk_interval[0])
    print(
        f"bare median {bare:.2f} us; otelkit stage {stage:.2f} us, overhead {overhead:+.2f} us "
        f"(95 % {stage_interval[0]:+.2f} to {stage_interval[1]:+.2f}); OpenTelemetry SDK "
        f"{sdk:.2f} us, overhead {sdk_overhead:+.2f} us (95 % {sdk_interval[0]:+.2f} to "
        f"{sdk_interval[1]:+.2f}); otelkit / OpenTelemetry {ratio:.3f} ({args.calls} calls "
        f"each, in blocks of {args.block})"
    )
    targets = {
        "stage_us": verdict(overhead, stage_interval, STAGE_US),
        "ratio_to_opentelemetry": verdict(ratio, ratio_interval, RATIO),
    }
    for key, found in targets.items():
        print(
            f"target: {key} {found['measured']} (95 % {found['interval95']}), at most "
            f"{found['bound']:g}: {found['verdict']}"
        )
    print(
        json.dumps(
            {
                "calls": args.calls,
                "block": args.block,
                "bare_median_us": round(bare, 2),
                "stage_median_us": round(stage, 2),
                "opentelemetry_median_us": round(sdk, 2),
                "overhead_us": round(overhead, 2),
                "opentelemetry_overhead_us": round(sdk_overhead, 2),
                "ratio": round(ratio, 3),
                "overhead_interval95_us": [round(bound, 2) for bound in stage_interval],
                "opentelemetry_overhead_interval95_us": [round(bound, 2) for bound in sdk_interval],
                "targets": targets,
                "spans_exported": stats.get("exported", 0),
                "spans_dropped": sum(n for k, n in stats.items() if k.startswith("dropped")),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
