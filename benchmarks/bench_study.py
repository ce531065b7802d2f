"""The study driver's efficiency: ``otelkit study``'s closed loop against a bare tritonclient
thread-pool loop, side by side on the same Triton model, up to 1,000 threads.

At each concurrency (1, 8 and 64 requests in flight) the two drivers take turns for
``--rounds`` rounds (which goes first alternates), each for ``--seconds`` measured after a
warm-up, against ``identity_fp32`` of the test models on one tritonserver with tracing off. The
bare loop is what a user would write: a thread per request in flight, each with its own
``tritonclient.http`` client, calling ``infer`` back to back and counting completions in the
measured window. The study runs ``Study(model=..., load=Load(concurrency=n))`` with no tracing
and no metrics scrape, so both do the same requests. Bound (issue 29): the study's throughput
is at least 95 % of the bare loop's (the median of the rounds' paired ratios).

At ``--threads`` (1,000) three drivers take turns in this process for ``--thread-rounds``
rounds (the order rotates): the bare loop, the *floor* (the bare loop doing the bookkeeping
no driver can leave out: a request's index, its start and end times kept per thread) and
the study; each turn's CPU time per request over its measured window. Bound (issue 46): the
study's CPU per request at most 1.2 times the bare loop's (the median of the rounds' paired
ratios). A round's ratio on a busy 2-core host spreads widely (0.01 to 166 at 1,000 threads):
each median is printed with its 95 % interval (``medians.median_interval``, the binomial
law's order statistics), and a verdict is ``met`` or ``missed`` only where the whole
interval is on one side of its bound, ``undecided`` otherwise. Then each of bare and study
runs alone in a fresh process for its peak resident memory.

    python benchmarks/bench_study.py [--rounds 12] [--seconds 1] [--threads 1000]

The last line is JSON.
"""

from __future__ import annotations

import argparse
import itertools
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

import gevent
import numpy as np
import tritonclient.http as httpclient
from medians import median_interval, verdict  # benchmarks/, this script's directory

from otelkit.study import Load, Remote, Study, StudyError
from otelkit.tritonserver import TritonServer

ROOT = Path(__file__).resolve().parents[1]
MODEL = "identity_fp32"
BOUND = 0.95  # the study's throughput over the bare loop's, at least
CPU_BOUND = 1.2  # the study's CPU per request over the bare loop's at --threads, at most
DRIVERS = ("bare", "floor", "study")
PAGE = os.sysconf("SC_PAGE_SIZE")


def bare(
    url: str, concurrency: int, seconds: float, warmup_s: float, bookkeeping: bool = False
) -> tuple[float, float]:
    """Requests a second of the bare loop over the measured window, and its CPU seconds; with
    ``bookkeeping``, each request also takes an index and keeps its start and end times, as
    any driver that reports latencies must (the floor of the study's own cost)."""
    stop, go = threading.Event(), threading.Event()
    counts = [0] * concurrency
    data = np.zeros((1, 16), dtype=np.float32)
    indices = itertools.count()

    def loop(slot: int) -> None:
        go.wait()  # the threads start together: a thread started among busy ones waits long
        # each thread makes its client once the load starts, as the study's do: at 1,000
        # threads, clients made before sent a thousand first requests at once, and that loop
        # then spent 3 times the CPU a request of one whose threads make theirs after (0.34
        # [0.26, 1.19], 8 rounds): the GIL's wake-ups settle into either state and stay
        client = httpclient.InferenceServerClient(url, network_timeout=60)
        tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(data)
        begins: list[float] = []
        ends: list[float] = []
        while not stop.is_set():
            if bookkeeping:
                begin = time.perf_counter()
                next(indices)
                client.infer(MODEL, [tensor])
                begins.append(begin)
                ends.append(time.perf_counter())
            else:
                client.infer(MODEL, [tensor])
            counts[slot] += 1
        client.close()
        # tritonclient.http's gevent hub: its event loop's two file descriptors outlive the
        # thread unless destroyed (the study's ModelCalls does it too)
        gevent.get_hub().destroy(destroy_loop=True)

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


def turn(
    kind: str, url: str, concurrency: int, seconds: float, warmup_s: float
) -> tuple[float, float] | None:
    """One driver's turn: requests a second and CPU microseconds a request; ``None`` when it
    measured no request (on a host loaded far past its cores, a thousand threads may take
    longer to start than the warm-up and the window)."""
    if kind == "study":
        try:
            throughput, cpu_s = study(url, concurrency, seconds, warmup_s)
        except StudyError as error:
            if "no request completed" not in str(error):
                raise
            return None
    else:
        throughput, cpu_s = bare(url, concurrency, seconds, warmup_s, bookkeeping=kind == "floor")
    if throughput <= 0:
        return None
    return throughput, 1e6 * cpu_s / (throughput * seconds)


def side_by_side(
    url: str, kinds: tuple[str, ...], concurrency: int, rounds: int, seconds: float, warmup_s: float
) -> tuple[list[dict[str, tuple[float, float]]], int]:
    """``rounds`` rounds of a turn each of ``kinds``, in an order that rotates round by round
    (each kind goes first as often): per round, each kind's (requests/s, CPU us a request);
    and how many rounds were lost, a turn of theirs having measured nothing."""
    found = []
    lost = 0
    for round_ in range(rounds):
        shift = round_ % len(kinds)
        order = kinds[shift:] + kinds[:shift]
        got = {kind: turn(kind, url, concurrency, seconds, warmup_s) for kind in order}
        measured = {kind: value for kind, value in got.items() if value is not None}
        if len(measured) == len(kinds):
            found.append(measured)
            continue
        lost += 1
        empty = ", ".join(kind for kind in kinds if kind not in measured)
        print(f"  round {round_ + 1} lost: {empty} measured no request", flush=True)
    if len(found) < rounds / 2:
        raise RuntimeError(f"{lost} of {rounds} rounds at {concurrency} measured nothing")
    return found, lost


MIN_ROUNDS = 6  # fewer: the rounds' range covers the median less than 95 % of the time


def summarise(ratios: list[float]) -> dict[str, Any]:
    """The median of the rounds' paired ratios, its 95 % interval and the rounds' range."""
    low, high = median_interval(ratios)
    return {
        "median": round(statistics.median(ratios), 3),
        "interval95": [round(low, 3), round(high, 3)],
        "rounds": [round(r, 3) for r in ratios],
    }


def at_least(summary: dict[str, Any], bound: float) -> str:
    """``met`` when the whole interval is at or above ``bound``, ``missed`` when it is all
    below, else ``undecided`` (and with too few rounds for an interval)."""
    low, high = summary["interval95"]
    if len(summary["rounds"]) < MIN_ROUNDS:
        return "undecided"
    return "met" if low >= bound else "missed" if high < bound else "undecided"


def at_most(summary: dict[str, Any], bound: float) -> str:
    """``met`` when the whole interval is at or below ``bound``, ``missed`` when it is all
    above, else ``undecided`` (and with too few rounds for an interval)."""
    if len(summary["rounds"]) < MIN_ROUNDS:
        return "undecided"
    return str(verdict(summary["median"], summary["interval95"], bound)["verdict"])


def footprint(kind: str, url: str, threads: int, seconds: float, warmup_s: float) -> dict[str, Any]:
    """One driver at ``threads`` in this (fresh) process: its peak resident memory."""
    rss0 = _rss()
    peak = [rss0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            peak[0] = max(peak[0], _rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    run = study if kind == "study" else bare
    throughput, _ = run(url, threads, seconds, warmup_s)
    stop.set()
    sampler.join()
    return {
        "driver": kind,
        "threads": threads,
        "requests_per_s": round(throughput, 1),
        "rss_start_mb": round(rss0 / 2**20, 1),
        "rss_peak_mb": round(peak[0] / 2**20, 1),
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
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=1.0, help="measured per turn")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 64])
    parser.add_argument("--threads", type=int, default=1000, help="0: not measured")
    parser.add_argument("--thread-rounds", type=int, default=10)
    parser.add_argument("--thread-seconds", type=float, default=1.5, help="measured per turn")
    # a thousand threads ramp up for a second or two: their connections, gevent's hubs
    parser.add_argument("--thread-warmup", type=float, default=3.0)
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
            f"{args.seconds:g} s a driver; load average {_load()}",
            flush=True,
        )
        for concurrency in args.concurrency:
            rounds, lost = side_by_side(
                url, ("bare", "study"), concurrency, args.rounds, args.seconds, args.warmup
            )
            entry = {**_compare(rounds, "study"), "lost_rounds": lost}
            entry["verdict"] = at_least(entry["throughput_ratio"], BOUND)
            summary["concurrency"][str(concurrency)] = entry
            print(f"concurrency {concurrency:>4}: {_line(entry, 'study')}", flush=True)
        if args.threads:
            print(
                f"{args.threads} threads: bare, floor and study take turns, "
                f"{args.thread_rounds} rounds of {args.thread_seconds:g} s after "
                f"{args.thread_warmup:g} s; load average {_load()}",
                flush=True,
            )
            rounds, lost = side_by_side(
                url,
                DRIVERS,
                args.threads,
                args.thread_rounds,
                args.thread_seconds,
                args.thread_warmup,
            )
            entry = {kind: _compare(rounds, kind) for kind in ("floor", "study")}
            entry["study"]["verdict"] = at_most(entry["study"]["cpu_ratio"], CPU_BOUND)
            summary["threads"] = {
                "threads": args.threads,
                "cpu_bound": CPU_BOUND,
                "lost_rounds": lost,
                **entry,
            }
            for kind in ("floor", "study"):
                print(f"{kind:>5} at {args.threads} threads: {_line(entry[kind], kind)}")
            print(f"load average {_load()}", flush=True)
            for kind in ("bare", "study"):
                # alone in a fresh process: its own peak memory
                found = in_fresh_process(kind, url, args.threads, 5.0, 5.0)
                summary[f"footprint_{kind}"] = found
                print(
                    f"{kind:>5} alone at {args.threads} threads: peak RSS {found['rss_peak_mb']} "
                    f"MB (from {found['rss_start_mb']} MB), {found['requests_per_s']}/s",
                    flush=True,
                )
    verdicts = [e["verdict"] for e in summary["concurrency"].values()]
    if "threads" in summary:
        verdicts.append(summary["threads"]["study"]["verdict"])
    summary["verdict"] = (
        "not judged"
        if not verdicts
        else "met"
        if all(v == "met" for v in verdicts)
        else "missed"
        if "missed" in verdicts
        else "undecided"
    )
    print(json.dumps(summary))
    return 0


def _compare(rounds: list[dict[str, tuple[float, float]]], kind: str) -> dict[str, Any]:
    """``kind`` against the bare loop over paired rounds: medians of each, and the medians
    of the rounds' ratios (throughput, CPU a request) with their intervals."""
    return {
        "bare_per_s": round(statistics.median(r["bare"][0] for r in rounds), 1),
        f"{kind}_per_s": round(statistics.median(r[kind][0] for r in rounds), 1),
        "bare_cpu_us": round(statistics.median(r["bare"][1] for r in rounds), 1),
        f"{kind}_cpu_us": round(statistics.median(r[kind][1] for r in rounds), 1),
        "throughput_ratio": summarise([r[kind][0] / r["bare"][0] for r in rounds]),
        "cpu_ratio": summarise([r[kind][1] / r["bare"][1] for r in rounds]),
    }


def _line(entry: dict[str, Any], kind: str) -> str:
    def ratio(name: str) -> str:
        found = entry[name]
        low, high = found["interval95"]
        spread = f"{min(found['rounds']):.2f}-{max(found['rounds']):.2f}"
        return f"{found['median']:.3f} [{low:.3f}, {high:.3f}] (rounds {spread})"

    return (
        f"bare {entry['bare_per_s']:7.1f}/s {entry['bare_cpu_us']:6.0f} us, {kind} "
        f"{entry[f'{kind}_per_s']:7.1f}/s {entry[f'{kind}_cpu_us']:6.0f} us a request "
        f"(medians); ratios {kind}/bare, median [95 % interval]: throughput "
        f"{ratio('throughput_ratio')}, CPU a request {ratio('cpu_ratio')}"
        + (f": {entry['verdict']}" if "verdict" in entry else "")
    )


def _load() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
