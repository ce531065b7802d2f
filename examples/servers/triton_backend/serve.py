"""Serve ``model_repository/`` (the ``hit_features`` model) with Triton, traced, until Ctrl-C.

    otelkit receive --out traces &                      # OTLP/HTTP on 127.0.0.1:4318
    python examples/servers/triton_backend/serve.py     # HTTP 8000, gRPC 8001, metrics 8002
    python examples/clients/infer_sync.py               # then: otelkit breakdown traces

``otelkit.tritonserver`` runs the ``tritonserver`` bundled with nvidia-pytriton (CPU, Python
backend). Triton's spans and the model's stage spans go to ``--traces-url`` (default
``$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else the receiver above). With a tritonserver of your
own, the same in flags (and otelkit importable by its Python backend)::

    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4318/v1/traces tritonserver \\
        --model-repository examples/servers/triton_backend/model_repository \\
        --trace-config mode=opentelemetry --trace-config rate=1 \\
        --trace-config level=TIMESTAMPS \\
        --trace-config opentelemetry,url=http://127.0.0.1:4318/v1/traces
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from pathlib import Path

from otelkit.tritonserver import TritonServer

REPOSITORY = Path(__file__).resolve().parent / "model_repository"
DEFAULT_TRACES_URL = "http://127.0.0.1:4318/v1/traces"


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve hit_features with Triton, traced.")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    traces_url = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", DEFAULT_TRACES_URL)
    parser.add_argument("--traces-url", default=traces_url, help="OTLP/HTTP traces URL")
    args = parser.parse_args()

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    # The models inherit this environment: otelkit.configure() in model.py reads it. Their
    # spans leave within half a second (not 5 s), so a trace is whole soon after its request.
    models_env = {
        "OTEL_SERVICE_NAME": "hit-features-model",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": args.traces_url,
        "OTEL_BSP_SCHEDULE_DELAY": os.environ.get("OTEL_BSP_SCHEDULE_DELAY", "500"),
    }
    with TritonServer(
        REPOSITORY,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        trace_url=args.traces_url,
        trace_resource={"service.name": "triton"},
        env=models_env,
    ) as server:
        print(f"serving hit_features: HTTP {server.http_url}, gRPC {server.grpc_url}", flush=True)
        print(f"traces to {args.traces_url}, log in {server.log_path}; Ctrl-C stops", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
