"""GPU sampler cost: one sample of every GPU, and one scrape of the exporter that serves it.

The sampler reads an 8-GPU node (``tests/fixtures/gpu/h100x8.json`` replayed, or real NVML
with ``--nvml``) back to back; each sample's CPU time (``thread_time``: what the sampler takes
from the node, not time spent waiting in NVML's 20 ms PCIe window) and wall time are measured.
The exporter's ``/metrics`` is then scraped, to show what a Prometheus scrape costs on top. The
last line is JSON: ``sample_us_per_gpu`` (CPU, median), ``cpu_pct_at_1hz_8gpu`` (share of one
core when sampling 8 GPUs once a second), ``sample_wall_us_per_gpu`` and ``scrape_ms``.

    python benchmarks/bench_gpu.py [--samples 2000] [--nvml]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

from otelkit.gpu import GpuBackend, NvmlBackend, ReplayBackend
from otelkit.gpu.exporter import GpuExporter

RECORDING = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gpu" / "h100x8.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000, help="samples to time")
    parser.add_argument("--scrapes", type=int, default=200, help="scrapes to time")
    parser.add_argument("--nvml", action="store_true", help="real NVML instead of the replay")
    args = parser.parse_args()
    backend: GpuBackend = NvmlBackend() if args.nvml else ReplayBackend(RECORDING)
    exporter = GpuExporter(backend, "127.0.0.1", 0, interval_s=3600)  # no background samples
    sampler = exporter.sampler
    gpus = len([d for d in sampler.devices if d.mig_instance is None])
    if not gpus:
        print(f"no GPU to sample: {sampler.unavailable_reason}", file=sys.stderr)
        return 1
    for _ in range(50):  # warm-up
        sampler.sample()
    cpu_us, wall_us = [], []
    for _ in range(args.samples):
        cpu0, wall0 = time.thread_time_ns(), time.perf_counter_ns()
        sampler.sample()
        wall_us.append((time.perf_counter_ns() - wall0) / 1e3)
        cpu_us.append((time.thread_time_ns() - cpu0) / 1e3)
    scrape_ms = []
    for _ in range(args.scrapes):
        started = time.perf_counter()
        with urllib.request.urlopen(exporter.url) as response:
            size = len(response.read())
        scrape_ms.append((time.perf_counter() - started) * 1e3)
    exporter.close()
    per_gpu = statistics.median(cpu_us) / gpus
    result = {
        "backend": "nvml" if args.nvml else f"replay of {RECORDING.name}",
        "gpus": gpus,
        "samples": args.samples,
        "sample_us_per_gpu": round(per_gpu, 1),
        "sample_wall_us_per_gpu": round(statistics.median(wall_us) / gpus, 1),
        "cpu_pct_at_1hz_8gpu": round(per_gpu * 8 / 1e6 * 100, 4),
        "scrape_ms": round(statistics.median(scrape_ms), 2),
        "exposition_bytes": size,
        "target_cpu_pct_at_1hz_8gpu": 0.2,
    }
    print(f"one sample of {gpus} GPUs: {statistics.median(cpu_us):.0f} us CPU "
          f"({per_gpu:.1f} us per GPU), {statistics.median(wall_us):.0f} us wall; "
          f"one scrape ({size} bytes): {result['scrape_ms']} ms")  # fmt: skip
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
