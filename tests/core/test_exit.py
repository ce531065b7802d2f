"""Exit is bounded and accounted: with a telemetry backend that accepts connections and never
answers (a black hole, the worst case: nothing fails fast), a SIGTERM ends the process within
``exit_timeout_s`` + 1 s, whichever thread or lock it interrupts, and the last log line counts
every span that was not sent. During the outage, every span ended is exported, dropped,
queued or in export at any scrape."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from otelkit.tritonserver import free_port

EXIT_TIMEOUT_S = 2.0
SPANS = 3000
FINAL_LINE = "otelkit: shut down; spans exported "


@pytest.fixture(scope="module")
def black_hole() -> Iterator[int]:
    """A TCP port that accepts every connection and never reads or answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    listener.close()


PROLOGUE = """
import os, sys, time, otelkit
from opentelemetry import trace
from otelkit._core.worker import LATER
otelkit.configure(service_name="exit-test", endpoint=sys.argv[1], protocol=sys.argv[2],
                  exit_timeout_s={bound}, bsp_schedule_delay_ms=50, metrics_exporter="none")
tracer = trace.get_tracer("exit-test")
for _ in range({spans}):
    tracer.start_span("work").end()
"""

#: What the main thread is doing when SIGTERM arrives.
SCENARIOS = {
    # idle, with spans queued and a batch stuck in export
    "idle": "print('ready', flush=True)\ntime.sleep(120)\n",
    # inside otelkit.flush(), which holds the worker's lock while a call's work runs
    "in a flush": (
        "LATER.add(lambda: (print('ready', flush=True), time.sleep(120)))\n"
        "LATER.drain()  # as otelkit.flush() does first, here on the main thread\n"
    ),
    # inside the worker's overflow path: the queue is full, the caller runs its own work
    "in the overflow path": (
        "LATER.limit = 0\nLATER.add(lambda: (print('ready', flush=True), time.sleep(120)))\n"
    ),
}


def run_until_sigterm(script: str, port: int, protocol: str) -> tuple[float, str]:
    """Start ``script``, SIGTERM it once it is ready; seconds until it was gone, its stderr."""
    process = subprocess.Popen(
        [sys.executable, "-c", script, f"http://127.0.0.1:{port}", protocol],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    time.sleep(0.3)  # the first batch is in export, the rest queued or dropped
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=EXIT_TIMEOUT_S + 30)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError("the process outlived SIGTERM by 30 s") from None
    took = time.monotonic() - sent
    assert process.returncode == -signal.SIGTERM, stderr
    return took, stderr


def final_counts(stderr: str) -> tuple[int, int]:
    """Spans exported and dropped, from the last log line."""
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(FINAL_LINE), stderr
    exported, dropped = last.removeprefix(FINAL_LINE).split(", dropped ")
    return int(exported), int(dropped.split(" ")[0])


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_sigterm_ends_within_the_bound_and_counts_every_span(
    black_hole: int, protocol: str, scenario: str
) -> None:
    script = PROLOGUE.format(bound=EXIT_TIMEOUT_S, spans=SPANS) + SCENARIOS[scenario]
    took, stderr = run_until_sigterm(textwrap.dedent(script), black_hole, protocol)
    assert took <= EXIT_TIMEOUT_S + 1.0, stderr
    exported, dropped = final_counts(stderr)
    assert exported == 0  # a black hole takes nothing
    assert exported + dropped == SPANS


def test_every_span_is_accounted_for_at_a_scrape_during_an_outage(black_hole: int) -> None:
    metrics_port = free_port()
    script = (
        PROLOGUE.format(bound=EXIT_TIMEOUT_S, spans=SPANS).replace(
            'metrics_exporter="none"', f"prometheus_port={metrics_port}"
        )
        + SCENARIOS["idle"]
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script, f"http://127.0.0.1:{black_hole}", "http/protobuf"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # a batch of 512 is stuck in export, the rest queued or dropped
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
    finally:
        process.kill()
        process.communicate()
    values = telemetry_values(text)
    assert values["otelkit_telemetry_spans_exporting"] > 0  # a batch stuck in export
    accounted = (
        values["otelkit_telemetry_spans_exported_total"]
        + values["otelkit_telemetry_spans_dropped_total"]
        + values["otelkit_telemetry_spans_queued"]
        + values["otelkit_telemetry_spans_exporting"]
    )
    assert accounted == SPANS, values


def telemetry_values(exposition: str) -> dict[str, float]:
    """The health metrics of one exposition, summed over their labels."""
    totals: dict[str, float] = {}
    for line in exposition.splitlines():
        if line.startswith("otelkit_telemetry_spans"):
            name = line.split("{")[0].split(" ")[0]
            totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def test_shutdown_bounds_the_exporters_too(black_hole: int, tmp_path: Path) -> None:
    """``otelkit.shutdown(timeout_s)`` called by the program, not by a signal; the program
    lives on past the export timeout, so an export abandoned at shutdown has ended by then
    (gRPC's cancelled by the closed channel, HTTP's timed out), and the count is still the
    last line."""
    prologue = PROLOGUE.format(bound=30.0, spans=SPANS).replace(
        'metrics_exporter="none"', 'metrics_exporter="none", export_timeout_ms=1000'
    )
    script = prologue + textwrap.dedent(
        """
        time.sleep(0.3)
        start = time.monotonic()
        otelkit.shutdown(timeout_s=1.5)
        print(f"took {time.monotonic() - start:.3f}", flush=True)
        time.sleep(1.5)
        """
    )
    for protocol in ("http/protobuf", "grpc"):
        done = subprocess.run(
            [sys.executable, "-c", script, f"http://127.0.0.1:{black_hole}", protocol],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        took = float(done.stdout.split("took ")[1])
        assert took <= 1.5 + 0.5, (protocol, took)
        exported, dropped = final_counts(done.stderr)
        assert exported + dropped == SPANS
