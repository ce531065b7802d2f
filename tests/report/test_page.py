"""The report's page in a real headless Chromium: it loads with no console message and no
request, draws every chart, and its waterfall shows a known trace as the trace files hold it."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from otelkit.report import Report
from otelkit.testing import wait_until
from tests.report.conftest import GROUP_BY, TRACES

# The ensemble (option 4) on Triton at one thread: client span, InferRequest, the ensemble's
# model span, each step's model span with its compute and stage spans.
KNOWN = "median of server=triton option=4 threads=1"


def _raw_spans() -> dict[str, list[dict[str, Any]]]:
    """The spans of the trace files by trace id, as written (read without otelkit)."""
    spans: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in TRACES.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    spans[span["traceId"]].append(span)
    return spans


def _expected_rows(spans: list[dict[str, Any]]) -> list[tuple[str, int, float, float, int]]:
    """(name, depth, offset µs, duration µs, events) depth first, children by start time."""
    origin = min(int(s["startTimeUnixNano"]) for s in spans)
    children: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in spans:
        children[s.get("parentSpanId", "")].append(s)
    rows: list[tuple[str, int, float, float, int]] = []

    def visit(parent: str, depth: int) -> None:
        key = lambda s: (int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]))  # noqa: E731
        for s in sorted(children[parent], key=key):
            start, end = int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])
            rows.append(
                (
                    s["name"],
                    depth,
                    (start - origin) / 1e3,
                    (end - start) / 1e3,
                    len(s.get("events", [])),
                )
            )
            visit(s["spanId"], depth + 1)

    visit("", 0)
    return rows


def _screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where screenshots go: the session's temporary folder, or OTELKIT_REPORT_SCREENSHOTS
    (``docs/images`` regenerates the README's)."""
    folder = os.environ.get("OTELKIT_REPORT_SCREENSHOTS")
    return Path(folder) if folder else tmp_path_factory.getbasetemp()


def _load(browser: WebDriver, html: Path, fragment: str = "") -> None:
    browser.get_log("browser")  # drop what earlier tests left
    browser.get_log("performance")
    browser.get(html.as_uri() + fragment)
    script = (
        "return document.querySelectorAll('.vega svg').length === "
        "window.otelkitReport.data.charts.length"
    )
    wait_until(lambda: browser.execute_script(script), 30, "every chart drawn", interval=0.2)


def test_loads_without_console_messages_or_requests(
    browser: WebDriver, report_html: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _load(browser, report_html)
    assert browser.get_log("browser") == []
    requests = [
        json.loads(entry["message"])["message"]["params"]["request"]["url"]
        for entry in browser.get_log("performance")
        if json.loads(entry["message"])["message"]["method"] == "Network.requestWillBeSent"
    ]
    assert requests == [report_html.as_uri()]  # the page itself, nothing else
    shot = _screenshot_dir(tmp_path_factory) / "report-page.png"
    assert browser.save_screenshot(str(shot))
    print(f"screenshot: {shot}")


def test_every_chart_is_drawn(browser: WebDriver, report: Report, report_html: Path) -> None:
    _load(browser, report_html)
    drawn = browser.execute_script(
        "return Array.from(document.querySelectorAll('.chart')).map(c => [c.dataset.chart,"
        " c.querySelectorAll('svg .mark-line path, svg .mark-rect path, svg .mark-symbol path')"
        ".length, Array.from(c.querySelectorAll('svg .role-axis-title text')).map(t =>"
        " t.textContent)])"
    )
    assert [name for name, _, _ in drawn] == [chart.name for chart in report.charts]
    names = {chart.name for chart in report.charts}
    assert {"breakdown", "study-efficiency", "study-throughput-n-over-l"} <= names
    assert {"study-strong-scaling", "study-saturation", "study-attribution-0"} <= names
    for name, marks, titles in drawn:
        assert marks > 0, f"{name}: nothing drawn"
        # both axes titled (the breakdown's y in each of its panels); counts (threads,
        # instances) need no unit, measured values name one
        assert len(set(titles)) == 2 and all(titles) and any("(" in t for t in titles), (
            name,
            titles,
        )


def test_waterfall_of_a_known_trace(
    browser: WebDriver,
    report: Report,
    report_html: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    trace_id = report.views["server=triton option=4 threads=1"]["median"]
    _load(browser, report_html)
    box = browser.find_element(By.ID, "trace-id")
    box.clear()
    box.send_keys(trace_id.upper())  # ids are matched whatever their case
    browser.find_element(By.ID, "open-trace").click()
    assert browser.find_element(By.CSS_SELECTOR, "svg.wf").get_attribute("data-trace-id") == (
        trace_id
    )
    rows = browser.execute_script(
        "return Array.from(document.querySelectorAll('.wf-row')).map(r => [r.dataset.name,"
        " +r.dataset.depth, +r.dataset.offsetUs, +r.dataset.durationUs,"
        " r.querySelectorAll('.wf-event').length, +r.querySelector('rect').getAttribute('x'),"
        " +r.querySelector('rect').getAttribute('width')])"
    )
    expected = _expected_rows(_raw_spans()[trace_id])
    assert [tuple(row[:2]) for row in rows] == [row[:2] for row in expected]
    names = [name for name, _ in (row[:2] for row in rows)]
    assert names[:4] == [
        "reconstruct event",
        "v2/models/infer tracking",
        "InferRequest",
        "tracking",
    ]
    for got, want in zip(rows, expected, strict=True):
        assert got[2] == pytest.approx(want[2], abs=0.06) and got[3] == pytest.approx(
            want[3], abs=0.06
        )
        assert got[4] == want[4]  # Triton's events, one mark each
    # the bars sit at their offsets, on one scale with their widths
    x0 = rows[0][5]
    scale = rows[0][6] / rows[0][3]
    for _, _, offset, duration, _, x, width in rows:
        assert x - x0 == pytest.approx(offset * scale, abs=0.5)
        assert width == pytest.approx(max(1.0, duration * scale), abs=0.5)
    browser.find_elements(By.CSS_SELECTOR, ".wf-row")[3].click()
    assert "triton.model_name" in browser.find_element(By.ID, "wf-attributes").text
    section = browser.find_element(By.ID, "wf-section")
    browser.execute_script("arguments[0].scrollIntoView()", section)
    shot = _screenshot_dir(tmp_path_factory) / "report-waterfall.png"
    assert section.screenshot(str(shot))
    print(f"screenshot: {shot}")


def test_trace_id_box_and_link(browser: WebDriver, report: Report, report_html: Path) -> None:
    slowest = report.views["server=fastapi option=4 threads=8"]["slowest"]
    _load(browser, report_html, f"#trace={slowest}")
    svg = browser.find_element(By.CSS_SELECTOR, "svg.wf")
    assert svg.get_attribute("data-trace-id") == slowest
    box = browser.find_element(By.ID, "trace-id")
    box.clear()
    box.send_keys("0" * 31 + "1\n")
    assert "is not in this report" in browser.find_element(By.ID, "wf-message").text
    browser.find_element(By.CSS_SELECTOR, "button[data-view='p99']").click()
    median = report.views[browser.find_element(By.ID, "wf-group").get_attribute("value")]
    assert (
        browser.find_element(By.CSS_SELECTOR, "svg.wf").get_attribute("data-trace-id")
        == (median["p99"])
    )


def test_a_study_alone_loads_cleanly(browser: WebDriver, tmp_path: Path) -> None:
    """Without traces the page still opens: the study's plots, an empty waterfall, no error."""
    from tests.report.conftest import STUDY

    page = Report.build(studies=[STUDY]).write_html(tmp_path / "study.html")
    _load(browser, page)
    assert browser.get_log("browser") == []
    assert browser.find_element(By.ID, "waterfall").text == ""
    assert "No complete traces" in browser.find_element(By.TAG_NAME, "body").text


def _demo_like_traces(path: Path) -> list[str]:
    """Thirty groups as the demo makes them (servers × options × threads, a warm-up and a
    check), one trace each, written as OTLP JSON; their group labels, in the page's order."""
    servers, options, threads = ("triton-grpc-ensemble", "fastapi", "ray-serve"), "1234", "18"
    keys = [(s, o, t) for s in servers for o in options for t in threads]
    keys += [("warmup", "1", "1"), ("check", "1", "1")]
    lines = []
    for n, (server, option, thread) in enumerate(keys, 1):
        values = dict(zip(GROUP_BY, (server, option, thread), strict=True))
        attributes = [{"key": k, "value": {"stringValue": v}} for k, v in values.items()]
        span = {
            "traceId": f"{n:032x}",
            "spanId": f"{n:016x}",
            "name": "reconstruct event",
            "kind": 1,
            "startTimeUnixNano": str(n * 10**9),
            "endTimeUnixNano": str(n * 10**9 + n * 10**6),
            "attributes": attributes,
        }
        scope = {"scope": {"name": "demo"}, "spans": [span]}
        lines.append(json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [scope]}]}))
    path.write_text("\n".join(lines) + "\n")
    return [f"server={s} option={o} threads={t}" for s, o, t in keys]


def test_breakdown_of_thirty_groups_in_panels_with_whole_labels(
    browser: WebDriver, tmp_path: Path
) -> None:
    """One panel per server, its options and threads side by side, the warm-up and the check
    in a panel of their own, last; every label whole."""
    (tmp_path / "traces").mkdir()
    _demo_like_traces(tmp_path / "traces" / "demo.jsonl")
    report = Report.build([tmp_path / "traces"], group_by=GROUP_BY)
    _load(browser, report.write_html(tmp_path / "report.html"))
    texts = browser.execute_script(
        "const chart = document.querySelector('[data-chart=breakdown] svg');"
        "const of = role => Array.from(chart.querySelectorAll(`[class*=role-${role}] text`))"
        ".map(t => t.textContent);"
        "return [of('title-text'), of('axis-label')];"
    )
    headers, labels = texts
    assert headers == [
        "server=fastapi",
        "server=ray-serve",
        "server=triton-grpc-ensemble",
        "warm-up and checks",
    ]
    bars = [f"option={o} threads={t}" for o in "1234" for t in "18"]
    names = [label for label in labels if label.startswith(("option=", "server="))]
    assert names == [
        *bars * 3,
        "server=check option=1 threads=1",
        "server=warmup option=1 threads=1",
    ]
    assert not [label for label in labels if label.endswith("…")]
