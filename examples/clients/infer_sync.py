"""An instrumented tritonclient client: one inference, traced from this process into Triton.

    python examples/clients/infer_sync.py [--protocol grpc|http] [--url HOST:PORT] [--model M]

Talks to ``examples/servers/triton_backend/serve.py`` (or ``pytriton_stages.py``) on localhost.
Spans go to ``$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (``otelkit receive``:
http://127.0.0.1:4318/v1/traces) or ``$OTEL_EXPORTER_OTLP_ENDPOINT`` (a Collector, metrics too);
with neither, to OTLP-JSON lines under ``./otelkit-traces``.
"""

from __future__ import annotations

import argparse

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry import trace

import otelkit

# One event's hits, (x, y, z) in mm.
HITS = np.array([[30, 40, 10], [-60, 80, -25], [0, -120, 40]], dtype=np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description="One traced inference with tritonclient.")
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--url", help="host:port; default localhost:8001 (gRPC), :8000 (HTTP)")
    parser.add_argument("--model", default="hit_features")
    args = parser.parse_args()
    module = grpcclient if args.protocol == "grpc" else httpclient
    url = args.url or ("localhost:8001" if args.protocol == "grpc" else "localhost:8000")

    telemetry = otelkit.configure(service_name="hit-features-client")  # OTEL_* env vars too
    with otelkit.instrument(module.InferenceServerClient(url)) as client:
        hits = module.InferInput("HITS", list(HITS.shape), "FP32")
        hits.set_data_from_numpy(HITS)
        # A span of the job's own: the call's CLIENT span, and Triton's spans, join its trace.
        with trace.get_tracer("example").start_as_current_span("reconstruct event") as job:
            result = client.infer(args.model, [hits])
    print("FEATURES", result.as_numpy("FEATURES").astype(float).round(4).tolist())
    trace_id = f"{job.get_span_context().trace_id:032x}"
    print(f"trace {trace_id} -> {telemetry.traces_destination}")  # flushed at exit


if __name__ == "__main__":
    main()
