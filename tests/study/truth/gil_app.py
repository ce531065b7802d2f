"""A KServe v2 model server in one Python process whose model burns 5 ms of CPU a request: its
GIL, not its threads or the host's cores, caps it at about 1 / (5 ms + the framework's own).

    python -m tests.study.truth.gil_app --port 8011
"""

from __future__ import annotations

import argparse
from typing import Any

import uvicorn
from gnn_tracking.serving.kserve import ModelSpec, create_app
from gnn_tracking.serving.kserve_tensors import TensorSpec
from numpy.typing import NDArray

from tests.study.truth.work import spin

WORK_S = 0.005


def infer(inputs: dict[str, NDArray[Any]]) -> dict[str, NDArray[Any]]:
    spin(WORK_S)
    return {"OUTPUT0": inputs["INPUT0"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    spec = ModelSpec(
        "busy",
        (TensorSpec("INPUT0", "FP32", (-1, 16)),),
        (TensorSpec("OUTPUT0", "FP32", (-1, 16)),),
        infer,
    )
    uvicorn.run(
        create_app([spec], name="gil"), host="127.0.0.1", port=args.port, log_level="warning"
    )


if __name__ == "__main__":
    main()
