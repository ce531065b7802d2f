"""FastAPI request overhead: the same app with and without ``otelkit.instrument(app)``.

Requests go straight to the ASGI app (no sockets, so the network does not drown the
difference), interleaved request by request in one event loop, at 100 % sampling with spans
exported to OTLP-JSON-lines files and the request-duration histogram on. The handler opens one
``otelkit.stage`` in both apps, as an inference handler would. The last line is JSON.

    python benchmarks/bench_fastapi.py [--requests 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import sys
import tempfile
import time
from collections.abc import MutableMapping
from typing import Any

from fastapi import FastAPI
from medians import latency_summary  # benchmarks/, this script's directory

import otelkit

SCOPE: dict[str, Any] = {
    "type": "http",
    "asgi": {"version": "3.0"},
    "http_version": "1.1",
    "method": "POST",
    "scheme": "http",
    "path": "/v2/models/gnn/infer",
    "raw_path": b"/v2/models/gnn/infer",
    "query_string": b"",
    "root_path": "",
    "server": ("127.0.0.1", 8000),
    "client": ("127.0.0.1", 50000),
    "headers": [
        (b"host", b"127.0.0.1:8000"),
        (b"content-length", b"0"),
        (b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    ],
}


def make_app() -> FastAPI:
    # FastAPI >= 0.165 traces natively once a provider is set: off, to compare otelkit alone
    options: dict[str, Any] = {}
    if "telemetry" in inspect.signature(FastAPI).parameters:
        options["telemetry"] = {"tracing": False, "metrics": False}
    app = FastAPI(**options)

    @app.post("/v2/models/{model}/infer")
    async def infer(model: str) -> dict[str, str]:
        with otelkit.stage("preprocess"):
            return {"model": model}

    return app


async def call(app: FastAPI) -> None:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        return None

    await app(dict(SCOPE), receive, send)


async def run(requests: int) -> tuple[list[int], list[int]]:
    plain, traced = make_app(), otelkit.instrument(make_app())
    clock = time.perf_counter_ns
    plain_ns: list[int] = []
    traced_ns: list[int] = []
    for index in range(requests):
        order = ((plain, plain_ns), (traced, traced_ns))
        for app, out in order if index % 2 else reversed(order):
            start = clock()
            await call(app)
            out.append(clock() - start)
    return plain_ns, traced_ns


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000, help="interleaved pairs")
    args = parser.parse_args()
    telemetry = otelkit.configure(
        service_name="bench-fastapi",
        traces_dir=tempfile.mkdtemp(prefix="bench-fastapi-"),
        sampler="always_on",
        prometheus_port=0,
        bsp_max_queue_size=200_000,
    )
    plain_ns, traced_ns = asyncio.run(run(args.requests))
    telemetry.flush()
    summary: dict[str, float] = {"requests": args.requests}
    summary |= latency_summary({"plain": plain_ns, "instrumented": traced_ns})
    summary["overhead_p50_us"] = round(summary["instrumented_p50_us"] - summary["plain_p50_us"], 1)
    summary["spans_exported"] = telemetry.stats().get("exported", 0)
    otelkit.shutdown()
    print(
        f"p50 {summary['plain_p50_us']} us plain, {summary['instrumented_p50_us']} us "
        f"instrumented ({args.requests} pairs)"
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
