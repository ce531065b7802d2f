"""Shared test set-up.

Under CI (``CI=true``) a skipped test fails unless it is marked ``gpu``: every other component
(Triton, Prometheus, uvicorn) runs on CI's machines, so a skip there would hide a missing install.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Generator

import pytest

ON_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_binary(name: str) -> str:
    """Path of an executable that a test needs; skip locally, fail under CI, when missing."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (make test installs it)")
    return path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report = outcome.get_result()
    if ON_CI and report.skipped and item.get_closest_marker("gpu") is None:
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"skipped under CI, where only GPU tests may skip: {reason}"
