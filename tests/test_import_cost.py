"""What ``import otelkit`` loads: the modules a stage needs, not the exporters and their clients.

A Triton Python-backend instance or a PyTriton worker that only wants ``@otelkit.stage`` pays
for every module ``import otelkit`` brings, in every instance it starts. The exporters, their
clients (requests, protobuf, gRPC, prometheus_client) and the SDK's metrics come with
``configure()``, the integrations with their own modules. The literal list below is the whole
of otelkit's share: a new eager import changes it, and shows in review.
(``benchmarks/bench_import.py`` measures the time; docs/performance.md has the figures.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.paths import ROOT

#: Modules ``import otelkit`` must not load, with their submodules.
HEAVY = (
    "email",
    "google.protobuf",
    "grpc",
    "importlib.metadata",
    "multiprocessing",
    "numpy",
    "opentelemetry.exporter",
    "opentelemetry.proto",
    "opentelemetry.sdk.metrics",
    "prometheus_client",
    "pynvml",
    "ray",
    "requests",
    "starlette",
    "torch",
    "tritonclient",
    "urllib3",
    "wsgiref",
)

#: What a process that exports OTLP-JSON lines (the embedded default) never needs.
EXPORT_CLIENTS = (
    "google.protobuf",
    "grpc",
    "opentelemetry.exporter",
    "opentelemetry.proto",
    "prometheus_client",
    "requests",
    "urllib3",
    "wsgiref",
)

#: Every otelkit module ``import otelkit`` loads: the stage, its spans and hot metrics, and W3C
#: propagation (``inject``, ``extract``).
OTELKIT_MODULES = [
    "otelkit",
    "otelkit._core",
    "otelkit._core.baggage",
    "otelkit._core.carriers",
    "otelkit._core.context",
    "otelkit._core.deps",
    "otelkit._core.deps.otel",
    "otelkit._core.guard",
    "otelkit._core.hotmetrics",
    "otelkit._core.spans",
    "otelkit._core.switch",
    "otelkit._core.worker",
    "otelkit._errors",
    "otelkit._propagation",
    "otelkit.gpu",
    "otelkit.gpu._cuda_events",
    "otelkit.semconv",
    "otelkit.server",
    "otelkit.server._stage",
]


def loaded_by(code: str) -> list[str]:
    """``sys.modules`` after ``code`` runs in a fresh interpreter that imports this tree."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("OTEL_", "OTELKIT_"))  # the defaults, whatever runs the tests
    }
    found = subprocess.run(  # in ROOT: ``-c`` puts the working directory first on sys.path
        [sys.executable, "-c", f"{code}\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
        cwd=ROOT,
        env=environment,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    modules: list[str] = json.loads(found.splitlines()[-1])
    return modules


def heavy(modules: list[str], names: tuple[str, ...] = HEAVY) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(f"{h}.") for h in names)]


def test_import_otelkit_loads_no_exporter_and_no_client_library() -> None:
    assert heavy(loaded_by("import otelkit")) == []


def test_import_otelkit_loads_exactly_these_otelkit_modules() -> None:
    modules = loaded_by("import otelkit")
    assert [m for m in modules if m == "otelkit" or m.startswith("otelkit.")] == OTELKIT_MODULES


def test_a_stage_runs_right_after_import_without_loading_more() -> None:
    code = (
        "import otelkit\n"
        "@otelkit.stage('frnn', model='tracking')\n"
        "def build_graph(points): return len(points)\n"
        "assert build_graph([1, 2]) == 2\n"
        "with otelkit.stage('filter') as run: run.set(edges=3)"
    )
    assert heavy(loaded_by(code)) == []


def test_the_public_names_come_on_first_use() -> None:
    modules = loaded_by("import otelkit\nassert callable(otelkit.configure)")
    assert "otelkit.telemetry" in modules
    assert "otelkit.telemetry" not in loaded_by("import otelkit")


def test_configure_with_the_embedded_default_loads_no_export_client(tmp_path: Path) -> None:
    code = (
        "import otelkit\n"
        f"otelkit.configure(service_name='import-cost', traces_dir={str(tmp_path)!r})\n"
        "with otelkit.stage('frnn'): pass\n"
        "assert otelkit.flush()\n"
        "otelkit.shutdown()"
    )
    assert heavy(loaded_by(code), EXPORT_CLIENTS) == []
    assert list(tmp_path.glob("traces-import-cost-*.jsonl"))  # the span was written
