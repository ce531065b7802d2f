"""The reference pipeline on a GPU, traced: each stage's host time beside its GPU time.

Runs the five stages of ``examples/gnn_tracking`` in process (service option 0) on CUDA, with
otelkit writing stage spans to JSON-lines files. A stage launches kernels and returns before
they run, so its host time alone misleads; otelkit times each stage with CUDA events too
(``otelkit.stage``'s GPU timing) and puts the GPU time and the growth of torch's allocated
memory on the span. The run also checks that the GPU gives the CPU's track labels for the same
events (the GNN's cut is applied to scores computed in another order, so a few edges near the
cut may differ: the share of hits whose track differs is printed, and must stay small).

Events of three sizes: the reference event's size (about 330 hits), 3,300 and 11,000 hits.
The last line is JSON: per size and stage, median host and GPU milliseconds.

    PYTHONPATH=examples python benchmarks/bench_pipeline_gpu.py [--events 20] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from gnn_tracking.physics.events import generate_event
from gnn_tracking.physics.models import load_models
from gnn_tracking.physics.pipeline import run_pipeline

import otelkit
from otelkit import semconv
from otelkit.analysis import load_spans

STAGE_ORDER = ("embed", "build_graph", "filter", "gnn", "label")  # the pipeline's stage spans
SIZES = {"reference": 30, "3k hits": 300, "11k hits": 1000}  # particles; about 11 hits each
CHECKED = 3  # events per size whose labels are compared with the CPU's (the CPU is slow)
SIZE_ATTRIBUTE = "bench.event_size"


def _partition_agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """Share of hits whose track mates are the same in both labellings (labels may be renamed)."""
    pairs = torch.stack([a.cpu(), b.cpu()], dim=1)
    _, a_of_b = torch.unique(pairs, dim=0, return_inverse=True)
    # a labelling agrees where each (a, b) pair class is the whole of its a class and b class
    same_a = torch.bincount(a.cpu()).gather(0, a.cpu())
    same_b = torch.bincount(b.cpu()).gather(0, b.cpu())
    same_pair = torch.bincount(a_of_b).gather(0, a_of_b)
    return float(((same_pair == same_a) & (same_pair == same_b)).float().mean())


def _device_name() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_initialized() else "cpu"


def _synchronize() -> None:
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20, help="timed events per size")
    parser.add_argument("--out", type=Path, help="where the spans go (a temporary folder)")
    parser.add_argument("--device", default="cuda", help="cpu checks the script without a GPU")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to measure", file=sys.stderr)
        return 1
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-pipeline-gpu-"))
    otelkit.configure(service_name="gnn-pipeline-gpu", traces_dir=out, metrics_exporter="none")
    gpu_models, cpu_models = load_models(args.device), load_models("cpu")
    print(f"{_device_name()}; torch {torch.__version__}; spans to {out}")
    agreement: dict[str, float] = {}
    for size, particles in SIZES.items():
        events = [generate_event(particles, seed=500 + i).features for i in range(args.events)]
        run_pipeline(gpu_models, events[0])  # warm-up: kernels loaded, allocator grown
        _synchronize()
        agree = []
        for n, features in enumerate(events):
            with otelkit.stage("event", size=size):
                labels = run_pipeline(gpu_models, features).labels
            _synchronize()
            if n < CHECKED:
                cpu_labels = run_pipeline(cpu_models, features).labels
                agree.append(_partition_agreement(labels, cpu_labels))
        agreement[size] = min(agree)
    otelkit.flush()
    time.sleep(0.5)  # the GPU timer thread ends stage spans once their events completed
    otelkit.shutdown()
    return _summarise(out, agreement)


def _summarise(out: Path, agreement: dict[str, float]) -> int:
    spans = load_spans(out)
    by_id = {s.span_id: s for s in spans}
    table: dict[str, dict[str, dict[str, float | None]]] = {}
    for size in SIZES:
        rows: dict[str, dict[str, float | None]] = {}
        for stage in STAGE_ORDER:
            runs = [
                s
                for s in spans
                if s.name == stage
                and s.parent_span_id in by_id
                and by_id[s.parent_span_id].attributes.get("size") == size
            ]
            gpu = [
                float(s.attributes[semconv.STAGE_GPU_S])
                for s in runs
                if semconv.STAGE_GPU_S in s.attributes
            ]
            rows[stage] = {
                "runs": len(runs),
                "host_ms": round(statistics.median(s.duration_ns for s in runs) / 1e6, 3),
                "gpu_ms": round(statistics.median(gpu) * 1e3, 3) if gpu else None,
            }
        table[size] = rows
        cells = ", ".join(f"{stage} {r['host_ms']}/{r['gpu_ms']}" for stage, r in rows.items())
        print(f"{size:>10}: host/GPU ms {cells}; labels agree on {agreement[size]:.1%} of hits")
    print(json.dumps({"device": _device_name(), "stages": table, "min_label_agreement": agreement}))
    return 0 if all(rows[s]["runs"] for rows in table.values() for s in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
