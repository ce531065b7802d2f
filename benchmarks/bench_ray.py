"""Ray Serve request overhead: an instrumented application against its uninstrumented twin.

Both applications run on one local Ray (2 CPUs) behind Serve's HTTP proxy: an ingress
deployment that calls a second deployment through a ``DeploymentHandle``, which opens one
``otelkit.stage``. In the instrumented twin every deployment went through
``otelkit.instrument``: each request gets the ingress's SERVER span, the handle call's span
and its queued span, the stage span and two duration histograms, at 100 % sampling, spans
exported to OTLP-JSON-lines files. Requests alternate between the twins, pair by pair, from
one keep-alive HTTP connection each. The last line is JSON.

    python benchmarks/bench_ray.py [--requests 600]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from medians import latency_summary  # benchmarks/, this script's directory
from ray import serve
from starlette.requests import Request

import otelkit
from otelkit.server.ray_serve import instrument_deployment
from otelkit.tritonserver import free_port

ROOT = Path(__file__).resolve().parents[1]
NO_CPU = {"num_cpus": 0}
BOUND = 0.05  # of the uninstrumented median, as issue 31 asks


@serve.deployment(ray_actor_options=NO_CPU)
class Child:
    def run(self, values: list[float]) -> list[float]:
        with otelkit.stage("double"):
            return [2 * v for v in values]


@serve.deployment(ray_actor_options=NO_CPU)
class Ingress:
    def __init__(self, child: Any) -> None:
        self.child = child

    async def __call__(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        return {"y": await self.child.run.remote(body["x"])}


def deploy(traces_dir: str, sampler: str) -> int:
    """Both twins on Serve's proxy; its port."""
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    env = {
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "examples")]),
        "OTELKIT_TRACES_DIR": traces_dir,
        "OTEL_TRACES_SAMPLER": sampler,
        "OTEL_SERVICE_NAME": "bench-ray",
    }
    # the twin imports the same otelkit (its stage then records nothing: not configured there)
    same = {"num_cpus": 0, "runtime_env": {"env_vars": {"PYTHONPATH": env["PYTHONPATH"]}}}
    plain = Ingress.options(ray_actor_options=same).bind(
        Child.options(ray_actor_options=same).bind()
    )
    traced = instrument_deployment(Ingress, env).bind(instrument_deployment(Child, env).bind())
    serve.run(plain, name="plain", route_prefix="/plain")
    serve.run(traced, name="traced", route_prefix="/traced")
    return port


def timed(connection: http.client.HTTPConnection, path: str) -> int:
    body = json.dumps({"x": [1.0, 2.0, 3.0]})
    start = time.perf_counter_ns()
    connection.request("POST", path, body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    response.read()
    elapsed = time.perf_counter_ns() - start
    if response.status != 200:
        raise RuntimeError(f"{path}: HTTP {response.status}")
    return elapsed


def run(port: int, requests: int, warmup: int) -> tuple[list[int], list[int]]:
    connections = {p: http.client.HTTPConnection("127.0.0.1", port) for p in ("/plain", "/traced")}
    for _ in range(warmup):
        for path, connection in connections.items():
            timed(connection, path)
    plain_ns: list[int] = []
    traced_ns: list[int] = []
    for index in range(requests):
        order = (("/plain", plain_ns), ("/traced", traced_ns))
        for path, out in order if index % 2 else reversed(order):
            out.append(timed(connections[path], path))
    return plain_ns, traced_ns


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600, help="interleaved pairs")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument(
        "--sampler",
        default="always_on",
        help="the instrumented replicas' sampler (always_off: the hooks alone, no span recorded)",
    )
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        port = deploy(tempfile.mkdtemp(prefix="bench-ray-"), args.sampler)
        plain_ns, traced_ns = run(port, args.requests, args.warmup)
    finally:
        serve.shutdown()
        ray.shutdown()  # type: ignore[no-untyped-call]
    summary: dict[str, Any] = {"requests": args.requests, "sampler": args.sampler}
    summary |= latency_summary({"plain": plain_ns, "instrumented": traced_ns})
    added = summary["instrumented_p50_us"] - summary["plain_p50_us"]
    summary["overhead_p50_us"] = round(added, 1)
    summary["overhead_ratio"] = round(added / summary["plain_p50_us"], 4)
    summary["bound_ratio"] = BOUND
    summary["met"] = summary["overhead_ratio"] <= BOUND
    print(
        f"p50 {summary['plain_p50_us']} us plain, {summary['instrumented_p50_us']} us "
        f"instrumented: {added:+.1f} us per request ({100 * summary['overhead_ratio']:+.1f} %, "
        f"bound {100 * BOUND:.0f} %; {args.requests} pairs)"
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
