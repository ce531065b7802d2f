"""Does a tritonserver survive traced load? Threads call the 16-float identity model in a loop,
traced by otelkit under a sampler, against a Triton that traces every request carrying a trace
context (and no other). Prints the calls, the traced rate, the errors, when the first error
came, and whether the server is still alive; the last line is JSON.

    python benchmarks/traced_load.py --protocol grpc --sampler ratelimiting --arg 200 \\
        --threads 32 --seconds 60

docs/known-issues.md has the rates at which tritonserver 2.51 crashes, measured with this.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import otelkit
from otelkit.receiver import Receiver
from otelkit.tritonserver import TritonServer

MODELS = Path(__file__).resolve().parents[1] / "tests" / "models"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    parser.add_argument("--sampler", default="ratelimiting", help="as OTEL_TRACES_SAMPLER")
    parser.add_argument("--arg", type=float, default=100.0, help="as OTEL_TRACES_SAMPLER_ARG")
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    module = grpcclient if args.protocol == "grpc" else httpclient
    out = Path(tempfile.mkdtemp(prefix="traced-load-"))
    with (
        Receiver(out / "server", max_concurrent=16) as receiver,
        TritonServer(MODELS, trace_url=receiver.traces_url, trace_rate=1_000_000) as server,
    ):
        telemetry = otelkit.configure(
            service_name="traced-load",
            traces_dir=str(out / "client"),
            sampler=args.sampler,
            sampler_arg=args.arg,
            metrics_exporter="none",
        )
        url = server.grpc_url if args.protocol == "grpc" else server.http_url
        stop = threading.Event()
        calls, errors = [0] * args.threads, [0] * args.threads
        first_error: list[float] = []
        started = time.monotonic()

        def work(index: int) -> None:
            # a crashed tritonserver may hang instead of exiting: every call has a deadline
            if args.protocol == "http":
                client = otelkit.instrument(
                    httpclient.InferenceServerClient(url, network_timeout=10)
                )
                timeout = {}
            else:
                client = otelkit.instrument(grpcclient.InferenceServerClient(url))
                timeout = {"client_timeout": 10.0}
            tensor = module.InferInput("INPUT0", [1, 16], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
            while not stop.is_set():
                try:
                    client.infer("identity_fp32", [tensor], **timeout)
                    calls[index] += 1
                except Exception:  # counted: a dead server answers nothing
                    errors[index] += 1
                    if not first_error:
                        first_error.append(time.monotonic() - started)
                    time.sleep(0.05)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(args.threads)]
        for thread in threads:
            thread.start()
        time.sleep(args.seconds)
        stop.set()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
        otelkit.flush()
        traced = telemetry.stats()["exported"]
        alive = server.running
        otelkit.shutdown()
    result = {
        "protocol": args.protocol,
        "sampler": args.sampler,
        "arg": args.arg,
        "threads": args.threads,
        "seconds": round(elapsed, 1),
        "calls": sum(calls),
        "traced_per_s": round(traced / elapsed, 1),
        "errors": sum(errors),
        "first_error_after_s": round(first_error[0], 1) if first_error else None,
        "server_alive": alive,
    }
    print(
        f"{args.protocol} {args.sampler} {args.arg:g}, {args.threads} threads: {sum(calls)} calls "
        f"in {elapsed:.1f} s, {result['traced_per_s']} traced/s, {sum(errors)} errors"
        + (f" from {first_error[0]:.1f} s" if first_error else "")
        + f", server {'alive' if alive else 'DEAD'}"
    )
    print(json.dumps(result))
    return 0 if alive else 1


if __name__ == "__main__":
    sys.exit(main())
