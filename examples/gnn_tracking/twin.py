"""The FastAPI twin: the same pipeline served by a Python model server over KServe v2 HTTP.

    python -m gnn_tracking.twin --port 8010

It serves the models Triton serves (each stage, and ``tracking`` for the whole pipeline)
through the KServe v2 protocol, so the instrumented ``tritonclient.http`` code of the client
calls either server unchanged. ``otelkit.instrument(app)`` gives each request a SERVER span
joined to the client's trace, and the stages' ``otelkit.stage`` spans nest under it.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial

import torch
from fastapi import FastAPI

import otelkit
from gnn_tracking.kserve import ModelSpec, create_app
from gnn_tracking.models import Models, load_models
from gnn_tracking.stages import ENSEMBLE_STAGE, STAGES
from gnn_tracking.triton_model import TORCH_THREADS

__all__ = ["create_twin"]


def create_twin(models: Models | None = None) -> FastAPI:
    """The KServe v2 app serving every stage and the whole pipeline, instrumented."""
    models = models or load_models()
    specs = [
        ModelSpec(stage.name, stage.inputs, stage.outputs, partial(stage.run_arrays, models))
        for stage in (*STAGES.values(), ENSEMBLE_STAGE)
    ]
    app = create_app(specs, name="gnn-tracking-fastapi")
    otelkit.instrument(app)
    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8010)
    args = parser.parse_args(argv)
    # requests run on the thread pool at once: one intra-op thread each, as the Triton models
    torch.set_num_threads(int(os.environ.get(TORCH_THREADS, "1")))
    otelkit.configure(service_name="gnn-tracking-fastapi")
    try:
        uvicorn.run(create_twin(), host=args.host, port=args.port, log_level="warning")
    finally:
        otelkit.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
