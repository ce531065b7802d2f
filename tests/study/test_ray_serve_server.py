"""``otelkit.study._servers.RayServe`` on the session's local Ray: a point deploys the
application with its ``instances`` as replicas, the next point's count scales it in place."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Mapping
from typing import Any

import pytest

from tests.support import LocalRay

serve = pytest.importorskip("ray.serve")


def doubling_app(params: Mapping[str, Any], env_vars: Mapping[str, str]) -> Any:
    from otelkit.server.ray_serve import instrument_deployment
    from tests.server.ray_apps import Child, Ingress

    quiet = LocalRay.replica_env("http://127.0.0.1:9/v1/traces", OTEL_TRACES_SAMPLER="always_off")
    env = {**quiet, **env_vars}
    child = instrument_deployment(Child, env).options(num_replicas=params["instances"])
    batched = instrument_deployment(Child, env).options(name="Spare")
    return instrument_deployment(Ingress, env).bind(child.bind(), batched.bind())


def running_replicas(app: str, deployment: str) -> int:
    status = serve.status().applications[app].deployments[deployment]
    return int(status.replica_states.get("RUNNING", 0))


def test_instances_are_replicas_and_a_new_count_scales_the_application(
    ray_local: LocalRay,
) -> None:
    from otelkit.study import RayServe

    server = RayServe(doubling_app, name="study-test")
    try:
        for instances in (1, 2):
            endpoint = server.prepare({"instances": instances}, None)
            assert running_replicas("study-test", "Child") == instances
            request = urllib.request.Request(
                f"http://{endpoint.url('http')}/double",
                json.dumps({"x": [1.5]}).encode(),
                method="POST",
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                assert json.load(response) == {"y": [3.0]}
        assert server.describe() == {"kind": "ray_serve", "application": "study-test"}
    finally:
        server.close()
