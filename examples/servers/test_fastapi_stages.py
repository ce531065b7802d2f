"""Testing an app's own stages with ``otelkit.testing``: the tests a user writes for
``fastapi_stages.py``. From the repository root (``conftest.py`` here loads the fixtures):

    python -m pytest examples/servers/test_fastapi_stages.py

In this process, ``otelkit_spans`` keeps the spans and stage metrics in memory; across
processes, the server runs on its own and exports to ``otelkit_receiver``, the session's
embedded receiver, of which each test reads its own part.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastapi_stages
import pytest
import uvicorn
from opentelemetry.sdk.metrics.export import HistogramDataPoint

from otelkit import semconv
from otelkit.analysis import Span
from otelkit.testing import (
    Capture,
    MemoryCapture,
    ReceiverCapture,
    answers,
    components,
    tree,
    wait_until,
)
from otelkit.tritonserver import free_port

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
EVENT = {"hits": [[30, 40, 10], [-60, 80, -25]]}
FEATURES = {"features": [[0.05, 0.2952, 0.01], [0.1, 0.7048, -0.025]]}
STAGES = [(0, "POST /features", "SERVER"), (1, "cylindrical", "INTERNAL"), (1, "scale", "INTERNAL")]


def post(url: str, trace_id: str = TRACE_ID, sampled: bool = True) -> Any:
    """One event, from a caller whose context is ``trace_id``; the answer."""
    parent = f"00-{trace_id}-b7ad6b7169203331-{'01' if sampled else '00'}"
    headers = {"content-type": "application/json", "traceparent": parent}
    request = urllib.request.Request(f"{url}/features", json.dumps(EVENT).encode(), headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def app_url() -> Iterator[str]:
    """The app on uvicorn, in a thread of this process; its URL."""
    server = uvicorn.Server(uvicorn.Config(fastapi_stages.app, port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, "uvicorn started")
    yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    server.should_exit = True
    thread.join(10)


def traced_request(url: str, captured: Capture) -> list[Span]:
    """One request from a sampled caller; its trace, checked whole, from either capture."""
    assert post(url) == FEATURES
    # the SERVER span ends once the response is sent: wait for it, not for a while
    spans = captured.wait_for_trace(TRACE_ID, count=3)
    assert tree(spans) == STAGES
    return spans


def test_a_request_is_a_server_span_over_its_stages(
    app_url: str, otelkit_spans: MemoryCapture
) -> None:
    spans = traced_request(app_url, otelkit_spans)
    (cylindrical,) = [s for s in spans if s.name == "cylindrical"]
    assert cylindrical.attributes["hits"] == 2
    assert components(spans).keys() >= {"client cylindrical", "client scale", "total"}
    counts = {
        dict(point.attributes or {})["stage"]: point.count
        for point in otelkit_spans.metrics()[semconv.STAGE_DURATION.name]
        if isinstance(point, HistogramDataPoint)
    }
    assert counts == {"cylindrical": 1, "scale": 1}


def test_a_caller_that_did_not_sample_gets_no_spans(
    app_url: str, otelkit_spans: MemoryCapture
) -> None:
    post(app_url, sampled=False)
    marker = "1" * 32  # a sampled request after it: once its spans are in, the first's are
    post(app_url, trace_id=marker)
    otelkit_spans.assert_absent(lambda s: s.trace_id != marker, after=marker, count=3)


@pytest.fixture
def server(otelkit_receiver: ReceiverCapture, tmp_path: Path) -> Iterator[str]:
    """The app in a process of its own, exporting to the session's receiver; its URL."""
    port = free_port()
    command = [sys.executable, fastapi_stages.__file__, "--port", str(port)]
    env = {**os.environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": otelkit_receiver.traces_url}
    with subprocess.Popen(command, env=env, cwd=tmp_path) as process:
        url = f"http://127.0.0.1:{port}"
        wait_until(answers(f"{url}/docs", process), 60, "the FastAPI server")
        yield url
        process.terminate()


def test_another_process_exports_the_same_tree(
    server: str, otelkit_receiver: ReceiverCapture
) -> None:
    spans = traced_request(server, otelkit_receiver)
    assert {s.resource["service.name"] for s in spans} == {"hit-features-fastapi"}
