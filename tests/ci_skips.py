"""Under CI (``CI=true``) a skip fails unless the test is marked ``gpu``.

Every other component (Triton, Prometheus, uvicorn, Ray, Chromium) runs on CI's machines, so a
skip there would hide a missing install. This covers each way a test can skip: ``pytest.skip``
in a test or fixture, ``skip``/``skipif`` marks, and skips at collection (``importorskip`` or
``pytest.skip(allow_module_level=True)`` at the top of a module), which fail the collection.
A GPU test therefore skips inside the test (marked ``gpu``), never at module level. An expected
failure (``pytest.xfail``: the component ran and met a known upstream bug) is not a skip.

This module imports nothing of the tests' so that a pytester run can load it as its conftest.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

ON_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _reason(report: pytest.TestReport | pytest.CollectReport) -> object:
    return report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report = outcome.get_result()
    # an expected failure (pytest reports it as skipped, with ``wasxfail``) ran its component
    expected_failure = hasattr(report, "wasxfail")
    if ON_CI and report.skipped and not expected_failure and item.get_closest_marker("gpu") is None:
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, where only GPU tests may skip: {_reason(report)}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, None]:
    outcome = yield
    report = outcome.get_result()
    if ON_CI and report.skipped:
        report.outcome = "failed"
        report.longrepr = (
            f"{collector.nodeid} skipped at collection under CI, where only GPU tests may skip "
            f"(and those inside the test): {_reason(report)}"
        )
