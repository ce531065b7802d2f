"""A PyTriton server whose inference function runs in otelkit stages, until Ctrl-C or SIGTERM.

    otelkit receive --out traces &                          # OTLP/HTTP on 127.0.0.1:4318
    python examples/servers/pytriton_stages.py              # HTTP 8000, gRPC 8001, metrics 8002
    python examples/clients/infer_sync.py --protocol http   # then: otelkit breakdown traces

A request's trace: the client's span → Triton's ``InferRequest → hit_features`` →
``python_backend_execute`` → ``proxy_inference_callable`` (in this process) → the stages.
Triton's spans and this process's go to ``--traces-url`` (default
``$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else the receiver above). On Ctrl-C or SIGTERM,
PyTriton stops its ``tritonserver``, whose requests in flight get ``EXIT_TIMEOUT_S``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import sysconfig
import threading

import numpy as np
from numpy.typing import NDArray
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

import otelkit
from otelkit.server import pytriton as otp

MODEL = "hit_features"
DEFAULT_TRACES_URL = "http://127.0.0.1:4318/v1/traces"
# tritonserver's bound on its exit (its default: 30 s): the requests in flight, then the
# model's unload, which takes seconds of it
EXIT_TIMEOUT_S = 10


@otp.traced(model=MODEL)  # outside @batch: it reads the requests' spans
@batch  # type: ignore[untyped-decorator]  # pytriton ships no type hints
def infer(HITS: NDArray[np.float32]) -> dict[str, NDArray[np.float32]]:
    with otelkit.stage("cylindrical", hits=len(HITS)):  # keywords: span attributes
        r = np.hypot(HITS[:, 0], HITS[:, 1])
        phi = np.arctan2(HITS[:, 1], HITS[:, 0])
    with otelkit.stage("scale"):
        features = np.stack([r / 1000, phi / np.pi, HITS[:, 2] / 1000], axis=1)
    return {"FEATURES": features.astype(np.float32)}


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve hit_features with PyTriton, traced.")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    traces_url = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", DEFAULT_TRACES_URL)
    parser.add_argument("--traces-url", default=traces_url, help="OTLP/HTTP traces URL")
    args = parser.parse_args()
    # Handled here, not by triton.serve()'s KeyboardInterrupt: a script's background job
    # (`python pytriton_stages.py &`) starts with SIGINT ignored, where Python raises none;
    # and SIGTERM would end this process before PyTriton stops tritonserver and removes its
    # workspace. Set before configure(), which then leaves SIGTERM alone; otelkit flushes at
    # exit.
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())

    # Spans leave within half a second (not 5 s), so a trace is whole soon after its request:
    # this process's, and the Python-backend stub's, which inherits the environment.
    os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", "500")
    otelkit.configure(service_name="hit-features-pytriton", traces_endpoint=args.traces_url)
    # The Python-backend stub links libpython dynamically: this interpreter's must come first.
    libdir = sysconfig.get_config_var("LIBDIR")
    os.environ["LD_LIBRARY_PATH"] = f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}"
    config = TritonConfig(
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        exit_timeout_secs=EXIT_TIMEOUT_S,
        trace_config=[
            "mode=opentelemetry",
            "rate=1",
            "level=TIMESTAMPS",
            f"opentelemetry,url={args.traces_url}",
            "opentelemetry,bsp_schedule_delay=500",
            "opentelemetry,resource=service.name=pytriton",
        ],
    )
    with Triton(config=config) as triton:
        triton.bind(
            model_name=MODEL,
            infer_func=infer,
            inputs=[Tensor(name="HITS", dtype=np.float32, shape=(-1, 3))],
            outputs=[Tensor(name="FEATURES", dtype=np.float32, shape=(-1, 3))],
            # no batch dimension: a request is one event's hits, as in triton_backend/
            config=ModelConfig(batching=False),
        )
        triton.run()  # started and ready
        print(f"serving {MODEL}: HTTP {args.http_port}, gRPC {args.grpc_port}", flush=True)
        # as triton.serve() does: until a signal, or tritonserver or the model's handler dies
        while triton.is_alive() and not stop.wait(1.0):
            pass
        if not stop.is_set():
            sys.exit(f"{MODEL}: tritonserver or the model's handler stopped; its log is above")


if __name__ == "__main__":
    main()
