"""Triton Python-backend model: the "label" stage of the GNN tracking pipeline."""

import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[4]  # holds the gnn_tracking package
sys.path.insert(0, str(EXAMPLES))

from gnn_tracking.serving.triton_model import model_for  # noqa: E402

TritonPythonModel = model_for("label")
