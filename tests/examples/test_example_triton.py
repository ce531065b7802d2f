"""The Triton Python-backend example, and the client examples against it, run as a user runs them.

``examples/servers/triton_backend/serve.py`` serves the example's model repository with the
bundled tritonserver, traced to the session's receiver; each client script runs in its own
process. A trace is checked whole: the job's span, the CLIENT span, Triton's ``InferRequest →
hit_features → compute`` and the model's three stages, in one trace across three processes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from otelkit import semconv
from otelkit.analysis import build_traces, load_spans
from otelkit.receiver import Receiver
from otelkit.tritonserver import free_port
from tests.examples.scripts import (
    BIN,
    CLIENT_SERVICE,
    CLIENTS,
    FEATURES,
    MODEL,
    SERVERS,
    Node,
    environment,
    node,
    printed_trace,
    run_script,
    serving,
    tree,
)
from tests.support import joined_trace, wait_for_trace

pytestmark = pytest.mark.triton
MODEL_SERVICE = "hit-features-model"  # set by serve.py for the model's stage spans
METHODS = {"http": semconv.RPC_METHOD_HTTP_INFER, "grpc": semconv.RPC_METHOD_GRPC_INFER}
SPANS_PER_CALL = 7  # CLIENT, InferRequest, hit_features, compute, decode, cylindrical, scale


@dataclass(frozen=True)
class Served:
    http_url: str
    grpc_url: str


@pytest.fixture(scope="module")
def triton_example(
    receiver: Receiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """serve.py on free ports, tracing to the session's receiver."""
    http, grpc, metrics = (free_port() for _ in range(3))
    ports = ("--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics))
    with serving(
        SERVERS / "triton_backend" / "serve.py",
        *ports,
        "--traces-url",
        receiver.traces_url,
        ready_url=f"http://127.0.0.1:{http}/v2/models/{MODEL}/ready",
        log=tmp_path_factory.mktemp("triton-example") / "serve.log",
        env=environment(),
    ):
        yield Served(f"127.0.0.1:{http}", f"127.0.0.1:{grpc}")


def call_tree(protocol: str, client: str) -> Node:
    """A call's CLIENT span and what it caused in Triton and in the model."""
    stages = (node(stage, MODEL_SERVICE) for stage in ("decode", "cylindrical", "scale"))
    model = node(MODEL, "triton", node("compute", "triton"), *stages)
    return node(f"{METHODS[protocol]} {MODEL}", client, node("InferRequest", "triton", model))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sync_client_traces_from_its_job_span_to_the_models_stages(
    protocol: str, triton_example: Served, receiver: Receiver, tmp_path: Path
) -> None:
    url = triton_example.http_url if protocol == "http" else triton_example.grpc_url
    env = environment(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.traces_url)
    printed: list[str] = []

    def call() -> str:  # a whole run again if Triton 2.51 lost the gRPC context (joined_trace)
        done = run_script(
            CLIENTS / "infer_sync.py", "--protocol", protocol, "--url", url, cwd=tmp_path, env=env
        )
        printed.append(done.stdout)
        return printed_trace(done.stdout)[0]

    trace_id, spans = joined_trace(
        call, receiver.out_dir, count=1 + SPANS_PER_CALL, protocol=protocol
    )
    destination = f"OTLP/HTTP (protobuf) {receiver.traces_url}"
    assert printed[-1] == f"{FEATURES}\ntrace {trace_id} -> {destination}\n"
    assert tree(build_traces(spans)[trace_id]) == node(
        "reconstruct event", CLIENT_SERVICE, call_tree(protocol, CLIENT_SERVICE)
    )


def test_sync_client_without_an_endpoint_writes_its_spans_to_files(
    triton_example: Served, receiver: Receiver, tmp_path: Path
) -> None:
    done = run_script(
        CLIENTS / "infer_sync.py",
        "--protocol",
        "http",
        "--url",
        triton_example.http_url,
        cwd=tmp_path,
        env=environment(),
    )
    trace_id, destination = printed_trace(done.stdout)
    (written,) = (tmp_path / "otelkit-traces").glob("*.jsonl")
    assert destination == f"OTLP-JSON lines in {written}"
    client_side = load_spans(written)  # flushed when the script exited
    assert sorted((s.trace_id, s.name) for s in client_side) == [
        (trace_id, "reconstruct event"),
        (trace_id, f"{METHODS['http']} {MODEL}"),
    ]
    server_side = wait_for_trace(receiver.out_dir, trace_id, count=SPANS_PER_CALL - 1)
    assert tree(build_traces([*client_side, *server_side])[trace_id]) == node(
        "reconstruct event", CLIENT_SERVICE, call_tree("http", CLIENT_SERVICE)
    )


def test_asyncio_client_concurrent_calls_share_the_jobs_trace(
    triton_example: Served, receiver: Receiver, tmp_path: Path
) -> None:
    env = environment(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.traces_url)
    printed: list[str] = []

    def call() -> str:
        done = run_script(
            CLIENTS / "infer_asyncio.py",
            "--url",
            triton_example.grpc_url,
            "--events",
            "3",
            cwd=tmp_path,
            env=env,
        )
        printed.append(done.stdout)
        return printed_trace(done.stdout)[0]

    trace_id, spans = joined_trace(
        call, receiver.out_dir, count=1 + 3 * SPANS_PER_CALL, protocol="grpc"
    )
    destination = f"OTLP/HTTP (protobuf) {receiver.traces_url}"
    assert printed[-1].splitlines() == [
        "event 0 FEATURES [[0.05, 0.2952, 0.01], [0.1, 0.7048, -0.025], [0.12, -0.5, 0.04]]",
        "event 1 FEATURES [[0.1, 0.2952, 0.02], [0.2, 0.7048, -0.05], [0.24, -0.5, 0.08]]",
        "event 2 FEATURES [[0.15, 0.2952, 0.03], [0.3, 0.7048, -0.075], [0.36, -0.5, 0.12]]",
        f"trace {trace_id} -> {destination}",
    ]
    service = "hit-features-aio-client"
    assert tree(build_traces(spans)[trace_id]) == node(
        "reconstruct events", service, *[call_tree("grpc", service)] * 3
    )


def test_unmodified_script_is_traced_by_opentelemetry_instrument(
    triton_example: Served, receiver: Receiver, tmp_path: Path
) -> None:
    script, url = CLIENTS / "plain_client.py", ("--url", triton_example.http_url)
    plain = run_script(script, *url, cwd=tmp_path, env=environment())
    service = f"plain-client-{uuid.uuid4().hex[:8]}"
    env = environment(
        OTEL_SERVICE_NAME=service, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.traces_url
    )
    traced = run_script(
        script, *url, cwd=tmp_path, env=env, prefix=[str(BIN / "opentelemetry-instrument")]
    )
    assert (traced.stdout, traced.stderr) == (plain.stdout, plain.stderr) == (f"{FEATURES}\n", "")
    (call,) = [s for s in load_spans(receiver.out_dir) if s.resource.get("service.name") == service]
    assert (call.kind.name, call.parent_span_id) == ("CLIENT", None)
    spans = wait_for_trace(receiver.out_dir, call.trace_id, count=SPANS_PER_CALL)
    assert tree(build_traces(spans)[call.trace_id]) == call_tree("http", service)
