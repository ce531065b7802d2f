"""``otelkit.configure()`` is typed down to its keyword arguments: mypy rejects a misspelt option,
a value of the wrong type or outside a choice option's choices, and accepts the calls the docs
show."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import otelkit

# Each line marked ``# error`` must be reported by mypy, on that line; no other line may be.
CALLS = """
from pathlib import Path

import otelkit
from otelkit.study import ModelCalls

otelkit.configure()
otelkit.configure(service_name="tracking-client", prometheus_port=9464)
otelkit.configure(sampler="parentbased_ratelimiting", sampler_arg=50, metrics_exporter="none")
otelkit.configure(traces_dir=Path("traces"), headers={"authorization": "Bearer t"}, gpu=True)
otelkit.configure(endpoint=None, resource_attributes="team=trk")
otelkit.configure(protocol="grpc", traces_exporter="otlp", metrics_exporter=["otlp", "prometheus"])
telemetry: otelkit.Telemetry = otelkit.configure(exit_timeout_s=2)
otelkit.configure(sampler_ratio=0.1)  # error: Unexpected keyword argument "sampler_ratio"
otelkit.configure(sampler_arg="half")  # error: incompatible type "str"
otelkit.configure("tracking-client")  # error: Too many positional arguments
otelkit.configure(protocol="thrift")  # error: incompatible type "Literal['thrift']"
otelkit.configure(traces_exporter="zipkin")  # error: incompatible type "Literal['zipkin']"
otelkit.configure(metrics_exporter=["otlp", "statsd"])  # error: List item 1 has incompatible
otelkit.configure(sampler="always")  # error: incompatible type "Literal['always']"
ModelCalls("identity_fp32", protocol="grpc")
ModelCalls("identity_fp32", protocol="https")  # error: incompatible type "Literal['https']"
"""


def test_mypy_rejects_an_unknown_option_or_a_wrong_type(tmp_path: Path) -> None:
    calls = tmp_path / "calls.py"
    calls.write_text(textwrap.dedent(CALLS), encoding="utf-8")
    env = dict(os.environ)
    package_root = Path(otelkit.__file__).parents[1]
    if (package_root / "pyproject.toml").is_file():
        # A source checkout: mypy checks against it, not whatever otelkit is installed. An
        # installed otelkit it finds by itself, through its py.typed.
        env["MYPYPATH"] = str(package_root)
    result = subprocess.run(
        [
            *(sys.executable, "-m", "mypy", "--strict", "--ignore-missing-imports"),
            *("--follow-imports=silent", "--no-incremental", f"--cache-dir={tmp_path / 'cache'}"),
            *("--config-file=", "--no-error-summary", "--hide-error-context", str(calls)),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env=env,
    )
    reported = {
        int(match[1]): match[2]
        for match in re.finditer(r"^calls\.py:(\d+): error: (.*)$", result.stdout, re.MULTILINE)
    }
    expected = {
        number: line.partition("# error: ")[2]
        for number, line in enumerate(calls.read_text().splitlines(), start=1)
        if "# error: " in line
    }
    assert set(reported) == set(expected), result.stdout + result.stderr
    for number, fragment in expected.items():
        assert fragment in reported[number]


def test_help_shows_every_option_as_a_keyword_argument_with_its_default() -> None:
    parameters = inspect.signature(otelkit.configure).parameters
    assert {p.kind for p in parameters.values()} == {inspect.Parameter.KEYWORD_ONLY}
    assert list(parameters)[:3] == ["service_name", "resource_attributes", "traces_exporter"]
    assert parameters["sampler_arg"].default == 1.0
    assert parameters["install_signal_handler"].default is True
