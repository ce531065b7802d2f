"""The three learned stages, their configuration and their cached weights.

Every network sees a hit as ``(r, cos phi, sin phi, z)`` rather than the raw features: the angle
wraps at +-pi, and a track crossing there must not look torn apart. Pair networks see an edge from
its inner to its outer hit (by radius), so they need not learn that an edge has no direction.

>>> models = load_models()          # trains first (about a minute) when weights/ is empty
>>> models.config.gnn_cut
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, BinaryIO, cast

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "CONFIG_FILE",
    "MLP",
    "WEIGHTS_DIR",
    "WEIGHTS_FILE",
    "EdgeFilterNet",
    "EmbeddingNet",
    "InteractionGNN",
    "Models",
    "PipelineConfig",
    "load_models",
    "save_models",
]

logger = logging.getLogger(__name__)

# gnn_tracking/weights, beside the model repository and deploy files that name it
WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "weights"
WEIGHTS_FILE = "models.pt"  # config and state dicts: the one file load_models reads
CONFIG_FILE = "config.json"  # the config and the training's quality report, to read
HIT_DIM = 4  # r, cos phi, sin phi, z
PAIR_DIM = 2 * HIT_DIM + 6  # inner hit, outer hit, differences, slopes, z at the beam line
_MIN_DR = 0.005  # 5 mm in units of features


@dataclass(frozen=True)
class PipelineConfig:
    """Cuts and sizes of the pipeline, saved with the weights (and shown in ``config.json``).

    ``radius``: of the radius graph in embedding space; ``max_neighbours``: nearest neighbours a
    hit keeps within it (bounds the graph of dense events); ``filter_cut`` and ``gnn_cut``:
    thresholds on the sigmoid scores of the edge filter and of the GNN. Training chooses the
    radius and both cuts; the defaults here only start it.

    >>> PipelineConfig(radius=0.6, filter_cut=0.1, gnn_cut=0.99).iterations
    8
    """

    radius: float = 0.5
    filter_cut: float = 0.1
    gnn_cut: float = 0.5
    max_neighbours: int | None = 32
    embedding_dim: int = 8
    embedding_hidden: int = 64
    filter_hidden: int = 64
    gnn_hidden: int = 32
    iterations: int = 8

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PipelineConfig:
        """The config saved by ``save_models``; unknown keys are an error, not ignored."""
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown pipeline config keys {sorted(unknown)}; known: {known}")
        return cls(**values)


def hit_features(features: torch.Tensor) -> torch.Tensor:
    """``[N, 3]`` ``(r, phi / pi, z)`` to ``[N, 4]`` ``(r, cos phi, sin phi, z)``."""
    phi = features[:, 1] * math.pi
    return torch.stack([features[:, 0], torch.cos(phi), torch.sin(phi), features[:, 2]], dim=1)


def inner_outer(
    features: torch.Tensor, edge_index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two ends of each edge, the one at the smaller radius first."""
    i, j = edge_index[0], edge_index[1]
    swap = features[i, 0] > features[j, 0]
    return torch.where(swap, j, i), torch.where(swap, i, j)


def pair_features(features: torch.Tensor, inner: torch.Tensor, outer: torch.Tensor) -> torch.Tensor:
    """``[E, PAIR_DIM]``: both hits, their differences in r, phi (wrapped, in units of pi) and z,
    and what a straight line through them says: its slopes in phi and z against r, and where it
    meets the beam line in z. Along a track the slopes hardly change and the beam line is met
    near the vertex; between two tracks, rarely so."""
    hits = hit_features(features)
    a, b = features[inner], features[outer]
    dr = b[:, 0] - a[:, 0]
    dphi = torch.remainder(b[:, 1] - a[:, 1] + 1.0, 2.0) - 1.0
    dz = b[:, 2] - a[:, 2]
    run = dr.clamp(min=_MIN_DR)  # hits on one layer: a slope means nothing, keep it finite
    phi_slope, z_slope = dphi / run, dz / run
    z_at_beam = a[:, 2] - a[:, 0] * z_slope
    geometry = [dr, dphi, dz, 5.0 * phi_slope, z_slope, 10.0 * z_at_beam]
    return torch.cat([hits[inner], hits[outer], torch.stack(geometry, dim=1)], dim=1)


class MLP(nn.Module):
    """Linear layers with LayerNorm and ReLU between them, none after the last.

    One module whose forward calls the functions itself: on events of a few hundred hits the
    GNN runs sixteen of these per event, and a module call per layer would cost more than the
    arithmetic.
    """

    def __init__(self, sizes: list[int]) -> None:
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(sizes))
        self.norms = nn.ModuleList(nn.LayerNorm(n) for n in sizes[1:-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for k, linear in enumerate(cast(list[nn.Linear], self.linears)):
            x = F.linear(x, linear.weight, linear.bias)
            if k < len(self.norms):
                norm = cast(nn.LayerNorm, self.norms[k])
                x = F.relu(F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias))
        return x


class EmbeddingNet(nn.Module):
    """Hits to an ``out``-dimensional space where consecutive hits of a track lie close.

    >>> EmbeddingNet()(torch.zeros(5, 3)).shape
    torch.Size([5, 8])
    """

    def __init__(self, hidden: int = 64, out: int = 8) -> None:
        super().__init__()
        self.net = MLP([HIT_DIM, hidden, hidden, hidden, out])

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(hit_features(features))
        return out


class EdgeFilterNet(nn.Module):
    """A logit per candidate edge from its two hits and their embeddings.

    >>> EdgeFilterNet()(torch.zeros(3, 3), torch.zeros(3, 8), torch.tensor([[1], [0]])).shape
    torch.Size([1])
    """

    def __init__(self, hidden: int = 64, embedding_dim: int = 8) -> None:
        super().__init__()
        self.net = MLP([PAIR_DIM + 3 * embedding_dim, hidden, hidden, hidden, 1])

    def forward(
        self, features: torch.Tensor, embedding: torch.Tensor, edge_index: torch.Tensor
    ) -> torch.Tensor:
        inner, outer = inner_outer(features, edge_index)
        e_in, e_out = embedding.index_select(0, inner), embedding.index_select(0, outer)
        x = torch.cat([pair_features(features, inner, outer), e_in, e_out, e_out - e_in], dim=1)
        out: torch.Tensor = self.net(x).squeeze(1)
        return out


class InteractionGNN(nn.Module):
    """An interaction network: hits and edges encoded, ``iterations`` rounds of edge then node
    updates (shared weights, residual), a logit per edge from its final state.

    Messages flow along edges from inner to outer hit; a hit sums what comes in from inside and
    what goes out to the outside separately.

    >>> InteractionGNN()(torch.zeros(3, 3), torch.tensor([[1, 2], [0, 1]])).shape
    torch.Size([2])
    """

    def __init__(self, hidden: int = 32, iterations: int = 8) -> None:
        super().__init__()
        self.iterations = iterations
        self.node_encoder = MLP([HIT_DIM, hidden, hidden])
        self.edge_encoder = MLP([PAIR_DIM, hidden, hidden])
        self.edge_network = MLP([3 * hidden, hidden, hidden])
        self.node_network = MLP([3 * hidden, hidden, hidden])
        self.classifier = MLP([3 * hidden, hidden, 1])

    def forward(self, features: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        inner, outer = inner_outer(features, edge_index)
        nodes = self.node_encoder(hit_features(features))
        edges = self.edge_encoder(pair_features(features, inner, outer))
        ends = torch.stack([inner, outer], 1).flatten()
        for _ in range(self.iterations):
            edges = edges + self.edge_network(torch.cat([_pairs_of(nodes, ends), edges], 1))
            incoming = torch.zeros_like(nodes).index_add_(0, outer, edges)
            outgoing = torch.zeros_like(nodes).index_add_(0, inner, edges)
            nodes = nodes + self.node_network(torch.cat([nodes, incoming, outgoing], 1))
        out: torch.Tensor = self.classifier(torch.cat([_pairs_of(nodes, ends), edges], 1))
        return out.squeeze(1)


def _pairs_of(nodes: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """``[E, 2 * hidden]``: each edge's inner then outer node state. ``index_select``, not
    ``nodes[...]``: its gradient is a deterministic ``index_add_`` on CPU, where that of advanced
    indexing adds atomically from several threads."""
    return nodes.index_select(0, ends).view(-1, 2 * nodes.shape[1])


@dataclass
class Models:
    """The three networks, on ``device``, with the config they were trained for."""

    embedding: EmbeddingNet
    edge_filter: EdgeFilterNet
    gnn: InteractionGNN
    config: PipelineConfig
    device: torch.device

    @classmethod
    def create(cls, config: PipelineConfig, device: str | torch.device = "cpu") -> Models:
        """Freshly initialised networks of the config's sizes (seed torch first to repeat)."""
        where = torch.device(device)
        return cls(
            EmbeddingNet(config.embedding_hidden, config.embedding_dim).to(where),
            EdgeFilterNet(config.filter_hidden, config.embedding_dim).to(where),
            InteractionGNN(config.gnn_hidden, config.iterations).to(where),
            config,
            where,
        )

    def networks(self) -> dict[str, nn.Module]:
        """The three networks by the names they are saved under."""
        return {"embedding": self.embedding, "edge_filter": self.edge_filter, "gnn": self.gnn}

    def frozen(self) -> Models:
        """Eval mode, no gradients: ready for inference."""
        for network in self.networks().values():
            network.eval()
            network.requires_grad_(False)
        return self


def save_models(models: Models, weights_dir: Path, extra: dict[str, Any] | None = None) -> None:
    """Write ``models.pt`` (the config and the three state dicts, one file replaced atomically,
    so a concurrent reader gets the old set or the new one), then ``config.json``: the same
    config plus ``extra`` (the training's quality report), for people and diffs.
    """
    weights_dir.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {"config": asdict(models.config)}
    for name, network in models.networks().items():
        payload[name] = {k: v.detach().cpu() for k, v in network.state_dict().items()}
    path = weights_dir / WEIGHTS_FILE
    _atomic_write(path, lambda file: torch.save(payload, file))
    record = {"config": asdict(models.config), WEIGHTS_FILE: _sha256(path), **(extra or {})}
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    _atomic_write(weights_dir / CONFIG_FILE, lambda file: file.write(text.encode()))


def load_models(device: str | torch.device = "cpu", *, weights_dir: Path = WEIGHTS_DIR) -> Models:
    """The trained networks in eval mode without gradients, on ``device``.

    When ``weights_dir`` holds no ``models.pt`` they are trained first with
    ``gnn_tracking.physics.train``'s defaults (about a minute on two cores) and saved there.

    >>> models = load_models("cpu")
    """
    path = weights_dir / WEIGHTS_FILE
    if not path.exists():
        from gnn_tracking.physics.train import TrainSettings, train  # train imports this module

        logger.warning("gnn_tracking: no weights in %s, training them now (about a minute)", path)
        train(TrainSettings(out=weights_dir))
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        models = Models.create(PipelineConfig.from_dict(payload["config"]), device)
        for name, network in models.networks().items():
            network.load_state_dict(payload[name])
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as error:
        raise RuntimeError(
            f"{path} is not a complete set of gnn_tracking weights ({error}); "
            f"retrain with: python -m gnn_tracking.physics.train --out {weights_dir}"
        ) from error
    return models.frozen()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write into a temporary file next to ``path``, then rename it over ``path``."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as file:
            write(file)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
