"""The private names of OpenTelemetry that otelkit reads (``otelkit._core.deps``), each taken
away as a newer release could: ``import otelkit`` works, stages and spans are still recorded,
and one log line says what is missing and what otelkit does instead."""

from __future__ import annotations

import contextvars
import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from opentelemetry import context as otel_context
from opentelemetry.sdk.resources import Resource

import otelkit
from otelkit._core import deps, spans
from otelkit._core.deps import otel
from otelkit.analysis import build_traces, load_spans
from tests.support import otelkit_lines

# Imports otelkit with NAME gone from MODULE (a copy of the module without it stands in for
# it, so the API's own functions, and the SDK imported before, keep theirs), runs nested
# stages and prints their tree.
_WITHOUT = textwrap.dedent("""
    import importlib, json, sys, types
    module_name, name, out = sys.argv[1:4]
    # OpenTelemetry's own packages imported first (those of a newer release go with its API),
    # then otelkit's modules forgotten, to import them again over the newer module
    import opentelemetry.sdk.metrics, opentelemetry.sdk.trace, otelkit.telemetry
    for loaded in [m for m in sys.modules if m == "otelkit" or m.startswith("otelkit.")]:
        del sys.modules[loaded]
    real = importlib.import_module(module_name)
    newer = types.ModuleType(module_name)
    newer.__dict__.update({k: v for k, v in vars(real).items() if k != name})
    sys.modules[module_name] = newer
    parent, _, child = module_name.rpartition(".")
    setattr(sys.modules[parent], child, newer)

    import otelkit
    from otelkit.analysis import build_traces, load_spans

    otelkit.configure(service_name="deps", traces_dir=out, metrics_exporter="none")
    with otelkit.stage("outer"):
        with otelkit.stage("inner"):
            pass
    otelkit.flush()
    trees = build_traces(load_spans(out)).values()
    print(json.dumps([[(depth, span.name) for depth, span in tree.walk()] for tree in trees]))
""")


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("opentelemetry.context", "_RUNTIME_CONTEXT"),
        ("opentelemetry.context", "_SUPPRESS_INSTRUMENTATION_KEY"),
        ("opentelemetry.trace.propagation", "_SPAN_KEY"),
    ],
)
def test_otelkit_imports_and_records_without_a_private_name_of_the_api(
    module: str, name: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT, module, name, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [[[0, "outer"], [1, "inner"]]]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert f"otelkit: opentelemetry-api {deps.version_of('opentelemetry-api')} has no " in lines[0]
    assert name in lines[0]


def test_the_public_runtime_attaches_reads_and_detaches(
    fresh_warnings: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="otelkit"):
        runtime = otel._runtime_context(SimpleNamespace())
        otel._runtime_context(SimpleNamespace())
    (line,) = otelkit_lines(caplog)
    assert "_RUNTIME_CONTEXT" in line and "opentelemetry.context's functions" in line
    inner = otel_context.set_value("k", 1)
    token = runtime.attach(inner)
    assert runtime.get_current() is inner is otel_context.get_current()
    runtime.detach(token)
    assert otel_context.get_current().get("k") is None


def test_a_runtime_without_its_context_variable_is_read_through_get_current(
    fresh_warnings: None, caplog: pytest.LogCaptureFixture
) -> None:
    current = otel_context.set_value("k", 2)
    newer = type("ContextVarsRuntimeContext", (), {"get_current": lambda self: current})()
    with caplog.at_level(logging.WARNING, logger="otelkit"):
        read = otel.context_reader(newer)
        other = otel.context_reader(SimpleNamespace(get_current=lambda: current))  # quietly
    assert read() is current and other() is current
    (line,) = otelkit_lines(caplog)
    assert "_current_context" in line
    variable: contextvars.ContextVar[object] = contextvars.ContextVar("v")
    assert otel.context_reader(SimpleNamespace(_current_context=variable)) == variable.get


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Path]:
    otelkit.configure(service_name="deps", traces_dir=tmp_path, metrics_exporter="none")
    yield tmp_path
    otelkit.shutdown()


def test_without_the_sdks_span_processor_spans_go_through_the_sdks_tracer(
    fresh_warnings: None,
    local: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the provider as a newer SDK could make it: no _active_span_processor
    monkeypatch.setattr(
        spans, "active_span_processor", lambda provider: otel.active_span_processor(object())
    )
    with caplog.at_level(logging.WARNING, logger="otelkit"):
        otelkit.configure(service_name="deps", traces_dir=local, metrics_exporter="none")
        with otelkit.stage("outer"), otelkit.stage("inner"):
            pass
    otelkit.flush()
    trees = build_traces(load_spans(local)).values()
    assert [[(d, s.name) for d, s in tree.walk()] for tree in trees] == [
        [(0, "outer"), (1, "inner")]
    ]
    (line,) = otelkit_lines(caplog)
    assert "opentelemetry-sdk" in line and "_active_span_processor" in line
    assert "SDK's tracer" in line


def test_a_forked_childs_resource_falls_back_to_the_providers_resource_then_to_none(
    fresh_warnings: None, caplog: pytest.LogCaptureFixture
) -> None:
    pid = Resource({"process.pid": 7})
    older = SimpleNamespace(resource=Resource({"service.name": "s"}), _resource=None)
    assert otel.merge_resource(older, pid)
    assert dict(older._resource.attributes) == {"service.name": "s", "process.pid": 7}
    with caplog.at_level(logging.WARNING, logger="otelkit"):
        assert not otel.merge_resource(SimpleNamespace(resource=Resource({})), pid)
    (line,) = otelkit_lines(caplog)
    assert "process.pid" in line


def test_the_keys_found_through_the_public_api_are_the_apis_own() -> None:
    from opentelemetry.trace import propagation

    assert otel._span_key(SimpleNamespace()) == propagation._SPAN_KEY == otel.SPAN_KEY
    suppress = otel._suppress_key(SimpleNamespace())
    assert (
        suppress == otel_context._SUPPRESS_INSTRUMENTATION_KEY == otel.SUPPRESS_INSTRUMENTATION_KEY
    )


def test_rays_private_parts_missing_cost_their_hook_or_figure_with_one_line(
    fresh_warnings: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from ray._private import state

    from otelkit._core.deps import ray as ray_private

    assert ray_private.serve_class("ray.serve.batching", "_BatchQueue") is not None
    monkeypatch.delattr(state, "actors")
    with caplog.at_level(logging.WARNING, logger="otelkit"):
        assert ray_private.serve_class("ray.serve.batching", "_RenamedQueue") is None
        assert ray_private.serve_class("ray.serve._moved", "UserCallableWrapper") is None
        assert ray_private.actor_table() == {}
        assert ray_private.actor_table() == {}
    lines = otelkit_lines(caplog)
    assert [line.split(" has no ")[1].split(";")[0] for line in lines] == [
        "ray.serve.batching._RenamedQueue",
        "ray.serve._moved.UserCallableWrapper",
        "ray._private.state.actors",
    ]
    assert all(line.startswith(f"otelkit: ray {deps.version_of('ray')} ") for line in lines)


def test_a_grpc_channel_without_its_target_names_the_server_unknown_with_one_line(
    fresh_warnings: None, caplog: pytest.LogCaptureFixture
) -> None:
    """grpcio's asyncio channel tells its target from 1.82 on; before, otelkit's spans name the
    server ``unknown`` (checked at 1.67.1 by ``make check-lowest``)."""
    import grpc

    from otelkit._core.deps import grpcio

    channel = grpc.insecure_channel("127.0.0.1:8001")
    try:
        assert grpcio.channel_target(SimpleNamespace(_channel=channel)) == "dns:///127.0.0.1:8001"
    finally:
        channel.close()

    class AioChannel:  # what grpcio 1.67's asyncio channel holds: no target
        def close(self) -> None: ...

    with caplog.at_level(logging.WARNING, logger="otelkit"):
        assert grpcio.channel_target(SimpleNamespace(_channel=AioChannel())) is None
        assert grpcio.channel_target(SimpleNamespace(_channel=AioChannel())) is None
    lines = otelkit_lines(caplog)
    assert len(lines) == 1
    assert lines[0].startswith(f"otelkit: grpcio {deps.version_of('grpcio')} has no ")
    assert lines[0].endswith(".AioChannel.target; otelkit names the server 'unknown'")
