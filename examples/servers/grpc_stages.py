"""A Python gRPC model server speaking KServe v2 (as Triton does, and as CMSSW's SONIC clients
call), its model in otelkit stages: one SERVER span per RPC, in the caller's trace.

    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4318/v1/traces \\
        python examples/servers/grpc_stages.py --port 8001
    python examples/clients/infer_sync.py     # tritonclient.grpc, as against Triton

The KServe v2 gRPC service itself is the reference deployment's
(``examples/gnn_tracking/serving/kserve_grpc.py``: copy it, or keep ``examples/`` on the path as
here); what this script adds is ``otelkit.server.grpc.server_interceptor()`` and the stages.
Spans go to ``$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (``otelkit receive`` listens on the URL
above) or ``$OTEL_EXPORTER_OTLP_ENDPOINT`` (a Collector); with neither, to OTLP-JSON lines
under ``./otelkit-traces``. Stops on Ctrl-C or SIGTERM: the RPCs in flight get ``GRACE_S`` to
finish, the spans otelkit's ``exit_timeout_s`` (5 s) to leave.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

import otelkit
from otelkit.server.grpc import server_interceptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for gnn_tracking
from gnn_tracking.serving.kserve import ModelSpec, TensorSpec
from gnn_tracking.serving.kserve_grpc import KServeServicer, grpc_server

MODEL = "hit_features"  # the label of the stages' metrics
GRACE_S = 2.0  # for the RPCs in flight at Ctrl-C
Arrays = dict[str, NDArray[Any]]


@otelkit.stage("scale", model=MODEL)  # a stage as a decorator: one span per call
def scale(r: NDArray[Any], phi: NDArray[Any], z: NDArray[Any]) -> NDArray[Any]:
    return np.stack([r / 1000, phi / np.pi, z / 1000], axis=1)


def hit_features(inputs: Arrays) -> Arrays:
    """Hits (x, y, z in mm) to ExaTrkX-style features; runs in the RPC's context."""
    hits = inputs["HITS"]
    with otelkit.stage("cylindrical", model=MODEL, hits=len(hits)):  # keywords: attributes
        r = np.hypot(hits[:, 0], hits[:, 1])
        phi = np.arctan2(hits[:, 1], hits[:, 0])
    return {"FEATURES": scale(r, phi, hits[:, 2]).astype(np.float32)}


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve hit_features over KServe v2 gRPC, traced.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    # Handled here, not left to KeyboardInterrupt: a script's background job
    # (`python grpc_stages.py &`) starts with SIGINT ignored, where Python raises none. Set
    # before configure(), which then leaves SIGTERM alone; otelkit.shutdown() below flushes.
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    otelkit.configure(service_name="hit-features-grpc")  # OTEL_* env vars too
    spec = ModelSpec(
        MODEL,
        (TensorSpec("HITS", "FP32", (-1, 3)),),
        (TensorSpec("FEATURES", "FP32", (-1, 3)),),
        hit_features,
    )
    servicer = KServeServicer([spec], name="hit-features-grpc")
    interceptor = server_interceptor(args.host, args.port)
    server = grpc_server(servicer, args.port, host=args.host, interceptors=[interceptor])
    print(f"serving {MODEL} over KServe v2 gRPC on {args.host}:{args.port}", flush=True)
    try:
        stop.wait()
    finally:
        server.stop(GRACE_S).wait()  # set once the RPCs in flight end, or are cancelled at GRACE_S
        otelkit.shutdown()


if __name__ == "__main__":
    main()
