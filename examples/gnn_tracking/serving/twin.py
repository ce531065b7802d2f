"""The FastAPI twin: the same pipeline served by a Python model server over KServe v2 HTTP,
and over KServe v2 gRPC beside it when asked (``--grpc-port``).

    python -m gnn_tracking.serving.twin --port 8010 --grpc-port 8011

It serves the models Triton serves (each stage, and ``tracking`` for the whole pipeline)
through the KServe v2 protocol, so the instrumented ``tritonclient.http`` code of the client
calls either server unchanged, and so does the ``tritonclient.grpc`` code of a SONIC-style
client. ``otelkit.instrument(app)``, and otelkit's gRPC server interceptor, give each request
a SERVER span joined to the client's trace, and the stages' ``otelkit.stage`` spans nest
under it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import grpc
import torch
from fastapi import FastAPI

import otelkit
from gnn_tracking.physics.models import Models, load_models
from gnn_tracking.serving.kserve import ModelSpec, create_app
from gnn_tracking.serving.kserve_grpc import KServeServicer, grpc_server
from gnn_tracking.serving.stages import ENSEMBLE_STAGE, STAGES
from gnn_tracking.serving.triton_model import TORCH_THREADS
from otelkit.tritonserver import free_port

__all__ = ["create_grpc_twin", "create_twin", "twin_process"]


def _specs(models: Models | None) -> list[ModelSpec]:
    models = models or load_models()
    return [
        ModelSpec(stage.name, stage.inputs, stage.outputs, partial(stage.run_arrays, models))
        for stage in (*STAGES.values(), ENSEMBLE_STAGE)
    ]


def create_twin(models: Models | None = None) -> FastAPI:
    """The KServe v2 app serving every stage and the whole pipeline, instrumented."""
    app = create_app(_specs(models), name="gnn-tracking-fastapi")
    otelkit.instrument(app)
    return app


def create_grpc_twin(
    models: Models | None = None, *, port: int, host: str = "127.0.0.1"
) -> grpc.Server:
    """The same models over the KServe v2 gRPC service on ``host:port``, traced; started."""
    from otelkit.server.grpc import server_interceptor

    servicer = KServeServicer(_specs(models), name="gnn-tracking-grpc", stages=True)
    return grpc_server(servicer, port, host=host, interceptors=[server_interceptor(host, port)])


@contextmanager
def twin_process(
    traces_url: str,
    log_path: Path,
    *,
    metrics_port: int | None = None,
    grpc_port: int | None = None,
) -> Iterator[str]:
    """The twin in its own process (its own GIL, as a real server); yields its ``host:port``.

    Its spans go to ``traces_url`` and follow the caller's sampling decision; with
    ``metrics_port`` it serves its Prometheus ``/metrics`` there; with ``grpc_port`` it serves
    KServe v2 gRPC there too (ready when its HTTP side is).
    """
    port = free_port()
    env = dict(os.environ, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=traces_url)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), *sys.path])
    env["OTEL_BSP_SCHEDULE_DELAY"] = "200"
    env["OTEL_TRACES_SAMPLER"] = "parentbased_always_off"  # follow the client's decision
    if metrics_port is not None:
        env.update(OTELKIT_PROMETHEUS_PORT=str(metrics_port), OTELKIT_PROMETHEUS_HOST="127.0.0.1")
    command = [sys.executable, "-m", "gnn_tracking.serving.twin", "--port", str(port)]
    command += [] if grpc_port is None else ["--grpc-port", str(grpc_port)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the FastAPI twin did not start; see {log_path}") from None
                time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8010)
    parser.add_argument("--grpc-port", type=int, help="serve KServe v2 gRPC there too")
    args = parser.parse_args(argv)
    # requests run on the thread pool at once: one intra-op thread each, as the Triton models
    torch.set_num_threads(int(os.environ.get(TORCH_THREADS, "1")))
    otelkit.configure(service_name="gnn-tracking-fastapi")
    models = load_models()
    # started first: the HTTP side's readiness then says both are ready
    served = (
        None
        if args.grpc_port is None
        else create_grpc_twin(models, port=args.grpc_port, host=args.host)
    )
    try:
        uvicorn.run(create_twin(models), host=args.host, port=args.port, log_level="warning")
    finally:
        if served is not None:
            served.stop(5).wait(5)
        otelkit.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
