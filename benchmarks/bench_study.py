"""The study driver's efficiency: ``otelkit study``'s closed loop against a bare tritonclient
thread-pool loop, side by side on the same Triton model, and its footprint at 1,000 threads.

At each concurrency (1, 8 and 64 requests in flight) the two drivers take turns for
``--rounds`` rounds (which goes first alternates), each for ``--seconds`` measured after a
warm-up, against ``identity_fp32`` of the test models on one tritonserver with tracing off. The
bare loop is what a user would write: a thread per request in flight, each with its own
``tritonclient.http`` client, calling ``infer`` back to back and counting completions in the
measured window. The study runs ``Study(model=..., load=Load(concurrency=n))`` with no tracing
and no metrics scrape, so both do the same requests. Bound (issue 29): the study's throughput
is at least 95 % of the bare loop's (the median of the rounds' paired ratios).

At 1,000 threads each driver runs alone in a fresh process: its peak resident memory (over
the interpreter's own at start), the CPU time it spends per request and its throughput.

    python benchmarks/bench_study.py [--rounds 5] [--seconds 2] [--threads 1000]

The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient

from otelkit.study import Load, Remote, Study
from otelkit.tritonserver import TritonServer

ROOT = Path(__file__).resolve().parents[1]
MODEL = "identity_fp32"
BOUND = 0.95
PAGE = os.sysconf("SC_PAGE_SIZE")


def bare(url: str, concurrency: int, seconds: float, warmup_s: float) -> tuple[float, float]:
    """Requests a second of the bare loop over the measured window, and its CPU seconds."""
    stop, go = threading.Event(), threading.Event()
    counts = [0] * concurrency
    data = np.zeros((1, 16), dtype=np.float32)

    def loop(slot: int) -> None:
        client = httpclient.InferenceServerClient(url, network_timeout=60)
        tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(data)
        go.wait()  # the threads start together: a thread started among busy ones waits long
        while not stop.is_set():
            client.infer(MODEL, [tensor])
            counts[slot] += 1
        client.close()

    threads = [threading.Thread(target=loop, args=(n,), daemon=True) for n in range(concurrency)]
    for thread in threads:
        thread.start()
    go.set()
    time.sleep(warmup_s)
    done0, wall0, cpu0 = sum(counts), time.monotonic(), time.process_time()
    time.sleep(seconds)
    done1, wall1, cpu1 = sum(counts), time.monotonic(), time.process_time()
    stop.set()
    for thread in threads:
        thread.join()
    return (done1 - done0) / (wall1 - wall0), cpu1 - cpu0


def study(url: str, concurrency: int, seconds: float, warmup_s: float) -> tuple[float, float]:
    """Requests a second of ``otelkit study``'s closed loop at ``concurrency``, and its CPU."""
    with tempfile.TemporaryDirectory() as scratch:
        results = Study(
            model=MODEL,
            server=Remote(url),
            load=Load(concurrency=concurrency, seconds=seconds, warmup_s=warmup_s),
            out=Path(scratch) / "study.jsonl",
            progress=False,
        ).run()
    point = results.points[0]
    if point.status != "ok" or point.failed:
        raise RuntimeError(f"the study's point failed: {point.error or point.errors}")
    return point.throughput, point.cpu_s


def footprint(kind: str, url: str, threads: int, seconds: float, warmup_s: float) -> dict[str, Any]:
    """One driver at ``threads`` in this (fresh) process: peak memory, CPU per request."""
    rss0 = _rss()
    peak = [rss0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            peak[0] = max(peak[0], _rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    run = study if kind == "study" else bare
    throughput, cpu_s = run(url, threads, seconds, warmup_s)
    stop.set()
    sampler.join()
    return {
        "driver": kind,
        "threads": threads,
        "requests_per_s": round(throughput, 1),
        "rss_start_mb": round(rss0 / 2**20, 1),
        "rss_peak_mb": round(peak[0] / 2**20, 1),
        "cpu_us_per_request": round(1e6 * cpu_s / (throughput * seconds), 1),
        "cores": round(cpu_s / seconds, 2),
    }


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def in_fresh_process(
    kind: str, url: str, threads: int, seconds: float, warmup_s: float
) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--footprint",
        kind,
        "--url",
        url,
        "--threads",
        str(threads),
        "--seconds",
        str(seconds),
        "--warmup",
        str(warmup_s),
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} at {threads} threads failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="measured per turn")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 64])
    parser.add_argument("--threads", type=int, default=1000, help="the footprint's; 0: none")
    parser.add_argument("--footprint", choices=["bare", "study"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.footprint:
        found = footprint(args.footprint, args.url, args.threads, args.seconds, args.warmup)
        print(json.dumps(found))
        return 0
    summary: dict[str, Any] = {"bound": BOUND, "concurrency": {}}
    with TritonServer(ROOT / "tests" / "models") as server:  # tracing off
        url = server.http_url
        print(
            f"tritonserver {url}, {MODEL}, tracing off; {args.rounds} rounds of "
            f"{args.seconds:g} s a driver",
            flush=True,
        )
        for concurrency in args.concurrency:
            pairs = []
            for round_ in range(args.rounds):
                order = ("bare", "study") if round_ % 2 == 0 else ("study", "bare")
                got = {
                    kind: (bare if kind == "bare" else study)(
                        url, concurrency, args.seconds, args.warmup
                    )[0]
                    for kind in order
                }
                pairs.append((got["bare"], got["study"]))
            ratios = [s / b for b, s in pairs]
            ratio = statistics.median(ratios)
            entry = {
                "bare_median": round(statistics.median(b for b, _ in pairs), 1),
                "study_median": round(statistics.median(s for _, s in pairs), 1),
                "ratio_median": round(ratio, 3),
                "ratios": [round(r, 3) for r in ratios],
                "verdict": "met" if ratio >= BOUND else "missed",
            }
            summary["concurrency"][str(concurrency)] = entry
            print(
                f"concurrency {concurrency:>3}: bare {entry['bare_median']:8.1f}/s, study "
                f"{entry['study_median']:8.1f}/s, ratio {ratio:.3f} (rounds: "
                f"{', '.join(f'{r:.3f}' for r in ratios)}): {entry['verdict']}",
                flush=True,
            )
        if args.threads:
            for kind in ("bare", "study"):
                # a thousand threads ramp up for seconds: a longer warm-up and window
                found = in_fresh_process(
                    kind, url, args.threads, max(args.seconds, 5.0), max(args.warmup, 5.0)
                )
                summary[f"footprint_{kind}"] = found
                print(
                    f"{kind:>5} at {args.threads} threads: {found['requests_per_s']}/s, "
                    f"peak RSS {found['rss_peak_mb']} MB (from {found['rss_start_mb']} MB), "
                    f"{found['cpu_us_per_request']} us CPU a request, {found['cores']} cores",
                    flush=True,
                )
    verdicts = [e["verdict"] for e in summary["concurrency"].values()]
    summary["verdict"] = (
        "not judged" if not verdicts else "met" if all(v == "met" for v in verdicts) else "missed"
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
