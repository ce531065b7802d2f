"""The report without a browser: the streaming reader's bounds, the waterfall views, the page's
text, the figures as images with labelled axes, and the command."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path
from xml.etree import ElementTree

import pytest

from otelkit.analysis import Span, SpanKind, build_traces, load_spans
from otelkit.analysis._breakdown import TOTAL
from otelkit.cli import main
from otelkit.report import Report
from otelkit.report._collect import Gathered
from otelkit.report._figures import write_figures
from otelkit.report._stream import TraceStream
from tests.paths import ROOT
from tests.report.conftest import GROUP_BY, STUDY, TRACES


def _trace_spans(n: int, start_s: float, spans: int = 3) -> list[Span]:
    trace_id = f"{n:032x}"
    start = int(start_s * 1e9)
    root = Span(trace_id, "00" * 7 + "01", None, "event", SpanKind.INTERNAL, start, start + 10**7)
    children = [
        Span(
            trace_id,
            f"{k + 2:016x}",
            root.span_id,
            f"step {k}",
            SpanKind.INTERNAL,
            start + k * 10**6,
            start + (k + 1) * 10**6,
        )
        for k in range(spans - 1)
    ]
    return [*children, root]


def test_stream_hands_on_whole_traces_and_bounds_what_it_holds() -> None:
    # 2000 traces one second apart, each 3 spans: with a 30 s grace, about 30 are open at once
    spans = [s for n in range(2000) for s in _trace_spans(n + 1, n)]
    stream = TraceStream(grace_s=30, max_open_spans=10_000)
    sizes, most_held = [], 0
    for trace in stream.complete_traces(spans):
        sizes.append(len(trace.spans))
        most_held = max(most_held, stream._held)
    assert sizes == [3] * 2000
    assert (stream.traces, stream.spans, stream.late_spans, stream.closed_early) == (
        2000,
        6000,
        0,
        0,
    )
    assert most_held < 4096 + 200  # one check interval of spans, plus the grace's traces


def test_stream_counts_late_spans_and_closes_early_under_its_bound() -> None:
    early = _trace_spans(1, 0.0)
    later = [s for n in range(2, 40) for s in _trace_spans(n, 100.0 + n)]
    straggler = Span(
        early[0].trace_id, "ff" * 8, early[-1].span_id, "late", SpanKind.INTERNAL, 0, 10
    )
    stream = TraceStream(grace_s=1, max_open_spans=20)
    traces = list(stream.complete_traces([*early, *later, straggler]))
    assert len(traces) == 39 and stream.late_spans == 1
    assert stream.closed_early > 0  # 20 spans held at most: traces handed on before their grace


def test_views_are_the_exact_median_p99_and_slowest_of_small_groups() -> None:
    gathered = Gathered(group_by=GROUP_BY, root_name="reconstruct event")
    traces = build_traces(load_spans(TRACES))
    for trace in traces.values():
        gathered.add(trace)
    views = gathered.views()
    for key, chosen in views.items():
        durations = sorted(gathered.groups[key].components[TOTAL])
        roots = {tid: traces[tid].roots[0].duration_ns * 1e-9 for tid in chosen.values()}
        assert roots[chosen["slowest"]] == durations[-1]
        assert roots[chosen["median"]] == durations[0]  # 2 traces a group: the lower is the median
        assert set(chosen.values()) <= set(gathered.kept)
    assert len(views) == 12


def test_page_text(report: Report) -> None:
    html = report.html()
    assert html.count("<script") == 3 and "</script" not in html.split("<script>")[-1][:-20]
    assert 'src="http' not in html and 'href="http' not in html
    data = html.split('id="otelkit-data">', 1)[1].split("</script>", 1)[0]
    parsed = json.loads(data)
    assert set(parsed) == {"charts", "traces", "views", "sampled", "facts"}
    assert parsed["facts"] == {"traces": 24, "spans": 396}
    assert "gnn-tracking-client" in html and "triton" in html  # the services' resources
    assert "triton: OpenTelemetry SDK cpp 1.13.0" in html and "otelkit 0.1.0" in html
    assert "nesting consistent" in html and "contended" in html  # a check and a verdict
    # each group's slowest server stage with its share of the time, and no capacity from it
    assert re.search(r"<td>server [\w ]+ \(\d+\.\d\d ms, \d+ %\)</td>", html)


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_figures_open_as_images_with_labelled_axes(report: Report, tmp_path: Path) -> None:
    written = report.write_figures(tmp_path)
    assert len(written) == 2 * len(report.charts)
    for chart in report.charts:
        width, height = _png_size(tmp_path / f"{chart.name}.png")
        # a paper column at 300 dpi: 3.4 in is 1020 px; a legend may widen it
        assert 600 <= width <= 2400 and 300 <= height <= 1800, (chart.name, width, height)
        svg = ElementTree.parse(tmp_path / f"{chart.name}.svg").getroot()
        texts = [t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text")]
        assert any("(" in t and ")" in t for t in texts), (chart.name, texts[:10])


def test_readme_figure_is_current(tmp_path: Path) -> None:
    """docs/images/report-breakdown.svg is what the code draws from the committed demo traces
    (docs/report.md says how to regenerate it)."""
    report = Report.build([TRACES], group_by=GROUP_BY, root_name="reconstruct event")
    assert report.breakdown is not None
    write_figures([report.breakdown], tmp_path)
    committed = ROOT / "docs" / "images" / "report-breakdown.svg"
    assert (tmp_path / "breakdown.svg").read_text() == committed.read_text()
    assert (ROOT / "docs" / "images" / "report-waterfall.png").stat().st_size > 10_000


def test_command_writes_the_page_and_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.html"
    args = [
        "report",
        str(TRACES),
        "--study",
        str(STUDY),
        "--out",
        str(out),
        "--root",
        "reconstruct event",
        "--figures",
        str(tmp_path / "fig"),
    ]
    for key in GROUP_BY:
        args += ["--group-by", key]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert f"report: {out.resolve()}" in printed and "24 traces, 396 spans" in printed
    assert out.stat().st_size < 5e6
    assert (tmp_path / "fig" / "breakdown.svg").exists()
    assert main(["report"]) == 2


def test_n_over_latency_chart_says_derived_and_draws_the_measured() -> None:
    from otelkit.report._study_charts import study_charts
    from otelkit.study import StudyResults
    from tests.study.conftest import make_point

    points = [
        make_point({"batch_size": n, "concurrency": 4}, 4000.0 / ms, latency_ms=ms)
        for n, ms in [(1, 2.0), (4, 4.0)]
    ]
    results = StudyResults({"unit": "request"}, points)
    results.derive()
    (chart,) = [c for c in study_charts(results) if c.name == "study-throughput-n-over-l"]
    assert chart.title == "T = N/ℓ (derived) and measured inferences/s against batch size"
    assert chart.note.startswith("T = N/ℓ is derived: the batch over the mean latency, what the ")
    assert chart.spec["layer"][0]["data"]["values"] == [
        {"at": 1, "inferences/s": 500.0, "series": "concurrency=4: T = N/ℓ (derived)"},
        {"at": 1, "inferences/s": 2000.0, "series": "concurrency=4: measured"},
        {"at": 4, "inferences/s": 1000.0, "series": "concurrency=4: T = N/ℓ (derived)"},
        {"at": 4, "inferences/s": 4000.0, "series": "concurrency=4: measured"},
    ]


def test_the_p99_view_says_it_is_the_nearest_of_the_sampled(report: Report) -> None:
    gathered = Gathered(group_by=(), max_spans=0)  # none kept in full: the sample alone
    for n in range(1, 201):
        root = Span(f"{n:032x}", "01" * 8, None, "event", SpanKind.INTERNAL, 0, n * 10**6)
        gathered.add(build_traces([root])[root.trace_id])
    gathered.views()
    assert gathered.sampled == {("event",): 33}  # 32 sampled and the slowest
    # the demo's 12 groups of 2 traces: both are candidates
    html = report.html()
    assert '<button data-view="p99">p99 (nearest of 2 sampled)</button>' in html
    text = " ".join(html.split())
    assert "median and p99 are the traces nearest them among a random sample of up to 32" in text
    data = json.loads(html.split('id="otelkit-data">', 1)[1].split("</script>", 1)[0])
    assert data["sampled"] == {label: 2 for label in report.views}


def test_study_charts_with_gpus_saturation_and_knees() -> None:
    """A sweep whose points hold GPU readings and Triton's figures: the GPU plots (memory per
    instance), saturation and the knee ring come from them."""
    from otelkit.report._study_charts import study_charts
    from otelkit.study import StudyResults
    from tests.study.conftest import figures, make_point

    points = []
    for n, (instances, throughput) in enumerate([(1, 100.0), (2, 190.0), (4, 200.0)]):
        point = make_point(
            {"instances": instances},
            throughput,
            {"server gnn": 5.0 * n + 5},
            index=n,
            triton={"gnn": figures(4.0, queue_ms=n * 2.0)},
        )
        point.gpus = {
            "GPU-0123456789ab": {
                "utilization": 0.3 * (n + 1),
                "memory_used_bytes": 2**30 * 2 * instances,
            }
        }
        points.append(point)
    results = StudyResults({"unit": "event"}, points)
    results.derive()
    charts = {chart.name: chart for chart in study_charts(results)}
    assert {
        "study-throughput-instances",
        "study-efficiency",
        "study-saturation",
        "study-gpu-utilisation",
        "study-gpu-memory",
    } <= set(charts)
    memory = charts["study-gpu-memory"].spec["layer"][0]["data"]["values"]
    assert [row["GiB"] for row in memory] == [2.0, 2.0, 2.0]  # 2 GiB an instance throughout
    rings = charts["study-throughput-instances"].spec["layer"][1]["data"]["values"]
    assert rings == [{"instances": 2, "events/s": 190.0, "label": "knee"}]
    utilisation = charts["study-gpu-utilisation"].spec["layer"][0]["data"]["values"]
    assert [round(row["pct"]) for row in utilisation] == [30, 60, 90]


def test_the_utilisation_chart_marks_the_bottleneck_and_its_predicted_plateau() -> None:
    from otelkit.report._study_charts import study_charts
    from otelkit.study import StudyResults
    from tests.study.conftest import figures, make_point

    # gnn: 8 ms on 2 instances (250/s at most), embed: 2 ms on 1 (500/s at most)
    points = []
    for index, (n, x) in enumerate([(1, 95.0), (16, 245.0)]):
        triton = {
            "gnn": figures(8.0, instances=2, requests=round(x * 10)),
            "embed": figures(2.0, instances=1, requests=round(x * 10)),
        }
        points.append(
            make_point({"concurrency": n}, x, triton=triton, index=index, latency_ms=1e3 * n / x)
        )
    results = StudyResults({"unit": "event"}, points)
    results.derive()
    (chart,) = [c for c in study_charts(results) if c.name == "study-utilisation-0"]
    rows = chart.spec["layer"][0]["data"]["values"]
    at_peak = {r["resource"]: r["U"] for r in rows if r["concurrency"] == 16}
    assert at_peak == {"gnn": pytest.approx(0.98), "embed": pytest.approx(0.49)}
    assert chart.note.startswith(
        "plateau measured 245 events/s; predicted m/D 250 events/s "
        "(derived). saturated: gnn's 2 instances are busy all the time"
    )
    bold = chart.spec["layer"][0]["encoding"]["strokeWidth"]["condition"]["test"]
    assert bold == {"field": "resource", "equal": "gnn"}  # the bottleneck drawn bold


def test_a_title_and_study_names_from_outside_are_escaped_in_the_page(tmp_path: Path) -> None:
    """Text from outside (the title from the command line, a study's file name) never becomes
    markup: the page's policy allows inline script, so a tag would run."""
    hostile = "<img src=x onerror=alert(1)>"
    named = tmp_path / "x<svg onload=alert(3)>.jsonl"  # a study is named by its file
    shutil.copyfile(STUDY, named)
    report = Report.build(studies=[named])
    report.title = hostile
    page = report.html()
    assert hostile not in page and "<svg onload" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "x&lt;svg onload=alert(3)&gt;" in page
