"""A client call's root sampling decision taken before its span (``_begin.begin``, by the rule
of ``SpanRecorder.roots``): the same draw as the SDK's samplers, only where the sampler allows
it, and a call found not sampled records its metrics and nothing else, against a real
tritonserver."""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import Histogram
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

import otelkit
from otelkit import semconv, telemetry
from otelkit._core.hotmetrics import HOT
from otelkit._core.spans import (
    NOT_SAMPLED,
    READY_IDS,
    READY_ROOTS,
    UNDECIDED,
    UNSAMPLED,
    LeanSpan,
    RootDecision,
)
from otelkit._core.switch import SWITCH
from otelkit._core.worker import LATER
from otelkit.analysis import load_spans
from otelkit.client._begin import begin
from otelkit.client._call import RECORDER, Call, MeteredCall
from otelkit.client._target import GRPC_TENSORS, ClientTarget
from otelkit.tritonserver import TritonServer
from tests.core.test_ready_roots import Sequential

DATA = np.arange(8, dtype=np.float32).reshape(2, 4)
# no server there: calls here are opened, never made (their series are kept apart)
TARGET = ClientTarget("grpc", "127.0.0.1:1", "grpc", "ModelInfer", GRPC_TENSORS)
ARGS = ("identity_fp32", [])


@pytest.fixture
def sampler(tmp_path: Path) -> Iterator[Any]:
    """``configure`` with a sampler (and its ratio); shut down after the test."""

    def configure(name: str, ratio: float = 1.0) -> otelkit.Telemetry:
        return otelkit.configure(
            service_name="sampling", traces_dir=str(tmp_path), sampler=name, sampler_arg=ratio
        )

    yield configure
    otelkit.shutdown()


def begun() -> MeteredCall | Call:
    """A call as a wrapper begins one (``_begin.begin``), in the current context."""
    call = begin(lambda client: TARGET, SimpleNamespace(), ARGS, {}, "infer")
    assert call is not None
    return call


def opened_call(context: Any = None) -> Any:
    """A call begun as a wrapper begins one (with ``context``: as a stream begins a streamed
    request's), ended at once (as a failed call): this is about its span, and no series should
    stay in flight."""
    call = begun() if context is None else Call(TARGET, ARGS, {}, "infer", context=context)
    call.finish(ConnectionRefusedError("never made"))
    return call


def decided() -> RootDecision:
    """The decision that a call beginning now takes for its root, before its span is asked
    for (a ``MeteredCall``'s is ``NOT_SAMPLED``)."""
    return opened_call().root


def drawn() -> RootDecision:
    """``decided()`` after a first call, which reads the configuration, as the first call
    after ``configure`` does."""
    opened_call()
    return decided()


@pytest.mark.parametrize("name", ["traceidratio", "parentbased_traceidratio"])
def test_ratio_roots_are_drawn_before_the_span_as_the_sdk_draws_them(
    name: str, sampler: Any
) -> None:
    sampler(name, 0.25)
    drawn()
    draws = [decided() for _ in range(8000)]
    assert {draw for draw in draws if not draw.sampled} == {NOT_SAMPLED}
    sampled = [draw.trace_id for draw in draws if draw.sampled]
    # binomial(8000, 0.25): 2000 expected, sigma 39
    assert 1800 < len(sampled) < 2200
    sdk = TraceIdRatioBased(0.25)
    assert all(
        sdk.should_sample(None, trace_id, "call").decision is Decision.RECORD_AND_SAMPLE
        for trace_id in sampled
    )
    assert len(set(sampled)) == len(sampled)
    assert all(trace_id >> 64 for trace_id in sampled)  # 128 random bits, not 64
    span = RECORDER.start("call", SpanKind.CLIENT, root=RootDecision.drawn(sampled[0]))
    assert isinstance(span, LeanSpan)
    assert span.context.trace_id == sampled[0] and span.parent is None
    assert span.context.trace_flags == TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)
    assert RECORDER.start("call", SpanKind.CLIENT, root=NOT_SAMPLED) is UNSAMPLED


def test_a_sampled_draw_is_the_trace_id_the_sdk_would_have_drawn(sampler: Any) -> None:
    """From the same state of ``random``, the SDK's ``RandomIdGenerator`` and the draw ahead
    give the same trace ids (its low 64 bits come first, as ``getrandbits(128)`` fills them)."""
    sampler("traceidratio", 1.0)
    drawn()
    ids = RandomIdGenerator()
    ours, sdk = [], []
    with LATER._lock:  # no refill of ready roots draws meanwhile
        for _ in range(100):
            state = random.getstate()
            ours.append(decided().trace_id)
            random.setstate(state)
            sdk.append(ids.generate_trace_id())
    assert len(set(ours)) == 100 and ours == sdk


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("always_off", {NOT_SAMPLED}),
        ("parentbased_always_off", {NOT_SAMPLED}),
        ("traceidratio", {NOT_SAMPLED}),
        ("always_on", {READY_IDS}),
        ("parentbased_always_on", {READY_IDS}),
    ],
)
def test_roots_are_drawn_ahead_only_for_samplers_that_decide_by_trace_id(
    name: str, expected: set[RootDecision], sampler: Any
) -> None:
    sampler(name, 0.0)
    drawn()
    assert {decided() for _ in range(50)} == expected


def ready_roots() -> list[tuple[SpanContext, str]]:
    """Ready roots drawn now (as the worker's next cycle would), in the order calls take them."""
    READY_ROOTS._wanted = True
    READY_ROOTS.refill()
    return list(READY_ROOTS._ready)


def test_a_root_with_ready_ids_gets_its_span_as_it_ends(sampler: Any, tmp_path: Path) -> None:
    """Every root sampled: a call takes ready ids and sends their header; its span, made only
    as the call ends, has those ids and starts when the call started."""
    sampler("always_on")
    assert drawn() is READY_IDS
    with LATER._lock:  # no refill meanwhile: the next call takes the first ready root
        context, traceparent = ready_roots()[0]
        started = time.time_ns()
        call = begun()
    assert call.span is None  # nothing built on the caller's path
    assert call.headers({"x-job": "7"}) == {"x-job": "7", "traceparent": traceparent}
    time.sleep(0.05)
    call.finish(ConnectionRefusedError("never made"))
    ended = time.time_ns()
    assert isinstance(call.span, LeanSpan)
    otelkit.shutdown()
    (span,) = [s for s in load_spans(tmp_path) if s.trace_id == f"{context.trace_id:032x}"]
    assert (span.trace_id, span.span_id) == (f"{context.trace_id:032x}", f"{context.span_id:016x}")
    assert span.parent_span_id is None and span.kind.name == "CLIENT"
    assert span.attributes[semconv.ERROR_TYPE] == "ConnectionRefusedError"
    # its start is the call's (to the clock's skew), not the end's
    assert started - 2_000_000 <= span.start_ns <= started + 2_000_000
    assert 50_000_000 <= span.duration_ns <= ended - started + 2_000_000


def test_a_root_finds_no_ready_ids_and_draws_its_own(sampler: Any) -> None:
    sampler("always_on")
    assert drawn() is READY_IDS
    with LATER._lock:
        ready = ready_roots()
        READY_ROOTS._ready.clear()
        call = opened_call()
    assert isinstance(call.span, LeanSpan) and call.sampled
    assert call.span.context.trace_id not in {context.trace_id for context, _ in ready}
    assert call.span.context.trace_id >> 64  # the SDK's 128 random bits


def test_a_current_span_leaves_the_decision_to_the_span(sampler: Any) -> None:
    sampler("parentbased_always_off")
    parent = SpanContext(0xAB, 0xCD, True, TraceFlags(TraceFlags.SAMPLED))
    with trace.use_span(NonRecordingSpan(parent)):
        assert decided() is UNDECIDED
        call = opened_call()
    assert call.sampled and call.span.context.trace_id == 0xAB  # the parent's decision


def test_a_drawn_root_is_not_used_for_a_call_given_its_own_context(sampler: Any) -> None:
    """A streamed request's span has the stream's context as its parent, whatever was drawn."""
    sampler("parentbased_always_off")
    stream = trace.set_span_in_context(
        NonRecordingSpan(SpanContext(0xAB, 0xCD, False, TraceFlags(TraceFlags.SAMPLED)))
    )
    assert drawn() is NOT_SAMPLED
    call = opened_call(stream)
    assert call.sampled and call.span.context.trace_id == 0xAB


def test_a_new_configuration_is_followed_from_its_first_call(sampler: Any) -> None:
    sampler("always_off")
    assert drawn() is NOT_SAMPLED
    sampler("always_on")
    assert decided() is UNDECIDED  # not drawn under the old sampler
    assert opened_call().sampled


def test_an_id_generator_of_its_own_decides_at_the_span(
    sampler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = sampler("parentbased_traceidratio", 1.0)
    monkeypatch.setattr(state.tracer_provider, "id_generator", Sequential())
    monkeypatch.setattr(SWITCH, "generation", SWITCH.generation + 1)
    assert drawn() is UNDECIDED
    call = opened_call()
    assert call.sampled and call.span.context.trace_id > 0x1000  # the generator's own


def duration_counts() -> dict[str, int]:
    """The client duration histogram's count per protocol."""
    counts: dict[str, int] = {}
    for metric in HOT.collect():
        if metric.name == semconv.CLIENT_DURATION.name and isinstance(metric.data, Histogram):
            for point in metric.data.data_points:
                protocol = str(point.attributes[semconv.M_PROTOCOL])
                counts[protocol] = counts.get(protocol, 0) + point.count
    return counts


@pytest.mark.triton
def test_ratio_sampled_calls_export_the_sampled_ones_and_count_them_all(
    triton: TritonServer, tmp_path: Path
) -> None:
    """Half the calls sampled: each sampled one exports its span, under the ratio's bound;
    every call, sampled or not, is in the duration histogram, and none stays in flight."""
    state = otelkit.configure(
        service_name="ratio",
        traces_dir=str(tmp_path),
        sampler="parentbased_traceidratio",
        sampler_arg=0.5,
    )
    calls = 48
    try:
        before = duration_counts()
        for module, url in ((grpcclient, triton.grpc_url), (httpclient, triton.http_url)):
            client = otelkit.instrument(module.InferenceServerClient(url))
            tensor = module.InferInput("INPUT0", list(DATA.shape), "FP32")
            tensor.set_data_from_numpy(DATA)
            for _ in range(calls):
                result = client.infer("identity_fp32", [tensor])
                assert np.array_equal(result.as_numpy("OUTPUT0"), DATA)
            client.close()
        telemetry.flush()
        after = duration_counts()
        servers = {triton.grpc_url, triton.http_url}
        in_flight = [
            point.value
            for metric in HOT.collect()
            if metric.name == semconv.CLIENT_IN_FLIGHT.name
            for point in metric.data.data_points  # type: ignore[union-attr]
            if point.attributes[semconv.M_SERVER] in servers
        ]
        stats = state.stats()
    finally:
        otelkit.shutdown()
    for protocol in ("grpc", "http"):
        assert after[protocol] - before.get(protocol, 0) == calls
    assert in_flight and set(in_flight) == {0}
    spans = [span for span in load_spans(tmp_path) if span.kind.name == "CLIENT"]
    assert stats == {"exported": len(spans), "queued": 0, "in_export": 0}  # nothing dropped
    by_protocol = {
        protocol: [s for s in spans if s.attributes[semconv.PROTOCOL] == protocol]
        for protocol in ("grpc", "http")
    }
    # binomial(48, 0.5) outside [8, 40]: about 1 in 2.6 million
    assert all(8 <= len(found) <= 40 for found in by_protocol.values()), by_protocol
    for span in spans:
        assert span.parent_span_id is None
        assert int(span.trace_id, 16) % 2**64 < 2**63  # the ratio's bound, on the low 64 bits


@dataclass
class Summed:
    """A client metric's points summed over the servers they name: a client whose grpcio does not
    tell its channel's target names it ``unknown`` (otelkit._core.deps.grpcio)."""

    value: float = 0
    count: int = 0


def client_points(name: str, model: str, protocol: str) -> dict[str, Summed]:
    """The points of one client metric for ``model``, by error type (or "" for none)."""
    summed: dict[str, Summed] = {}
    for metric in HOT.collect():
        if metric.name != name:
            continue
        for point in metric.data.data_points:  # type: ignore[union-attr]
            attributes = point.attributes
            if attributes[semconv.M_MODEL] != model or attributes[semconv.M_PROTOCOL] != protocol:
                continue
            total = summed.setdefault(str(attributes.get(semconv.M_ERROR_TYPE, "")), Summed())
            total.value += getattr(point, "value", 0)
            total.count += getattr(point, "count", 0)
    return summed


def recording_own_errors(client: Any, raised: list[BaseException]) -> Callable[[], None]:
    """Have the instrumented ``infer`` of ``client`` (sync or asyncio) call, in place of the
    client's own, one that notes each exception it raises in ``raised``; returns the undo."""
    wrapper = client.__dict__["infer"].__func__
    cell = wrapper.__closure__[wrapper.__code__.co_freevars.index("original")]
    own = cell.cell_contents

    def recording(*args: Any, **kwargs: Any) -> Any:
        try:
            return own(*args, **kwargs)
        except Exception as error:
            raised.append(error)
            raise

    async def awaited(*args: Any, **kwargs: Any) -> Any:
        try:
            return await own(*args, **kwargs)
        except Exception as error:
            raised.append(error)
            raise

    cell.cell_contents = awaited if inspect.iscoroutinefunction(own) else recording
    return functools.partial(setattr, cell, "cell_contents", own)


@pytest.mark.triton
@pytest.mark.parametrize("style", ["sync", "asyncio"])
@pytest.mark.parametrize(("protocol", "error_type"), [("grpc", "NOT_FOUND"), ("http", "404")])
def test_a_failed_call_not_sampled_raises_its_own_exception_and_is_counted(
    style: str, protocol: str, error_type: str, triton: TritonServer, tmp_path: Path
) -> None:
    """The short path of a call not sampled: the exception the client raised reaches the
    caller as the very same object, and the failure is in the error counter and the
    duration histogram at once; nothing stays in flight, no span."""
    otelkit.configure(service_name="unsampled", traces_dir=str(tmp_path), sampler="always_off")
    url = triton.grpc_url if protocol == "grpc" else triton.http_url
    module = importlib.import_module(
        f"tritonclient.{protocol}" + (".aio" if style == "asyncio" else "")
    )
    raised: list[BaseException] = []
    tensor = module.InferInput("INPUT0", list(DATA.shape), "FP32")
    tensor.set_data_from_numpy(DATA)

    def points() -> tuple[dict[str, Any], ...]:
        names = (semconv.CLIENT_ERRORS, semconv.CLIENT_DURATION, semconv.CLIENT_IN_FLIGHT)
        return tuple(client_points(spec.name, "no_such_model", protocol) for spec in names)

    async def calls() -> tuple[tuple[dict[str, Any], ...], tuple[dict[str, Any], ...], Any]:
        client = otelkit.instrument(module.InferenceServerClient(url))
        undo = recording_own_errors(client, raised)
        try:
            result = client.infer("identity_fp32", [tensor])  # the short path from here on
            if style == "asyncio":
                await result
            before = points()
            with pytest.raises(Exception) as caught:
                failed = client.infer("no_such_model", [tensor])
                if style == "asyncio":
                    await failed
            return before, points(), caught.value
        finally:
            undo()
            closed = client.close()
            if style == "asyncio":
                await closed

    try:
        (errors, durations, _), (errors_after, durations_after, in_flight), error = asyncio.run(
            calls()
        )
        telemetry.flush()
    finally:
        otelkit.shutdown()
    assert raised and error is raised[-1]
    before = errors[error_type].value if error_type in errors else 0
    assert errors_after[error_type].value == before + 1
    calls_before = durations[""].count if durations else 0
    assert durations_after[""].count == calls_before + 1 and in_flight[""].value == 0
    assert load_spans(tmp_path) == []
