"""The reference deployment's GPU path: Triton's ``KIND_GPU`` instance groups
(``configs/gpu.pbtxt``, ``tritonserver --model-config-name=gpu``) serving the pipeline on a
CUDA device, called over gRPC as SONIC's clients call it.

Marked ``gpu``: without a CUDA device it skips (the only tests allowed to). On a GPU machine:
``pytest -m gpu tests/examples/test_tracking_gpu.py -s`` (it prints what it measured).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from gnn_tracking.driving.client import drive, event_pool
from gnn_tracking.driving.options import OPTIONS, ROOT_SPAN, Remote, reconstruct
from gnn_tracking.physics.models import Models, load_models
from gnn_tracking.serving.serve import triton_server
from gnn_tracking.serving.stages import STAGE_ORDER

import otelkit
from otelkit.analysis import breakdown, build_traces, load_spans
from otelkit.receiver import Receiver
from otelkit.tritonserver import TritonServer
from tests.support import wait_for_trace


# Measured on a lent H200 (2026-11-26), with nvidia-pytriton 0.7.0's tritonserver 2.51: every
# KIND_GPU Python model answered with outputs of the right shape and no bytes (the client's
# "cannot reshape array of size 0 into shape (667,8)"; in the ensemble "input byte size
# mismatch for input 'EMBEDDING' for model 'build_graph'. Expected 35520, got 0"), and Triton
# logged no error. The same tests pass on the CPU configuration. Strict: the day they pass, the
# mark must go (docs/known-issues.md).
class EmptyGpuOutputs(AssertionError):
    """The known problem, and only it: an output with the right shape and no bytes."""


# what the empty outputs look like to the client, and to the ensemble's next step
_EMPTY = ("cannot reshape array of size 0", "input byte size mismatch")


def empty_outputs(error: object) -> bool:
    return any(sign in str(error) for sign in _EMPTY)


@contextmanager
def known_problem() -> Iterator[None]:
    """Raise ``EmptyGpuOutputs`` for the known problem; any other failure stays itself."""
    try:
        yield
    except Exception as error:
        if empty_outputs(error):
            raise EmptyGpuOutputs(str(error)) from error
        raise


# Strict, and for the known problem only: any other failure (an otelkit regression) fails.
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.triton,
    pytest.mark.xfail(
        strict=True,
        raises=EmptyGpuOutputs,
        reason="tritonserver 2.51's KIND_GPU Python models returned empty outputs on an H200",
    ),
]


@pytest.fixture(scope="module")
def gpu_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TritonServer, Path]]:
    """Triton on the GPU configs, tracing what carries a context; yields it and the traces."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    out = tmp_path_factory.mktemp("gpu-traces")
    with Receiver(out) as receiver:
        server = triton_server(
            receiver.traces_url, gpu=True, log_path=out / "triton.log", trace_rate=1_000_000
        )
        with server:
            otelkit.configure(
                service_name="gnn-tracking-gpu-tests",
                traces_endpoint=receiver.traces_url,
                bsp_schedule_delay_ms=50,
            )
            yield server, receiver.out_dir
            otelkit.shutdown()


@pytest.fixture(scope="module")
def cpu_models() -> Models:
    return load_models("cpu")


@pytest.mark.parametrize("option", [1, 2, 3, 4])
def test_each_option_on_the_gpu_gives_the_labels_of_the_cpu_pipeline(
    gpu_triton: tuple[TritonServer, Path], cpu_models: Models, option: int
) -> None:
    server, _ = gpu_triton
    remote = Remote(server.grpc_url, "grpc", instrument=False)
    for features in event_pool(4, 60, seed=91):
        expected = reconstruct(OPTIONS[0], features, cpu_models, None)
        with known_problem():
            labels = reconstruct(OPTIONS[option], features, cpu_models, remote)
        differ = int((labels != expected).sum())
        assert differ == 0, f"option {option}: {differ} of {len(labels)} hits differ"
    remote.close()


def test_a_traced_event_on_the_gpu_breaks_down_into_every_stage(
    gpu_triton: tuple[TritonServer, Path],
) -> None:
    server, traces = gpu_triton
    remote = Remote(server.grpc_url, "grpc")
    events = event_pool(8, 100, seed=5)
    for features in events:  # the first calls pay for CUDA's and cuBLAS's start-up
        with known_problem():
            reconstruct(OPTIONS[3], features, None, remote)
    remote.close()
    otelkit.flush()
    roots = [s for s in load_spans(traces) if s.name == ROOT_SPAN]
    # root, 5 x (pack, client, unpack, InferRequest, model span, compute, stage)
    spans = wait_for_trace(traces, roots[-1].trace_id, 1 + 7 * len(STAGE_ORDER))
    (group,) = breakdown(build_traces(spans).values(), root_name=ROOT_SPAN).values()
    assert group.problems == [] and group.incomplete == 0
    stage_ms = {name: group.mean(f"server {name}") * 1e3 for name in STAGE_ORDER}
    assert all(ms > 0 for ms in stage_ms.values()), stage_ms
    timings = ", ".join(f"{name} {ms:.2f} ms" for name, ms in stage_ms.items())
    print(f"GPU, one traced event of {events[-1].shape[0]} hits: {timings}")


@pytest.mark.parametrize("option", [3, 4])
def test_the_pipeline_on_the_gpu_serves_threads_over_grpc(
    gpu_triton: tuple[TritonServer, Path], cpu_models: Models, option: int
) -> None:
    server, _ = gpu_triton
    remote = Remote(server.grpc_url, "grpc", instrument=False)
    events = event_pool(16, 100, seed=7)
    for threads in (1, 4):
        report = drive(
            OPTIONS[option], events, threads=threads, models=cpu_models, remote=remote, seconds=5.0
        )
        if report.errors and empty_outputs(report.first_error):
            raise EmptyGpuOutputs(str(report.first_error))
        assert report.errors == 0, report.first_error
        print(f"GPU over gRPC: {report.line()}")
    remote.close()
    with urllib.request.urlopen(server.metrics_url, timeout=10) as answer:
        metrics = answer.read().decode().splitlines()
    executed = [
        line
        for line in metrics
        if line.startswith("nv_inference_exec_count{") and 'model="gnn"' in line
    ]
    assert executed and float(executed[0].rsplit(" ", 1)[1]) > 0, executed
    # Triton's own GPU metrics come from DCGM, which a container may not let it start
    gpu = [line for line in metrics if line.startswith(("nv_gpu_memory_used", "nv_gpu_util"))]
    print("Triton's GPU metrics:", "\n".join(gpu) or "none (DCGM did not start)")
