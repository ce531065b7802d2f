"""How well the pipeline tracks: edge efficiency and purity per stage, and track efficiency.

Conventions (ExaTrkX's):

- an edge's **efficiency** is measured against the truth graph: the fraction of truth edges
  (consecutive hits of a particle) that a stage keeps, in either direction;
- its **purity** counts as true any kept edge joining two hits of the same particle, consecutive
  or not: a skipped layer still joins the right hits for connected components. Noise hits belong
  to no particle, so an edge touching one is false;
- a particle with at least ``min_hits`` hits is **found** when strictly more than half of its
  hits sit in one predicted track and strictly more than half of that track's hits are its own
  (the "double majority"; strictly, so that two equal tracks merged into one do not count).

Ratios with nothing to count (no truth edge, no kept edge, no particle) are NaN.

From a shell: ``python -m gnn_tracking.physics.quality --events 20 --n-particles 40 [--json]``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch

from gnn_tracking.physics.events import generate_event, true_edges
from gnn_tracking.physics.graph import connected_components
from gnn_tracking.physics.models import WEIGHTS_DIR, Models, load_models
from gnn_tracking.physics.pipeline import run_pipeline

__all__ = ["edge_metrics", "evaluate", "format_report", "main", "track_efficiency"]

STAGES = ("build_graph", "filter", "gnn")


def edge_metrics(edges: torch.Tensor, truth: torch.Tensor, num_nodes: int) -> tuple[float, float]:
    """``(efficiency, purity)`` of ``edges`` against the truth graph ``truth`` (both ``[2, E]``).

    >>> edge_metrics(torch.tensor([[1, 2], [0, 0]]), torch.tensor([[0], [1]]), 3)
    (1.0, 0.5)
    """
    found, n_truth, true_kept, n_kept = edge_counts(edges, truth, num_nodes)
    return _ratio(found, n_truth), _ratio(true_kept, n_kept)


def edge_counts(
    edges: torch.Tensor, truth: torch.Tensor, num_nodes: int
) -> tuple[int, int, int, int]:
    """Truth edges kept, truth edges, kept edges that are true, kept edges."""
    edges, truth = edges.cpu(), truth.cpu()
    kept = _undirected(edges, num_nodes)
    found = int(torch.isin(_undirected(truth, num_nodes), kept).sum())
    # the truth graph is one chain per particle: its components are the particles
    particle = connected_components(num_nodes, truth)
    sizes = torch.bincount(particle, minlength=1)
    true = (particle[edges[0]] == particle[edges[1]]) & (sizes[particle[edges[0]]] > 1)
    return found, int(truth.shape[1]), int(true.sum()), int(kept.shape[0])


def _undirected(edges: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """One int64 key per edge whatever its direction; duplicates removed."""
    high = torch.maximum(edges[0], edges[1])
    low = torch.minimum(edges[0], edges[1])
    keys: torch.Tensor = torch.unique(high * num_nodes + low)
    return keys


def track_efficiency(labels: torch.Tensor, particle_id: torch.Tensor, min_hits: int = 5) -> float:
    """Fraction of the particles with ``min_hits`` hits or more that are found (double majority).

    >>> track_efficiency(torch.tensor([0, 0, 1, 2, 3]), torch.tensor([1, 1, 2, 2, 2]), 2)
    0.5
    """
    matched, eligible = track_counts(labels, particle_id, min_hits)
    return _ratio(matched, eligible)


def track_counts(
    labels: torch.Tensor, particle_id: torch.Tensor, min_hits: int = 5
) -> tuple[int, int]:
    """Particles found, and particles with at least ``min_hits`` hits."""
    labels, particle_id = labels.cpu(), particle_id.cpu()
    if particle_id.numel() == 0:
        return 0, 0
    hits = torch.bincount(particle_id)
    hits[0] = 0  # noise is no particle
    eligible = hits >= min_hits
    track_size = torch.bincount(labels)
    signal = particle_id > 0
    stride = int(particle_id.max()) + 1
    pairs, shared = torch.unique(labels[signal] * stride + particle_id[signal], return_counts=True)
    track, particle = pairs // stride, pairs % stride
    majority = (2 * shared > hits[particle]) & (2 * shared > track_size[track])
    found = torch.zeros_like(eligible)
    found[particle[majority]] = True
    return int((found & eligible).sum()), int(eligible.sum())


def evaluate(
    models: Models, n_events: int = 20, n_particles: int = 40, seed: int = 1_000
) -> dict[str, Any]:
    """Quality of the pipeline over ``n_events`` fresh events (seeds ``seed``, ``seed + 1``, ...),
    counts summed over all events before dividing.

    >>> evaluate(load_models(), 10)["gnn"]["purity"]
    """
    totals = {stage: [0, 0, 0, 0] for stage in STAGES}
    matched = eligible = hits = 0
    for k in range(n_events):
        event = generate_event(n_particles, seed=seed + k)
        result = run_pipeline(models, event.features)
        truth = true_edges(event)
        kept = result.scores.cpu() > models.config.gnn_cut
        stage_edges = {
            "build_graph": result.edge_index,
            "filter": result.filtered_edges,
            "gnn": result.filtered_edges.cpu()[:, kept],
        }
        for stage, edges in stage_edges.items():
            counts = edge_counts(edges, truth, event.num_hits)
            totals[stage] = [a + b for a, b in zip(totals[stage], counts, strict=True)]
        m, e = track_counts(result.labels, event.particle_id)
        matched, eligible, hits = matched + m, eligible + e, hits + event.num_hits
    report: dict[str, Any] = {"events": n_events, "n_particles": n_particles}
    report["hits_per_event"] = hits / max(n_events, 1)
    for stage, (found, n_truth, true_kept, n_kept) in totals.items():
        report[stage] = {
            "efficiency": _ratio(found, n_truth),
            "purity": _ratio(true_kept, n_kept),
            "edges_per_event": n_kept / max(n_events, 1),
        }
    report["track_efficiency"] = _ratio(matched, eligible)
    return report


def format_report(report: dict[str, Any]) -> str:
    """A few aligned lines for a terminal."""
    lines = [
        f"{report['events']} events of {report['n_particles']} particles, "
        f"{report['hits_per_event']:.0f} hits each"
    ]
    for stage in STAGES:
        values = report[stage]
        lines.append(
            f"  {stage:<12} efficiency {values['efficiency']:6.1%}  purity "
            f"{values['purity']:6.1%}  edges/event {values['edges_per_event']:8.1f}"
        )
    lines.append(
        f"  track efficiency {report['track_efficiency']:.1%} (double majority, >= 5 hits)"
    )
    return "\n".join(lines)


def _ratio(numerator: int, denominator: int) -> float:
    return numerator / denominator if denominator else math.nan


def main(argv: list[str] | None = None) -> int:
    """``python -m gnn_tracking.physics.quality``: the quality report of the cached weights."""
    parser = argparse.ArgumentParser(
        prog="python -m gnn_tracking.physics.quality", description=main.__doc__
    )
    parser.add_argument("--events", type=int, default=20)
    parser.add_argument("--n-particles", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1_000)
    parser.add_argument("--weights", type=Path, default=WEIGHTS_DIR)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = evaluate(
        load_models(weights_dir=args.weights), args.events, args.n_particles, args.seed
    )
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
