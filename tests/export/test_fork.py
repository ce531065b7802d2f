"""A forked child exports its own spans over OTLP, with a client of its own: OTLP/HTTP to the
embedded receiver and OTLP/gRPC to a real gRPC trace service, each a real server."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter

from otelkit.testing import ReceiverCapture
from tests.export.test_exporters import GrpcTraceSink, serving

SCRIPT = textwrap.dedent(
    """
    import multiprocessing, os, sys, otelkit
    from opentelemetry import trace
    otelkit.configure(service_name="forking", endpoint=sys.argv[1], protocol=sys.argv[2],
                      bsp_schedule_delay_ms=50, metrics_exporter="none")
    tracer = trace.get_tracer("fork-test")
    tracer.start_span("parent-before-fork").end()
    otelkit.flush()  # the parent's client is connected when the children are forked

    def child():
        for _ in range(10):
            tracer.start_span(f"child-{os.getpid()}").end()

    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=child) for _ in range(2)]
    for worker in workers: worker.start()
    for worker in workers: worker.join()
    tracer.start_span("parent-after-fork").end()
    otelkit.shutdown()
    codes = ",".join(str(w.exitcode) for w in workers)
    print(",".join(str(w.pid) for w in workers), f"[{codes}]", flush=True)
    """
)


def run(endpoint: str, protocol: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, endpoint, protocol],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    pids, exit_codes = done.stdout.split()
    assert exit_codes == "[0,0]", done.stderr
    return pids.split(",")


def expected(pids: list[str]) -> Counter[str]:
    names = Counter({"parent-before-fork": 1, "parent-after-fork": 1})
    names.update({f"child-{pid}": 10 for pid in pids})
    return names


def test_forked_children_export_over_otlp_http(otelkit_receiver: ReceiverCapture) -> None:
    pids = run(otelkit_receiver.endpoint, "http/protobuf")
    # every child flushed before it exited, and the receiver stores a request before answering
    spans = [s for s in otelkit_receiver.spans() if s.resource.get("service.name") == "forking"]
    assert Counter(s.name for s in spans) == expected(pids)
    by_pid = {(s.name, s.resource.get("process.pid")) for s in spans}
    assert {(f"child-{pid}", int(pid)) for pid in pids} <= by_pid  # each child's own resource


def test_forked_children_export_over_otlp_grpc() -> None:
    sink = GrpcTraceSink()
    with serving(sink) as (port, _):
        pids = run(f"http://127.0.0.1:{port}", "grpc")
    assert Counter(sink.span_names()) == expected(pids)
