"""The Grafana dashboards: committed JSON matches its source, every query names only metrics
otelkit or Triton emit and parses in a real Prometheus, and the command writes what it is told.
"""

from __future__ import annotations

import ast
import io
import json
import re
import runpy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otelkit import semconv
from otelkit.cli import main
from otelkit.dashboards import (
    DASHBOARDS,
    DashboardOptions,
    PanelQuery,
    dumps,
    panel_queries,
    render,
    substitute,
)
from tests.paths import ROOT
from tests.prometheus import PrometheusError, PrometheusServer
from tests.support import require_binary

grafanalib = pytest.importorskip("grafanalib")

COMMITTED = ROOT / "dashboards"
SOURCES = ROOT / "otelkit" / "dashboards"
NAMES = sorted(DASHBOARDS)
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
REGENERATE = "run `otelkit dashboards --out dashboards` and commit the result"

# Prometheus's own series and OpenTelemetry's resource series, beside otelkit's and Triton's
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "target_info"}
TRACED_HISTOGRAMS = (
    semconv.CLIENT_DURATION,
    semconv.STAGE_DURATION,
    semconv.STAGE_GPU_DURATION,
    semconv.HTTP_SERVER_DURATION,
)


def emitted_names() -> set[str]:
    """Every sample name otelkit and Triton put on a Prometheus endpoint."""
    names = set(semconv.TRITON_METRICS) | set(semconv.RAY_SERVE_METRICS)
    names |= set(semconv.ENVOY_METRICS)
    for spec in (*semconv.METRICS, *semconv.FLEET_METRICS):
        base = semconv.prometheus_name(spec)
        suffixes = ("_bucket", "_sum", "_count") if spec.kind == "histogram" else ("",)
        names.update(f"{base}{suffix}" for suffix in suffixes)
    return names


EMITTED = emitted_names()
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS_OR_RANGE = re.compile(r"\{[^}]*\}|\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?")
_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "inf",
    "nan",
    "Inf",
    "NaN",
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels or keywords)."""
    bare = _LABEL_LIST.sub(" ", _MATCHERS_OR_RANGE.sub(" ", _STRING.sub(" ", expr)))
    return {name for name, call in _IDENTIFIER.findall(bare) if not call and name not in _KEYWORDS}


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, Any]]:
    return render(DashboardOptions())


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", ())


def all_queries(rendered: dict[str, dict[str, Any]]) -> list[PanelQuery]:
    return [query for name in NAMES for query in panel_queries(rendered[name])]


# -- (a) the committed JSON is what the source builds --------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_committed_json_matches_its_source(name: str, rendered: dict[str, Any]) -> None:
    path = COMMITTED / f"{name}.json"
    assert path.exists(), f"{path} is missing: {REGENERATE}"
    assert json.loads(path.read_text()) == rendered[name], f"{path} is stale: {REGENERATE}"
    assert path.read_text() == dumps(rendered[name]), f"{path} is not formatted: {REGENERATE}"


def test_no_stray_dashboard_files() -> None:
    assert sorted(p.name for p in COMMITTED.glob("*.json")) == [f"{n}.json" for n in NAMES]
    assert sorted(p.name for p in COMMITTED.glob("*.dashboard.py")) == [
        f"{n}.dashboard.py" for n in NAMES
    ]


# -- (b) structure Grafana relies on -------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_dashboard_structure(name: str, rendered: dict[str, Any]) -> None:
    dashboard = rendered[name]
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["uid"] == f"otelkit-{name}"
    assert dashboard["tags"] == ["otelkit", name]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert list(variables) == ["datasource", "model", "instance"]
    assert variables["datasource"] | {"current": None} == {
        "current": None,
        "hide": 0,
        "label": "Prometheus",
        "name": "datasource",
        "options": [],
        "query": "prometheus",
        "refresh": 1,
        "regex": "",
        "type": "datasource",
    }
    assert variables["datasource"]["current"]["value"] == "prometheus"
    for multi in ("model", "instance"):
        variable = variables[multi]
        assert variable["type"] == "query"
        assert variable["multi"] is variable["includeAll"] is True
        assert variable["allValue"] == ".*"
        assert variable["current"]["value"] == ["$__all"]
        assert variable["datasource"] == DATASOURCE
        assert re.fullmatch(rf"label_values\(\w+, {multi}\)", variable["query"])

    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids {sorted(ids)}"
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert "[$__rate_interval]" in target["expr"] or "rate(" not in target["expr"]


def _overlaps(a: dict[str, int], b: dict[str, int]) -> bool:
    return (
        a["x"] < b["x"] + b["w"]
        and b["x"] < a["x"] + a["w"]
        and a["y"] < b["y"] + b["h"]
        and b["y"] < a["y"] + a["h"]
    )


@pytest.mark.parametrize("name", NAMES)
def test_panels_fit_the_grid_without_overlapping(name: str, rendered: dict[str, Any]) -> None:
    grids = [(p["title"], p["gridPos"]) for p in panels(rendered[name])]
    for title, grid in grids:
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, title
    for i, (title, grid) in enumerate(grids):
        for other, other_grid in grids[i + 1 :]:
            assert not _overlaps(grid, other_grid), f"{name}: {title!r} overlaps {other!r}"


def test_latency_panels_fetch_exemplars(rendered: dict[str, Any]) -> None:
    buckets = [f"{semconv.prometheus_name(spec)}_bucket" for spec in TRACED_HISTOGRAMS]
    latency: dict[str, list[str]] = {name: [] for name in NAMES}
    for name in NAMES:
        for panel in panels(rendered[name]):
            for target in panel.get("targets", ()) if panel["type"] == "timeseries" else ():
                if "histogram_quantile" in target["expr"] and any(
                    bucket in target["expr"] for bucket in buckets
                ):
                    assert target["exemplar"] is True, f"{name}: {panel['title']}"
                    latency[name].append(panel["title"])
    assert {name for name, titles in latency.items() if titles} == {
        "inference",
        "stages",
        "clients",
    }


@pytest.mark.parametrize("name", NAMES)
def test_dashboards_link_to_jaeger_and_to_each_other(name: str, rendered: dict[str, Any]) -> None:
    links = {link["title"]: link for link in rendered[name]["links"]}
    assert links["otelkit dashboards"]["tags"] == ["otelkit"]
    assert links["otelkit dashboards"]["type"] == "dashboards"
    jaeger = links["Traces in Jaeger"]["url"]
    assert jaeger.startswith("/explore?")
    assert "%22uid%22%3A%22jaeger%22" in jaeger  # "uid":"jaeger", URL-encoded


# -- (c) no metric the code does not emit ----------------------------------------------------------


def test_metric_names_of_a_query() -> None:
    expr = (
        'sum by (model) (rate(a_total{model=~"$model", x="b_total"}[5m])) / ignoring (stage) '
        "group_left sum(c) * on (job) group_left (d) e or vector(1e6) > bool 2"
    )
    assert metric_names(expr) == {"a_total", "c", "e"}


def test_every_query_names_only_emitted_metrics(rendered: dict[str, Any]) -> None:
    allowed = EMITTED | PROMETHEUS_SERIES
    unknown = {
        (query.dashboard, query.panel, name)
        for query in all_queries(rendered)
        for name in metric_names(query.expr) - allowed
    }
    assert not unknown, f"metrics not in otelkit.semconv: {sorted(unknown)}"
    for query in all_queries(rendered):
        assert metric_names(query.expr), f"{query} selects no metric"
    for name in NAMES:
        for variable in rendered[name]["templating"]["list"][1:]:
            metric = re.fullmatch(r"label_values\((\w+), \w+\)", variable["query"])
            assert metric and metric[1] in allowed, variable["query"]


def test_every_emitted_metric_family_is_on_a_dashboard(rendered: dict[str, Any]) -> None:
    used = {name for query in all_queries(rendered) for name in metric_names(query.expr)}
    families = {re.sub(r"_(bucket|sum|count)$", "", name) for name in used}
    missing = {
        spec.name for spec in semconv.METRICS if semconv.prometheus_name(spec) not in families
    }
    assert missing == {semconv.GPU_MEMORY_FREE.name}  # total and used show it


@pytest.mark.parametrize("module", sorted(SOURCES.glob("*.py")), ids=lambda p: p.name)
def test_no_metric_name_literal_in_the_sources(module: Path) -> None:
    tree = ast.parse(module.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    literals = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]
    words = {word for text in literals for word in re.findall(r"[\w:]+", text)}
    assert not words & EMITTED, f"{module.name} spells metric names: {sorted(words & EMITTED)}"


# -- (d) every query parses in a real Prometheus -------------------------------------------------


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    binary = require_binary("prometheus")
    with PrometheusServer(binary, {}, tmp_path_factory.mktemp("prometheus")) as server:
        yield server


def _rejected(prometheus: PrometheusServer, queries: list[tuple[PanelQuery, str]]) -> list[str]:
    failures = []
    for query, expr in queries:
        try:
            prometheus.query(expr)
        except PrometheusError as error:
            failures.append(f"{query.dashboard} / {query.panel}: {expr}\n    {error}")
    return failures


@pytest.mark.prometheus
@pytest.mark.parametrize("name", NAMES)
def test_prometheus_accepts_every_panel_query(
    name: str, rendered: dict[str, Any], prometheus: PrometheusServer
) -> None:
    chosen = {"model": ["exatrkx.v2", "embed"], "instance": ["gpu-node:8002"]}
    queries = [
        (query, substitute(query.expr, values))
        for query in panel_queries(rendered[name])
        for values in ({}, chosen)
    ]
    failures = _rejected(prometheus, queries)
    assert not failures, "Prometheus rejected:\n" + "\n".join(failures)


@pytest.mark.prometheus
def test_prometheus_rejects_a_broken_query(prometheus: PrometheusServer) -> None:
    broken = PanelQuery("d", "p", "sum(rate(x[1m])")
    [failure] = _rejected(prometheus, [(broken, broken.expr)])
    assert failure.startswith("d / p: sum(rate(x[1m])\n    bad_data: ")
    assert "parse error" in failure


@pytest.mark.prometheus
def test_prometheus_accepts_the_variable_queries(
    rendered: dict[str, Any], prometheus: PrometheusServer
) -> None:
    for name in NAMES:
        for variable in rendered[name]["templating"]["list"][1:]:
            found = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["query"])
            assert found, variable["query"]
            metric, label = found.groups()
            assert prometheus.query(f"group by ({label}) ({metric})")["result"] == []


# -- substitution ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "values", "expected"),
    [
        ('x{m=~"$model"}[$__rate_interval]', {}, 'x{m=~".*"}[1m]'),
        ('x{m=~"${model}"}', {"model": ["a", "b.c"]}, 'x{m=~"(a|b\\\\.c)"}'),
        ('x{m=~"${instance:regex}"}', {"instance": "h:1"}, 'x{m=~"h:1"}'),
        ('x{m=~"$instance"}', {"instance": ["All"]}, 'x{m=~".*"}'),
        ('x{m=~"${model:pipe}"}', {"model": ["a", "b"]}, 'x{m=~"a|b"}'),
        ("x[$__range:$__interval] [[model]]", {"__range": "6h"}, "x[6h:15s] .*"),
    ],
)
def test_substitute(expr: str, values: dict[str, Any], expected: str) -> None:
    assert substitute(expr, values) == expected


def test_substitute_names_an_unknown_variable() -> None:
    with pytest.raises(KeyError, match=r"\$cluster"):
        substitute('x{c="$cluster"}')


# -- (e) the command -----------------------------------------------------------------------------


def test_command_writes_the_options_it_is_given(tmp_path: Path) -> None:
    argv = [
        "dashboards",
        "--out",
        str(tmp_path),
        "--prometheus-uid",
        "p2",
        "--jaeger-uid",
        "j2",
        "--title-prefix",
        "X",
    ]
    assert main(argv) == 0
    options = DashboardOptions(prometheus_uid="p2", jaeger_uid="j2", title_prefix="X")
    expected = render(options)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{n}.json" for n in NAMES]
    for name in NAMES:
        text = (tmp_path / f"{name}.json").read_text()
        dashboard = json.loads(text)
        assert dashboard == expected[name]
        assert dashboard["uid"] == f"x-{name}" and dashboard["title"].startswith("X / ")
        assert dashboard["templating"]["list"][0]["current"]["value"] == "p2"
        assert "%22uid%22%3A%22j2%22" in dashboard["links"][1]["url"]
        assert '"value": "prometheus"' not in text and "uid%22%3A%22jaeger%22" not in text


def test_command_without_grafanalib_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "grafanalib", None)  # as if it were not installed
    assert main(["dashboards", "--out", str(tmp_path)]) == 2
    assert "pip install 'otelkit[dashboards]'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_package_imports_without_grafanalib() -> None:
    script = (
        "import sys; sys.modules['grafanalib'] = None\n"
        "import otelkit.dashboards, otelkit.dashboards._cli\n"
        "print(otelkit.dashboards.substitute('$model'))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, ".*\n", "")


# -- (f) the grafanalib sources build the same dashboards ------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_dashboard_py_sources_build_the_committed_json(name: str) -> None:
    from grafanalib._gen import write_dashboard

    source = runpy.run_path(str(COMMITTED / f"{name}.dashboard.py"))
    written = io.StringIO()
    write_dashboard(source["dashboard"], written)  # what `generate-dashboards` writes
    assert written.getvalue() == (COMMITTED / f"{name}.json").read_text()


# the panels showing a real deployment: tests/test_dashboards_deployment.py
