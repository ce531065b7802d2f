"""The pipeline on Ray Serve, behind the KServe v2 HTTP protocol, traced by otelkit.

Deployments: one per stage (``embed`` … ``label``), one running the whole pipeline in its
process (``Pipeline``: service option 4), and the KServe ingress (``Ingress``), which serves

- each stage's model by a handle call to its stage deployment (the client's option 3),
- ``tracking`` by a handle call to ``Pipeline`` (option 4, Triton's ensemble's name),
- ``tracking_composed`` by chaining the five stage deployments through handles, server side.

The instrumented ``tritonclient.http`` code that calls Triton and the FastAPI twin calls this
server unchanged. ``otelkit.instrument`` on each deployment sets otelkit up in its replicas:
each request gets a SERVER span in the caller's trace, each handle call a span in the called
replica (and one of its wait), each stage its ``otelkit.stage`` span. Serve's own tracing, with
otelkit as its exporter, adds the proxy's and the router's spans (on a Ray it starts).

    with ray_serve_app(traces_url) as url:   # "127.0.0.1:<port>"; starts Ray if needed
        ...
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI
from numpy.typing import NDArray
from ray import serve
from ray.serve.handle import DeploymentHandle

import otelkit
from gnn_tracking.physics.models import load_models
from gnn_tracking.serving.kserve import ModelSpec, create_app
from gnn_tracking.serving.kserve_grpc import KServeServicer
from gnn_tracking.serving.ray_grpc import KServeGrpcMethods, grpc_options
from gnn_tracking.serving.stages import (
    ENSEMBLE_STAGE,
    STAGE_ORDER,
    STAGES,
    TRACK_LABELS,
    Stage,
)
from gnn_tracking.serving.triton_model import TORCH_THREADS
from otelkit.server import ray_serve
from otelkit.server.ray_serve import instrument_deployment
from otelkit.tritonserver import free_port

__all__ = ["COMPOSED", "build_app", "pipeline_app", "ray_serve_app", "study_app"]

COMPOSED = "tracking_composed"  # the five stage deployments chained through handles
Arrays = Mapping[str, NDArray[Any]]
_NO_CPU = {"num_cpus": 0}  # requests share the machine's cores; replicas reserve none
_EXAMPLES = Path(__file__).resolve().parents[2]


@serve.deployment(ray_actor_options=_NO_CPU, max_ongoing_requests=8)
class StageModel:
    """One stage (or, for ``tracking``, the whole pipeline) with the models in its process."""

    def __init__(self, name: str) -> None:
        # requests run on the replica's thread pool: one intra-op thread each, as in Triton
        torch.set_num_threads(int(os.environ.get(TORCH_THREADS, "1")))
        self.stage: Stage = ENSEMBLE_STAGE if name == ENSEMBLE_STAGE.name else STAGES[name]
        self.models = load_models()

    def run(self, arrays: Arrays) -> dict[str, Any]:
        """The stage on numpy arrays, as the KServe server decoded them."""
        return self.stage.run_arrays(self.models, arrays)


@serve.deployment(ray_actor_options=_NO_CPU, max_ongoing_requests=32)
@serve.ingress()
class Ingress(KServeGrpcMethods):
    """The KServe v2 server, HTTP and (through Serve's gRPC proxy, when started with
    ``ray_grpc.grpc_options``) gRPC, calling the stage and pipeline deployments by handle."""

    def __init__(
        self, stages: dict[str, DeploymentHandle[Any]], pipeline: DeploymentHandle[Any]
    ) -> None:
        self.stages, self.pipeline = stages, pipeline
        self.grpc_servicer = KServeServicer(self._specs(), name="gnn-tracking-ray-serve")

    def __serve_build_asgi_app__(self) -> FastAPI:
        # instrumented too: FastAPI's own tracing stays off (otelkit's hook traces the request)
        return otelkit.instrument(create_app(self._specs(), name="gnn-tracking-ray-serve"))

    def _specs(self) -> list[ModelSpec]:
        specs = [
            ModelSpec(s.name, s.inputs, s.outputs, self._caller(self.stages[s.name]))
            for s in STAGES.values()
            if s.name in self.stages
        ]
        whole = ENSEMBLE_STAGE
        specs.append(
            ModelSpec(whole.name, whole.inputs, whole.outputs, self._caller(self.pipeline))
        )
        if set(self.stages) == set(STAGE_ORDER):
            specs.append(ModelSpec(COMPOSED, whole.inputs, whole.outputs, self._composed))
        return specs

    @staticmethod
    def _caller(handle: DeploymentHandle[Any]) -> Any:
        def infer(arrays: Arrays) -> dict[str, Any]:  # on Starlette's thread pool: may block
            result: dict[str, Any] = handle.run.remote(dict(arrays)).result()
            return result

        return infer

    def _composed(self, arrays: Arrays) -> dict[str, Any]:
        tensors: dict[str, Any] = dict(arrays)
        for name in STAGE_ORDER:
            needed = {spec.name: tensors[spec.name] for spec in STAGES[name].inputs}
            tensors.update(self.stages[name].run.remote(needed).result())
        return {TRACK_LABELS: tensors[TRACK_LABELS]}


def build_app(
    env_vars: Mapping[str, str] | None = None,
    *,
    replicas: int = 1,
    stages: Sequence[str] = STAGE_ORDER,
) -> Any:
    """The application: every deployment instrumented, ``env_vars`` reaching each replica;
    ``replicas`` of each of ``stages`` and of the whole pipeline (the ingress has one).
    ``stages=()`` deploys the whole pipeline alone: ``tracking``, option 4."""
    env = {"PYTHONPATH": os.pathsep.join([str(_EXAMPLES.parent), str(_EXAMPLES)])}
    env |= dict(env_vars or {})
    stage = instrument_deployment(StageModel, env).options(num_replicas=replicas)
    chosen = {name: stage.options(name=f"stage_{name}").bind(name) for name in stages}
    pipeline = stage.options(name="pipeline").bind(ENSEMBLE_STAGE.name)
    return instrument_deployment(Ingress, env).bind(chosen, pipeline)


def study_app(params: Mapping[str, Any], env_vars: Mapping[str, str]) -> Any:
    """``otelkit.study.RayServe``'s builder: ``instances`` replicas per stage."""
    return build_app(env_vars, replicas=int(params.get("instances") or 1))


def pipeline_app(params: Mapping[str, Any], env_vars: Mapping[str, str]) -> Any:
    """``RayServe``'s builder of the whole pipeline alone (option 4, ``tracking``), in
    ``instances`` replicas: what ``make study`` sets beside Triton's ensemble (NERSC's figure)."""
    return build_app(env_vars, replicas=int(params.get("instances") or 1), stages=())


@contextmanager
def ray_serve_app(
    traces_url: str,
    *,
    env_vars: Mapping[str, str] | None = None,
    num_cpus: int = 2,
    grpc_port: int | None = None,
) -> Iterator[str]:
    """The application on Serve's HTTP proxy (a free port); yields its ``host:port``. With
    ``grpc_port``, Serve's gRPC proxy serves the KServe v2 gRPC service there too.

    Starts a local Ray (``num_cpus``) unless one is connected, and stops what it started;
    a connected Ray's workers need ``gnn_tracking`` importable for the gRPC proxy.
    Replicas export spans to ``traces_url`` and follow the caller's sampling decision.
    """
    import ray

    env = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces_url,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_TRACES_SAMPLER": "parentbased_always_off",  # follow the client's decision
        "OTEL_SERVICE_NAME": "gnn-tracking-ray-serve",
    } | dict(env_vars or {})
    started = not ray.is_initialized()
    if started:  # the proxy imports ray_grpc: the examples on every worker's path
        path = {"PYTHONPATH": os.pathsep.join([str(_EXAMPLES.parent), str(_EXAMPLES)])}
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            # Serve's proxy traced too, from the job's environment (its only one)
            runtime_env=ray_serve.runtime_env(path | env, serve_tracing=True),
        )
    port = free_port()
    try:
        grpc = grpc_options(grpc_port) if grpc_port is not None else None
        serve.start(http_options={"host": "127.0.0.1", "port": port}, grpc_options=grpc)
        serve.run(build_app(env), name="gnn-tracking", route_prefix="/")
        yield f"127.0.0.1:{port}"
    finally:
        if started:  # Serve's proxy is killed on shutdown, its last spans unexported: let it
            time.sleep(2 * float(env["OTEL_BSP_SCHEDULE_DELAY"]) / 1000)  # export them first
        serve.shutdown()  # type: ignore[no-untyped-call]
        if started:
            ray.shutdown()
