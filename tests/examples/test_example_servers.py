"""The FastAPI, gRPC and PyTriton server examples, run as a user runs them, called over real
HTTP or gRPC.

``examples/servers/fastapi_stages.py`` on uvicorn gets a request with a ``traceparent``; its
SERVER span must join that trace with the stages under it; so must ``grpc_stages.py``'s, called
by the client example ``infer_sync.py`` over gRPC. ``examples/servers/pytriton_stages.py``
is called by the client example ``infer_sync.py``: one trace from the client's job span through
Triton and PyTriton's proxy to the stages, across three processes. Each server exits 0 soon
after Ctrl-C (the gRPC and PyTriton ones after SIGTERM too), its child processes with it.
"""

from __future__ import annotations

import json
import secrets
import signal
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest

from otelkit import semconv
from otelkit.analysis import build_traces
from otelkit.receiver import Receiver
from otelkit.tritonserver import free_port
from tests.examples.scripts import (
    CLIENT_SERVICE,
    CLIENTS,
    FEATURES,
    MODEL,
    SERVERS,
    environment,
    node,
    printed_trace,
    run_script,
    serving,
    tree,
)
from tests.support import wait_for_trace

HITS = [[30, 40, 10], [-60, 80, -25], [0, -120, 40]]


@pytest.fixture(scope="module")
def fastapi_url(receiver: Receiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """fastapi_stages.py on a free port, tracing to the session's receiver."""
    port = free_port()
    with serving(
        SERVERS / "fastapi_stages.py",
        "--port",
        str(port),
        ready_url=f"http://127.0.0.1:{port}/openapi.json",
        log=tmp_path_factory.mktemp("fastapi-example") / "server.log",
        env=environment(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.traces_url),
    ):
        yield f"http://127.0.0.1:{port}"


def test_fastapi_stages_nest_under_the_server_span_in_the_callers_trace(
    fastapi_url: str, receiver: Receiver
) -> None:
    trace_id, caller_id = secrets.token_hex(16), secrets.token_hex(8)
    headers = {"content-type": "application/json", "traceparent": f"00-{trace_id}-{caller_id}-01"}
    body = json.dumps({"hits": HITS}).encode()
    request = urllib.request.Request(f"{fastapi_url}/features", data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        assert json.load(response) == {
            "features": [[0.05, 0.2952, 0.01], [0.1, 0.7048, -0.025], [0.12, -0.5, 0.04]]
        }
    trace = build_traces(wait_for_trace(receiver.out_dir, trace_id, count=3))[trace_id]
    service = "hit-features-fastapi"
    assert tree(trace) == node(
        "POST /features", service, node("cylindrical", service), node("scale", service)
    )
    (server,) = trace.roots
    assert (server.kind.name, server.parent_span_id) == ("SERVER", caller_id)
    stages = [s for s in trace.spans.values() if s is not server]
    assert {s.attributes[semconv.MODEL_NAME] for s in stages} == {MODEL}


@contextmanager
def grpc_example(
    receiver: Receiver, log: Path, stop: signal.Signals = signal.SIGINT
) -> Iterator[str]:
    """grpc_stages.py on a free port, tracing to the session's receiver: its address."""
    port = free_port()
    with serving(
        SERVERS / "grpc_stages.py",
        "--port",
        str(port),
        ready_url=f"grpc://127.0.0.1:{port}",
        log=log,
        env=environment(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.traces_url),
        stop=stop,
    ):
        yield f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def grpc_url(receiver: Receiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with grpc_example(receiver, tmp_path_factory.mktemp("grpc-example") / "server.log") as url:
        yield url


def test_grpc_stages_nest_under_the_server_span_in_the_clients_trace(
    grpc_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    env = environment(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.traces_url)
    done = run_script(CLIENTS / "infer_sync.py", "--url", grpc_url, cwd=tmp_path, env=env)
    trace_id, _ = printed_trace(done.stdout)
    assert done.stdout.startswith(f"{FEATURES}\n")
    spans = wait_for_trace(receiver.out_dir, trace_id, count=5)
    server = "hit-features-grpc"
    call = node(
        f"{semconv.RPC_METHOD_GRPC_INFER} {MODEL}",
        CLIENT_SERVICE,
        node(
            semconv.RPC_METHOD_GRPC_INFER,
            server,
            node("cylindrical", server),
            node("scale", server),
        ),
    )
    assert tree(build_traces(spans)[trace_id]) == node("reconstruct event", CLIENT_SERVICE, call)


@contextmanager
def pytriton_example(
    receiver: Receiver, log: Path, stop: signal.Signals = signal.SIGINT
) -> Iterator[str]:
    """pytriton_stages.py on free ports, Triton and otelkit tracing to the session's receiver:
    its HTTP address."""
    http, grpc, metrics = (free_port() for _ in range(3))
    ports = ("--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics))
    with serving(
        SERVERS / "pytriton_stages.py",
        *ports,
        "--traces-url",
        receiver.traces_url,
        ready_url=f"http://127.0.0.1:{http}/v2/models/{MODEL}/ready",
        log=log,
        env=environment(),
        stop=stop,
    ):
        yield f"127.0.0.1:{http}"


@pytest.fixture(scope="module")
def pytriton_url(receiver: Receiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("pytriton-example") / "server.log"
    with pytriton_example(receiver, log) as url:
        yield url


@pytest.mark.triton
def test_pytriton_stages_nest_under_proxy_inference_callable_in_the_clients_trace(
    pytriton_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    done = run_script(
        CLIENTS / "infer_sync.py",
        "--protocol",
        "http",
        "--url",
        pytriton_url,
        cwd=tmp_path,
        env=environment(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.traces_url),
    )
    trace_id, _ = printed_trace(done.stdout)
    assert done.stdout.startswith(f"{FEATURES}\n")
    spans = wait_for_trace(receiver.out_dir, trace_id, count=10)
    server = "hit-features-pytriton"  # this example's process: the proxy and the stages
    proxy = node(
        "proxy_inference_callable",
        server,
        node("pytriton-batch-decorator-span", server),
        node("cylindrical", server),
        node("scale", server),
    )
    model = node(
        MODEL,
        "pytriton",
        node("compute", "pytriton"),
        node("python_backend_execute", "pytriton", proxy),
    )
    call = node(
        f"{semconv.RPC_METHOD_HTTP_INFER} {MODEL}",
        CLIENT_SERVICE,
        node("InferRequest", "pytriton", model),
    )
    assert tree(build_traces(spans)[trace_id]) == node("reconstruct event", CLIENT_SERVICE, call)


@pytest.mark.parametrize(
    "example", [grpc_example, pytest.param(pytriton_example, marks=pytest.mark.triton)]
)
def test_an_example_server_stops_on_sigterm_as_on_ctrl_c(
    example: Callable[..., AbstractContextManager[str]], receiver: Receiver, tmp_path: Path
) -> None:
    with example(receiver, tmp_path / "server.log", stop=signal.SIGTERM):
        pass  # serving() checks the exit: 0, within EXIT_S, no process of the example left
