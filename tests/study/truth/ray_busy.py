"""(j) of the truth table: a Ray Serve deployment whose replica burns 40 ms of CPU a request in
its stage "compute": one replica caps it at about 25 requests/s. Its own module because
replicas import it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

import otelkit
from tests.study.truth.work import spin

WORK_S = 0.040


@serve.deployment(ray_actor_options={"num_cpus": 0})  # the session's Ray has 2 CPUs
class Busy:
    async def __call__(self, request: Request) -> JSONResponse:
        body = await request.json()
        with otelkit.stage("compute"):
            spin(WORK_S)
        return JSONResponse({"y": body["x"]})


def busy_app(params: Mapping[str, Any], env_vars: Mapping[str, str]) -> Any:
    """``RayServe``'s builder: ``instances`` replicas of ``Busy``, traced to the study."""
    from otelkit.server.ray_serve import instrument_deployment
    from tests.support import LocalRay

    env = {**LocalRay.replica_env("http://127.0.0.1:9/v1/traces"), **env_vars}
    deployment = instrument_deployment(Busy, env).options(num_replicas=params["instances"])
    return deployment.bind()
