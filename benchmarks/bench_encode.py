"""CPU cost of encoding SDK spans for export: OTLP JSON (``spans_to_bytes`` against the protobuf
detour) and OTLP protobuf (``otlp_proto.encode_request`` against the SDK's ``encode_spans``).

The exporters' worker thread pays this per span, and through the GIL it is taken from the
application's threads. The spans are typical client spans (15 attributes: strings, ints, floats;
a local parent) made by the SDK, in batches of 512 sharing one resource of 15 attributes. Each
direct encoder must give exactly the bytes of the path it replaces, which is checked first: for
JSON, ``dumps(request_to_json(encode_spans(spans)))`` (what otelkit's JSON exporters wrote at
first; a later version built the same dicts without protobuf, at about 25 us per span here).

    python benchmarks/bench_encode.py [--batch 512] [--batches 8] [--repeat 5]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from otelkit.export._otlp_json import dumps, request_to_json, spans_to_bytes
from otelkit.export._otlp_proto import encode_request

Batch = Sequence[ReadableSpan]

RESOURCE: dict[str, str | int] = {
    "service.name": "tracking-client",
    "service.version": "1.4.2",
    "service.instance.id": "5f1c0e9a-8b1e-4c53-9d6e-3c2f7a1b0d44",
    "service.namespace": "exatrkx",
    "deployment.environment.name": "production",
    "host.name": "node-17",
    "host.arch": "amd64",
    "os.type": "linux",
    "process.pid": 48213,
    "process.runtime.name": "cpython",
    "process.runtime.version": "3.11.9",
    "telemetry.sdk.name": "opentelemetry",
    "telemetry.sdk.language": "python",
    "telemetry.sdk.version": "1.45.2",
    "k8s.pod.name": "tracking-client-7d9f8b6c5-x2x4q",
}


def build_batches(count: int, size: int, seed: int = 7) -> list[list[ReadableSpan]]:
    """``count`` batches of ``size`` distinct client spans, each under its own local parent."""
    rnd = random.Random(seed)
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource(RESOURCE))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("otelkit.client", "0.1.0")
    spans: list[ReadableSpan] = []
    with tracer.start_as_current_span("request"):
        for _ in range(count * size):
            with tracer.start_as_current_span("infer exatrkx", kind=SpanKind.CLIENT) as span:
                span.set_attributes(_client_attributes(rnd))
    spans = [span for span in memory.get_finished_spans() if span.name != "request"]
    provider.shutdown()
    return [spans[i * size : (i + 1) * size] for i in range(count)]


def _client_attributes(rnd: random.Random) -> dict[str, Any]:
    return {
        "rpc.system.name": "grpc",
        "rpc.method": "inference.GRPCInferenceService/ModelInfer",
        "server.address": "gpu-node-3",
        "server.port": 8001,
        "network.peer.address": "10.0.3.17",
        "otelkit.model.name": "exatrkx",
        "otelkit.model.version": "1",
        "otelkit.request.id": f"{rnd.getrandbits(64):016x}",
        "otelkit.request.bytes": rnd.randint(10_000, 2_000_000),
        "otelkit.response.bytes": rnd.randint(1_000, 100_000),
        "otelkit.inputs": 3,
        "otelkit.outputs": 2,
        "otelkit.serialize.ms": rnd.random() * 2,
        "otelkit.deserialize.ms": rnd.random(),
        "otelkit.score.cut": 0.75,
    }


def old_path(spans: Batch) -> bytes:
    """SDK spans → protobuf → OTLP JSON dicts → bytes."""
    return dumps(request_to_json(encode_spans(spans)))


def us_per_span(
    encode: Callable[[Batch], Any], batches: list[list[ReadableSpan]], repeat: int
) -> float:
    """Best of ``repeat`` rounds over all batches, in CPU µs per span (the thread's own time)."""
    spans = sum(len(batch) for batch in batches)
    best = float("inf")
    for _ in range(repeat):
        start = time.thread_time()
        for batch in batches:
            encode(batch)
        best = min(best, time.thread_time() - start)
    return best / spans * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    batches = build_batches(args.batches, args.batch)
    for batch in batches:
        if spans_to_bytes(batch) != old_path(batch):
            raise SystemExit(
                "spans_to_bytes differs from dumps(request_to_json(encode_spans(...)))"
            )
    old = us_per_span(old_path, batches, args.repeat)
    new = us_per_span(spans_to_bytes, batches, args.repeat)
    print(f"{args.batches} batches of {args.batch} client spans, 15 attributes each")
    print("OTLP JSON (otelkit's trace files, http/json):")
    print(f"old  dumps(request_to_json(encode_spans(spans))) {old:6.2f} µs/span")
    print(
        f"new  spans_to_bytes(spans)                       {new:6.2f} µs/span  ({old / new:.1f}x)"
    )
    for batch in batches:
        ours = ExportTraceServiceRequest.FromString(encode_request(batch))
        if ours != encode_spans(batch):
            raise SystemExit("encode_request differs from encode_spans(...).SerializeToString()")
    sdk = us_per_span(lambda batch: encode_spans(batch).SerializeToString(), batches, args.repeat)
    direct = us_per_span(encode_request, batches, args.repeat)
    print("OTLP protobuf (http/protobuf, and grpc's request before gRPC serialises it):")
    print(f"SDK  encode_spans(spans).SerializeToString() {sdk:6.2f} µs/span")
    ratio = sdk / direct
    print(f"new  encode_request(spans)                   {direct:6.2f} µs/span  ({ratio:.1f}x)")


if __name__ == "__main__":
    main()
