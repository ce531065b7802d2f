"""A real tritonserver exports its own spans to the embedded receiver, joined to our trace."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.sdk.trace import TracerProvider

import otelkit
from otelkit.analysis import build_traces
from otelkit.receiver import Receiver
from otelkit.tritonserver import TritonServer
from tests.support import joined_trace

pytestmark = pytest.mark.triton

TRACER = TracerProvider().get_tracer("tests")  # a local SDK tracer: ids without exporting


def _inputs(module: object) -> list[object]:
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    infer_input = module.InferInput("INPUT0", list(data.shape), "FP32")  # type: ignore[attr-defined]
    infer_input.set_data_from_numpy(data)
    return [infer_input]


def _call(protocol: str, server: TritonServer, headers: dict[str, str]) -> None:
    if protocol == "http":
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.infer("identity_fp32", _inputs(httpclient), headers=headers)
    else:
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            client.infer("identity_fp32", _inputs(grpcclient), headers=headers)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_triton_spans_join_the_trace_whose_traceparent_we_sent(
    protocol: str, triton: TritonServer, receiver: Receiver
) -> None:
    sent: list[tuple[str, dict[str, str]]] = []

    def call() -> str:
        with TRACER.start_as_current_span("client-call") as span:
            headers = otelkit.inject({"x-experiment": "cms"})
            context = span.get_span_context()
        sent.append((f"{context.span_id:016x}", dict(headers)))  # tritonclient writes into it
        _call(protocol, triton, headers)
        return f"{context.trace_id:032x}"

    trace_id, spans = joined_trace(call, receiver.out_dir, count=3, protocol=protocol)
    client_span_id, headers = sent[-1]
    assert headers["traceparent"][-3:] in ("-01", "-03")  # sampled (and random, Level 2)
    assert headers == {
        "x-experiment": "cms",
        "traceparent": f"00-{trace_id}-{client_span_id}-{headers['traceparent'][-2:]}",
    }
    tree = build_traces(spans)[trace_id]
    shape = [(depth, s.name, s.resource.get("service.name")) for depth, s in tree.walk()]
    assert shape == [
        (0, "InferRequest", "triton-tests"),
        (1, "identity_fp32", "triton-tests"),
        (2, "compute", "triton-tests"),
    ]
    (root,) = tree.roots
    assert root.parent_span_id == client_span_id  # the orphan's parent is our client span
    model = tree.children(root)[0]
    assert model.attributes["triton.model_name"] == "identity_fp32"
    events = {e.name for s in spans for e in s.events}
    assert {"REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END"} <= events
    for parent, child in ((root, model), (model, tree.children(model)[0])):
        assert parent.start_ns <= child.start_ns <= child.end_ns <= parent.end_ns
