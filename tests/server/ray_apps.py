"""Ray Serve deployments for the tests: an HTTP ingress composed with a child and a batched
deployment through handles, and a KServe v2 ingress in front of a child. Their own module (not
the test's) because replicas import it."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import numpy as np
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import JSONResponse

import otelkit

NO_CPU = {"num_cpus": 0}  # the session's Ray has 2 CPUs: replicas must not reserve them


@serve.deployment(ray_actor_options=NO_CPU)
class Child:
    """Doubles a list inside a stage; ``fail`` raises; ``pid`` names its process."""

    def run(self, values: list[float]) -> list[float]:
        with otelkit.stage("double"):
            return [2 * v for v in values]

    def fail(self, values: list[float]) -> list[float]:
        raise ValueError(f"refused {values}")

    async def slow(self, seconds: float) -> int:
        await asyncio.sleep(seconds)
        return os.getpid()

    def pid(self) -> int:
        return os.getpid()


@serve.deployment(ray_actor_options=NO_CPU, max_ongoing_requests=16)
class Batched:
    """Triples numbers in batches of up to 4, one stage per batch."""

    @serve.batch(max_batch_size=4, batch_wait_timeout_s=0.5)
    async def __call__(self, values: list[float]) -> list[float]:
        with otelkit.stage("triple"):
            return [3 * v for v in values]


@serve.deployment(ray_actor_options=NO_CPU, max_ongoing_requests=32)
class Ingress:
    """``POST /double``, ``/batch``, ``/fail`` and ``/slow`` with a JSON body ``{"x": ...}``."""

    def __init__(self, child: DeploymentHandle, batched: DeploymentHandle) -> None:
        self.child, self.batched = child, batched

    async def __call__(self, request: Request) -> JSONResponse:
        body: dict[str, Any] = await request.json()
        action = request.url.path.rsplit("/", 1)[-1]
        if action == "batch":
            results = await asyncio.gather(*(self.batched.remote(v) for v in body["x"]))
            return JSONResponse({"y": list(results)})
        if action == "fail":
            return JSONResponse({"y": await self.child.fail.remote(body["x"])})
        if action == "slow":
            return JSONResponse({"pid": await self.child.slow.remote(body["x"])})
        return JSONResponse({"y": await self.child.run.remote(body["x"])})


@serve.deployment(ray_actor_options=NO_CPU, max_ongoing_requests=32)
@serve.ingress()
class KServeIngress:
    """The KServe v2 HTTP protocol in front of ``Child``, so that an instrumented
    ``tritonclient.http`` client calls it: models ``fail`` (``Child.fail``) and ``slow``
    (``Child.slow``, its input the seconds to sleep, its output the replica's pid)."""

    def __init__(self, child: DeploymentHandle) -> None:
        self.child = child

    def __serve_build_asgi_app__(self) -> Any:
        from gnn_tracking.serving.kserve import ModelSpec, TensorSpec, create_app

        x = (TensorSpec("x", "FP32", (-1,)),)
        models = [
            ModelSpec("fail", x, (TensorSpec("y", "FP32", (-1,)),), self._fail),
            ModelSpec("slow", x, (TensorSpec("pid", "INT64", (1,)),), self._slow),
        ]
        return otelkit.instrument(create_app(models, name="ray-tests-kserve"))

    # on Starlette's thread pool (the KServe server runs ``infer`` there): they may block
    def _fail(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"y": np.asarray(self.child.fail.remote(inputs["x"].tolist()).result())}

    def _slow(self, inputs: dict[str, Any]) -> dict[str, Any]:
        pid = self.child.slow.remote(float(inputs["x"][0])).result()
        return {"pid": np.asarray([pid], dtype=np.int64)}
