"""The tritonserver launcher against the real server bundled in nvidia-pytriton, on the CPU."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

pytest.importorskip("pytriton", reason="needs nvidia-pytriton: pip install 'otelkit[pytriton]'")
grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")

from otelkit import tritonserver  # noqa: E402
from otelkit.testing import wait_until  # noqa: E402
from otelkit.tritonserver import TritonServer, TritonStartError, free_port, triton_install  # noqa: E402
from otelkit.tritonserver import _install as _triton_install  # noqa: E402
from tests.paths import MODELS  # noqa: E402
from tests.support import resent_until_joined  # noqa: E402

pytestmark = pytest.mark.triton

SERVICE_NAME = "otelkit-test-triton"


class SpanSink:
    """A minimal OTLP/HTTP receiver: keeps every POSTed JSON body."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.changed = threading.Condition()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with sink.changed:
                    sink.bodies.append(json.loads(body))
                    sink.changed.notify_all()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self, trace_id: str) -> list[dict[str, Any]]:
        """Spans of one trace, each with its resource's attributes under ``resource``."""
        found = []
        for body in self.bodies:
            for resource_spans in body.get("resourceSpans", []):
                resource = _attributes(resource_spans.get("resource", {}))
                for scope in resource_spans.get("scopeSpans", []):
                    for span in scope.get("spans", []):
                        if span["traceId"] == trace_id:
                            found.append({**span, "resource": resource})
        return found

    def wait_for(self, trace_id: str, count: int, timeout: float = 15.0) -> list[dict[str, Any]]:
        with self.changed:
            self.changed.wait_for(lambda: len(self.spans(trace_id)) >= count, timeout)
            return self.spans(trace_id)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _attributes(item: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values())) for a in item.get("attributes", [])}


@pytest.fixture(scope="module")
def sink() -> Iterator[SpanSink]:
    sink = SpanSink()
    yield sink
    sink.close()


@pytest.fixture(scope="module")
def server(sink: SpanSink) -> Iterator[TritonServer]:
    started = time.monotonic()
    with TritonServer(
        MODELS, trace_url=sink.url, trace_resource={"service.name": SERVICE_NAME}
    ) as server:
        print(f"tritonserver ready in {time.monotonic() - started:.2f} s")
        yield server


def _infer_http(
    server: TritonServer, data: npt.NDArray[np.float32], headers: dict[str, str] | None = None
) -> Any:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        return client.infer("identity_fp32", [tensor], headers=headers).as_numpy("OUTPUT0")
    finally:
        client.close()  # Triton waits for open HTTP connections when it shuts down


def _infer_grpc(
    server: TritonServer, data: npt.NDArray[np.float32], headers: dict[str, str] | None = None
) -> Any:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        return client.infer("identity_fp32", [tensor], headers=headers).as_numpy("OUTPUT0")
    finally:
        client.close()


INFER: dict[str, Callable[..., Any]] = {"http": _infer_http, "grpc": _infer_grpc}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_identity_model_answers(server: TritonServer, protocol: str) -> None:
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    output = INFER[protocol](server, data)
    assert output.dtype == np.float32
    np.testing.assert_array_equal(output, data)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_traceparent_joins_triton_spans_to_the_callers_trace(
    server: TritonServer, sink: SpanSink, protocol: str
) -> None:
    parents: list[str] = []
    sent: list[float] = []

    def call() -> str:
        trace_id, parent_id = os.urandom(16).hex(), os.urandom(8).hex()
        parents.append(parent_id)
        sent.append(time.monotonic())
        headers = {"traceparent": f"00-{trace_id}-{parent_id}-01"}
        INFER[protocol](server, np.ones((1, 2), np.float32), headers)
        return trace_id

    # over gRPC, a call whose context Triton 2.51 lost is sent again, counted; never over HTTP
    _, spans = resent_until_joined(call, sink.spans, 3, protocol)
    print(f"{protocol}: Triton's spans arrived {time.monotonic() - sent[-1]:.2f} s after the call")
    parent_id = parents[-1]
    names = {span["spanId"]: span["name"] for span in spans}
    tree = {(span["name"], names.get(span["parentSpanId"], span["parentSpanId"])) for span in spans}
    assert tree == {
        ("InferRequest", parent_id),
        ("identity_fp32", "InferRequest"),
        ("compute", "identity_fp32"),
    }
    assert {span["resource"].get("service.name") for span in spans} == {SERVICE_NAME}


def test_it_says_whether_it_traces_and_the_version_it_reported(server: TritonServer) -> None:
    with urllib.request.urlopen(f"http://{server.http_url}/v2", timeout=5) as answer:
        metadata = json.load(answer)
    assert (server.traced, server.version) == (True, metadata["version"])
    url = "http://127.0.0.1:9/v1/traces"
    assert not TritonServer(MODELS).traced
    assert not TritonServer(MODELS, trace_url=url, trace_level="OFF").traced
    # at rate 0 Triton still traces each request that carries a context
    assert TritonServer(MODELS, trace_url=url, trace_rate=0).traced
    assert TritonServer(MODELS, trace_url=url).version is None  # nothing reported before a start


def test_port_already_in_use_is_named(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = TritonServer(MODELS, http_port=port, log_path=tmp_path / "triton.log")
        with pytest.raises(TritonStartError) as info:
            server.start()
    assert info.value.reason == "port_in_use"
    assert info.value.port == port
    assert f"port {port} on 127.0.0.1 is already in use" in str(info.value)
    assert not server.running


def test_a_picked_port_taken_meanwhile_is_picked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        picks = iter([port])
        real_free_port = tritonserver.free_port
        monkeypatch.setattr(
            tritonserver, "free_port", lambda host: next(picks, None) or real_free_port(host)
        )
        server = TritonServer(MODELS, auto_complete_config=False, log_path=tmp_path / "triton.log")
        assert server.http_port == port
        with server:
            assert server.http_port != port
            np.testing.assert_array_equal(_infer_http(server, np.ones((1, 3), np.float32)), 1)


def test_model_that_fails_to_load_is_named(tmp_path: Path) -> None:
    model = tmp_path / "models" / "broken_model"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text((MODELS / "identity_fp32" / "config.pbtxt").read_text())
    (model / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        raise RuntimeError('broken on purpose')\n"
    )
    server = TritonServer(tmp_path / "models", log_path=tmp_path / "triton.log")
    with pytest.raises(TritonStartError) as info:
        server.start()
    assert info.value.reason == "model_failed"
    assert info.value.model == "broken_model"
    assert "'broken_model'" in str(info.value)
    assert "RuntimeError: broken on purpose" in str(info.value)
    assert not server.running


def test_startup_timeout_reports_the_log(tmp_path: Path) -> None:
    server = TritonServer(MODELS, startup_timeout=0, log_path=tmp_path / "triton.log")
    with pytest.raises(TritonStartError) as info:
        server.start()
    assert info.value.reason == "timeout"
    assert str(info.value).startswith("otelkit: tritonserver was not ready within 0 s")
    assert f"--- last lines of {tmp_path / 'triton.log'} ---" in str(info.value)
    assert not server.running


def test_missing_binary_or_stub_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "pytriton"
    monkeypatch.setattr(_triton_install, "locate", lambda *args, **kwargs: package)
    with pytest.raises(TritonStartError, match="tritonserver binary not found") as info:
        triton_install(cache_dir=tmp_path)
    assert info.value.reason == "not_found"

    binary = package / "tritonserver" / "bin" / "tritonserver"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    (package / "tritonserver" / "python_backend_stubs" / "3.8").mkdir(parents=True)
    with pytest.raises(
        TritonStartError, match=r"no Python-backend stub for Python 3\.\d+ \(it has 3\.8\)"
    ):
        triton_install(cache_dir=tmp_path)


def test_stop_leaves_no_process_behind(tmp_path: Path) -> None:
    server = TritonServer(MODELS, log_path=tmp_path / "triton.log")
    started = time.monotonic()
    server.start()
    ready = time.monotonic()
    group = _process_group(server.pid)
    assert len(group) >= 2  # the server and the identity model's Python stub
    server.stop()
    stopped = time.monotonic()
    print(f"start {ready - started:.2f} s, stop {stopped - ready:.2f} s")
    assert not [pid for pid in group if _alive(pid)]
    server.stop()  # idempotent
    assert "successfully unloaded 'identity_fp32'" in server.log_tail(200)


def test_a_server_that_dies_by_itself_says_how(tmp_path: Path) -> None:
    server = TritonServer(MODELS, log_path=tmp_path / "triton.log")

    def failed(timeout: float = 15.0) -> str:
        return wait_until(server.failure, timeout, "the dead server noticed")

    with server:
        assert server.failure() is None
        version = server.version
        os.kill(server.pid or 0, signal.SIGSEGV)  # what tritonserver 2.51's tracing bug does
        failure = failed()
        assert "after logging 'Signal (11) received.'" in failure, failure
        assert f"(log: {tmp_path / 'triton.log'})" in failure
        server.stop(timeout=5)
        assert server.failure() is None  # stopped on purpose: no failure
        assert version is not None and server.version == version  # which build crashed

        server.start()  # a new log: the crash above is not reported again
        assert server.failure() is None
        os.kill(server.pid or 0, signal.SIGKILL)  # the kernel's OOM killer, say
        assert failed().startswith("tritonserver was killed by signal 9 (Killed) (log: ")


def test_install_is_built_once_even_when_processes_race(tmp_path: Path) -> None:
    with ProcessPoolExecutor(4) as pool:
        backends = set(pool.map(_backend_directory, [tmp_path] * 8))
    assert len(backends) == 1
    (backend,) = backends
    assert sorted(p.name for p in (backend / "python").iterdir()) == [
        "libtriton_python.so",
        "triton_python_backend_stub",
        "triton_python_backend_utils.py",
    ]
    assert [p.name for p in backend.parent.iterdir()] == [backend.name]  # no half-built leftovers


def test_free_port_is_bindable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))


def _backend_directory(cache_dir: Path) -> Path:
    return triton_install(cache_dir=cache_dir).backend_directory


def _process_group(pgid: int | None) -> list[int]:
    assert pgid is not None
    group = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:  # field 5: pgrp
                group.append(int(entry.name))
    return group


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
