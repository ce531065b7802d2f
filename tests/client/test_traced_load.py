"""Traced load: 256 threads x 100 calls, over HTTP and over gRPC, against a Triton that traces
every request carrying a trace context, with the clients under the rate-limiting sampler.

This is the load that crashes tritonserver 2.51 when every call is traced (upstream server
issue 7795, docs/known-issues.md). Under the rate limit every call must be answered, the traced
calls must stay within the limit, and each traced call must be joined to Triton's spans — on the
first try over HTTP; over gRPC, Triton 2.51 loses a few per cent of trace contexts, and at most
5 % may be unjoined.

The rate limit makes the crash rare, not impossible: tritonserver died in the gRPC test once,
in a clean-clone CI run (13 runs in a row here did not crash). When Triton's own crash handler
is what stopped it, the test checks what otelkit answers for (the limit held; every call
answered or failed with the transport's error, none hung) and is reported as an expected
failure naming the crash (tests/ci_skips.py lets an expected failure through); any other way of
dying fails it.
"""

from __future__ import annotations

import http.client
import secrets
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import otelkit
from otelkit.receiver import Receiver
from otelkit.testing import ReceiverCapture
from otelkit.tritonserver import TritonServer
from tests.conftest import above_five_percent
from tests.paths import MODELS

pytestmark = pytest.mark.triton

THREADS = 256
CALLS = 100
RATE = 20.0  # traced calls per second, per client process
TIMEOUT_S = 60.0  # a call under this load takes well under a second
MODULES = {"http": httpclient, "grpc": grpcclient}
TRANSPORT_ERRORS = (InferenceServerException, OSError, http.client.HTTPException)


@pytest.fixture(scope="module")
def sink(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    with Receiver(tmp_path_factory.mktemp("load-traces"), max_concurrent=16) as running:
        yield running


@pytest.fixture(scope="module")
def traced_triton(sink: Receiver) -> Iterator[TritonServer]:
    """Traces a request when, and only when, it carries a trace context (a rate so high that
    Triton's own sampling never picks one)."""
    with TritonServer(MODELS, trace_url=sink.traces_url, trace_rate=1_000_000) as server:
        yield server


def drive(protocol: str, server: TritonServer) -> tuple[int, list[Exception], float]:
    """256 threads, 100 calls each; the calls answered correctly, the errors, the seconds.

    A thread stops calling once the server has failed (a crashed tritonserver may hang in its
    crash handler: calls to it would wait for their timeout one after another)."""
    module = MODULES[protocol]
    url = server.http_url if protocol == "http" else server.grpc_url
    timeout = {"http": {"network_timeout": TIMEOUT_S}, "grpc": {}}[protocol]
    per_call = {"http": {}, "grpc": {"client_timeout": TIMEOUT_S}}[protocol]
    answered = [0] * THREADS
    errors: list[Exception] = []
    start = threading.Barrier(THREADS + 1)

    def work(index: int) -> None:
        data = np.full((1, 16), index, dtype=np.float32)
        client = otelkit.instrument(module.InferenceServerClient(url, **timeout))
        tensor = module.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(data)
        start.wait()
        for _ in range(CALLS):
            try:
                result = client.infer("identity_fp32", [tensor], **per_call)
                if np.array_equal(result.as_numpy("OUTPUT0"), data):
                    answered[index] += 1
                else:
                    errors.append(AssertionError("wrong answer"))
            except Exception as error:  # the test reports every failed call
                errors.append(error)
                if server.failure() is not None:
                    break
        client.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.monotonic()
    for thread in threads:
        thread.join()
    return sum(answered), errors, time.monotonic() - began


def described(error: Exception) -> str:
    """A failed call as a failure must say it: tritonclient's exception keeps its message and
    status out of its repr (``InferenceServerException()``)."""
    status = error.status() if isinstance(error, InferenceServerException) else None
    return f"{type(error).__name__} ({status}): {error}"


def marker_call(server: TritonServer) -> str:
    """One call with a sampled context of its own, made after the load: its trace id."""
    trace_id = secrets.token_hex(16)
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    headers = {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}
    client.infer("identity_fp32", [tensor], headers=headers)
    client.close()
    return trace_id


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_traced_load_under_the_rate_limit(
    protocol: str, traced_triton: TritonServer, sink: Receiver
) -> None:
    service = f"load-{protocol}"
    captured = ReceiverCapture(sink)
    traced_triton.start()  # again, if the other protocol's test saw it crash
    telemetry = otelkit.configure(
        service_name=service,
        endpoint=sink.traces_url.removesuffix("/v1/traces"),
        sampler="parentbased_ratelimiting",
        sampler_arg=RATE,
        bsp_schedule_delay_ms=200,
        metrics_exporter="none",
    )
    try:
        answered, errors, seconds = drive(protocol, traced_triton)
        otelkit.flush()
        sampled = telemetry.stats()["exported"]
    finally:
        otelkit.shutdown()
    # the rate limit held: one credit at the start, and at most one second's worth banked
    # while the threads were being set up
    assert 1 <= sampled <= RATE * (seconds + 1) + 1
    failure = traced_triton.failure()
    if failure is not None:
        traced_triton.stop(timeout=5)
        assert "after logging 'Signal (" in failure, f"{failure}\n{traced_triton.log_tail()}"
        # what the transport raises when its server is gone, as a bare client would see it
        unclear = [e for e in errors if not isinstance(e, TRANSPORT_ERRORS)]
        assert unclear == [], [described(e) for e in unclear[:5]]
        pytest.xfail(
            f"{failure}: tritonserver 2.51's crash under traced load (upstream issue 7795), "
            f"{answered} calls answered and {len(errors)} failed with a clear error before it"
        )
    assert not errors, [described(e) for e in errors[:5]]
    assert answered == THREADS * CALLS

    # The client's spans are in (flushed above); Triton exports its spans in the order they
    # end, so once the marker call's are in, those of every call before it are too.
    marker = marker_call(traced_triton)
    captured.wait_for_spans(
        lambda s: s.trace_id == marker and s.name == "InferRequest",
        timeout=60,
        what="the InferRequest span of a marker call after the load",
    )
    spans = captured.spans()
    ours = [s for s in spans if s.kind.name == "CLIENT" and s.resource["service.name"] == service]
    assert len(ours) == sampled
    triton_parents = {(s.trace_id, s.parent_span_id) for s in spans if s.name == "InferRequest"}
    unjoined = [s for s in ours if (s.trace_id, s.span_id) not in triton_parents]
    if protocol == "http":
        assert unjoined == []  # HTTP carries every context
    else:
        # at most 5 % lost, by the exact binomial test the join resends use: a bare ratio
        # failed at random (34 of 656, 5.2 %, in a clean-clone run)
        joined = len(ours) - len(unjoined)
        assert not above_five_percent(len(unjoined), joined), (len(unjoined), len(ours))
    print(
        f"{protocol}: {answered} calls in {seconds:.1f} s ({answered / seconds:.0f}/s), "
        f"{sampled} traced ({sampled / seconds:.1f}/s), {len(unjoined)} not joined"
    )
