"""The instrumented client when its tritonclient release lacks a private attribute otelkit
hooks (``otelkit._core.deps.tritonclient``): the call is answered, traced and counted as
before, without the phases the transport hook measures, and one log line says so.

Each test makes otelkit look for a name the real client does not have, as it would find a
release that renamed it; the client's own methods keep theirs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import pytest

import otelkit
from otelkit import semconv
from otelkit._core import deps
from otelkit._core.deps import tritonclient as triton_private
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
from tests.support import joined_trace

__all__ = ["telemetry"]  # the fixture, shared with test_client

PHASES = {semconv.SERIALIZE_S, semconv.WIRE_S, semconv.DESERIALIZE_S}


@pytest.fixture(autouse=True)
def fresh_warnings() -> Iterator[None]:
    saved = dict(deps.DEGRADED)
    deps.DEGRADED.clear()
    yield
    deps.DEGRADED.clear()
    deps.DEGRADED.update(saved)


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
