"""gRPC server overhead: the KServe v2 servicer with and without otelkit's server interceptor.

Three real grpcio servers in this process serve the same servicer (one small model, one
``otelkit.stage`` in it, as an inference handler would): bare, with
``otelkit.server.grpc.server_interceptor()``, and with OpenTelemetry's own interceptor
(``opentelemetry-instrumentation-grpc``, on the SDK's tracer) for comparison. One plain
``tritonclient.grpc`` client per server sends the same ``ModelInfer`` with a sampled
``traceparent``, the three taking turns call by call, at 100 % sampling with spans exported to
OTLP-JSON-lines files and the duration histogram on. The last line is JSON.

    python benchmarks/bench_grpc_server.py [--requests 3000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from medians import latency_summary  # benchmarks/, this script's directory
from opentelemetry import trace
from opentelemetry.instrumentation.grpc import server_interceptor as contrib_interceptor

import otelkit
from otelkit.server.grpc import server_interceptor
from otelkit.tritonserver import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gnn_tracking.serving.kserve import ModelSpec, TensorSpec
from gnn_tracking.serving.kserve_grpc import KServeServicer, grpc_server

HEADERS = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
X = np.arange(64, dtype=np.float32)


def double(inputs: dict[str, Any]) -> dict[str, Any]:
    with otelkit.stage("preprocess"):
        return {"y": inputs["x"] * 2}


def serve(variant: str) -> tuple[Any, grpcclient.InferenceServerClient]:
    spec = TensorSpec("x", "FP32", (-1,)), TensorSpec("y", "FP32", (-1,))
    servicer = KServeServicer([ModelSpec("double", spec[:1], spec[1:], double)])
    port = free_port()
    interceptors = {
        "plain": [],
        "otelkit": [server_interceptor("127.0.0.1", port)],
        "contrib": [contrib_interceptor(trace.get_tracer_provider())],
    }[variant]
    server = grpc_server(servicer, port, interceptors=interceptors, workers=2)
    return server, grpcclient.InferenceServerClient(f"127.0.0.1:{port}")


def run(requests: int, variants: list[str]) -> dict[str, list[int]]:
    served = {variant: serve(variant) for variant in variants}
    tensor = grpcclient.InferInput("x", [len(X)], "FP32")
    tensor.set_data_from_numpy(X)
    clock = time.perf_counter_ns
    durations: dict[str, list[int]] = {variant: [] for variant in variants}
    for index in range(requests + 200):  # the first 200 rounds warm up
        turn = variants[index % len(variants) :] + variants[: index % len(variants)]
        for variant in turn:
            client = served[variant][1]
            start = clock()
            client.infer("double", [tensor], headers=HEADERS)
            if index >= 200:
                durations[variant].append(clock() - start)
    for server, client in served.values():
        client.close()
        server.stop(None)
    return durations


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="rounds of one call each")
    args = parser.parse_args()
    telemetry = otelkit.configure(
        service_name="bench-grpc-server",
        traces_dir=tempfile.mkdtemp(prefix="bench-grpc-"),
        sampler="always_on",
        prometheus_port=0,
        bsp_max_queue_size=200_000,
    )
    durations = run(args.requests, ["plain", "otelkit", "contrib"])
    telemetry.flush()
    summary: dict[str, float] = {"requests": args.requests}
    summary |= latency_summary(durations)
    for name in ("otelkit", "contrib"):
        overhead = summary[f"{name}_p50_us"] - summary["plain_p50_us"]
        summary[f"{name}_overhead_p50_us"] = round(overhead, 1)
        summary[f"{name}_overhead_p50_pct"] = round(100 * overhead / summary["plain_p50_us"], 1)
    summary["spans_exported"] = telemetry.stats().get("exported", 0)
    otelkit.shutdown()
    print(
        f"p50 {summary['plain_p50_us']} us bare, {summary['otelkit_p50_us']} us otelkit, "
        f"{summary['contrib_p50_us']} us OpenTelemetry's interceptor ({args.requests} rounds)"
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
