"""A plain tritonclient script, no otelkit in it: traced by ``opentelemetry-instrument``.

    pip install 'otelkit[instrument]'
    export OTEL_SERVICE_NAME=hit-features-job
    export OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4318/v1/traces  # otelkit receive
    opentelemetry-instrument python examples/clients/plain_client.py --url localhost:8000

``opentelemetry-instrument`` loads otelkit's distro (it configures otelkit from the same
``OTEL_*`` / ``OTELKIT_*`` variables) and its tritonclient instrumentor before the first line:
each ``infer`` gets a CLIENT span, and Triton's spans join its trace. Without the command, the
script runs as it is, untraced.
"""

from __future__ import annotations

import argparse

import numpy as np
import tritonclient.http as httpclient

HITS = np.array([[30, 40, 10], [-60, 80, -25], [0, -120, 40]], dtype=np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description="Inference with tritonclient, nothing else.")
    parser.add_argument("--url", default="localhost:8000")
    parser.add_argument("--model", default="hit_features")
    args = parser.parse_args()
    with httpclient.InferenceServerClient(args.url) as client:
        hits = httpclient.InferInput("HITS", list(HITS.shape), "FP32")
        hits.set_data_from_numpy(HITS)
        result = client.infer(args.model, [hits])
    print("FEATURES", result.as_numpy("FEATURES").astype(float).round(4).tolist())


if __name__ == "__main__":
    main()
