"""A bounded loopback load on the pipeline's Triton over HTTP, looking for responses that fail
to parse (``HTTPParseError``, issue 45: 1 of 1151 events in one ``make demo`` run).

    PYTHONPATH=examples python -m gnn_tracking.driving.http_load [--events 2000] [--threads 8]

It starts Triton as ``make demo`` does (traced to an embedded receiver, at most
``--traces-per-s`` events a second traced end to end), sends ``--events`` events of service
option 3 (five calls each, one per stage model) from ``--threads`` threads over HTTP on
127.0.0.1, and prints the run, its errors by type, and for a response that failed to parse
whose fault it was, with the bytes received (``gnn_tracking.driving.http_parse``). Exits 1 when
a call failed or Triton did.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

import otelkit
from gnn_tracking.driving.client import drive, event_pool
from gnn_tracking.driving.http_parse import keep_response_heads
from gnn_tracking.driving.options import OPTIONS, Remote
from gnn_tracking.serving.serve import triton_server
from otelkit.receiver import Receiver

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--option", type=int, default=3, choices=[1, 2, 3, 4])
    parser.add_argument("--traces-per-s", type=float, default=20.0, help="as make demo's")
    parser.add_argument("--out", type=Path, default=None, help="traces and Triton's log")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="http-load-"))
    torch.set_num_threads(1)
    keep_response_heads()
    receiver = Receiver(out / "traces", max_concurrent=32).start()
    otelkit.configure(
        service_name="gnn-tracking-http-load",
        traces_endpoint=receiver.traces_url,
        sampler="parentbased_ratelimiting",
        sampler_arg=args.traces_per_s,
        bsp_max_queue_size=65536,
    )
    server = triton_server(receiver.traces_url, log_path=out / "triton.log", trace_rate=1_000_000)
    try:
        with server:
            remote = Remote(server.http_url, "http", timeout_s=10)
            option = OPTIONS[args.option]
            events = event_pool(32, 40)
            report = drive(option, events, threads=args.threads, remote=remote, count=args.events)
            remote.close()
            failure = server.failure()
    finally:
        otelkit.shutdown()
        receiver.stop()
    calls = report.events * len(option.served)
    print(report.line())
    print(
        f"{calls} calls answered ({calls / report.seconds:.0f}/s), errors by type: "
        f"{dict(report.error_kinds) or 'none'}; Triton: {failure or 'alive'} (log: {out})"
    )
    if report.http_parse_error:
        print(f"the first response that failed to parse: {report.http_parse_error}")
    return 1 if report.errors or failure else 0


if __name__ == "__main__":
    sys.exit(main())
