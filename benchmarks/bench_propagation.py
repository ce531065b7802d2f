"""Propagation cost: otelkit's W3C extract and inject against OpenTelemetry's own propagator.

Each round times, interleaved in one process, the extract of a ``traceparent`` with a
three-member ``tracestate`` and the inject of the context it gave, by otelkit and by
``TraceContextTextMapPropagator``, plus otelkit's hand-over to a service that does not sample
the request (``with_own_parent_id``). Medians per operation; the last line is JSON.

    python benchmarks/bench_propagation.py [--rounds 200000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otelkit import extract, inject
from otelkit._core.spans import with_own_parent_id

HEADERS = {
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "tracestate": "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7,1abc@x=y",
}
UNSAMPLED = {**HEADERS, "traceparent": HEADERS["traceparent"][:-2] + "00"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200_000)
    args = parser.parse_args()
    upstream = TraceContextTextMapPropagator()
    ours_context = extract(HEADERS)
    theirs_context = upstream.extract(HEADERS)
    unsampled = extract(UNSAMPLED)
    operations: dict[str, Callable[[], object]] = {
        "otelkit extract": lambda: extract(HEADERS),
        "opentelemetry extract": lambda: upstream.extract(HEADERS),
        "otelkit inject": lambda: inject({}, ours_context),
        "opentelemetry inject": lambda: upstream.inject({}, theirs_context),
        "otelkit own parent-id (unsampled)": lambda: with_own_parent_id(unsampled),
    }
    times: dict[str, list[int]] = {name: [] for name in operations}
    clock = time.perf_counter_ns
    items = list(operations.items())
    for index in range(args.rounds):
        for name, operation in items[index % 2 :: 1] + items[: index % 2]:
            start = clock()
            operation()
            times[name].append(clock() - start)
    medians = {name: statistics.median(ns) / 1e3 for name, ns in times.items()}
    for name, median in medians.items():
        print(f"{name:36s} {median:6.2f} us")
    ratios = {
        what: medians[f"otelkit {what}"] / medians[f"opentelemetry {what}"]
        for what in ("extract", "inject")
    }
    print(
        f"otelkit / opentelemetry: extract {ratios['extract']:.2f}, inject {ratios['inject']:.2f}"
    )
    print(
        json.dumps(
            {
                "rounds": args.rounds,
                "median_us": {name: round(m, 3) for name, m in medians.items()},
                "ratio_to_opentelemetry": {what: round(r, 3) for what, r in ratios.items()},
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
