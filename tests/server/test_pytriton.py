"""PyTriton: stage spans under ``proxy_inference_callable``, in the client's trace.

A real PyTriton ``Triton`` (its bundled tritonserver) serves an inference function with stages;
the same process is the otelkit-instrumented client. otelkit is configured only after PyTriton
has started, so the test also shows that ``install_tracer`` follows a later ``configure()``.
The other tests call ``traced`` functions in process with PyTriton's own ``Request`` objects and
spans started the way its proxy starts them: batches, every kind of function, no otelkit.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sysconfig
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from opentelemetry import trace
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy.telemetry import end_span, start_span_from_remote
from pytriton.proxy.types import Request
from pytriton.triton import Triton, TritonConfig

import otelkit
from otelkit import semconv
from otelkit.analysis import Span, build_traces, load_spans
from otelkit.receiver import Receiver
from otelkit.server.pytriton import install_tracer, traced
from otelkit.tritonserver import free_port
from tests.client.test_client import shape, telemetry
from tests.client.test_client import traced as under_job
from tests.support import joined_trace

__all__ = ["telemetry"]  # the fixture, shared with test_client

pytestmark = pytest.mark.triton
MODEL = "pipeline"
DATA = np.arange(8, dtype=np.float32).reshape(2, 4)
STAGES = ("embed", "build_graph", "classify")


@traced(model=MODEL)
@batch
def infer(INPUT0: np.ndarray) -> dict[str, np.ndarray]:
    with otelkit.stage("embed"):
        with otelkit.stage("build_graph"):
            time.sleep(0.002)
        embedded = INPUT0 * 2
    with otelkit.stage("classify"):
        return {"OUTPUT0": embedded + 1}


@pytest.fixture(scope="module")
def http_url(receiver: Receiver) -> Iterator[str]:
    """A PyTriton server serving ``infer``, tracing every request to the session's receiver."""
    with pytest.MonkeyPatch.context() as env:
        # The Python-backend stub links libpython dynamically: this interpreter's must come
        # first, PyTriton does not see to it (DESIGN.md section 3).
        libdir = sysconfig.get_config_var("LIBDIR")
        env.setenv("LD_LIBRARY_PATH", f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}")
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # the stub's python_backend_execute spans
        ports = {f"{name}_port": free_port() for name in ("http", "grpc", "metrics")}
        config = TritonConfig(
            **ports,
            exit_timeout_secs=5,
            trace_config=[
                "mode=opentelemetry",
                "rate=1",
                "level=TIMESTAMPS",
                f"opentelemetry,url={receiver.traces_url}",
                "opentelemetry,bsp_schedule_delay=50",
                "opentelemetry,resource=service.name=pytriton-tests",
            ],
        )
        with Triton(config=config) as triton:
            triton.bind(
                model_name=MODEL,
                infer_func=infer,
                inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=(-1,))],
                outputs=[Tensor(name="OUTPUT0", dtype=np.float32, shape=(-1,))],
                config=ModelConfig(max_batch_size=8),
            )
            triton.run()
            yield f"127.0.0.1:{ports['http_port']}"


def test_stages_nest_under_proxy_inference_callable_in_the_clients_trace(
    http_url: str, receiver: Receiver, telemetry: otelkit.Telemetry
) -> None:
    tensor = httpclient.InferInput("INPUT0", list(DATA.shape), "FP32")
    tensor.set_data_from_numpy(DATA)
    with otelkit.instrument(httpclient.InferenceServerClient(http_url)) as client:
        results = []

        def call() -> str:
            trace_id, _, result = under_job(lambda: client.infer(MODEL, [tensor]))
            results.append(result)
            return trace_id

        trace_id, spans = joined_trace(call, receiver.out_dir, count=11)
    assert np.array_equal(results[-1].as_numpy("OUTPUT0"), DATA * 2 + 1)
    assert shape(spans, trace_id) == [
        (0, "job", "client-tests"),
        (1, f"{semconv.RPC_METHOD_HTTP_INFER} {MODEL}", "client-tests"),
        (2, "InferRequest", "pytriton-tests"),
        (3, MODEL, "pytriton-tests"),
        (4, "compute", "pytriton-tests"),
        (4, "python_backend_execute", "pytriton-tests"),  # in Triton's Python-backend stub
        (5, "proxy_inference_callable", "client-tests"),  # in this process, otelkit's provider
        (6, "pytriton-batch-decorator-span", "client-tests"),
        (6, "embed", "client-tests"),
        (7, "build_graph", "client-tests"),
        (6, "classify", "client-tests"),
    ]
    by_id = {s.span_id: s for s in spans if s.trace_id == trace_id}
    proxy = next(s for s in by_id.values() if s.name == "proxy_inference_callable")
    assert proxy.scope == "otelkit.server.pytriton"
    for span in (s for s in by_id.values() if s.name in STAGES):
        parent = by_id[str(span.parent_span_id)]
        assert parent.start_ns <= span.start_ns <= span.end_ns <= parent.end_ns, span.name
        assert span.attributes[semconv.MODEL_NAME] == MODEL
        assert span.links == ()  # one request: no batch links


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Path]:
    """otelkit writing spans to JSON-lines files under ``tmp_path``."""
    otelkit.configure(service_name="pytriton-unit", traces_dir=tmp_path, metrics_exporter="none")
    assert install_tracer()
    yield tmp_path
    otelkit.shutdown()


def proxy_requests(count: int) -> list[Request]:
    """Requests as PyTriton's proxy hands them over, each with its own new trace."""
    return [
        Request(data={"INPUT0": DATA}, span=start_span_from_remote({}, "proxy_inference_callable"))
        for _ in range(count)
    ]


def finished(requests: list[Request], directory: Path) -> list[Span]:
    """End the requests' spans as PyTriton does; every span exported to ``directory``."""
    for request in requests:
        end_span(request.span)
    otelkit.flush()
    return load_spans(directory)


def hex_ids(request: Request) -> tuple[str, str]:
    context = request.span.get_span_context()
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def test_a_batch_nests_under_its_first_request_and_links_to_every_request(local: Path) -> None:
    requests = proxy_requests(2)
    outputs = infer(requests)
    assert [o["OUTPUT0"].shape for o in outputs] == [DATA.shape, DATA.shape]
    spans = finished(requests, local)
    traces = build_traces(spans)
    first, second = (hex_ids(r) for r in requests)
    assert [(d, s.name) for d, s in traces[first[0]].walk()] == [
        (0, "proxy_inference_callable"),
        (1, "pytriton-batch-decorator-span"),
        (1, "embed"),
        (2, "build_graph"),
        (1, "classify"),
    ]
    assert [(d, s.name) for d, s in traces[second[0]].walk()] == [
        (0, "proxy_inference_callable"),
        (1, "pytriton-batch-decorator-span"),
    ]
    stages = {s.name: s for s in spans if s.name in STAGES}
    links = {name: [(k.trace_id, k.span_id) for k in s.links] for name, s in stages.items()}
    # the outermost stages over the batch link to every request; the nested one does not
    assert links == {"embed": [first, second], "build_graph": [], "classify": [first, second]}
    assert stages["embed"].attributes[semconv.STAGE_BATCH_REQUESTS] == 2


class Model:
    @traced(model="method")
    def infer(self, requests: list[Request]) -> list[dict[str, np.ndarray]]:
        with otelkit.stage("method"):
            return [{"OUTPUT0": r["INPUT0"]} for r in requests]


@traced(model="generator")
def stream(requests: list[Request]) -> Iterator[list[dict[str, np.ndarray]]]:
    for _ in range(2):
        with otelkit.stage("generator"):
            yield [{"OUTPUT0": r["INPUT0"]} for r in requests]


@traced(model="coroutine")
async def infer_async(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    async with otelkit.stage("coroutine"):
        await asyncio.sleep(0)
        return [{"OUTPUT0": r["INPUT0"]} for r in requests]


@traced(model="async_generator")
async def stream_async(requests: list[Request]) -> AsyncIterator[list[dict[str, np.ndarray]]]:
    async with otelkit.stage("async_generator"):
        await asyncio.sleep(0)
        yield [{"OUTPUT0": r["INPUT0"]} for r in requests]


async def collect(requests: list[Request]) -> list[Any]:
    return [item async for item in stream_async(requests)]


def test_every_kind_of_function_runs_under_its_request(local: Path) -> None:
    # PyTriton picks how to call the function by its kind: the wrapper must keep it
    assert inspect.isgeneratorfunction(stream)
    assert inspect.iscoroutinefunction(infer_async)
    assert inspect.isasyncgenfunction(stream_async)
    calls: dict[str, Callable[[list[Request]], Any]] = {
        "method": Model().infer,
        "generator": lambda requests: list(stream(requests)),
        "coroutine": lambda requests: asyncio.run(infer_async(requests)),
        "async_generator": lambda requests: asyncio.run(collect(requests)),
    }
    requests = {name: proxy_requests(1) for name in calls}
    for name, call in calls.items():
        assert call(requests[name])
    spans = finished([r for group in requests.values() for r in group], local)
    for name, (request,) in requests.items():
        stages = [s for s in spans if s.name == name]
        assert len(stages) == (2 if name == "generator" else 1)
        for stage in stages:
            assert (stage.trace_id, stage.parent_span_id) == hex_ids(request), name
            assert stage.attributes[semconv.MODEL_NAME] == name
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing left attached


def test_batch_serves_requests_while_otelkit_is_not_configured() -> None:
    """Without otelkit, PyTriton gets non-recording spans, which its ``@batch`` must read too."""
    otelkit.shutdown()
    install_tracer()
    requests = proxy_requests(1)
    assert not requests[0].span.is_recording()
    (output,) = infer(requests)
    assert np.array_equal(output["OUTPUT0"], DATA * 2 + 1)
    end_span(requests[0].span)
