"""The reference pipeline's twin over KServe v2 gRPC (``create_grpc_twin``), as a SONIC client
reaches it: the same instrumented ``tritonclient.grpc`` code drives it and the real Triton of
the reference deployment, and each call is one trace from the client to the stages.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from gnn_tracking.driving.client import event_pool
from gnn_tracking.driving.options import OPTIONS, PACK, ROOT_SPAN, UNPACK, Remote, reconstruct
from gnn_tracking.physics.models import Models, load_models
from gnn_tracking.serving.kserve_grpc import DECODE, ENCODE
from gnn_tracking.serving.stages import ENSEMBLE, STAGE_ORDER
from gnn_tracking.serving.twin import create_grpc_twin

import otelkit
from otelkit import semconv
from otelkit.analysis import StatusCode, build_traces, load_spans
from otelkit.receiver import Receiver
from otelkit.tritonserver import free_port
from tests.support import TrackingServer, wait_for_trace


@pytest.fixture(scope="module")
def models() -> Models:
    return load_models()


@pytest.fixture(scope="module")
def events() -> list[torch.Tensor]:
    return event_pool(3, 30, seed=91)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """otelkit in this process (the client and the twin) exports to a receiver of its own."""
    with Receiver(tmp_path_factory.mktemp("grpc-twin-receiver")) as receiver:
        otelkit.configure(
            service_name="grpc-twin-tests",
            traces_endpoint=receiver.traces_url,
            bsp_schedule_delay_ms=50,
        )
        yield receiver.out_dir
        otelkit.shutdown()


@pytest.fixture(scope="module")
def twin_url(models: Models, traces: Path) -> Iterator[str]:
    port = free_port()
    server = create_grpc_twin(models, port=port)
    yield f"127.0.0.1:{port}"
    server.stop(None)


@pytest.mark.triton
def test_the_grpc_twin_and_triton_give_the_same_labels_for_the_same_event(
    twin_url: str,
    tracking_triton: TrackingServer,
    models: Models,
    events: list[torch.Tensor],
    traces: Path,
) -> None:
    twin = Remote(twin_url, "grpc")
    triton = Remote(tracking_triton.server.grpc_url, "grpc")
    for features in events:
        expected = reconstruct(OPTIONS[0], features, models, None)
        for option in (OPTIONS[3], OPTIONS[4]):
            from_twin = reconstruct(option, features, None, twin)
            from_triton = reconstruct(option, features, None, triton)
            assert torch.equal(from_twin, expected), f"twin, option {option.number}"
            assert torch.equal(from_triton, expected), f"Triton, option {option.number}"
    twin.close()
    triton.close()


def test_a_grpc_call_to_the_twin_is_one_trace_from_client_to_stages(
    twin_url: str, events: list[torch.Tensor], traces: Path
) -> None:
    twin = Remote(twin_url, "grpc")
    call = uuid.uuid4().hex
    reconstruct(OPTIONS[4], events[0], None, twin, {"test.call": call})
    twin.close()
    otelkit.flush()
    (trace_id,) = {s.trace_id for s in load_spans(traces) if s.attributes.get("test.call") == call}
    spans = wait_for_trace(traces, trace_id, 7 + len(STAGE_ORDER))
    (tree,) = build_traces(spans).values()
    walked = [(depth, span) for depth, span in tree.walk()]
    stages = sorted(span.attributes[semconv.STAGE_NAME] for depth, span in walked if depth == 3)
    assert [(d, s.name, s.kind.name) for d, s in walked if d < 3] == [
        (0, ROOT_SPAN, "INTERNAL"),
        (1, PACK, "INTERNAL"),
        (1, f"{semconv.RPC_METHOD_GRPC_INFER} {ENSEMBLE}", "CLIENT"),
        (2, semconv.RPC_METHOD_GRPC_INFER, "SERVER"),
        (1, UNPACK, "INTERNAL"),
    ]
    # the model's stages, and the twin's own decoding and encoding of the tensors
    assert stages == sorted([*STAGE_ORDER, DECODE, ENCODE]) and len(walked) == 7 + len(STAGE_ORDER)
    by_id = {span.span_id: span for _, span in walked}
    for _, span in walked[1:]:  # each inside its parent
        parent = by_id[span.parent_span_id or ""]
        assert parent.start_ns <= span.start_ns <= span.end_ns <= parent.end_ns, span.name
    (server,) = [span for depth, span in walked if depth == 2]
    assert server.status_code is StatusCode.UNSET
    assert server.attributes[semconv.RPC_RESPONSE_STATUS_CODE] == "OK"
