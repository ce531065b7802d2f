"""What otelkit shows its users, fixed: each public package's and module's names, nothing leaked
beside them, and every implementation module private (``_name.py``).

A change here is a change of the public API: it belongs in CHANGELOG.md. (httpx's
``tests/test_exported_members.py`` is the model.)
"""

from __future__ import annotations

import importlib
import types
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "otelkit"

#: The public modules and packages, with the whole of their API.
PUBLIC: dict[str, list[str]] = {
    "otelkit": [
        "ConfigError",
        "MissingExtraError",
        "OtelkitError",
        "Telemetry",
        "configure",
        "extract",
        "flush",
        "inject",
        "instrument",
        "shutdown",
        "stage",
        "uninstrument",
    ],
    "otelkit.analysis": [
        "Breakdown",
        "Selection",
        "SlowestStage",
        "Span",
        "SpanEvent",
        "SpanKind",
        "SpanLink",
        "SpanSource",
        "StatusCode",
        "Trace",
        "answered_by",
        "breakdown",
        "build_traces",
        "format_breakdowns",
        "group_key",
        "iter_spans",
        "load_spans",
        "open_source",
        "trace_components",
        "trace_files",
    ],
    "otelkit.auto": ["OtelkitDistro", "TritonClientInstrumentor"],
    "otelkit.cli": ["main"],
    "otelkit.client": [
        "instrument_classes",
        "instrument_client",
        "is_triton_client",
        "uninstrument_classes",
        "uninstrument_client",
    ],
    "otelkit.dashboards": [
        "DASHBOARDS",
        "DashboardOptions",
        "PanelQuery",
        "dumps",
        "grafanalib_dashboard",
        "panel_queries",
        "render",
        "substitute",
        "write",
    ],
    "otelkit.export": [],
    "otelkit.fleet": [
        "DirectoryRegistry",
        "Draining",
        "EtcdRegistry",
        "FleetError",
        "Listing",
        "LocalEnvoy",
        "LocalEtcd",
        "Registration",
        "RegistrationError",
        "Registry",
        "Renderer",
        "RendererMetrics",
        "ServerRecord",
        "envoy_binary",
        "envoy_config",
        "envoy_hosts",
        "write_config",
    ],
    "otelkit.gpu": [
        "Device",
        "FIELDS",
        "FieldNoData",
        "FieldNotSupported",
        "GpuBackend",
        "GpuLost",
        "GpuProcess",
        "GpuReadError",
        "GpuSampler",
        "GpuUnavailable",
        "NvmlBackend",
        "Reading",
        "RecordingError",
        "ReplayBackend",
        "Sample",
        "record",
    ],
    "otelkit.receiver": ["Receiver", "ReceiverProcess", "add_arguments", "run"],
    "otelkit.report": ["Report"],
    "otelkit.semconv": [
        "DURATION_BUCKETS_S",
        "METRICS",
        "MetricSpec",
        "PREFIX",
        "prometheus_metric_name",
        "prometheus_name",
    ],
    "otelkit.server": ["Stage", "StageRun", "stage"],
    "otelkit.server.fastapi": ["ServerSpanMiddleware", "instrument_app", "uninstrument_app"],
    "otelkit.server.grpc": [
        "AioServerInterceptor",
        "ServerInterceptor",
        "aio_server_interceptor",
        "server_interceptor",
    ],
    "otelkit.server.pytriton": ["install_tracer", "traced"],
    "otelkit.server.ray_serve": [
        "instrument_deployment",
        "runtime_env",
        "serve_span_processors",
        "setup",
        "uninstrument_deployment",
    ],
    "otelkit.server.triton_backend": ["batch", "each_request", "request_context", "serving"],
    "otelkit.study": [
        "Endpoint",
        "Fleet",
        "FunctionCalls",
        "Load",
        "ModelCalls",
        "Point",
        "RayServe",
        "Remote",
        "Server",
        "Study",
        "StudyError",
        "StudyResults",
        "Tracing",
        "Triton",
        "Workload",
        "compare",
        "format_comparison",
        "merge_parts",
        "read_results",
        "run",
    ],
    "otelkit.telemetry": ["Telemetry", "configure", "current", "flush", "shutdown"],
    "otelkit.testing": [
        "Capture",
        "MemoryCapture",
        "ReceiverCapture",
        "answers",
        "components",
        "tree",
        "wait_until",
    ],
    "otelkit.testing.pytest_plugin": [
        "otelkit_receiver",
        "otelkit_receiver_server",
        "otelkit_spans",
        "wait_until",
    ],
    "otelkit.tritonserver": [
        "TritonInstall",
        "TritonServer",
        "TritonStartError",
        "free_port",
        "triton_install",
    ],
}

#: Packages that only gather their private modules' public names: nothing else shows in them.
GATHERING = [
    "otelkit",
    "otelkit.analysis",
    "otelkit.export",
    "otelkit.fleet",
    "otelkit.gpu",
    "otelkit.report",
    "otelkit.study",
    "otelkit.testing",
]
#: Run as ``python -m``: public by its name, with nothing to import.
COMMANDS = {"otelkit.tritonserver.__main__"}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names(module: str) -> None:
    imported = importlib.import_module(module)
    assert sorted(imported.__all__) == PUBLIC[module]
    for name in imported.__all__:
        value = getattr(imported, name)
        if isinstance(value, (type, types.FunctionType)):
            assert value.__doc__, f"{module}.{name} has no docstring"


@pytest.mark.parametrize("package", GATHERING)
def test_a_gathering_package_shows_only_its_public_names(package: str) -> None:
    imported = importlib.import_module(package)
    shown = {
        name
        for name, value in vars(imported).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and str(getattr(value, "__module__", "")).startswith("otelkit")
    }
    assert shown - set(imported.__all__) == set()


def test_implementation_modules_are_private() -> None:
    public = set(PUBLIC) | COMMANDS
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if any(part.startswith("_") and part not in {"__init__", "__main__"} for part in parts):
            continue
        found.append(name)
    assert sorted(set(found) - public) == []
    assert sorted(public - set(found)) == []
