"""The instrumented client when its tritonclient release lacks a private attribute otelkit
hooks (``otelkit._core.deps.tritonclient``): the call is answered, traced and counted as
before, without the phases the transport hook measures, and one log line says so.

Each test makes otelkit look for a name the real client does not have, as it would find a
release that renamed it; the client's own methods keep theirs.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

import otelkit
from otelkit import semconv
from otelkit._core import deps
from otelkit._core.deps import grpcio
from otelkit._core.deps import tritonclient as triton_private
from otelkit.analysis import load_spans
from otelkit.client import _transport
from otelkit.receiver import Receiver
from otelkit.tritonserver import TritonServer
from tests.client.test_client import (
    DATA,
    client_for,
    client_span,
    expected_tree,
    inputs,
    shape,
    telemetry,
    traced,
)
from tests.client.test_client_interceptors import CONTRIB_SPAN, recorder
from tests.support import joined_trace, otelkit_lines

__all__ = ["recorder", "telemetry"]  # the fixtures, shared with test_client(_interceptors)

PHASES = {semconv.SERIALIZE_S, semconv.WIRE_S, semconv.DESERIALIZE_S}


pytestmark = pytest.mark.usefixtures("fresh_warnings")


def renamed(monkeypatch: pytest.MonkeyPatch, accessor: str, name: str) -> None:
    """otelkit's accessor looks for ``name`` + ``_renamed``, which no client has."""

    def missing(client: object) -> object:
        return triton_private._attribute(client, f"{name}_renamed", triton_private._UNHOOKED)

    monkeypatch.setattr(triton_private, accessor, missing)


@pytest.mark.parametrize(
    ("protocol", "accessor", "name"),
    [
        ("grpc", "stub", "_client_stub"),
        ("grpc", "channel", "_channel"),
        ("http", "http_post", "_post"),
    ],
)
def test_a_client_without_the_hooked_attribute_is_traced_without_its_phases(
    protocol: str,
    accessor: str,
    name: str,
    triton: TritonServer,
    receiver: Receiver,
    telemetry: otelkit.Telemetry,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    renamed(monkeypatch, accessor, name)
    results = []
    with caplog.at_level(logging.WARNING, logger="otelkit"), client_for(protocol, triton) as client:
        otelkit.instrument(client)

        def call() -> str:
            trace_id, _, result = traced(lambda: client.infer("identity_fp32", inputs(protocol)))
            results.append(result)
            return trace_id

        trace_id, spans = joined_trace(call, receiver.out_dir, count=5)
        client.infer("identity_fp32", inputs(protocol))  # and again: no second line
    assert np.array_equal(results[-1].as_numpy("OUTPUT0"), DATA)
    assert shape(spans, trace_id) == expected_tree(protocol)
    span = client_span(spans)
    assert PHASES.isdisjoint(span.attributes)
    assert span.attributes[semconv.REQUEST_BYTES] == span.attributes[semconv.RESPONSE_BYTES]
    assert span.attributes[semconv.INPUT_COUNT] == 1
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("otelkit: ")]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"otelkit: tritonclient {deps.version_of('tritonclient')} has no ")
    assert f"{name}_renamed" in lines[0] and "without their phases" in lines[0]


# grpcio's private names (``otelkit._core.deps.grpcio``): renamed as a newer grpcio could.


def test_a_channel_that_does_not_tell_its_interceptors_is_taken_as_intercepted(
    triton: TritonServer,
    receiver: Receiver,
    telemetry: otelkit.Telemetry,
    recorder: object,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Through OpenTelemetry's gRPC interceptor: one CLIENT span, otelkit's, with its phases
    and Triton's spans under it, as when grpcio tells."""
    monkeypatch.setattr(grpcio, "_WRAPPER_INTERCEPTOR", "_interceptor_renamed")
    with (
        caplog.at_level(logging.WARNING, logger="otelkit"),
        otelkit.instrument(grpcclient.InferenceServerClient(triton.grpc_url)) as client,
    ):

        def call() -> str:
            trace_id, _, result = traced(lambda: client.infer("identity_fp32", inputs("grpc")))
            assert np.array_equal(result.as_numpy("OUTPUT0"), DATA)
            return trace_id

        trace_id, spans = joined_trace(call, receiver.out_dir, count=5)
    assert shape(spans, trace_id) == expected_tree("grpc")
    assert set(client_span(spans).attributes) >= PHASES
    assert [s for s in load_spans(receiver.out_dir) if s.name == CONTRIB_SPAN] == []
    (line,) = otelkit_lines(caplog)
    assert line.startswith(f"otelkit: grpcio {deps.version_of('grpcio')} has no ")
    assert "._interceptor_renamed and ._unary_unary_interceptors;" in line  # named by its class
    assert "instrumentation suppressed" in line


class _OlderChannel:
    """grpcio's sync channel as a release without ``unary_unary``'s ``_registered_method``
    would make it."""

    __module__ = "grpc._channel"

    def __init__(self, channel: Any) -> None:
        self._real = channel

    def unary_unary(self, method: str, serialize: Any, parse: Any) -> Any:
        return self._real.unary_unary(method, serialize, parse)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_channel_without_registered_methods_gets_an_unregistered_model_infer(
    triton: TritonServer,
    receiver: Receiver,
    telemetry: otelkit.Telemetry,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    own = triton_private.channel
    monkeypatch.setattr(triton_private, "channel", lambda client: _OlderChannel(own(client)))
    with (
        caplog.at_level(logging.WARNING, logger="otelkit"),
        otelkit.instrument(grpcclient.InferenceServerClient(triton.grpc_url)) as client,
    ):

        def call() -> str:
            trace_id, _, result = traced(lambda: client.infer("identity_fp32", inputs("grpc")))
            assert np.array_equal(result.as_numpy("OUTPUT0"), DATA)
            return trace_id

        trace_id, spans = joined_trace(call, receiver.out_dir, count=5)
    assert shape(spans, trace_id) == expected_tree("grpc")
    assert set(client_span(spans).attributes) >= PHASES
    (line,) = otelkit_lines(caplog)
    assert "_OlderChannel.unary_unary(_registered_method=)" in line
    assert "unregistered" in line


def test_a_multicallable_of_grpcio_that_hides_its_codec_is_served_by_the_stubs_messages(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from tritonclient.grpc import service_pb2

    class _UnaryUnaryMultiCallable:  # grpcio's, as a release that renamed its fields
        __module__ = "grpc._channel"

    with caplog.at_level(logging.WARNING, logger="otelkit"):
        assert grpcio.multicallable_codec(object()) is None  # an interceptor's: quietly
        codec = _transport._model_infer_codec(_UnaryUnaryMultiCallable())
        _transport._model_infer_codec(_UnaryUnaryMultiCallable())
    assert codec == (
        service_pb2.ModelInferRequest.SerializeToString,
        service_pb2.ModelInferResponse.FromString,
    )
    (line,) = otelkit_lines(caplog)
    assert line.startswith(f"otelkit: grpcio {deps.version_of('grpcio')} has no grpc._channel.")
    assert "_request_serializer and _response_deserializer" in line


def test_tensor_bytes_kept_elsewhere_are_counted_zero_with_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Where tritonclient keeps a request's and a response's binary tensors (``_raw_content``,
    ``_raw_data``, ``_buffer``) is read with a default: a release that moves them would count
    0 bytes silently but for these checks."""
    from types import SimpleNamespace

    from otelkit.client._target import HTTP_TENSORS

    with caplog.at_level(logging.WARNING, logger="otelkit"):
        triton_private.check_input_bytes("tritonclient.grpc", "_raw_content")
        triton_private.check_input_bytes("tritonclient.http", "_raw_data")
        assert otelkit_lines(caplog) == []
        assert HTTP_TENSORS.response(SimpleNamespace(_buffer=b"1234")) == (4, None)
        assert otelkit_lines(caplog) == []
        for _ in range(2):
            triton_private.check_input_bytes("tritonclient.grpc.aio", "_raw_content_moved")
            assert HTTP_TENSORS.response(SimpleNamespace()) == (0, None)
    lines = otelkit_lines(caplog)
    assert len(lines) == 2, lines
    assert "tritonclient.grpc.aio.InferInput._raw_content_moved; otelkit counts" in lines[0]
    assert "SimpleNamespace._buffer; otelkit counts its responses' bytes as 0" in lines[1]
