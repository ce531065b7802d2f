"""The report tests' fixtures: one headless Chromium per session, and one report of real data.

The data: ``data/demo-traces.jsonl`` (24 traces of ``make demo``: the median and the slowest of
each group, as its receiver wrote them) and ``data/study.jsonl`` (a real study of the staged test
model on Triton, made by ``make_study.py``). Chromium is Debian's with its chromium-driver
(``make debian-packages``); without them the browser tests skip here and fail under CI.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from otelkit.report import Report
from tests.paths import TESTS
from tests.support import require_binary

DATA = TESTS / "report" / "data"
TRACES = DATA / "demo-traces.jsonl"
STUDY = DATA / "study.jsonl"
GROUP_BY = ("gnn_tracking.server", "gnn_tracking.option", "gnn_tracking.threads")


@pytest.fixture(scope="session")
def report() -> Report:
    return Report.build([TRACES], [STUDY], group_by=GROUP_BY, root_name="reconstruct event")


@pytest.fixture(scope="session")
def report_html(report: Report, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return report.write_html(tmp_path_factory.mktemp("report") / "report.html")


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """Headless Chromium through Selenium, with its console and network logs kept."""
    chromium = require_binary("chromium")
    driver_path = require_binary("chromedriver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1600"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
