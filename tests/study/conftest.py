"""Fixtures of the study tests: synthetic points, a server with a contended stage, and one
study on a Triton that otelkit launches (its points serve several tests)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from otelkit.analysis._breakdown import TOTAL
from otelkit.study import Load, Point, Remote, Study, StudyResults, Tracing, Triton
from otelkit.study._counters import ModelFigures
from otelkit.study._point import LatencyHistogram
from otelkit.study._traces import ComponentStat, PointTraces
from otelkit.testing import answers, wait_until
from otelkit.tritonserver import TritonServer, free_port
from tests.paths import MODELS, ROOT, TESTS

STUDY_MODELS = TESTS / "study" / "models"


def make_point(
    params: Mapping[str, Any],
    throughput: float,
    components: Mapping[str, float] | None = None,
    *,
    index: int = 0,
    stage_models: Mapping[str, str] | None = None,
    triton: Mapping[str, ModelFigures] | None = None,
    latency_ms: float = 10.0,
    calls: float = 1.0,
) -> Point:
    """A measured point over 10 s: its throughput, and ms per request of each component."""
    histogram = LatencyHistogram()
    histogram.add_many([latency_ms / 1e3] * 100)
    point = Point(
        index,
        dict(params),
        requests=round(throughput * 10),
        seconds=10.0,
        histogram=histogram,
        triton=dict(triton or {}),
        batch_size=int(params.get("batch_size", 1)),
    )
    if components is not None:
        stats = {name: ComponentStat(ms, ms * 1.2) for name, ms in components.items()}
        stats[TOTAL] = ComponentStat(sum(components.values()), sum(components.values()) * 1.2)
        point.traces = PointTraces(
            traces=50,
            components=stats,
            calls_per_request=calls,
            stage_models=dict(stage_models or {}),
        )
    return point


def figures(
    compute_ms: float,
    queue_ms: float = 0.1,
    *,
    requests: int = 1000,
    per_execution: float = 1.0,
    instances: int | None = None,
    ensemble: bool = False,
) -> ModelFigures:
    """Triton's figures of one model over a point."""
    executions = round(requests / per_execution)
    return ModelFigures(
        requests=requests,
        failures=0,
        inferences=requests,
        executions=executions,
        queue_ms=queue_ms,
        compute_input_ms=0.0,
        compute_infer_ms=compute_ms,
        compute_output_ms=0.0,
        request_ms=queue_ms + compute_ms,
        pending=0.0,
        instances=instances,
        ensemble=ensemble,
    )


@dataclass(frozen=True)
class ContendedServer:
    """The contended model server (tests/study/contended_app.py) and the receiver port its
    spans go to: a study's ``Tracing(port=...)``."""

    url: str
    receiver_port: int


@contextlib.contextmanager
def kserve_app(module: str, log: Path, env: Mapping[str, str] | None = None) -> Iterator[str]:
    """``python -m module --port P`` (a KServe v2 app of the tests) until the block ends: its
    ``127.0.0.1:P`` once it answers ready."""
    port = free_port()
    environ = dict(os.environ, **(env or {}))
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "examples"), *sys.path])
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environ,
        )
    try:
        ready = answers(f"http://127.0.0.1:{port}/v2/health/ready", proc)
        wait_until(ready, 60, f"{module} started", interval=0.1, explain=log.read_text)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(15)


@pytest.fixture(scope="module")
def contended_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContendedServer]:
    receiver_port = free_port()
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{receiver_port}/v1/traces",
        "OTEL_TRACES_SAMPLER": "parentbased_always_off",  # the client's sampled share only
    }
    log = tmp_path_factory.mktemp("contended") / "server.log"
    with kserve_app("tests.study.contended_app", log, env) as url:
        yield ContendedServer(url, receiver_port)


@pytest.fixture(scope="session")
def untraced_triton() -> Iterator[TritonServer]:
    """A Triton on tests/models that traces nothing: the studies here load it with thousands of
    requests a second, which would crash the session's traced Triton (tritonserver 2.51's
    tracer, docs/known-issues.md) under every other test."""
    with TritonServer(MODELS) as server:
        yield server


@pytest.fixture(scope="session")
def fixed_study(tmp_path_factory: pytest.TempPathFactory) -> StudyResults:
    """``fixed_fp32`` (a 10 ms stage, no batching) on a Triton the study launches, at 1 and 2
    instances × 1 and 4 requests in flight, traced: saturation and the instance sweep."""
    out = tmp_path_factory.mktemp("fixed-study") / "study.jsonl"
    study = Study(
        model="fixed_fp32",
        server=Triton(STUDY_MODELS),
        load=Load(seconds=2.0, warmup_s=0.5),
        sweep={"instances": [1, 2], "concurrency": [1, 4]},
        tracing=Tracing(per_second=20),
        out=out,
        tolerance=0.2,  # ±20 %: this machine's 2 cores are shared with Triton and the client
        progress=False,
    )
    return study.run()


def remote(server: TritonServer, protocol: str = "http") -> Remote:
    """A running Triton as a server the study does not launch."""
    url = server.http_url if protocol == "http" else server.grpc_url
    return Remote(url, metrics_url=server.metrics_url)


__all__ = [
    "STUDY_MODELS",
    "ContendedServer",
    "figures",
    "kserve_app",
    "make_point",
    "remote",
]


def points_written(path: Path) -> int:
    """The point records of a results file, not counting a line still being written."""
    lines = path.read_text().split("\n")[:-1]
    return sum(json.loads(line)["record"] == "point" for line in lines)


def answered(http_url: str, model: str) -> int:
    """The requests of ``model`` that tritonserver has answered so far."""
    url = f"http://{http_url}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=10) as response:
        (stats,) = json.load(response)["model_stats"]
    return int(stats["inference_stats"]["success"]["count"])
