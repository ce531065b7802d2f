"""GPU-timed stage spans are ended by a worker once their CUDA events are read: ``flush`` waits
for them, and ``shutdown`` counts the ones it could not wait for as dropped.

CUDA cannot run on these machines, so ``torch`` is replaced, for these tests only, by a stand-in
whose events the test completes by hand: ``synchronize`` blocks until the test releases it, as
a real event blocks until the GPU reaches it. The same code then runs with real CUDA in
``tests/server/test_server_stages.py``'s GPU test.
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import otelkit
from otelkit.analysis import load_spans
from otelkit.gpu import _cuda_events as cuda_events


class GpuStandIn:
    """``torch`` as ``otelkit.gpu._cuda_events`` uses it; events wait for ``gate``."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        gate = self.gate

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                pass

            def record(self) -> None:
                pass

            def synchronize(self) -> None:
                gate.wait()

            def elapsed_time(self, end: object) -> float:
                return 2.5  # milliseconds, as torch reports them

        self.cuda = types.SimpleNamespace(
            Event=Event,
            is_available=lambda: True,
            is_initialized=lambda: True,
            memory_allocated=lambda: 0,
        )


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[GpuStandIn]:
    stand_in = GpuStandIn()
    monkeypatch.setitem(sys.modules, "torch", stand_in)
    yield stand_in
    stand_in.gate.set()  # never leave the worker blocked for the next test
    otelkit.shutdown()


def run_stages(count: int) -> None:
    @otelkit.stage("gnn", model="tracking", gpu=True)
    def gnn() -> None:
        pass

    for _ in range(count):
        gnn()


def test_flush_waits_for_gpu_timed_spans(gpu: GpuStandIn, tmp_path: Path) -> None:
    otelkit.configure(service_name="cuda-exit", traces_dir=str(tmp_path), sampler="always_on")
    run_stages(5)
    assert otelkit.flush(timeout_s=0.3) is False  # the events have not completed
    assert load_spans(tmp_path) == []
    threading.Timer(0.2, gpu.gate.set).start()
    assert otelkit.flush(timeout_s=10) is True
    spans = load_spans(tmp_path)
    assert [(s.name, s.attributes["otelkit.stage.gpu_s"]) for s in spans] == [("gnn", 0.0025)] * 5


def test_shutdown_counts_gpu_timed_spans_it_cannot_wait_for(
    gpu: GpuStandIn, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    telemetry = otelkit.configure(
        service_name="cuda-exit", traces_dir=str(tmp_path), sampler="always_on"
    )
    run_stages(3)
    otelkit.shutdown(timeout_s=0.3)
    assert telemetry.stats()["dropped_shutdown"] == 3
    assert "dropped 3 (shutdown: 3)" in caplog.text
    gpu.gate.set()  # the events complete after all: the spans are not ended, nor counted again
    assert cuda_events.wait_idle(5.0)
    assert telemetry.stats()["dropped_shutdown"] == 3
    assert load_spans(tmp_path) == []
