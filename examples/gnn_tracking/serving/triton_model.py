"""The Triton Python-backend model behind every stage of ``model_repository``.

Each ``model_repository/<stage>/1/model.py`` is two lines: it puts ``examples/`` on the path
and binds ``TritonPythonModel = model_for("<stage>")``. The model

- configures otelkit from tritonserver's environment (``OTEL_*``/``OTELKIT_*``), each of the
  five stage models (five stub processes) serving its own ``/metrics``: on
  ``OTELKIT_PROMETHEUS_PORT`` plus the model's ``metrics_port_offset`` parameter where a
  deployment fixes the ports (compose, Slurm), else on a free port the model binds itself;
  either way it writes the port it serves on to ``$GNN_TRACKING_METRICS_PORTS/<model>`` when
  its launcher names that directory (``gnn_tracking.serving.serve``: a port picked in the
  launcher could be taken before the model binds it);
- loads the pipeline's weights on the instance's device (``KIND_GPU`` instances use
  ``cuda:<device_id>``); a CPU instance runs torch on ``GNN_TRACKING_TORCH_THREADS`` threads
  (default 1: the five stub processes share the cores, and OpenMP threads spinning against
  each other slow every stage down by orders of magnitude);
- runs each request under Triton's trace context (``otelkit.server.triton_backend``), so the
  stage's ``otelkit.stage`` span hangs under Triton's model span in the client's trace;
- answers a failing request with a Triton error naming the stage, never failing the batch.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import torch

import otelkit
from gnn_tracking.physics.models import WEIGHTS_DIR, load_models
from gnn_tracking.serving.stages import ENSEMBLE_STAGE, STAGES, Stage
from otelkit.server import triton_backend

__all__ = ["model_for"]

_log = logging.getLogger("gnn_tracking")
METRICS_PORT_OFFSET = "metrics_port_offset"
METRICS_PORTS = "GNN_TRACKING_METRICS_PORTS"  # the directory each model reports its port in
TORCH_THREADS = "GNN_TRACKING_TORCH_THREADS"  # intra-op threads of a CPU instance (default 1)
WEIGHTS = "GNN_TRACKING_WEIGHTS"  # a weights directory other than the committed one


def _metrics_port(model_config: dict[str, Any]) -> int | None:
    """The fixed port (base + offset), 0 (any free one) when the launcher reads the reports,
    or ``None`` (otelkit's own setting)."""
    base = os.environ.get("OTELKIT_PROMETHEUS_PORT")
    if not base:
        return 0 if os.environ.get(METRICS_PORTS) else None
    offset = model_config.get("parameters", {}).get(METRICS_PORT_OFFSET, {}).get("string_value")
    return int(base) + int(offset or 0)


def _report_metrics_port(model_name: str, telemetry: otelkit.Telemetry) -> None:
    """Write the port this model's ``/metrics`` serves on where the launcher reads it; nothing
    when no endpoint could be opened (otelkit logged why), so the launcher names this model."""
    directory = os.environ.get(METRICS_PORTS)
    if not directory or telemetry.prometheus_url is None:
        return
    port = urlsplit(telemetry.prometheus_url).port
    report = Path(directory) / model_name
    partial = report.with_name(f".{model_name}.partial")
    partial.write_text(f"{port}\n")
    os.replace(partial, report)  # the launcher never reads half a number


def _device(args: dict[str, str]) -> torch.device:
    if args.get("model_instance_kind") == "GPU":
        return torch.device("cuda", int(args.get("model_instance_device_id", 0)))
    return torch.device("cpu")


def model_for(stage_name: str) -> type:
    """A ``TritonPythonModel`` class serving ``stage_name`` (a stage, or the whole pipeline)."""
    stage = ENSEMBLE_STAGE if stage_name == ENSEMBLE_STAGE.name else STAGES[stage_name]

    class TritonPythonModel:
        def initialize(self, args: dict[str, str]) -> None:
            config = json.loads(args["model_config"])
            telemetry = otelkit.configure(prometheus_port=_metrics_port(config))
            self.model_name = args["model_name"]
            _report_metrics_port(self.model_name, telemetry)
            self.device = _device(args)
            if self.device.type == "cpu":  # instances share the cores: no intra-op threads each
                torch.set_num_threads(int(os.environ.get(TORCH_THREADS, "1")))
            self.models = load_models(
                self.device, weights_dir=Path(os.environ.get(WEIGHTS, WEIGHTS_DIR))
            )
            self.stage: Stage = stage

        def execute(self, requests: list[Any]) -> list[Any]:
            import triton_python_backend_utils as pb_utils

            responses = []
            for request in triton_backend.each_request(requests, self.model_name):
                try:
                    responses.append(self._respond(pb_utils, request))
                except Exception as error:
                    _log.exception("%s failed", self.model_name)
                    message = f"{self.model_name}: {type(error).__name__}: {error}"
                    responses.append(
                        pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
                    )
            return responses

        def _respond(self, pb_utils: Any, request: Any) -> Any:
            arrays = {
                spec.name: pb_utils.get_input_tensor_by_name(request, spec.name).as_numpy()
                for spec in self.stage.inputs
            }
            outputs = self.stage.run_arrays(self.models, arrays)
            return pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor(spec.name, outputs[spec.name]) for spec in self.stage.outputs
                ]
            )

        def finalize(self) -> None:
            otelkit.shutdown()

    TritonPythonModel.__qualname__ = f"TritonPythonModel[{stage_name}]"
    return TritonPythonModel
