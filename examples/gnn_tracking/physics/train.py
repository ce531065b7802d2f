"""Train the three networks on synthetic events and save them into ``weights/``.

``python -m gnn_tracking.physics.train [--events N --n-particles P --seconds S --out DIR --seed K
--steps F]``: by default 32 events of 200 particles, denser than the 40-particle reference events
so that the networks also cope with busier ones; about 80 s on two cores.

1. The embedding, with a contrastive hinge loss: consecutive hits of a particle are pulled
   together, random pairs and the current near neighbours from other particles pushed beyond a
   margin. The graph's radius is then the distance that keeps ``GRAPH_EFFICIENCY`` of the
   truth edges of held-out events.
2. The edge filter, on the radius graphs of the training events, an edge labelled true when its
   hits share a particle. Its cut keeps ``FILTER_EFFICIENCY`` of the truth edges that the graph
   found in held-out events.
3. The GNN, on the filtered edges, same labels; its cut is the one of ``GNN_CUTS`` that finds the
   most tracks in held-out events.

Step counts and seed are fixed, so a run repeats itself bit for bit; ``--seconds`` only caps a
run on a slow machine (each phase stops at its share, and says so); ``--steps`` scales the step
counts (0.02 makes a smoke run of a few seconds).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from gnn_tracking.physics.events import Event, generate_event, true_edges
from gnn_tracking.physics.graph import connected_components, radius_graph
from gnn_tracking.physics.models import WEIGHTS_DIR, Models, PipelineConfig, save_models
from gnn_tracking.physics.quality import evaluate, format_report, track_counts

__all__ = ["TrainSettings", "main", "train"]

logger = logging.getLogger(__name__)

GRAPH_EFFICIENCY = 0.995
FILTER_EFFICIENCY = 0.995
GNN_CUTS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995)
MARGIN = 1.0
LEARNING_RATE = 3e-3
# event seeds, apart from each other and from the small seeds tests and examples use
_TRAIN_SEEDS, _HELD_OUT_SEEDS, _REPORT_SEEDS = 100_000, 200_000, 300_000
_SHARES = {"embedding": 0.2, "filter": 0.1, "gnn": 0.6}  # of --seconds; the rest: evaluation


@dataclass(frozen=True)
class TrainSettings:
    """What to train on, how many steps, the wall-clock cap, and where to save."""

    events: int = 32
    n_particles: int = 200  # denser than the reference events: the networks then also cope
    seconds: float = 300.0  # a safety cap: about 80 s are needed on two cores
    out: Path = WEIGHTS_DIR
    seed: int = 0
    batch: int = 1  # events per step
    embedding_steps: int = 1000
    filter_steps: int = 1500
    gnn_steps: int = 1200
    held_out: int = 16
    report_events: int = 20
    config: PipelineConfig = field(default_factory=PipelineConfig)  # sizes; cuts are trained


@dataclass(frozen=True)
class _Graph:
    """One event's (or a batch's) hits, embeddings and candidate edges with their labels."""

    features: torch.Tensor
    embedding: torch.Tensor
    edges: torch.Tensor
    labels: torch.Tensor


def train(settings: TrainSettings | None = None) -> Models:
    """Train, choose the radius and the cuts, save into ``settings.out``; the frozen models.

    >>> train(TrainSettings(events=4, embedding_steps=20, out=Path("/tmp/weights")))
    """
    settings = settings or TrainSettings()
    started = time.monotonic()
    torch.manual_seed(settings.seed)
    generator = torch.Generator().manual_seed(settings.seed)
    seeds = range(1_000 * settings.seed, 1_000 * settings.seed + settings.events)
    events = [generate_event(settings.n_particles, seed=_TRAIN_SEEDS + s) for s in seeds]
    held_out = [
        generate_event(settings.n_particles, seed=_HELD_OUT_SEEDS + 1_000 * settings.seed + k)
        for k in range(settings.held_out)
    ]
    models = Models.create(settings.config)

    def schedule(phase: str, steps: int) -> _Schedule:
        return _Schedule(phase, steps, settings.batch, _SHARES[phase] * settings.seconds)

    _train_embedding(models, events, schedule("embedding", settings.embedding_steps), generator)
    _update(models, radius=_choose_radius(models, held_out))
    graphs = [_graph(models, event) for event in events]
    _train_filter(models, graphs, schedule("filter", settings.filter_steps), generator)
    _update(models, filter_cut=_choose_filter_cut(models, held_out))
    graphs = [_filtered(models, graph) for graph in graphs]
    _train_gnn(models, graphs, schedule("gnn", settings.gnn_steps), generator)
    _update(models, gnn_cut=_choose_gnn_cut(models, held_out))
    models.frozen()
    report = evaluate(models, settings.report_events, 40, _REPORT_SEEDS + settings.seed)
    elapsed = time.monotonic() - started
    training = {**dataclasses.asdict(settings), "elapsed_s": round(elapsed, 1)}
    del training["config"], training["out"]  # the config is saved in full next to it
    save_models(models, settings.out, {"quality": report, "training": training})
    logger.info("trained in %.1f s, saved in %s\n%s", elapsed, settings.out, format_report(report))
    return models


@dataclass(frozen=True)
class _Schedule:
    """A phase's steps, each over ``batch`` events, within ``seconds`` at most."""

    phase: str
    steps: int
    batch: int
    seconds: float

    def __iter__(self) -> Iterator[tuple[int, float]]:
        """Each step and its learning rate, a cosine decay over the steps; the phase ends early,
        unannealed and not reproducible, when its time is up (it says so)."""
        deadline = time.monotonic() + self.seconds
        for step in range(self.steps):
            if time.monotonic() > deadline:
                logger.warning(
                    "%s: out of time after %d of %d steps (--seconds); these weights are not "
                    "the reproducible ones",
                    self.phase,
                    step,
                    self.steps,
                )
                return
            yield step, LEARNING_RATE * 0.5 * (1.0 + math.cos(math.pi * step / self.steps))


def _optimizer(net: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(net.parameters(), lr=LEARNING_RATE)


def _step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, learning_rate: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = learning_rate
    optimizer.zero_grad()
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()


def _update(models: Models, **changes: Any) -> None:
    models.config = dataclasses.replace(models.config, **changes)
    logger.info("config: %s", ", ".join(f"{k} = {v:.4g}" for k, v in changes.items()))


def _pick(items: Sequence[Any], batch: int, generator: torch.Generator) -> list[Any]:
    chosen = torch.randperm(len(items), generator=generator)[:batch]
    return [items[int(k)] for k in chosen]


def _merge_events(events: Sequence[Event]) -> Event:
    """One event of several, particle ids kept apart (noise stays 0)."""
    offsets = torch.tensor(
        [0] + [int(e.particle_id.max()) if e.num_hits else 0 for e in events[:-1]]
    )
    offsets = torch.cumsum(offsets, 0)
    particle = [
        torch.where(e.particle_id > 0, e.particle_id + int(o), 0)
        for e, o in zip(events, offsets, strict=True)
    ]
    return Event(
        torch.cat([e.features for e in events]),
        torch.cat(particle),
        torch.cat([e.layer for e in events]),
    )


def _same_particle(event: Event, pairs: torch.Tensor) -> torch.Tensor:
    a, b = event.particle_id[pairs[0]], event.particle_id[pairs[1]]
    return (a == b) & (a > 0)


def _squared_distances(embedding: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    # index_select: a deterministic gradient on CPU (see models._pairs_of)
    a, b = embedding.index_select(0, pairs[0]), embedding.index_select(0, pairs[1])
    return (a - b).pow(2).sum(1)


# -- embedding -----------------------------------------------------------------------------------


def _train_embedding(
    models: Models,
    events: Sequence[Event],
    schedule: _Schedule,
    generator: torch.Generator,
) -> None:
    net = models.embedding.train()
    optimizer = _optimizer(net)
    for step, learning_rate in schedule:
        event = _merge_events(_pick(events, schedule.batch, generator))
        n = event.num_hits
        embedding = net(event.features)
        positive = true_edges(event)
        hard = radius_graph(embedding.detach(), MARGIN)  # the pairs the margin is about
        hard = hard[:, torch.randperm(hard.shape[1], generator=generator)[: 8 * n]]
        random = torch.randint(n, (2, 4 * n), generator=generator)
        negative = torch.cat([hard, random], 1)
        negative = negative[:, (negative[0] != negative[1]) & ~_same_particle(event, negative)]
        pull = _squared_distances(embedding, positive).mean()
        distance = (_squared_distances(embedding, negative) + 1e-12).sqrt()
        push = F.relu(MARGIN - distance).pow(2).mean()
        loss = pull + push
        _step(optimizer, loss, learning_rate)
        if step % 100 == 0:
            logger.info(
                "embedding step %4d  pull %.4f  push %.4f",
                step,
                float(pull.detach()),
                float(push.detach()),
            )
    net.eval()


def _choose_radius(models: Models, events: Sequence[Event]) -> float:
    """The truth-edge distance below which ``GRAPH_EFFICIENCY`` of them fall."""
    with torch.no_grad():
        distances = [
            _squared_distances(models.embedding(e.features), true_edges(e)).sqrt() for e in events
        ]
    distances_all = torch.cat(distances)
    if distances_all.numel() == 0:
        return models.config.radius  # no truth edge to measure (a smoke run on empty events)
    return float(torch.quantile(distances_all, GRAPH_EFFICIENCY))


# -- filter --------------------------------------------------------------------------------------


def _graph(models: Models, event: Event) -> _Graph:
    with torch.no_grad():
        embedding = models.embedding(event.features)
    config = models.config
    edges = radius_graph(embedding, config.radius, max_neighbours=config.max_neighbours)
    return _Graph(event.features, embedding, edges, _same_particle(event, edges).float())


def _merge_graphs(graphs: Sequence[_Graph]) -> _Graph:
    offsets = torch.cumsum(torch.tensor([0] + [len(g.features) for g in graphs[:-1]]), 0)
    return _Graph(
        torch.cat([g.features for g in graphs]),
        torch.cat([g.embedding for g in graphs]),
        torch.cat([g.edges + int(o) for g, o in zip(graphs, offsets, strict=True)], 1),
        torch.cat([g.labels for g in graphs]),
    )


def _balance(graphs: Sequence[_Graph]) -> torch.Tensor:
    """Weight of the true edges that makes them count as much as the false ones."""
    labels = torch.cat([g.labels for g in graphs])
    true = float(labels.sum())
    return torch.tensor(max(1.0, (len(labels) - true) / max(true, 1.0)))


def _train_filter(
    models: Models,
    graphs: Sequence[_Graph],
    schedule: _Schedule,
    generator: torch.Generator,
) -> None:
    net = models.edge_filter.train()
    optimizer = _optimizer(net)
    weight = _balance(graphs)
    for step, learning_rate in schedule:
        graph = _merge_graphs(_pick(graphs, schedule.batch, generator))
        logits = net(graph.features, graph.embedding, graph.edges)
        loss = F.binary_cross_entropy_with_logits(logits, graph.labels, pos_weight=weight)
        _step(optimizer, loss, learning_rate)
        if step % 100 == 0:
            logger.info("filter step %4d  loss %.4f", step, float(loss.detach()))
    net.eval()


def _truth_scores(models: Models, event: Event) -> torch.Tensor:
    """Filter scores of the graph's edges that are truth edges."""
    graph = _graph(models, event)
    with torch.no_grad():
        scores = torch.sigmoid(models.edge_filter(graph.features, graph.embedding, graph.edges))
    n = event.num_hits
    key = torch.maximum(graph.edges[0], graph.edges[1]) * n + torch.minimum(
        graph.edges[0], graph.edges[1]
    )
    truth = true_edges(event)
    truth_key = torch.maximum(truth[0], truth[1]) * n + torch.minimum(truth[0], truth[1])
    return scores[torch.isin(key, truth_key)]


def _choose_filter_cut(models: Models, events: Sequence[Event]) -> float:
    scores = torch.cat([_truth_scores(models, e) for e in events])
    if scores.numel() == 0:
        return models.config.filter_cut
    return float(torch.quantile(scores.double(), 1.0 - FILTER_EFFICIENCY))


# -- GNN -----------------------------------------------------------------------------------------


def _filtered(models: Models, graph: _Graph) -> _Graph:
    with torch.no_grad():
        logits = models.edge_filter(graph.features, graph.embedding, graph.edges)
    keep = torch.sigmoid(logits) > models.config.filter_cut
    return _Graph(graph.features, graph.embedding, graph.edges[:, keep], graph.labels[keep])


def _train_gnn(
    models: Models,
    graphs: Sequence[_Graph],
    schedule: _Schedule,
    generator: torch.Generator,
) -> None:
    net = models.gnn.train()
    optimizer = _optimizer(net)
    for step, learning_rate in schedule:
        graph = _merge_graphs(_pick(graphs, schedule.batch, generator))
        logits = net(graph.features, graph.edges)
        loss = F.binary_cross_entropy_with_logits(logits, graph.labels)
        _step(optimizer, loss, learning_rate)
        if step % 100 == 0:
            logger.info("gnn step %4d  loss %.4f", step, float(loss.detach()))
    net.eval()


def _choose_gnn_cut(models: Models, events: Sequence[Event]) -> float:
    """The cut of ``GNN_CUTS`` that finds the most particles (the lowest of equals)."""
    found = dict.fromkeys(GNN_CUTS, 0)
    for event in events:
        graph = _filtered(models, _graph(models, event))
        with torch.no_grad():
            scores = torch.sigmoid(models.gnn(graph.features, graph.edges))
        for cut in GNN_CUTS:
            labels = connected_components(event.num_hits, graph.edges[:, scores > cut])
            found[cut] += track_counts(labels, event.particle_id)[0]
    return max(GNN_CUTS, key=lambda cut: (found[cut], -cut))


def main(argv: list[str] | None = None) -> int:
    """``python -m gnn_tracking.physics.train``: train and save the weights, print the quality."""
    defaults = TrainSettings()
    parser = argparse.ArgumentParser(
        prog="python -m gnn_tracking.physics.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--events", type=int, default=defaults.events, help="training events")
    parser.add_argument("--n-particles", type=int, default=defaults.n_particles)
    parser.add_argument("--seconds", type=float, default=defaults.seconds, help="wall-clock cap")
    parser.add_argument("--out", type=Path, default=defaults.out, help="weights directory")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--steps", type=float, default=1.0, help="scale the step counts (e.g. 0.01 for a smoke run)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    settings = TrainSettings(
        events=args.events,
        n_particles=args.n_particles,
        seconds=args.seconds,
        out=args.out,
        seed=args.seed,
        embedding_steps=max(1, round(defaults.embedding_steps * args.steps)),
        filter_steps=max(1, round(defaults.filter_steps * args.steps)),
        gnn_steps=max(1, round(defaults.gnn_steps * args.steps)),
    )
    train(settings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
