"""Throughput of the embedded OTLP receiver under the OpenTelemetry SDK's own exporter.

The receiver runs as its own process (through ``otelkit.receiver.run``, as ``otelkit receive``
will), and this process drives it with ``OTLPSpanExporter`` (http/protobuf) from a few threads,
each exporting pre-built batches of realistic inference spans for a fixed time. Afterwards the
receiver's output is checked span by span: every span of every batch sent must be there
exactly as many times as its batch was acknowledged. Both of the receiver's formats, OTLP JSON
lines and the span store's Parquet segments (``--format parquet``), are driven in one run,
taking turns (a fresh receiver each time), ``--rounds`` times each: their medians and the
ratio of the segments' rate to the JSON lines'. Work a receiver leaves for its close (the
last segment's columns) is counted apart: its close's seconds, its rate over the export and
the close together, and its CPU to its exit (``wait4``). The last line printed is a JSON
summary.

    python benchmarks/bench_receiver.py [--seconds 10] [--threads 2] [--batch 512] [--rounds 2]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Tracer

TARGET_SPANS_PER_S = 20_000
RECEIVER = """
import argparse, logging, sys
from otelkit import receiver
logging.basicConfig(level=logging.INFO, format="receiver: %(message)s")
parser = argparse.ArgumentParser()
receiver.add_arguments(parser)
sys.exit(receiver.run(parser.parse_args(sys.argv[1:]), log_every=5.0))
"""


class _Keep(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def build_batches(count: int, size: int, seed: int = 7) -> list[list[ReadableSpan]]:
    """Distinct spans, ``count`` batches of ``size``, made by the SDK as in a traced call."""
    rnd = random.Random(seed)
    keep = _Keep()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "tracking-client", "host.name": "node-17"})
    )
    provider.add_span_processor(SimpleSpanProcessor(keep))
    tracer = provider.get_tracer("otelkit.client", "0.1.0")
    while len(keep.spans) < count * size:
        _traced_call(tracer, rnd)
    provider.shutdown()
    spans = keep.spans[: count * size]
    return [spans[i * size : (i + 1) * size] for i in range(count)]


def _traced_call(tracer: Tracer, rnd: random.Random) -> None:
    """A client call and what a traced Triton adds: request, model and compute spans with their
    timestamp events, and the model's stage spans (9 spans)."""
    with tracer.start_as_current_span("infer exatrkx", kind=SpanKind.CLIENT) as call:
        call.set_attributes(
            {
                "rpc.system.name": "grpc",
                "rpc.method": "inference.GRPCInferenceService/ModelInfer",
                "server.address": "gpu-node-3",
                "server.port": 8001,
                "otelkit.model.name": "exatrkx",
                "otelkit.request.bytes": rnd.randint(10_000, 2_000_000),
            }
        )
        call.add_event("serialize.end", {"otelkit.bytes": rnd.randint(1000, 10**6)})
        with (
            tracer.start_as_current_span("InferRequest", kind=SpanKind.SERVER),
            tracer.start_as_current_span("exatrkx") as model,
        ):
            model.set_attributes({"triton.model_name": "exatrkx", "triton.model_version": 1})
            for event in ("REQUEST_START", "QUEUE_START", "REQUEST_END"):
                model.add_event(event)
            with tracer.start_as_current_span("compute") as compute:
                for event in ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_END"):
                    compute.add_event(event)
                for stage in ("embed", "frnn", "filter", "gnn", "components"):
                    with tracer.start_as_current_span(stage) as span:
                        span.set_attributes(
                            {
                                "otelkit.stage": stage,
                                "otelkit.edges": rnd.randint(1, 3000),
                                "otelkit.score.cut": 0.75,
                            }
                        )


def start_receiver(out_dir: Path, fmt: str = "jsonl") -> tuple[subprocess.Popen[bytes], int]:
    """Start the receiver process on a free port, writing ``fmt``, and wait until it accepts
    connections."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    cmd = [sys.executable, "-c", RECEIVER, "--port", str(port), "--out", str(out_dir)]
    cmd += ["--format", fmt]
    proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[1])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the receiver did not start (exit status {proc.poll()})")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for_exit(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, float]:
    """Wait for ``proc`` to exit: its exit status and the CPU seconds it used in all (user +
    system, its own threads' and its children's it waited for, from ``wait4``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_utime + usage.ru_stime
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"the receiver did not exit within {timeout:g} s of SIGTERM")


def drive(url: str, batches: list[list[ReadableSpan]], args: argparse.Namespace) -> list[int]:
    """Export batches round-robin from ``args.threads`` threads; acknowledged sends per batch."""
    acked = [0] * len(batches)
    failed = [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + args.seconds

    def worker(offset: int) -> None:
        exporter = OTLPSpanExporter(endpoint=url, timeout=60, compression=args.compression)
        i = offset
        while time.monotonic() < stop_at:
            result = exporter.export(batches[i % len(batches)])
            with lock:
                if result is SpanExportResult.SUCCESS:
                    acked[i % len(batches)] += 1
                else:
                    failed[0] += 1
            i += args.threads
        exporter.shutdown()  # type: ignore[no-untyped-call]

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(args.threads)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        time.sleep(1.0)
        sent = sum(acked) * args.batch
        elapsed = time.monotonic() - start
        print(f"  {elapsed:5.1f} s  {sent:8d} spans acknowledged  {sent / elapsed:8.0f} spans/s")
    if failed[0]:
        print(f"  {failed[0]} exports failed")
    return acked


def stored_span_ids(path: Path) -> collections.Counter[str]:
    """How many times each span id occurs in the receiver's file (``traces.jsonl``), or in its
    segments (a folder's ``*.parquet``)."""
    counts: collections.Counter[str] = collections.Counter()
    if path.is_dir():
        import pyarrow.parquet

        for segment in sorted(path.glob("*.parquet")):
            counts.update(pyarrow.parquet.read_table(segment, columns=["SpanId"])[0].to_pylist())
        return counts
    with path.open() as lines:
        for line in lines:
            for rs in json.loads(line).get("resourceSpans", ()):
                for ss in rs.get("scopeSpans", ()):
                    counts.update(span["spanId"] for span in ss.get("spans", ()))
    return counts


def measure(
    fmt: str, batches: list[list[ReadableSpan]], args: argparse.Namespace
) -> dict[str, float | int | bool]:
    """One receiver writing ``fmt``, driven for ``args.seconds``: its rate, its CPU per span,
    and whether it kept exactly the spans acknowledged."""
    with tempfile.TemporaryDirectory(prefix="bench-receiver-") as tmp:
        proc, port = start_receiver(Path(tmp), fmt)
        url = f"http://127.0.0.1:{port}/v1/traces"
        print(f"{fmt}: receiver pid {proc.pid} on {url}; exporting for {args.seconds:g} s")
        start = time.monotonic()
        acked = drive(url, batches, args)
        seconds = time.monotonic() - start
        receiver_cpu = cpu_seconds(proc.pid)
        stopping = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        status, cpu_to_exit = wait_for_exit(proc, timeout=120)  # the last segment is written
        close_s = time.monotonic() - stopping
        stored = stored_span_ids(Path(tmp) / "traces.jsonl" if fmt == "jsonl" else Path(tmp))
    expected: collections.Counter[str] = collections.Counter()
    for batch, times in zip(batches, acked, strict=True):
        expected.update({format(span.context.span_id, "016x"): times for span in batch})
    sent, kept = sum(expected.values()), sum(stored.values())
    exact = +expected == +stored
    print(f"{fmt}: receiver exit status {status}; holds exactly the spans sent: {exact}")
    return {
        "spans_per_s": round(sent / seconds),
        "spans_sent": sent,
        "spans_stored": kept,
        "dropped": sent - kept if exact else sum((expected - stored).values()),
        "unexpected": sum((stored - expected).values()),
        "receiver_cpu_us_per_span": round(receiver_cpu / max(kept, 1) * 1e6, 1),
        "receiver_cpu_us_per_span_to_exit": round(cpu_to_exit / max(kept, 1) * 1e6, 1),
        "close_s": round(close_s, 2),
        "spans_per_s_to_exit": round(sent / (seconds + close_s)),
        "exact": exact and status == 0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--batches", type=int, default=8, help="distinct pre-built batches")
    parser.add_argument("--compression", type=Compression, default=Compression.NoCompression)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each format, in turns")
    args = parser.parse_args()

    batches = build_batches(args.batches, args.batch)
    print(f"built {args.batches} batches of {args.batch} spans")
    runs: dict[str, list[dict[str, float | int | bool]]] = {"jsonl": [], "parquet": []}
    for _ in range(args.rounds):  # taking turns: a change in the host's load hits both
        for fmt, measured in runs.items():
            measured.append(measure(fmt, batches, args))

    def median(fmt: str, key: str) -> float:
        return float(statistics.median(float(run[key]) for run in runs[fmt]))

    formats = {
        fmt: {
            "spans_per_s": round(median(fmt, "spans_per_s")),
            "receiver_cpu_us_per_span": round(median(fmt, "receiver_cpu_us_per_span"), 1),
            "receiver_cpu_us_per_span_to_exit": round(
                median(fmt, "receiver_cpu_us_per_span_to_exit"), 1
            ),
            "close_s": round(median(fmt, "close_s"), 2),
            "spans_per_s_to_exit": round(median(fmt, "spans_per_s_to_exit")),
            "rates": [run["spans_per_s"] for run in measured],
            "dropped": sum(int(run["dropped"]) for run in measured),
            "unexpected": sum(int(run["unexpected"]) for run in measured),
            "exact": all(run["exact"] for run in measured),
        }
        for fmt, measured in runs.items()
    }
    ratio = median("parquet", "spans_per_s") / max(median("jsonl", "spans_per_s"), 1.0)
    to_exit = median("parquet", "spans_per_s_to_exit") / max(
        median("jsonl", "spans_per_s_to_exit"), 1.0
    )
    jsonl, parquet = formats["jsonl"], formats["parquet"]
    print(
        f"JSON lines {jsonl['spans_per_s']} spans/s, segments {parquet['spans_per_s']} spans/s "
        f"(x{ratio:.2f}); counting each receiver's close ({jsonl['close_s']:g} and "
        f"{parquet['close_s']:g} s): x{to_exit:.2f}; receiver CPU a span, to its exit: "
        f"{jsonl['receiver_cpu_us_per_span_to_exit']} and "
        f"{parquet['receiver_cpu_us_per_span_to_exit']} us"
    )
    summary = {
        "formats": formats,
        "parquet_over_jsonl": round(ratio, 2),
        "parquet_over_jsonl_to_exit": round(to_exit, 2),
        "batch": args.batch,
        "threads": args.threads,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "target_spans_per_s": TARGET_SPANS_PER_S,
    }
    print(json.dumps(summary))
    return 0 if all(f["exact"] for f in formats.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
