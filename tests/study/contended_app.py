"""A KServe v2 model server whose stage "build_graph" holds a lock shared by every request.

    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4318/v1/traces \\
        python -m tests.study.contended_app --port 8010

The model ``graph`` runs two otelkit stages per request: "prepare" (2 ms, alone) and
"build_graph" (8 ms under a process-wide lock, the time waiting for it included). Alone, a
request takes about 10 ms; with 4 in flight, build_graph's time grows with the wait while
prepare's stays put: the study's verdict must name build_graph as contended.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import uvicorn
from gnn_tracking.serving.kserve import ModelSpec, create_app
from gnn_tracking.serving.kserve_tensors import TensorSpec
from numpy.typing import NDArray

import otelkit

PREPARE_S = 0.002
BUILD_S = 0.008
_graph_lock = threading.Lock()


def infer(inputs: dict[str, NDArray[Any]]) -> dict[str, NDArray[Any]]:
    with otelkit.stage("prepare"):
        time.sleep(PREPARE_S)
    with otelkit.stage("build_graph"), _graph_lock:
        time.sleep(BUILD_S)
    return {"OUTPUT0": inputs["INPUT0"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    otelkit.configure(service_name="contended-app", bsp_schedule_delay_ms=200)
    spec = ModelSpec(
        "graph",
        (TensorSpec("INPUT0", "FP32", (-1, 16)),),
        (TensorSpec("OUTPUT0", "FP32", (-1, 16)),),
        infer,
    )
    app = otelkit.instrument(create_app([spec], name="contended"))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
