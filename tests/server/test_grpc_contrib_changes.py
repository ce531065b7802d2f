"""``otelkit.server.grpc`` when ``opentelemetry-instrumentation-grpc``'s private parts change
(``otelkit._core.deps.grpc_instrumentation``): every RPC is still answered, with one log line.

A real grpcio server and the real ``tritonclient.grpc``, with the contrib package patched the
way a newer release could change it: a new call on the span otelkit hands it, new arguments to
the methods otelkit overrides, those methods renamed.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.instrumentation.grpc import _server as contrib

import otelkit
from otelkit import semconv
from otelkit._core.deps import grpc_instrumentation
from otelkit.analysis import Span, load_spans
from otelkit.server import grpc as server_grpc
from otelkit.testing import wait_until
from otelkit.tritonserver import free_port
from tests.server.test_grpc import MODELS, SCOPE, BrokenServicer, answer, grpc_server

EXPECTED = [[0, 2, 4], [6, 8, 10]]
INFER = "inference.GRPCInferenceService/ModelInfer"


def infer_spans(directory: Path) -> list[Span]:
    """otelkit's SERVER spans of ModelInfer in ``directory``, once one has arrived."""
    return wait_until(
        lambda: [
            s
            for s in load_spans(directory)
            if s.scope == SCOPE and s.attributes.get(semconv.RPC_METHOD) == INFER
        ],
        what=f"otelkit's SERVER span of {INFER}",
    )


@pytest.fixture
def traces(tmp_path: Path) -> Iterator[Path]:
    otelkit.configure(service_name="grpc-contrib", traces_dir=tmp_path, metrics_exporter="none")
    yield tmp_path
    otelkit.shutdown()


pytestmark = pytest.mark.usefixtures("fresh_warnings")


def served_answer() -> Any:
    port = free_port()
    interceptor = server_grpc.server_interceptor("127.0.0.1", port)
    server = grpc_server(BrokenServicer(MODELS), port, interceptors=[interceptor], workers=2)
    try:
        return answer(port)
    finally:
        server.stop(None)


def test_a_new_call_on_the_span_is_ignored_and_the_rpc_traced(
    traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own_init = contrib._OpenTelemetryServicerContext.__init__

    def init(self: Any, servicer_context: Any, active_span: Any) -> None:
        own_init(self, servicer_context, active_span)
        active_span.add_event("a call a newer contrib release makes")  # not in otelkit's span
        active_span.set_attributes({"rpc.grpc.new": 1})

    monkeypatch.setattr(contrib._OpenTelemetryServicerContext, "__init__", init)
    assert served_answer() == EXPECTED
    otelkit.flush()
    (span,) = infer_spans(traces)
    assert span.attributes["rpc.response.status_code"] == "OK"


def test_new_arguments_to_the_overridden_methods_are_taken(
    traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = contrib.OpenTelemetryServerInterceptor.intercept_service

    def intercept_service(self: Any, continuation: Any, handler_call_details: Any) -> Any:
        start, remote = self._start_span, self._set_remote_context
        self._start_span = lambda *a, **k: start(*a, "new positional", new_keyword=True, **k)
        self._set_remote_context = lambda *a, **k: remote(*a, new_keyword=True, **k)
        return own(self, continuation, handler_call_details)

    monkeypatch.setattr(
        contrib.OpenTelemetryServerInterceptor, "intercept_service", intercept_service
    )
    assert served_answer() == EXPECTED
    otelkit.flush()
    assert len(infer_spans(traces)) == 1


@pytest.fixture
def renamed_start_span(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The contrib's ``_start_span`` renamed in a newer release; afterwards, as it was, and
    otelkit's module imported again over it."""
    start = contrib.OpenTelemetryServerInterceptor._start_span
    monkeypatch.delattr(contrib.OpenTelemetryServerInterceptor, "_start_span")
    monkeypatch.setattr(
        contrib.OpenTelemetryServerInterceptor, "_start_server_span", start, raising=False
    )
    yield
    monkeypatch.undo()
    importlib.reload(server_grpc)


def test_a_renamed_private_method_serves_every_rpc_untraced_with_one_log_line(
    renamed_start_span: None, traces: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="otelkit"):
        importlib.reload(server_grpc)  # otelkit's module imported over the new release
        importlib.reload(server_grpc)  # a second import: still one line
        assert served_answer() == EXPECTED
        assert served_answer() == EXPECTED
    lines = [r.getMessage() for r in caplog.records if "instrumentation-grpc" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("otelkit: opentelemetry-instrumentation-grpc ")
    assert "OpenTelemetryServerInterceptor._start_span" in lines[0]
    assert "pass-through" in lines[0]
    assert issubclass(server_grpc.ServerInterceptor, grpc_instrumentation.PassThroughInterceptor)
    assert issubclass(server_grpc.ServerInterceptor, grpc.ServerInterceptor)
