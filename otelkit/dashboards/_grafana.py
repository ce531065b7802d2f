"""The one module that imports grafanalib: PromQL targets, panels, variables, layout, dashboard.

The dashboard modules describe *what* to show with these helpers; everything grafanalib 0.7.1
lacks (exemplar targets, a current ``schemaVersion``, variables whose ``All`` is selected) is
filled in here, so replacing grafanalib later touches this module only.

>>> panel = timeseries("Requests/s", [Q("sum(rate(up[$__rate_interval]))", "all")], unit="reqps")
>>> to_json(dashboard(DashboardOptions(), "demo", "Demo", "", "up", [("Load", [panel])]))["uid"]
'otelkit-demo'
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import attr
from grafanalib.core import (
    GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
    Dashboard,
    DashboardLink,
    GridPos,
    RowPanel,
    Stat,
    Templating,
    Time,
    TimeSeries,
)

from otelkit._core.deps.grafanalib import dashboard_encoder
from otelkit.dashboards._options import DashboardOptions

__all__ = [
    "ALL",
    "INSTANCE",
    "MODEL",
    "SCHEMA_VERSION",
    "SCRAPE_DURATION",
    "TARGET_INFO",
    "UP",
    "Q",
    "Section",
    "dashboard",
    "quantile",
    "rate",
    "selector",
    "stat",
    "sum_by",
    "timeseries",
    "to_json",
]

SCHEMA_VERSION = 39  # Grafana 10.4 - 11.3; grafanalib 0.7.1 writes 12 unless told
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
ALL = "$__all"
MODEL = 'model=~"$model"'
INSTANCE = 'instance=~"$instance"'
_HEIGHT = {"timeseries": 8, "stat": 4}
_BASE_THRESHOLD = [{"color": "green", "value": None}]  # Grafana's default: one base step
# Prometheus's own series and OpenTelemetry's resource series, beside otelkit's and Triton's
UP = "up"
SCRAPE_DURATION = "scrape_duration_seconds"
TARGET_INFO = "target_info"

# -- PromQL ---------------------------------------------------------------------------------------


def selector(metric: str, *matchers: str) -> str:
    """``metric{m1, m2}``; the matchers are PromQL text such as ``MODEL``."""
    return f"{metric}{{{', '.join(matchers)}}}" if matchers else metric


def rate(metric: str, *matchers: str) -> str:
    """``rate(metric{...}[$__rate_interval])``: Grafana picks a window of at least 4 scrapes."""
    return f"rate({selector(metric, *matchers)}[$__rate_interval])"


def sum_by(labels: Sequence[str], expr: str) -> str:
    """``sum by (labels) (expr)``."""
    return f"sum by ({', '.join(labels)}) ({expr})"


def quantile(q: float, bucket: str, labels: Sequence[str], *matchers: str) -> str:
    """The ``q`` quantile of a histogram's ``_bucket`` series, per ``labels``."""
    return f"histogram_quantile({q}, {sum_by([*labels, 'le'], rate(bucket, *matchers))})"


# -- panels ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Q:
    """One PromQL query of a panel, its legend, and whether Grafana fetches its exemplars."""

    expr: str
    legend: str = ""
    exemplar: bool = False


@dataclass(frozen=True)
class _Target:
    query: Q
    ref_id: str

    def to_json_data(self) -> dict[str, Any]:
        return {
            "datasource": DATASOURCE,
            "editorMode": "code",
            "exemplar": self.query.exemplar,
            "expr": self.query.expr,
            "instant": False,
            "legendFormat": self.query.legend or "__auto",
            "range": True,
            "refId": self.ref_id,
        }


def _targets(queries: Sequence[Q]) -> list[_Target]:
    return [_Target(q, ref) for q, ref in zip(queries, string.ascii_uppercase, strict=False)]


def timeseries(
    title: str,
    queries: Sequence[Q],
    *,
    unit: str = "short",
    description: str = "",
    width: int = 12,
    stack: bool = False,
    steps: bool = False,
) -> Any:
    """A time-series panel of ``queries`` on the dashboard's Prometheus datasource."""
    return TimeSeries(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=_targets(queries),
        unit=unit,
        gridPos=GridPos(h=_HEIGHT["timeseries"], w=width, x=0, y=0),
        maxDataPoints=None,
        fillOpacity=30 if stack else 0,
        stacking={"mode": "normal" if stack else "none", "group": "A"},
        thresholds=_BASE_THRESHOLD,
        lineInterpolation="stepAfter" if steps else "linear",
        showPoints="never",
        tooltipMode="multi",
        tooltipSort="desc",
        legendDisplayMode="table",
        legendCalcs=["mean", "max", "lastNotNull"],
    )


def stat(
    title: str, queries: Sequence[Q], *, unit: str = "short", description: str = "", width: int = 6
) -> Any:
    """A stat panel: the last value of each query, with a sparkline."""
    return Stat(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=_targets(queries),
        format=unit,
        reduceCalc="lastNotNull",
        noValue="no data",
        thresholds=_BASE_THRESHOLD,
        gridPos=GridPos(h=_HEIGHT["stat"], w=width, x=0, y=0),
        maxDataPoints=None,
    )


Section = tuple[str, Sequence[Any]]  # a row title and its panels, laid out left to right


def _layout(sections: Sequence[Section]) -> list[Any]:
    """Rows and their panels with grid positions and ids, in reading order."""
    laid: list[Any] = []
    y = 0
    for title, panels in sections:
        laid.append(RowPanel(title=title, gridPos=GridPos(h=1, w=24, x=0, y=y), id=len(laid) + 1))
        y += 1
        x = height = 0
        for panel in panels:
            grid = panel.gridPos
            if x + grid.w > 24:
                x, y, height = 0, y + height, 0
            laid.append(
                attr.evolve(panel, gridPos=GridPos(h=grid.h, w=grid.w, x=x, y=y), id=len(laid) + 1)
            )
            x += grid.w
            height = max(height, grid.h)
        y += height
    return laid


# -- variables and links --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Variable:
    """A template variable as Grafana 10/11 writes it (grafanalib's Template cannot pick All)."""

    name: str
    label: str
    type: str
    query: str
    current: str
    multi: bool = False

    def to_json_data(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "current": {"selected": True, "text": self.current, "value": self.current},
            "hide": 0,
            "label": self.label,
            "name": self.name,
            "options": [],
            "query": self.query,
            "refresh": 1,
            "regex": "",
            "type": self.type,
        }
        if self.multi:
            body["current"] = {"selected": True, "text": ["All"], "value": [ALL]}
            body.update(
                datasource=DATASOURCE,
                definition=self.query,
                includeAll=True,
                allValue=".*",  # `=~".*"` also matches series without the label
                multi=True,
                refresh=2,  # on time range change: new models appear without a reload
                sort=1,
            )
        return body


def _variables(options: DashboardOptions, model_metric: str) -> Templating:
    models = f"label_values({model_metric}, model)"
    instances = f"label_values({UP}, instance)"
    return Templating(
        list=[
            _Variable(
                "datasource", "Prometheus", "datasource", "prometheus", options.prometheus_uid
            ),
            _Variable("model", "Model", "query", models, ALL, multi=True),
            _Variable("instance", "Instance", "query", instances, ALL, multi=True),
        ]
    )


def _jaeger_explore(uid: str) -> str:
    """Grafana Explore on the Jaeger datasource, in the search view."""
    pane = {
        "datasource": uid,
        "queries": [
            {"refId": "A", "datasource": {"type": "jaeger", "uid": uid}, "queryType": "search"}
        ],
        "range": {"from": "now-1h", "to": "now"},
    }
    panes = json.dumps({"traces": pane}, sort_keys=True, separators=(",", ":"))
    return f"/explore?schemaVersion=1&panes={quote(panes, safe='')}&orgId=1"


def _links(options: DashboardOptions) -> list[Any]:
    return [
        DashboardLink(
            type="dashboards",
            tags=[options.slug],
            asDropdown=True,
            includeVars=True,
            keepTime=True,
            title=f"{options.title_prefix} dashboards",
        ),
        DashboardLink(
            type="link",
            uri=_jaeger_explore(options.jaeger_uid),
            title="Traces in Jaeger",
            icon="external link",
            keepTime=False,
            targetBlank=True,
            tooltip="Search traces; an exemplar on a latency panel opens its own trace",
        ),
    ]


# -- the dashboard --------------------------------------------------------------------------------


def dashboard(
    options: DashboardOptions,
    name: str,
    title: str,
    description: str,
    model_metric: str,
    sections: Sequence[Section],
) -> Any:
    """A grafanalib ``Dashboard`` with otelkit's variables, links, uid, tags and layout.

    ``model_metric`` is a metric carrying the ``model`` label, for the ``$model`` choices.
    """
    return Dashboard(
        title=options.title(title),
        uid=options.uid(name),
        description=description,
        tags=[options.slug, name],
        timezone="browser",
        refresh="30s",
        time=Time("now-1h", "now"),
        graphTooltip=GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
        schemaVersion=SCHEMA_VERSION,
        templating=_variables(options, model_metric),
        links=_links(options),
        panels=_layout(sections),
    )


def to_json(built: Any) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model: plain dicts, lists and scalars."""
    data: dict[str, Any] = json.loads(json.dumps(built.to_json_data(), cls=dashboard_encoder()))
    return data
