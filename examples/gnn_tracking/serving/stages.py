"""The pipeline's stages as served models: their tensors and how each runs.

One table serves every server and client: the Triton Python-backend models
(``model_repository/<stage>/1/model.py``), the FastAPI twin, and the client's service
options that call some stages remotely and run the others in process. ``config.pbtxt`` files
declare the same tensors (a test checks them against this table through a running Triton).

    features [N,3] ─ embed ─> embedding [N,8] ─ build_graph ─> edge_index [2,E]
      ─ filter ─> filtered_edges [2,E'] ─ gnn ─> scores [E'] ─ label ─> track_labels [N]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from numpy.typing import NDArray

from gnn_tracking.physics import pipeline
from gnn_tracking.physics.models import Models
from gnn_tracking.serving.kserve import TensorSpec  # a tensor as config.pbtxt declares it

__all__ = ["ENSEMBLE", "STAGES", "STAGE_ORDER", "Stage", "TensorSpec", "run_ensemble"]

Tensors = Mapping[str, torch.Tensor]

FEATURES, EMBEDDING, EDGE_INDEX, FILTERED_EDGES, SCORES, TRACK_LABELS = (
    "FEATURES",
    "EMBEDDING",
    "EDGE_INDEX",
    "FILTERED_EDGES",
    "SCORES",
    "TRACK_LABELS",
)
ENSEMBLE = "tracking"  # the one model that runs all five stages (service option 4)


@dataclass(frozen=True)
class Stage:
    """One served stage: its model name, tensors, and the pipeline function behind it."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    run: Callable[[Models, Tensors], dict[str, torch.Tensor]]

    def run_arrays(self, models: Models, arrays: Mapping[str, NDArray[Any]]) -> dict[str, Any]:
        """The stage on a server's numpy arrays: onto the models' device, run, back to numpy."""
        tensors = {name: torch.from_numpy(a).to(models.device) for name, a in arrays.items()}
        with torch.inference_mode():
            outputs = self.run(models, tensors)
        return {name: tensor.cpu().numpy() for name, tensor in outputs.items()}


_FEATURES = TensorSpec(FEATURES, "FP32", (-1, 3))
_EMBEDDING = TensorSpec(EMBEDDING, "FP32", (-1, 8))
_EDGES = TensorSpec(EDGE_INDEX, "INT64", (2, -1))
_KEPT = TensorSpec(FILTERED_EDGES, "INT64", (2, -1))
_SCORES = TensorSpec(SCORES, "FP32", (-1,))
_LABELS = TensorSpec(TRACK_LABELS, "INT64", (-1,))


def _embed(models: Models, x: Tensors) -> dict[str, torch.Tensor]:
    return {EMBEDDING: pipeline.embed(models, x[FEATURES])}


def _build_graph(models: Models, x: Tensors) -> dict[str, torch.Tensor]:
    return {EDGE_INDEX: pipeline.build_graph(models, x[EMBEDDING])}


def _filter(models: Models, x: Tensors) -> dict[str, torch.Tensor]:
    kept = pipeline.filter_edges(models, x[FEATURES], x[EMBEDDING], x[EDGE_INDEX])
    return {FILTERED_EDGES: kept}


def _gnn(models: Models, x: Tensors) -> dict[str, torch.Tensor]:
    return {SCORES: pipeline.gnn_scores(models, x[FEATURES], x[FILTERED_EDGES])}


def _label(models: Models, x: Tensors) -> dict[str, torch.Tensor]:
    labels = pipeline.label_tracks(models, x[FEATURES].shape[0], x[FILTERED_EDGES], x[SCORES])
    return {TRACK_LABELS: labels}


STAGES: dict[str, Stage] = {
    stage.name: stage
    for stage in (
        Stage("embed", (_FEATURES,), (_EMBEDDING,), _embed),
        Stage("build_graph", (_EMBEDDING,), (_EDGES,), _build_graph),
        Stage("filter", (_FEATURES, _EMBEDDING, _EDGES), (_KEPT,), _filter),
        Stage("gnn", (_FEATURES, _KEPT), (_SCORES,), _gnn),
        Stage("label", (_FEATURES, _KEPT, _SCORES), (_LABELS,), _label),
    )
}
STAGE_ORDER: tuple[str, ...] = tuple(STAGES)


def run_ensemble(models: Models, x: Tensors) -> dict[str, torch.Tensor]:
    """All five stages in order, the tensors of each step feeding the next (the ensemble)."""
    tensors = dict(x)
    with torch.inference_mode():
        for name in STAGE_ORDER:
            tensors.update(STAGES[name].run(models, tensors))
    return {TRACK_LABELS: tensors[TRACK_LABELS]}


ENSEMBLE_STAGE = Stage(ENSEMBLE, (_FEATURES,), (_LABELS,), run_ensemble)
