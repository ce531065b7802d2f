"""README's first trace runs as it reads: its four commands, as a newcomer types them.

The commands are read from README.md itself (the block under "A first trace"), so the page
cannot drift from what is tested, and run unchanged: on the default ports (the receiver's 4318,
PyTriton's 8000, 8001 and 8002), which must be free; a taken one fails the test, naming it.
A command ending in ``&`` starts in a session of its own; the test waits where a reader waits
(the receiver listening, the model ready), runs the client and ``otelkit breakdown``, then the
block under "A study and a report", and stops every process it started, whatever happened.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from otelkit.testing import answers, wait_until
from tests.docs.test_docs import LINKED_DIRS, README, block_environment, code_blocks
from tests.paths import ROOT
from tests.support import wait_for_trace

PORTS = (4318, 8000, 8001, 8002)  # the receiver's and PyTriton's defaults
RECEIVER = ("127.0.0.1", 4318)
MODEL_READY = "http://127.0.0.1:8000/v2/models/hit_features/ready"
READY_TIMEOUT_S = 120  # PyTriton on two loaded cores
COMMAND_TIMEOUT_S = 120
# The trace: the job's span, the client's, Triton's InferRequest, the model, compute,
# python_backend_execute, PyTriton's proxy and batch decorator, the stages cylindrical and scale.
TRACE_SPANS = 10
PARTS = [
    "client serialize",
    "connection set-up",  # the client process's first call opens its connection
    "network + client wait",
    "server receive",  # Triton's HTTP_RECV events, before its span
    "server frontend",
    "server queue",
    "server scheduler",
    "server compute input",
    "server cylindrical",
    "server scale",
    "server hit_features hand-off",  # Triton's Python backend to PyTriton's proxy model
    "server proxy hand-off",  # the proxy model to the callable's process and back
    "server callable overhead",
    "server batch decorator",
    "server compute output",
    "server send",  # Triton's HTTP_SEND events
    "server other",
    "client deserialize",
    "client other",
]
_ROW = re.compile(r"^\s+(?P<part>\S.*?)\s{2,}\d+\.\d+ ms\s+(?P<share>-?\d+\.\d+) %$")
_TRACE_LINE = re.compile(r"^trace ([0-9a-f]{32}) -> ", re.MULTILINE)


@dataclass(frozen=True)
class Command:
    """One shell command of a README block; ``background`` when it ends with ``&``."""

    line: str
    background: bool


def commands(heading: str) -> list[Command]:
    """The commands of the first bash block under ``heading`` of README.md, as bash reads them:
    continued lines joined, comments dropped."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    line = text.count("\n", 0, start) + 2
    block = next(b for b in code_blocks(README) if b.line > line and b.language == "bash")
    found = []
    for logical in block.code.replace("\\\n", " ").splitlines():
        words = shlex.split(logical, comments=True)
        if words:
            background = words[-1] == "&"
            found.append(Command(shlex.join(words[:-1] if background else words), background))
    return found


def test_the_first_trace_is_four_commands_two_of_them_servers() -> None:
    first = commands("A first trace, on this machine")
    assert [(c.line.split()[:2], c.background) for c in first] == [
        (["otelkit", "receive"], True),
        (["python", "examples/servers/pytriton_stages.py"], True),
        (["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4318/v1/traces", "python"], False),
        (["otelkit", "breakdown"], False),
    ]
    assert [c.line.split()[:3] for c in commands("A study and a report")] == [
        ["otelkit", "study", "run"],
        ["otelkit", "report", "--study"],
    ]


@pytest.mark.triton
@pytest.mark.timeout(400)
def test_the_first_trace_runs_as_written(tmp_path: Path) -> None:
    wait_until(  # a server of an earlier test may still be exiting
        lambda: all(map(_free, PORTS)),
        30,
        "README's first trace runs on the default ports: all of them free",
        interval=0.5,
        explain=lambda: f"taken: {[port for port in PORTS if not _free(port)]}",
    )
    for name in LINKED_DIRS:
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    receive, serve, client, breakdown = commands("A first trace, on this machine")
    with _background(receive, tmp_path) as receiving, _background(serve, tmp_path) as serving:
        servers = [receiving, serving]
        for ready, what in [
            (lambda: _listening(RECEIVER), "the receiver"),
            (answers(MODEL_READY), "PyTriton's model"),
        ]:
            check = _while_serving(ready, servers, tmp_path)
            wait_until(check, READY_TIMEOUT_S, what, interval=0.2, explain=lambda: _logs(tmp_path))
        called = _run(client, tmp_path)
        (trace_id,) = _TRACE_LINE.findall(called)
        assert called.startswith("FEATURES [[0.05, 0.2952, 0.01], "), called
        spans = wait_for_trace(tmp_path / "traces", trace_id, count=TRACE_SPANS, timeout=30)
        assert len(spans) == TRACE_SPANS, sorted(s.name for s in spans)

        table = _run(breakdown, tmp_path).splitlines()
        assert table[0].startswith("all traces: 1 traces, mean "), table
        rows = {m["part"]: float(m["share"]) for m in map(_ROW.match, table) if m}
        assert list(rows) == PARTS, table
        # no unexplained time: each between two timestamps the trace recorded
        assert rows["server other"] <= 5 and rows["client other"] <= 5, table
        assert not [line for line in table if "unexplained" in line], table
        assert re.match(r"^\s+slowest stage: server (cylindrical|scale), ", table[-2]), table
        # how the traces were chosen, as the processes' resources say: every one, by default
        assert table[-1].startswith(
            "sampling: head sampling in the services (parentbased_always_on "
            "(hit-features-client, hit-features-pytriton)): "
        ), table

        study, report = commands("A study and a report")
        assert "verdict [all]" in _run(study, tmp_path)
        written = re.search(r", (\d+) traces, ", _run(report, tmp_path))
        assert written and int(written.group(1)) > 0, "the study's traces, found from its results"
        assert (tmp_path / "report.html").stat().st_size > 100_000


def _run(command: Command, cwd: Path) -> str:
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", command.line],
        cwd=cwd,
        env=block_environment(),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    assert done.returncode == 0, f"{command.line} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


@contextmanager
def _background(command: Command, cwd: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``command`` running as with ``&`` until the block ends; then Ctrl-C to its session,
    and SIGKILL to what is left of it after 30 s."""
    name = Path(command.line.split()[1]).stem
    with (cwd / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(
            ["bash", "-c", command.line],
            cwd=cwd,
            env=block_environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        _signal(proc.pid, signal.SIGINT)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        _signal(proc.pid, signal.SIGKILL)  # children that outlived it (tritonserver, stubs)
        proc.wait(timeout=10)


def _signal(group: int, signum: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(group, signum)


def _logs(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text(errors="replace")[-3000:] for p in folder.glob("*.log")}


def _while_serving(
    ready: Callable[[], bool], servers: list[subprocess.Popen[bytes]], logs: Path
) -> Callable[[], bool]:
    """``ready``, failing the test at once, with the logs, when a server has exited."""

    def check() -> bool:
        exited = [proc.args for proc in servers if proc.poll() is not None]
        if exited:
            pytest.fail(f"{exited} exited: {_logs(logs)}")
        return ready()

    return check


def _free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _listening(address: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(address, timeout=1):
            return True
    except OSError:
        return False
