"""Triton Python-backend model: hits (x, y, z) to features (r, phi, z), in otelkit stages.

otelkit is configured from tritonserver's environment (``OTEL_*`` / ``OTELKIT_*``), so the
stage spans go where ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` points and hang under Triton's
model span, in the client's trace: ``InferRequest → hit_features → {compute, decode,
cylindrical, scale}``. ``../../serve.py`` serves it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

import otelkit
from otelkit.server import triton_backend


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        otelkit.configure()
        self.model = args["model_name"]

    def execute(self, requests: list[Any]) -> list[Any]:
        # Work done once for all the requests Triton hands over: one span, under the first
        # request's model span and linked to every request's.
        with triton_backend.batch(requests, self.model), otelkit.stage("decode"):
            events = [pb_utils.get_input_tensor_by_name(r, "HITS").as_numpy() for r in requests]
        responses = []
        # Each request's work runs under its own model span, in its own client's trace.
        for hits, _ in zip(events, triton_backend.each_request(requests, self.model), strict=True):
            with otelkit.stage("cylindrical", hits=len(hits)):  # keywords: span attributes
                r = np.hypot(hits[:, 0], hits[:, 1])
                phi = np.arctan2(hits[:, 1], hits[:, 0])
            with otelkit.stage("scale"):
                features = np.stack([r / 1000, phi / np.pi, hits[:, 2] / 1000], axis=1)
            output = pb_utils.Tensor("FEATURES", features.astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses

    def finalize(self) -> None:
        otelkit.shutdown()  # export the last stage spans before the stub exits
