"""``opentelemetry-instrument python script.py``: an unmodified tritonclient script, traced.

Each script runs in a subprocess, as a user runs it: ``opentelemetry-instrument`` loads otelkit's
distro and instrumentor through their entry points before the script's first line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import uuid
import venv
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from otelkit import ConfigError
from otelkit._config import resolve
from otelkit.analysis import Span
from otelkit.auto import TritonClientInstrumentor
from otelkit.testing import ReceiverCapture
from otelkit.tritonserver import TritonServer
from tests.client.test_client import expected_tree, shape
from tests.client.test_traced_load import marker_call

BIN = Path(sys.executable).parent
CALLS = 3

# Plain tritonclient: nothing here knows about OpenTelemetry or otelkit.
CLIENT_SCRIPT = """
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

protocol, url = sys.argv[1], sys.argv[2]
module = httpclient if protocol == "http" else grpcclient
data = np.arange(8, dtype=np.float32).reshape(2, 4)
with module.InferenceServerClient(url) as client:
    for _ in range(int(sys.argv[3])):
        tensor = module.InferInput("INPUT0", [2, 4], "FP32")
        tensor.set_data_from_numpy(data)
        print(client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0").tolist())
"""


# The same with the asyncio HTTP client, whose transport is aiohttp: OpenTelemetry's aiohttp
# instrumentation (installed beside aiohttp by opentelemetry-bootstrap) is loaded with it.
AIO_SCRIPT = """
import asyncio
import sys

import numpy as np
import tritonclient.http.aio as aioclient


async def main(url: str, calls: int) -> None:
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    client = aioclient.InferenceServerClient(url)
    try:
        for _ in range(calls):
            tensor = aioclient.InferInput("INPUT0", [2, 4], "FP32")
            tensor.set_data_from_numpy(data)
            print((await client.infer("identity_fp32", [tensor])).as_numpy("OUTPUT0").tolist())
    finally:
        await client.close()


asyncio.run(main(sys.argv[2], int(sys.argv[3])))
"""
SESSION_HOOKS = """
import asyncio, aiohttp
async def main():
    async with aiohttp.ClientSession() as session:
        configs = session._trace_configs
        print([getattr(c, "_is_instrumented_by_opentelemetry", False) for c in configs])
asyncio.run(main())
"""


def run(command: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``command`` to completion; it must exit 0."""
    done = subprocess.run(
        command, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done


def instrumented(python: Path, script: Path, *args: str) -> list[str]:
    return [str(BIN / "opentelemetry-instrument"), str(python), str(script), *args]


def traces_of(
    captured: ReceiverCapture, trace_ids: set[str], triton: TritonServer
) -> dict[str, list[Span]]:
    """The spans of each trace, once Triton's spans of a marker call after them are in: Triton
    exports in the order its requests end, and a trace whose context it lost stays short."""
    marker = marker_call(triton)
    captured.wait_for_spans(
        lambda s: s.trace_id == marker and s.name == "InferRequest", what="the marker call"
    )
    traces: dict[str, list[Span]] = {trace_id: [] for trace_id in trace_ids}
    for span in captured.spans():
        if span.trace_id in traces:
            traces[span.trace_id].append(span)
    return traces


# OpenTelemetry's gRPC instrumentation (opentelemetry-bootstrap installs it beside grpcio):
# loaded by opentelemetry-instrument unless disabled by name.
CONTRIB_GRPC = "grpc_client,grpc_aio_client,grpc_server,grpc_aio_server"
CHANNEL_MODULE = "import grpc; print(type(grpc.insecure_channel('127.0.0.1:1')).__module__)"


@pytest.mark.triton
@pytest.mark.parametrize(
    ("client", "contrib_grpc"),
    [("http", False), ("grpc", False), ("grpc", True), ("http.aio", False)],
)
def test_unmodified_script_gives_the_same_trace_as_instrument(
    client: str,
    contrib_grpc: bool,
    triton: TritonServer,
    otelkit_receiver: ReceiverCapture,
    tmp_path: Path,
) -> None:
    """The same trace with and without OpenTelemetry's gRPC instrumentation loaded beside
    otelkit's: its interceptor on tritonclient's channel adds no span and no context; and with
    its aiohttp instrumentation, whose hooks are on the asyncio HTTP client's session."""
    disabled = {} if contrib_grpc else {"OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": CONTRIB_GRPC}
    channel = run(
        instrumented(Path(sys.executable), Path("-c"), CHANNEL_MODULE),
        tmp_path,
        OTEL_TRACES_EXPORTER="none",
        **disabled,
    )
    intercepted = "opentelemetry.instrumentation.grpc.grpcext._interceptor"
    assert channel.stdout.strip() == (intercepted if contrib_grpc else "grpc._channel")
    protocol = client.removesuffix(".aio")
    script = tmp_path / "client.py"
    script.write_text(AIO_SCRIPT if client == "http.aio" else CLIENT_SCRIPT)
    if client == "http.aio":  # OpenTelemetry's trace config is on every session
        hooks = run(
            instrumented(Path(sys.executable), Path("-c"), SESSION_HOOKS),
            tmp_path,
            OTEL_TRACES_EXPORTER="none",
        )
        assert hooks.stdout.strip() == "[True]"
    url = triton.http_url if protocol == "http" else triton.grpc_url
    service = f"auto-{protocol}-{uuid.uuid4().hex[:8]}"
    plain = run([sys.executable, str(script), protocol, url, str(CALLS)], tmp_path)
    traced = run(
        instrumented(Path(sys.executable), script, protocol, url, str(CALLS)),
        tmp_path,
        **disabled,
        OTEL_SERVICE_NAME=service,
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=otelkit_receiver.traces_url,
        OTEL_METRICS_EXPORTER="none",
        # Nothing is exported on a schedule: spans that arrive were flushed at exit.
        OTEL_BSP_SCHEDULE_DELAY="600000",
    )
    assert (traced.stdout, traced.stderr) == (plain.stdout, plain.stderr)
    assert plain.stdout == f"{[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]}\n" * CALLS

    # the script's spans were flushed at its exit, and the receiver stores before it answers
    ours = [s for s in otelkit_receiver.spans() if s.resource.get("service.name") == service]
    assert [(s.kind.name, s.parent_span_id) for s in ours] == [("CLIENT", None)] * CALLS
    tree = [
        (depth - 1, name, service if owner == "client-tests" else owner)
        for depth, name, owner in expected_tree(protocol)[1:]
    ]
    traces = traces_of(otelkit_receiver, {s.trace_id for s in ours}, triton)
    assert len(traces) == CALLS
    shapes = [shape(spans, trace_id) for trace_id, spans in traces.items()]
    # Triton 2.51 drops the traceparent of about 2-3 % of gRPC requests (see joined_trace in
    # conftest): such a request's Triton spans start a trace of their own, leaving otelkit's
    # span alone in its trace. A subprocess cannot resend one call, so over CALLS calls at
    # least one joins; over HTTP, every one does.
    joined = [s for s in shapes if s == tree]
    assert all(s == tree or (protocol == "grpc" and s == tree[:1]) for s in shapes), shapes
    assert len(joined) >= 1


def test_instrumentor_wraps_and_restores_every_client_class() -> None:
    classes = (httpclient.InferenceServerClient, grpcclient.InferenceServerClient)
    originals = [cls.__dict__["infer"] for cls in classes]
    instrumentor = TritonClientInstrumentor()
    instrumentor.instrument()
    try:
        assert [
            cls.__dict__["infer"] is not original
            for cls, original in zip(classes, originals, strict=True)
        ] == [True, True]
    finally:
        instrumentor.uninstrument()
    assert [cls.__dict__["infer"] for cls in classes] == originals


def test_bad_configuration_is_logged_and_the_script_runs(tmp_path: Path) -> None:
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    with pytest.raises(ConfigError) as caught:
        resolve({}, environ={"OTEL_TRACES_SAMPLER": "bogus"})
    done = run(instrumented(Path(sys.executable), script), tmp_path, OTEL_TRACES_SAMPLER="bogus")
    assert (done.stdout, done.stderr) == ("hello\n", f"{caught.value}; the script runs untraced\n")


def test_without_tritonclient_the_instrumentor_is_skipped(tmp_path: Path) -> None:
    """A Python with every package of this one except tritonclient: nothing to instrument."""
    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    site = Path(sysconfig.get_paths()["purelib"])
    target = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    for entry in site.iterdir():
        if not entry.name.startswith("tritonclient"):
            (target / entry.name).symlink_to(entry)
    script = tmp_path / "check.py"
    script.write_text(
        "import importlib.util\n"
        "import otelkit.telemetry\n"
        "print(importlib.util.find_spec('tritonclient'), otelkit.telemetry.current() is not None)\n"
    )
    done = run(instrumented(python, script), tmp_path, OTELKIT_TRACES_DIR=str(tmp_path / "traces"))
    assert (done.stdout, done.stderr) == ("None True\n", "")
