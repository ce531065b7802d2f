"""Running the example scripts of ``examples/`` as a user runs them: each in its own process.

Servers run until SIGINT (Ctrl-C) and must then exit 0 within ``EXIT_S``, their child processes
gone; clients run to completion. Every process imports this checkout's otelkit
(``PYTHONPATH``) and exports its spans fast.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from otelkit.analysis import Span, Trace
from otelkit.testing import answers, wait_until
from tests.paths import EXAMPLES, ROOT

CLIENTS = EXAMPLES / "clients"
SERVERS = EXAMPLES / "servers"
BIN = Path(sys.executable).parent
MODEL = "hit_features"  # what every example server serves
CLIENT_SERVICE = "hit-features-client"  # infer_sync.py's service.name
# What the client examples print for their event: (r / 1000, phi / pi, z / 1000) of each hit.
FEATURES = "FEATURES [[0.05, 0.2952, 0.01], [0.1, 0.7048, -0.025], [0.12, -0.5, 0.04]]"
_TRACE_LINE = re.compile(r"^trace ([0-9a-f]{32}) -> (.+)$", re.MULTILINE)
# A server's exit after Ctrl-C, its children's included. Measured here (2 cores, other
# engineers' suites running): FastAPI 0.4 s, gRPC 0.4 s, Triton's serve.py 2.9 s, PyTriton
# 4.3 s (tritonserver polls its unloading model once a second, and the Python stub's finalize
# takes 2 s); with two busy loops beside, up to 2.1, 2.3, 3.7 and 8.8 s. The examples bound
# their own exits (PyTriton's tritonserver 10 s, otelkit's exit flush 5 s): 30 s is three
# times the slowest seen, and above those bounds.
EXIT_S = 30.0

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
    script: Path,
    *args: str,
    ready_url: str,
    log: Path,
    env: Mapping[str, str],
    stop: signal.Signals = signal.SIGINT,
) -> Iterator[subprocess.Popen[bytes]]:
    """A server script running until the block ends; then ``stop`` (SIGINT: Ctrl-C) to it
    alone (not to its children, as a terminal's Ctrl-C would: the script must stop them), and
    it must exit 0 within ``EXIT_S``, leaving none of its processes behind.

    It starts with SIGINT ignored, as a script's background job (``server &``) does, where
    Python raises no KeyboardInterrupt: the examples stop on it even then, and the result does
    not depend on how pytest was started (a pytest started so passed it on, and two examples
    ran until killed).

    Ready when ``ready_url`` answers 200, or, for ``grpc://host:port``, when the KServe v2
    gRPC server there says it is ready."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", 'trap "" INT; exec "$@"', "sh", sys.executable, str(script), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=log.parent,
        )
    try:
        _wait_ready(proc, ready_url, log)
        yield proc
    finally:
        family = _descendants(proc.pid)
        proc.send_signal(stop)
        deadline = time.monotonic() + EXIT_S
        try:
            code: int | None = proc.wait(timeout=EXIT_S)
        except subprocess.TimeoutExpired:
            code = None
        # children that outlive it a moment by design (multiprocessing's resource tracker
        # ends once it reads its parent's end) have until the same deadline
        while (left := _left(family)) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in ([proc.pid] if code is None else []) + list(left):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
    sent = "Ctrl-C" if stop == signal.SIGINT else stop.name
    assert code is not None, f"{script.name} still ran {EXIT_S} s after {sent}:\n{log.read_text()}"
    assert code == 0, f"{script.name} exited {code} on {sent}:\n{log.read_text()}"
    assert not left, f"{script.name}'s processes still ran {EXIT_S} s after {sent}: {left}"


def _descendants(root: int) -> dict[int, str]:
    """The processes under ``root`` now: pid -> its command and start time (a pid the kernel
    has given to another process since reads differently)."""
    stats = {int(e.name): stat for e in Path("/proc").iterdir() if (stat := _stat(e.name))}
    found: dict[int, str] = {}
    queue = [root]
    while queue:
        parent = str(queue.pop())
        children = [pid for pid, stat in stats.items() if _fields(stat)[1] == parent]
        found.update((pid, _identity(stats[pid])) for pid in children)
        queue += children
    return found


def _left(family: dict[int, str]) -> dict[int, str]:
    """Those of ``family`` still running: the same process (not a pid given to another since),
    and not a zombie."""
    running = {}
    for pid, identity in family.items():
        stat = _stat(str(pid))
        if stat is not None and _identity(stat) == identity and _fields(stat)[0] != "Z":
            running[pid] = identity
    return running


def _identity(stat: str) -> str:
    return f"{stat.rsplit(')', 1)[0]}) {_fields(stat)[19]}"  # the start time: field 22


def _fields(stat: str) -> list[str]:
    """``/proc/<pid>/stat`` from its third field (state, ppid, ...): the command before them,
    in parentheses, may hold spaces and parentheses."""
    return stat.rsplit(")", 1)[1].split()


def _stat(pid: str) -> str | None:
    if not pid.isdigit():
        return None
    try:
        return Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float = 120) -> None:
    def ready() -> bool:
        assert proc.poll() is None, f"the server exited {proc.returncode}:\n{log.read_text()}"
        if url.startswith("grpc://"):
            return _grpc_ready(url.removeprefix("grpc://"))
        return answers(url)()

    wait_until(ready, timeout, f"the server at {url} ready", interval=0.2, explain=log.read_text)


def _grpc_ready(address: str) -> bool:
    """Whether a KServe v2 gRPC server at ``address`` says it is ready."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    try:
        with grpcclient.InferenceServerClient(address) as client:
            return bool(client.is_server_ready(client_timeout=1))
    except InferenceServerException:
        return False
