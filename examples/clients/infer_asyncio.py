"""The asyncio gRPC client, instrumented: a few events inferred concurrently, one trace.

    python examples/clients/infer_asyncio.py [--url HOST:PORT] [--model M] [--events N]

Each task's call gets its own CLIENT span under the job's span, with Triton's spans under it.
Talks to ``examples/servers/triton_backend/serve.py`` on localhost; spans go where
``infer_sync.py`` says (``$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, or ``./otelkit-traces``).
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np
import tritonclient.grpc.aio as aioclient
from numpy.typing import NDArray
from opentelemetry import trace

import otelkit

HITS = np.array([[30, 40, 10], [-60, 80, -25], [0, -120, 40]], dtype=np.float32)


async def infer(
    client: aioclient.InferenceServerClient, model: str, hits: NDArray[np.float32]
) -> str:
    tensor = aioclient.InferInput("HITS", list(hits.shape), "FP32")
    tensor.set_data_from_numpy(hits)
    result = await client.infer(model, [tensor])
    return str(result.as_numpy("FEATURES").astype(float).round(4).tolist())


async def main(url: str, model: str, events: int) -> None:
    telemetry = otelkit.configure(service_name="hit-features-aio-client")
    client = otelkit.instrument(aioclient.InferenceServerClient(url))
    try:
        with trace.get_tracer("example").start_as_current_span("reconstruct events") as job:
            # Tasks copy the current context: every call is a child of the job's span.
            results = await asyncio.gather(
                *(infer(client, model, HITS * (1 + event)) for event in range(events))
            )
    finally:
        await client.close()
    for event, features in enumerate(results):
        print(f"event {event} FEATURES {features}")
    trace_id = f"{job.get_span_context().trace_id:032x}"
    print(f"trace {trace_id} -> {telemetry.traces_destination}")  # flushed at exit


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Concurrent traced inferences with asyncio.")
    parser.add_argument("--url", default="localhost:8001")
    parser.add_argument("--model", default="hit_features")
    parser.add_argument("--events", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.url, args.model, args.events))
