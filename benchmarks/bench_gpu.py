"""GPU sampler cost: one sample of every GPU, and one scrape of the exporter that serves it.

The sampler reads an 8-GPU node (``tests/fixtures/gpu/h100x8.json`` replayed, or real NVML
with ``--nvml``) back to back; each sample's CPU time (``thread_time``: what the sampler takes
from the node, not time spent waiting in NVML's 20 ms PCIe window) and wall time are measured.
The exporter's ``/metrics`` is then scraped, to show what a Prometheus scrape costs on top. The
samples alternate: every field read (``every_field_us_per_gpu``), and the default cadence's
samples between two reads of the backend's slow fields (``fast_fields_us_per_gpu``; NVML's PCIe
throughput and energy counter, read every 10 s). The last line is JSON: ``sample_us_per_gpu``
(CPU, median, the two mixed as the default cadence mixes them at one sample a second),
``cpu_pct_at_1hz_8gpu`` (share of one core when sampling 8 GPUs once a second),
``sample_wall_us_per_gpu`` (every field) and ``scrape_ms``. ``--per-call`` first times each call
the backend makes, for the first GPU.

    python benchmarks/bench_gpu.py [--samples 2000] [--nvml] [--per-call]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path

from otelkit.gpu import (
    FIELDS,
    Device,
    FieldNoData,
    FieldNotSupported,
    GpuBackend,
    GpuReadError,
    GpuSampler,
    NvmlBackend,
    ReplayBackend,
)
from otelkit.gpu._exporter import GpuExporter

RECORDING = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gpu" / "h100x8.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000, help="samples to time")
    parser.add_argument("--scrapes", type=int, default=200, help="scrapes to time")
    parser.add_argument("--nvml", action="store_true", help="real NVML instead of the replay")
    parser.add_argument("--per-call", action="store_true", help="also time each backend call")
    args = parser.parse_args()
    backend: GpuBackend = NvmlBackend() if args.nvml else ReplayBackend(RECORDING)
    if args.per_call:
        _per_call(NvmlBackend() if args.nvml else ReplayBackend(RECORDING), repeats=50)
    exporter = GpuExporter(backend, "127.0.0.1", 0, interval_s=3600)  # no background samples
    sampler = exporter.sampler
    gpus = len([d for d in sampler.devices if d.mig_instance is None])
    if not gpus:
        print(f"no GPU to sample: {sampler.unavailable_reason}", file=sys.stderr)
        return 1
    for _ in range(50):  # warm-up
        sampler.sample()
    # every sample reading every field, then the default cadence's samples between two reads
    # of the backend's slow fields (``slow_fields``), interleaved
    every = {"cpu": [], "wall": []}
    between = {"cpu": [], "wall": []}
    for _ in range(args.samples):
        for taken, slow_interval_s in ((every, 0.0), (between, 3600.0)):
            sampler.slow_interval_s = slow_interval_s
            cpu0, wall0 = time.thread_time_ns(), time.perf_counter_ns()
            sampler.sample()
            taken["wall"].append((time.perf_counter_ns() - wall0) / 1e3)
            taken["cpu"].append((time.thread_time_ns() - cpu0) / 1e3)
    scrape_ms = []
    for _ in range(args.scrapes):
        started = time.perf_counter()
        with urllib.request.urlopen(exporter.url) as response:
            size = len(response.read())
        scrape_ms.append((time.perf_counter() - started) * 1e3)
    exporter.close()
    every_us = statistics.median(every["cpu"]) / gpus
    between_us = statistics.median(between["cpu"]) / gpus
    # at the default cadence: one sample a second, the slow fields every tenth of them
    ratio = 1.0 / GpuSampler(backend, torch_cuda=False).slow_interval_s
    per_gpu = between_us + (every_us - between_us) * ratio
    result = {
        "backend": "nvml" if args.nvml else f"replay of {RECORDING.name}",
        "gpus": gpus,
        "samples": args.samples,
        "sample_us_per_gpu": round(per_gpu, 1),
        "every_field_us_per_gpu": round(every_us, 1),
        "fast_fields_us_per_gpu": round(between_us, 1),
        "sample_wall_us_per_gpu": round(statistics.median(every["wall"]) / gpus, 1),
        "cpu_pct_at_1hz_8gpu": round(per_gpu * 8 / 1e6 * 100, 4),
        "scrape_ms": round(statistics.median(scrape_ms), 2),
        "exposition_bytes": size,
        "target_cpu_pct_at_1hz_8gpu": 0.2,
    }
    print(
        f"one sample, per GPU: every field {every_us:.1f} us CPU, the fast ones "
        f"{between_us:.1f} us; at 1 Hz with the slow fields every "
        f"{1 / ratio:g} s: {per_gpu:.1f} us a sample; "
        f"one scrape ({size} bytes): {result['scrape_ms']} ms"
    )
    print(json.dumps(result))
    return 0


def _per_call(backend: GpuBackend, repeats: int) -> None:
    """Median CPU and wall time of each call a sample makes, for the first GPU: what to cut."""
    device = backend.open()[0]
    calls: dict[str, Callable[[], object]] = {"begin_sample (GPM)": backend.begin_sample}
    calls.update({field: partial(_quiet_read, backend, device, field) for field in FIELDS})
    calls["processes"] = partial(backend.processes, device)
    for name, call in calls.items():
        cpu, wall = [], []
        for _ in range(repeats):
            cpu0, wall0 = time.thread_time_ns(), time.perf_counter_ns()
            call()
            wall.append((time.perf_counter_ns() - wall0) / 1e3)
            cpu.append((time.thread_time_ns() - cpu0) / 1e3)
        print(
            f"  {name:>28}: {statistics.median(cpu):9.1f} us CPU, "
            f"{statistics.median(wall):9.1f} us wall"
        )
    backend.close()


def _quiet_read(backend: GpuBackend, device: Device, field: str) -> object:
    try:
        return backend.read(device, field)
    except (FieldNotSupported, FieldNoData, GpuReadError):  # timed all the same
        return None


if __name__ == "__main__":
    sys.exit(main())
