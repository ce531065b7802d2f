"""Running the example scripts of ``examples/`` as a user runs them: each in its own process.

Servers run until SIGINT (Ctrl-C) and must then exit 0; clients run to completion. Every
process imports this checkout's otelkit (``PYTHONPATH``) and exports its spans fast.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from otelkit.analysis import Span, Trace
from tests.paths import EXAMPLES, ROOT

CLIENTS = EXAMPLES / "clients"
SERVERS = EXAMPLES / "servers"
BIN = Path(sys.executable).parent
MODEL = "hit_features"  # what every example server serves
CLIENT_SERVICE = "hit-features-client"  # infer_sync.py's service.name
# What the client examples print for their event: (r / 1000, phi / pi, z / 1000) of each hit.
FEATURES = "FEATURES [[0.05, 0.2952, 0.01], [0.1, 0.7048, -0.025], [0.12, -0.5, 0.04]]"
_TRACE_LINE = re.compile(r"^trace ([0-9a-f]{32}) -> (.+)$", re.MULTILINE)

# A span tree with its order left out: (name, service.name, children sorted). Spans of one
# parent come from several processes and clocks (Triton's compute beside the model's stages),
# so their start order is not part of what an example promises.
Node = tuple[str, str, tuple["Node", ...]]


def node(name: str, service: str, *children: Node) -> Node:
    return (name, service, tuple(sorted(children)))


def tree(trace: Trace) -> Node:
    """The whole trace as a ``Node``; it must have a single root."""
    (root,) = trace.roots
    return _node(trace, root)


def _node(trace: Trace, span: Span) -> Node:
    service = str(span.resource.get("service.name"))
    return node(span.name, service, *(_node(trace, child) for child in trace.children(span)))


def printed_trace(stdout: str) -> tuple[str, str]:
    """The trace id and the destination that a client example printed."""
    (found,) = _TRACE_LINE.findall(stdout)
    trace_id, destination = found
    return str(trace_id), str(destination)


def environment(**extra: str) -> dict[str, str]:
    """This process's environment without its OpenTelemetry settings, plus ``extra``.

    Spans leave every 50 ms, so that a test sees them while the server still runs.
    """
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OTEL_", "OTELKIT_")) or key == "OTELKIT_RAISE_INTERNAL_ERRORS"
    }
    path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env.update(PYTHONPATH=os.pathsep.join(path), OTEL_BSP_SCHEDULE_DELAY="50", **extra)
    return env


def run_script(
    script: Path, *args: str, cwd: Path, env: Mapping[str, str], prefix: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` to completion (``prefix`` before the interpreter); it must exit 0."""
    command = [*prefix, sys.executable, str(script), *args]
    done = subprocess.run(
        command, cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{script.name} exited {done.returncode}:\n{done.stderr}"
    return done


@contextmanager
def serving(
    script: Path, *args: str, ready_url: str, log: Path, env: Mapping[str, str]
) -> Iterator[subprocess.Popen[bytes]]:
    """A server script running until the block ends; then Ctrl-C, and it must exit 0.

    Ready when ``ready_url`` answers 200, or, for ``grpc://host:port``, when the KServe v2
    gRPC server there says it is ready."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=log.parent,
        )
    try:
        _wait_ready(proc, ready_url, log)
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    assert code == 0, f"{script.name} exited {code} on Ctrl-C:\n{log.read_text()}"


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if url.startswith("grpc://") and _grpc_ready(url.removeprefix("grpc://")):
            return
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            pass
        assert proc.poll() is None, f"the server exited {proc.returncode}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"not ready after {timeout} s:\n{log.read_text()}"
        time.sleep(0.2)


def _grpc_ready(address: str) -> bool:
    """Whether a KServe v2 gRPC server at ``address`` says it is ready."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    try:
        with grpcclient.InferenceServerClient(address) as client:
            return bool(client.is_server_ready(client_timeout=1))
    except InferenceServerException:
        return False
