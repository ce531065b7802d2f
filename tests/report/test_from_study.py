"""From a study to its report as a user types it (docs/study.md): ``otelkit study run`` on a
Triton it launches, then the command it prints, then the page in Chromium — the study's traces
found in its folder, grouped by point, each point linked to the waterfall of one of its traces;
and a folder with no trace file in it, said so, with no page written."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from otelkit import semconv
from otelkit.analysis import load_spans
from otelkit.report._sections import study_section
from otelkit.testing import wait_until
from tests.paths import MODELS, ROOT
from tests.report.test_page import _load

POINTS = ("concurrency=1", "concurrency=2")
# the command of docs/study.md, kept short: two points of a second each
STUDY = "study run --triton {models} --model identity_fp32 --sweep concurrency=1,2 --seconds 1 "
STUDY += "--warmup 0.3 --out study.jsonl --quiet"


@dataclass(frozen=True)
class Ran:
    folder: Path
    stdout: str


def _otelkit(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "otelkit.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    """Two short points of the identity model on a Triton the study launches, traced."""
    folder = tmp_path_factory.mktemp("from-study")
    done = _otelkit(shlex.split(STUDY.format(models=shlex.quote(str(MODELS)))), folder)
    assert done.returncode == 0, done.stderr
    return Ran(folder, done.stdout)


def test_the_study_prints_its_report_command_and_records_its_traces(study: Ran) -> None:
    last = study.stdout.strip().splitlines()[-1]
    assert last == (
        "the report, with the study's traces: otelkit report --study study.jsonl --out study.html"
    )
    header = json.loads((study.folder / "study.jsonl").read_text().splitlines()[0])
    assert header["record"] == "study" and header["traces"] == "study-files/traces"
    assert load_spans(study.folder / header["traces"])


def test_the_printed_command_makes_a_page_of_the_points(browser: WebDriver, study: Ran) -> None:
    command = study.stdout.strip().splitlines()[-1].split(": ", 1)[1]
    done = _otelkit(shlex.split(command)[1:], study.folder)
    assert done.returncode == 0, done.stderr
    assert " 0 traces" not in done.stdout
    page = study.folder / "study.html"
    _load(browser, page)
    assert browser.get_log("browser") == []
    groups = [
        option.get_attribute("value")
        for option in browser.find_elements(By.CSS_SELECTOR, "#wf-group option")
    ]
    assert groups == [*POINTS, "study warm-up"]
    bars = browser.execute_script(
        "return window.otelkitReport.data.charts[0].spec.data.values.map(r => [r.facet, r.bar])"
    )
    assert {tuple(bar) for bar in bars} == {
        ("", "concurrency=1"),
        ("", "concurrency=2"),
        ("warm-up and checks", "study warm-up"),
    }
    # the study's server in words, as its results file records it, not that record's dict
    said = browser.find_element(By.CSS_SELECTOR, 'h2[id^="study-"] + p.facts-line').text
    assert f"a tritonserver the study launched (repository {MODELS}; models identity_fp32)" in said
    assert "{" not in said and "kind" not in said
    links = browser.find_elements(By.CSS_SELECTOR, "table.points a.point-trace")
    assert [link.find_element(By.XPATH, "../../td[1]").text for link in links] == list(POINTS)
    for n, point in enumerate(POINTS):
        link = browser.find_elements(By.CSS_SELECTOR, "table.points a.point-trace")[n]
        trace_id = (link.get_attribute("href") or "").rsplit("#trace=", 1)[1]
        link.click()  # the page draws the waterfall on the hash's change, after the click returns
        _shown(browser, f'svg.wf[data-trace-id="{trace_id}"]')
        assert browser.find_element(By.ID, "wf-title").text.startswith(f"trace {trace_id}")
        root = browser.find_element(By.CSS_SELECTOR, ".wf-row")
        assert root.get_attribute("data-name") == semconv.STUDY_SPAN
        root.click()
        shown = browser.find_element(By.ID, "wf-attributes").text
        value = point.split("=")[1]
        assert f"{semconv.STUDY_PARAM}.concurrency" in shown and value in shown
        assert f"{semconv.STUDY_PHASE}" in shown and semconv.STUDY_PHASE_MEASURE in shown


def test_the_study_folder_as_given_is_read_and_grouped_by_point(study: Ran) -> None:
    """The issue's own command: the traces are one folder down in study-files."""
    done = _otelkit(
        ["report", "study-files", "--study", "study.jsonl", "--out", "r.html"], study.folder
    )
    assert done.returncode == 0, done.stderr
    assert " 0 traces" not in done.stdout and (study.folder / "r.html").exists()
    text = (study.folder / "r.html").read_text()
    assert all(f'"{point}"' in text for point in POINTS)
    listed = _otelkit(
        ["breakdown", "study-files", "--group-by", f"{semconv.STUDY_PARAM}.concurrency"],
        study.folder,
    )
    assert listed.returncode == 0, listed.stderr
    heads = [line.split(":")[0] for line in listed.stdout.splitlines() if "traces," in line]
    assert heads == [f"{semconv.STUDY_PARAM}.concurrency={v}" for v in ("1", "2")]


def test_a_folder_without_trace_files_is_an_error_and_writes_no_page(tmp_path: Path) -> None:
    (tmp_path / "empty" / "logs").mkdir(parents=True)
    (tmp_path / "empty" / "logs" / "tritonserver.log").write_text("started\n")
    done = _otelkit(["report", "empty", "--out", "r.html"], tmp_path)
    assert done.returncode == 1
    assert "empty: no trace file" in done.stderr
    assert "no span read from empty" in done.stderr and "no page written" in done.stderr
    assert not (tmp_path / "r.html").exists()
    listed = _otelkit(["breakdown", "empty"], tmp_path)
    assert listed.returncode == 1 and "no span read from empty" in listed.stderr


def test_a_folder_without_trace_files_is_named_beside_one_with_them(
    study: Ran, tmp_path: Path
) -> None:
    (tmp_path / "nothing-here").mkdir()
    done = _otelkit(
        ["report", str(study.folder / "study-files"), "nothing-here", "--out", "r.html"], tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "nothing-here: no trace file" in done.stderr
    assert (tmp_path / "r.html").exists()


def _shown(browser: WebDriver, selector: str, timeout_s: float = 10.0) -> None:
    """Wait until an element matching ``selector`` is on the page."""
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, selector), timeout_s, selector)


def test_an_untraced_study_says_so_once_instead_of_a_column_without_traces() -> None:
    header = {
        "model": "identity_fp32",
        "server": {"kind": "remote", "url": "gpu-node:8000", "metrics_url": None},
        "tracing": None,
    }
    points = [("concurrency=1", None), ("concurrency=2", None)]
    page = study_section("s", header, ["[all] rising: ..."], "", points)
    assert "no trace read" not in page and 'class="points"' not in page
    assert "This study ran untraced" in page and "--no-traces" in page
    assert "a server at gpu-node:8000 (not launched by the study)" in page
    traced = study_section("s", {**header, "tracing": {"per_second": 20}}, [], "", points)
    assert traced.count("no trace read") == 2  # traced, a point whose traces were not read
