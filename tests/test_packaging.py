"""The package's promises to its users: lazy extras, the console script, CI's skip rule."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

import otelkit
from otelkit import MissingExtraError
from otelkit._core.extras import locate, require
from otelkit._resource import installed_version
from otelkit.analysis import load_spans
from tests import ci_skips

pytest_plugins = ["pytester"]


def test_missing_extra_names_the_pip_line() -> None:
    with pytest.raises(ImportError) as caught:
        require("otelkit_no_such_module", extra="gpu", feature="GPU telemetry")
    assert isinstance(caught.value, MissingExtraError)
    assert str(caught.value) == (
        "otelkit: GPU telemetry needs the 'otelkit_no_such_module' package: "
        "pip install 'otelkit[gpu]'"
    )


def test_a_package_is_located_without_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "otelkit_test_located"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert locate("otelkit_test_located", extra="x", feature="y") == package
    assert "otelkit_test_located" not in sys.modules
    with pytest.raises(MissingExtraError, match=r"pip install 'otelkit\[pytriton\]'"):
        locate("otelkit_no_such_package", extra="pytriton", feature="the tritonserver launcher")


def test_a_source_tree_never_installed_still_has_a_version() -> None:
    # a Triton model's stub imports otelkit from a checkout on PYTHONPATH: no metadata there
    assert installed_version("otelkit-no-such-distribution") == "unknown"
    assert installed_version("otelkit") == metadata.version("otelkit")


def test_public_api_is_the_documented_list() -> None:
    assert sorted(otelkit.__all__) == sorted(
        name for name in dir(otelkit) if not name.startswith("_") and name in otelkit.__all__
    )
    for name in otelkit.__all__:
        assert getattr(otelkit, name).__doc__, f"otelkit.{name} has no docstring"


def test_console_script_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "otelkit.cli", "config"], capture_output=True, text=True, check=True
    )
    assert "service_name" in done.stdout
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in done.stdout


def test_spans_are_flushed_at_interpreter_exit(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys, otelkit
        from opentelemetry import trace
        otelkit.configure(traces_dir=sys.argv[1], bsp_schedule_delay_ms=600_000)
        for _ in range(11):
            trace.get_tracer("t").start_span("s").end()
        """
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True)
    assert len(load_spans(tmp_path)) == 11


SKIPS = {
    "in the test": 'def test_needs_something():\n    pytest.skip("component missing")\n',
    "gpu test": '@pytest.mark.gpu\ndef test_needs_a_gpu():\n    pytest.skip("no GPU")\n',
    "skipif mark": '@pytest.mark.skipif(True, reason="off")\ndef test_marked():\n    pass\n',
    "in a fixture": (
        "@pytest.fixture\ndef server():\n    pytest.skip('no server')\n\n"
        "def test_with_server(server):\n    pass\n"
    ),
    "module level": 'pytest.skip("no lib", allow_module_level=True)\n\ndef test_x():\n    pass\n',
    "importorskip": 'pytest.importorskip("no_such_module_here")\n\ndef test_x():\n    pass\n',
    "expected failure": 'def test_ran_and_met_a_known_bug():\n    pytest.xfail("upstream crash")\n',
}


@pytest.mark.parametrize(
    ("form", "ci", "outcome"),
    [
        ("in the test", "true", "failed"),
        ("in the test", "", "skipped"),
        ("gpu test", "true", "skipped"),
        ("skipif mark", "true", "errors"),
        ("in a fixture", "true", "errors"),
        ("module level", "true", "errors"),
        ("module level", "", "skipped"),
        ("importorskip", "true", "errors"),
        ("expected failure", "true", "xfailed"),
    ],
)
def test_under_ci_only_gpu_tests_may_skip(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, form: str, ci: str, outcome: str
) -> None:
    monkeypatch.setenv("CI", ci)
    pytester.makeconftest(Path(ci_skips.__file__).read_text())
    pytester.makeini("[pytest]\nmarkers =\n    gpu: gpu\n")
    pytester.makepyfile("import pytest\n\n" + SKIPS[form])
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(**{outcome: 1})
    if outcome not in ("skipped", "xfailed"):
        result.stdout.fnmatch_lines(["*under CI, where only GPU tests may skip*"])


def test_the_grpc_resend_rule_fails_only_on_evidence_above_five_percent() -> None:
    from tests.conftest import above_five_percent

    assert not above_five_percent(0, 40)
    assert not above_five_percent(3, 20)  # 13 % of a small sample: chance at a 5 % rate
    assert above_five_percent(6, 20)  # 23 %: not chance
    assert not above_five_percent(60, 1000)  # 5.7 % of many: within chance of 5 %
    assert above_five_percent(80, 1000)  # 7.4 % of many: above
