"""The instrumented client: sends generated events from a thread pool and reports.

    python -m gnn_tracking.driving.client --option 4 --url 127.0.0.1:8001 --protocol grpc \
        --threads 8
    python -m gnn_tracking.driving.client --option 0 --events 100          # no server at all

Each thread takes the next event of a pre-generated pool and reconstructs it under the chosen
service option, as CMS/ATLAS clients do with a thread per event (up to 1000 threads here, as in
the seeds). Throughput is events per second of wall time; latency percentiles are per event.
otelkit is configured from the environment (``OTEL_*``/``OTELKIT_*``): point
``OTEL_EXPORTER_OTLP_ENDPOINT`` at a collector or receiver to keep the traces.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import statistics
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

import otelkit
from gnn_tracking.driving.http_parse import explain
from gnn_tracking.driving.options import (
    OPTIONS,
    THREADS_ATTRIBUTE,
    Remote,
    ServiceOption,
    reconstruct,
)
from gnn_tracking.physics.events import generate_event
from gnn_tracking.physics.models import Models, load_models

__all__ = ["MAX_THREADS", "RunReport", "drive", "event_pool"]

MAX_THREADS = 1000


@dataclass(frozen=True)
class RunReport:
    option: int
    threads: int
    events: int
    errors: int
    seconds: float
    latencies_s: tuple[float, ...]
    first_error: str = ""
    error_kinds: tuple[tuple[str, int], ...] = ()  # each error type, how often
    http_parse_error: str = ""  # whose fault the first HTTPParseError was (``http_parse``)

    @property
    def throughput(self) -> float:
        """Events reconstructed per second of wall time."""
        return self.events / self.seconds if self.seconds else 0.0

    def percentile_ms(self, q: float) -> float:
        if not self.latencies_s:
            return float("nan")
        if len(self.latencies_s) == 1:
            return self.latencies_s[0] * 1e3
        return statistics.quantiles(self.latencies_s, n=100, method="inclusive")[int(q) - 1] * 1e3

    def line(self) -> str:
        errors = f", {self.errors} errors ({self.first_error})" if self.errors else ""
        return (
            f"option {self.option} threads {self.threads:>4}: {self.throughput:8.1f} events/s, "
            f"latency p50 {self.percentile_ms(50):7.2f} ms p90 {self.percentile_ms(90):7.2f} ms "
            f"p99 {self.percentile_ms(99):7.2f} ms ({self.events} events){errors}"
        )


def event_pool(size: int, n_particles: int, seed: int = 1000) -> list[torch.Tensor]:
    """``size`` events' features, generated once so the run measures reconstruction only."""
    return [generate_event(n_particles, seed=seed + i).features for i in range(size)]


def drive(
    option: ServiceOption,
    events: Sequence[torch.Tensor],
    *,
    threads: int,
    models: Models | None = None,
    remote: Remote | None = None,
    count: int | None = None,
    seconds: float | None = None,
    max_errors: int = 100,
    attributes: Mapping[str, str | int] | None = None,
) -> RunReport:
    """Reconstruct ``count`` events, or as many as ``seconds`` allows, from ``threads`` threads.

    A failed event is counted and the run goes on; after ``max_errors`` failures (a dead
    server) every thread stops, and the report says so.
    """
    if not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"threads must be within 1..{MAX_THREADS}, not {threads}")
    if count is None and seconds is None:
        raise ValueError("give count or seconds")
    tickets = itertools.count()
    lock = threading.Lock()
    latencies: list[float] = []
    errors: list[BaseException] = []
    start = time.perf_counter()
    deadline = start + seconds if seconds is not None else float("inf")

    def worker() -> None:
        while time.perf_counter() < deadline and len(errors) < max_errors:
            ticket = next(tickets)
            if count is not None and ticket >= count:
                return
            began = time.perf_counter()
            try:
                reconstruct(
                    option,
                    events[ticket % len(events)],
                    models,
                    remote,
                    {THREADS_ATTRIBUTE: threads, **(attributes or {})},
                )
            except Exception as error:
                with lock:
                    errors.append(error)
                continue
            elapsed = time.perf_counter() - began
            with lock:
                latencies.append(elapsed)

    with ThreadPoolExecutor(threads, thread_name_prefix="event") as pool:
        for future in [pool.submit(worker) for _ in range(threads)]:
            future.result()
    first = f"{type(errors[0]).__name__}: {errors[0]}" if errors else ""
    parse_errors = (explain(error) for error in errors)
    return RunReport(
        option.number,
        threads,
        len(latencies),
        len(errors),
        time.perf_counter() - start,
        tuple(latencies),
        first[:200],
        tuple(collections.Counter(type(error).__name__ for error in errors).items()),
        next((why for why in parse_errors if why is not None), ""),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--option", type=int, choices=[o.number for o in OPTIONS], default=4)
    parser.add_argument("--url", default="127.0.0.1:8001", help="server host:port")
    parser.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    parser.add_argument("--threads", type=int, default=8, help=f"1..{MAX_THREADS}")
    parser.add_argument("--events", type=int, default=200, help="events to reconstruct")
    parser.add_argument("--n-particles", type=int, default=40, help="event size")
    parser.add_argument("--pool", type=int, default=32, help="distinct events generated")
    parser.add_argument("--torch-threads", type=int, default=1, help="intra-op, per process")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.torch_threads)  # event threads are the parallelism
    option = OPTIONS[args.option]
    telemetry = otelkit.configure(service_name="gnn-tracking-client")
    print(telemetry, file=sys.stderr)
    models = load_models() if option.runs_locally else None
    remote = Remote(args.url, args.protocol) if option.served else None
    try:
        events = event_pool(args.pool, args.n_particles)
        report = drive(
            option, events, threads=args.threads, models=models, remote=remote, count=args.events
        )
    finally:
        if remote is not None:
            remote.close()
        otelkit.shutdown()
    print(report.line())
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
