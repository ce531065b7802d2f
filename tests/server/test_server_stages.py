"""``otelkit.stage``: in process (decorator, context manager, errors) and inside a Triton
Python-backend model, where the stage spans join the client's trace under Triton's model span."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.openmetrics.parser import text_string_to_metric_families

import otelkit
from otelkit import semconv
from otelkit.analysis import Span, build_traces, load_spans
from otelkit.receiver import Receiver
from otelkit.testing import ReceiverCapture, tree, wait_until
from otelkit.tritonserver import TritonServer
from tests.client.test_client import telemetry, traced
from tests.core.test_telemetry import scrape
from tests.support import joined_trace

__all__ = ["telemetry"]  # the fixture, shared with test_client


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Path]:
    """otelkit writing spans to JSON-lines files under ``tmp_path``, metrics on Prometheus."""
    otelkit.configure(
        service_name="stages",
        traces_dir=tmp_path,
        metrics_exporter="prometheus",
        prometheus_port=0,
    )
    yield tmp_path
    otelkit.shutdown()


def test_decorator_and_context_manager_nest(local: Path) -> None:
    @otelkit.stage("outer", detector="pixel")
    def outer(n: int) -> int:
        with otelkit.stage("inner") as run:
            assert run is not None
            run.set(edges=n)
        return n * 2

    @otelkit.stage("coroutine")
    async def coroutine() -> int:
        async with otelkit.stage("awaited"):
            await asyncio.sleep(0)
        return 7

    @otelkit.stage("generator")
    def generator() -> Iterator[int]:
        for i in range(3):
            with otelkit.stage("item"):
                yield i

    assert outer(3) == 6
    assert asyncio.run(coroutine()) == 7
    assert list(generator()) == [0, 1, 2]
    otelkit.flush()
    assert [(depth, name) for depth, name, _ in tree(load_spans(local))] == [
        (0, "outer"),
        (1, "inner"),
        (0, "coroutine"),
        (1, "awaited"),
        (0, "generator"),
        (1, "item"),
        (1, "item"),
        (1, "item"),
    ]
    spans = {s.name: s for s in load_spans(local)}
    assert spans["outer"].kind.name == "INTERNAL"
    assert spans["outer"].attributes["detector"] == "pixel"
    assert spans["inner"].attributes["edges"] == 3
    assert spans["inner"].attributes[semconv.STAGE_NAME] == "inner"


def test_generator_context_is_current_only_inside_the_generator(local: Path) -> None:
    @otelkit.stage("producer")
    def producer() -> Iterator[int]:
        yield 1
        yield 2

    for _ in producer():
        with otelkit.stage("consumer"):  # the consumer's work is not inside the producer
            pass
    otelkit.flush()  # three traces: the producer's started first
    assert tree(load_spans(local)) == [
        (0, "producer", "INTERNAL"),
        (0, "consumer", "INTERNAL"),
        (0, "consumer", "INTERNAL"),
    ]


def test_an_exception_is_recorded_and_reraised_unchanged(local: Path) -> None:
    error = KeyError("missing hit")

    @otelkit.stage("fails")
    def fails() -> None:
        raise error

    with pytest.raises(KeyError) as caught:
        fails()
    assert caught.value is error
    otelkit.flush()
    (span,) = load_spans(local)
    assert span.status_code.name == "ERROR"
    assert span.attributes[semconv.ERROR_TYPE] == "KeyError"
    assert span.events[0].name == "exception"


def test_stage_metrics_count_every_run_with_exemplars(local: Path) -> None:
    telemetry = otelkit.telemetry.current()
    assert telemetry is not None and telemetry.prometheus_url is not None

    @otelkit.stage("threaded", model="gnn")
    def work(i: int) -> int:
        if i % 10 == 0:
            raise ValueError("bad event")
        return i

    def call(i: int) -> None:
        with contextlib.suppress(ValueError):
            work(i)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(call, range(100)))
    families = {f.name: f for f in text_string_to_metric_families(scrape(telemetry.prometheus_url))}
    base = semconv.prometheus_name(semconv.STAGE_DURATION)
    labels = {"model": "gnn", "stage": "threaded"}
    count = [s for s in families[base].samples if s.name == f"{base}_count" and s.labels == labels]
    assert [s.value for s in count] == [100]
    buckets = [s for s in families[base].samples if s.name == f"{base}_bucket"]
    assert any(s.exemplar is not None and len(s.exemplar.labels["trace_id"]) == 32 for s in buckets)
    errors = semconv.prometheus_name(semconv.STAGE_ERRORS)
    failed = [
        (s.labels["error_type"], s.value)
        for s in families[errors.removesuffix("_total")].samples
        if s.name == errors and s.labels["stage"] == "threaded"
    ]
    assert failed == [("ValueError", 10)]
    in_flight = semconv.prometheus_name(semconv.STAGE_IN_FLIGHT)
    assert [s.value for s in families[in_flight].samples if s.labels == labels] == [0]


# -- inside a Triton Python-backend model -------------------------------------------------------


def stage_spans(spans: list[Span], trace_id: str) -> dict[str, list[Span]]:
    found: dict[str, list[Span]] = {}
    for span in spans:
        if span.trace_id == trace_id and semconv.STAGE_NAME in span.attributes:
            found.setdefault(span.name, []).append(span)
    return found


@pytest.mark.triton
def test_stages_in_a_python_backend_model_hang_under_tritons_model_span(
    triton: TritonServer, otelkit_receiver_server: Receiver, telemetry: otelkit.Telemetry
) -> None:
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    with otelkit.instrument(httpclient.InferenceServerClient(triton.http_url)) as client:

        def call() -> str:
            tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data)
            trace_id, _, result = traced(lambda: client.infer("staged_fp32", [tensor]))
            assert np.array_equal(result.as_numpy("OUTPUT0"), data * 2)
            return trace_id

        # job, CLIENT, InferRequest, model, compute and the three stages
        trace_id, spans = joined_trace(call, otelkit_receiver_server.out_dir, count=8)
    walk = [(d, s.name) for d, s in build_traces(spans)[trace_id].walk()]
    assert walk[:4] == [
        (0, "job"),
        (1, "v2/models/infer staged_fp32"),
        (2, "InferRequest"),
        (3, "staged_fp32"),
    ]
    assert sorted(walk[4:]) == [(4, "compute"), (4, "gather"), (4, "pack"), (4, "scale")]
    by_id = {s.span_id: s for s in spans}
    for name, (span,) in stage_spans(spans, trace_id).items():
        parent = by_id[span.parent_span_id]
        assert parent.name == "staged_fp32", name
        assert parent.start_ns <= span.start_ns <= span.end_ns <= parent.end_ns, name
        assert span.resource["service.name"] == "triton-models"


@pytest.mark.triton
def test_a_batch_wide_stage_is_one_span_linked_to_every_request(
    triton: TritonServer,
    otelkit_receiver: ReceiverCapture,
    telemetry: otelkit.Telemetry,
    model_metrics_port: int,
) -> None:
    """Concurrent requests batched by Triton: one ``gather`` span per execution, linked to the
    model span of every request of its batch; ``scale`` and ``pack`` once per request."""
    metrics_url = f"http://127.0.0.1:{model_metrics_port}/metrics"
    before = model_stage_counts(metrics_url)
    requests = 16

    start = threading.Barrier(requests)

    def one(i: int) -> str:  # an HTTP client is not shared between threads: one each
        data = np.full((1, 4), i, dtype=np.float32)
        tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        with otelkit.instrument(httpclient.InferenceServerClient(triton.http_url)) as client:
            start.wait(timeout=30)  # all at once, so that Triton batches them
            trace_id, _, result = traced(lambda: client.infer("staged_fp32", [tensor]))
        assert np.array_equal(result.as_numpy("OUTPUT0"), data * 2)
        return trace_id

    with ThreadPoolExecutor(requests) as pool:
        trace_ids = list(pool.map(one, range(requests)))
    otelkit.flush()
    wanted = set(trace_ids)

    def every_requests_stages() -> list[Span] | None:
        spans = [s for s in otelkit_receiver.spans() if s.trace_id in wanted]
        names = ("pack", "staged_fp32")
        arrived = all({s.trace_id for s in spans if s.name == name} == wanted for name in names)
        return spans if arrived else None

    deadline_spans = wait_until(every_requests_stages, 15, "each request's pack and model span")
    model_spans = {(s.trace_id, s.span_id): s for s in deadline_spans if s.name == "staged_fp32"}
    gathers = [s for s in deadline_spans if s.name == "gather"]
    linked = [(link.trace_id, link.span_id) for g in gathers for link in g.links]
    assert sorted(linked) == sorted(model_spans)  # every request's model span, exactly once
    assert len(gathers) < requests  # Triton batched some of them
    for gather in gathers:
        assert gather.attributes[semconv.STAGE_BATCH_REQUESTS] == len(gather.links)
        assert (gather.trace_id, gather.parent_span_id) in model_spans
    after = model_stage_counts(metrics_url)
    assert after["scale"] - before.get("scale", 0) == requests
    assert after["pack"] - before.get("pack", 0) == requests
    assert after["gather"] - before.get("gather", 0) == len(gathers)


def model_stage_counts(url: str) -> dict[str, float]:
    base = semconv.prometheus_name(semconv.STAGE_DURATION)
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(scrape(url)):
        for sample in family.samples:
            if sample.name == f"{base}_count" and sample.labels["model"] == "staged_fp32":
                counts[sample.labels["stage"]] = sample.value
    return counts


@pytest.mark.gpu
def test_a_stage_running_cuda_work_records_its_gpu_time(local: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    matrix = torch.rand(4096, 4096, device="cuda")
    # cuBLAS takes its workspace from torch's allocator on the first product (32 MiB on an
    # H200): made before the stages run, it is not counted as the stages' growth
    matrix @ matrix
    torch.cuda.synchronize()

    @otelkit.stage("matmul", model="gpu")
    def multiply() -> Any:
        return matrix @ matrix  # asynchronous: returns before the GPU is done

    for _ in range(3):
        multiply()
    torch.cuda.synchronize()
    otelkit.flush()
    time.sleep(0.5)  # the GPU timer thread ends the spans once their events completed
    otelkit.flush()
    spans = [s for s in load_spans(local) if s.name == "matmul"]
    assert len(spans) == 3
    for span in spans:
        gpu_s = span.attributes[semconv.STAGE_GPU_S]
        assert isinstance(gpu_s, float) and gpu_s > 0
        # the product (4096 x 4096 float32) is alive when the stage ends
        assert span.attributes[semconv.STAGE_GPU_MEMORY_GROWTH] == 4096 * 4096 * 4
    telemetry = otelkit.telemetry.current()
    assert telemetry is not None and telemetry.prometheus_url is not None
    text = scrape(telemetry.prometheus_url)
    gpu_count = semconv.prometheus_name(semconv.STAGE_GPU_DURATION) + "_count"
    assert f'{gpu_count}{{model="gpu",stage="matmul"}} 3.0' in text


def test_without_a_gpu_asking_for_gpu_timing_changes_nothing(local: Path) -> None:
    @otelkit.stage("asked", gpu=True)
    def work() -> int:
        return 1

    assert [work() for _ in range(3)] == [1, 1, 1]
    otelkit.flush()
    spans = [s for s in load_spans(local) if s.name == "asked"]
    assert len(spans) == 3
    torch_here = "torch" in sys.modules and sys.modules["torch"].cuda.is_available()
    if not torch_here:
        assert all(semconv.STAGE_GPU_S not in s.attributes for s in spans)
