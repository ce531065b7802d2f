"""The five stages of ExaTrkX-style track finding, each a plain function of tensors and an
``otelkit.stage`` (one span and one duration sample per call when telemetry is configured).

embed -> build_graph -> filter -> gnn -> label: hits are embedded, joined to their neighbours in
embedding space, the candidate edges filtered, scored by the GNN, and the hits labelled by the
connected components of the edges that score above the cut.

>>> models = load_models()
>>> result = run_pipeline(models, generate_event(40, seed=1).features)
>>> int(result.labels.max()) + 1                 # tracks, noise hits each a track of one
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import otelkit
from gnn_tracking.physics.graph import connected_components, radius_graph
from gnn_tracking.physics.models import Models

__all__ = [
    "PipelineResult",
    "build_graph",
    "embed",
    "filter_edges",
    "gnn_scores",
    "label_tracks",
    "run_pipeline",
]

_CHUNK = 1 << 17  # edges per filter batch: bounds memory on dense events


@otelkit.stage("embed")
def embed(models: Models, features: torch.Tensor) -> torch.Tensor:
    """``[N, 3]`` hit features to ``[N, embedding_dim]`` float32 embeddings."""
    out: torch.Tensor = models.embedding(features)
    return out


@otelkit.stage("build_graph")
def build_graph(models: Models, embedding: torch.Tensor) -> torch.Tensor:
    """Candidate edges ``[2, E]``: hits within ``config.radius`` in embedding space."""
    config = models.config
    return radius_graph(embedding, config.radius, max_neighbours=config.max_neighbours)


@otelkit.stage("filter")
def filter_edges(
    models: Models, features: torch.Tensor, embedding: torch.Tensor, edge_index: torch.Tensor
) -> torch.Tensor:
    """The candidate edges whose filter score exceeds ``config.filter_cut``, ``[2, E']``."""
    cut = models.config.filter_cut
    keep = [
        torch.sigmoid(models.edge_filter(features, embedding, edge_index[:, at : at + _CHUNK]))
        > cut
        for at in range(0, edge_index.shape[1], _CHUNK)
    ]
    if not keep:
        return edge_index
    return edge_index[:, torch.cat(keep)]


@otelkit.stage("gnn")
def gnn_scores(models: Models, features: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
    """The GNN's score in [0, 1] for every edge, ``[E']`` float32."""
    return torch.sigmoid(models.gnn(features, edge_index))


@otelkit.stage("label")
def label_tracks(
    models: Models, num_nodes: int, edge_index: torch.Tensor, scores: torch.Tensor
) -> torch.Tensor:
    """A track label per hit, ``[N]`` int64: connected components of the edges scoring above
    ``config.gnn_cut``, numbered in order of their first hit."""
    return connected_components(num_nodes, edge_index[:, scores > models.config.gnn_cut])


@dataclass(frozen=True)
class PipelineResult:
    """Every stage's output for one event."""

    embedding: torch.Tensor
    edge_index: torch.Tensor
    filtered_edges: torch.Tensor
    scores: torch.Tensor
    labels: torch.Tensor


def run_pipeline(models: Models, features: torch.Tensor) -> PipelineResult:
    """All five stages on one event's ``[N, 3]`` features (moved to ``models.device``)."""
    with torch.inference_mode():
        features = features.to(models.device, torch.float32)
        embedding = embed(models, features)
        edge_index = build_graph(models, embedding)
        filtered = filter_edges(models, features, embedding, edge_index)
        scores = gnn_scores(models, features, filtered)
        labels = label_tracks(models, features.shape[0], filtered, scores)
    return PipelineResult(embedding, edge_index, filtered, scores, labels)
