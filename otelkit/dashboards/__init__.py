"""Grafana dashboards for otelkit's metrics, built with grafanalib (``pip install
'otelkit[dashboards]'``), every metric name taken from ``otelkit.semconv``.

This package imports without grafanalib; only building a dashboard needs it.

>>> paths = write("dashboards", DashboardOptions(prometheus_uid="prom"))  # doctest: +SKIP
>>> substitute('rate(x{model=~"$model"}[$__rate_interval])', {"model": ["a", "b"]})
'rate(x{model=~"(a|b)"}[1m])'
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from otelkit._core.extras import require
from otelkit.dashboards._options import DashboardOptions

__all__ = [
    "DASHBOARDS",
    "DashboardOptions",
    "PanelQuery",
    "dumps",
    "grafanalib_dashboard",
    "panel_queries",
    "render",
    "substitute",
    "write",
]

JsonDict = dict[str, Any]


def grafanalib_dashboard(name: str, options: DashboardOptions | None = None) -> Any:
    """The grafanalib ``Dashboard`` of one of ``DASHBOARDS``: what a ``*.dashboard.py`` source
    for grafanalib's ``generate-dashboards`` assigns to ``dashboard``."""
    if name not in _NAMES:
        raise ValueError(f"no dashboard {name!r}; there are {', '.join(_NAMES)}")
    require("grafanalib", extra="dashboards", feature="building Grafana dashboards")
    module = importlib.import_module(f"otelkit.dashboards._{name}")
    return module.build(options or DashboardOptions())


def _builder(name: str) -> Callable[[DashboardOptions], JsonDict]:
    def build(options: DashboardOptions) -> JsonDict:
        grafana = importlib.import_module("otelkit.dashboards._grafana")
        data: JsonDict = grafana.to_json(grafanalib_dashboard(name, options))
        return data

    build.__doc__ = f"The {name} dashboard as Grafana's JSON model."
    return build


# file name (without .json) -> builder; each module's build() returns the grafanalib Dashboard
_NAMES = ("inference", "stages", "gpu", "clients", "health", "fleet")
DASHBOARDS: dict[str, Callable[[DashboardOptions], JsonDict]] = {
    name: _builder(name) for name in _NAMES
}


def render(options: DashboardOptions | None = None) -> dict[str, JsonDict]:
    """Every dashboard as Grafana's JSON model, by name."""
    options = options or DashboardOptions()
    return {name: build(options) for name, build in DASHBOARDS.items()}


def dumps(dashboard: JsonDict) -> str:
    """The file text of a dashboard: sorted keys, two-space indent, a trailing newline.

    The same text as grafanalib's ``generate-dashboards`` writes for the ``*.dashboard.py``
    sources, so either command leaves the committed files unchanged.
    """
    return json.dumps(dashboard, sort_keys=True, indent=2) + "\n"


def write(directory: str | Path, options: DashboardOptions | None = None) -> list[Path]:
    """Write ``<name>.json`` for every dashboard into ``directory``; the paths written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, dashboard in render(options).items():
        path = directory / f"{name}.json"
        path.write_text(dumps(dashboard), encoding="utf-8")
        paths.append(path)
    return paths


class PanelQuery(NamedTuple):
    """One PromQL query of a panel: the dashboard's title, the panel's title, the expression."""

    dashboard: str
    panel: str
    expr: str


def _panels(panels: Sequence[JsonDict]) -> Iterator[JsonDict]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or ())


def panel_queries(dashboard: JsonDict) -> list[PanelQuery]:
    """Every PromQL expression of a dashboard's panels (rows' nested panels too)."""
    return [
        PanelQuery(dashboard["title"], panel.get("title", ""), target["expr"])
        for panel in _panels(dashboard.get("panels") or ())
        for target in panel.get("targets") or ()
        if target.get("expr")
    ]


# -- Grafana's variables, as Grafana would replace them ------------------------------------------

DEFAULT_VALUES: dict[str, str | Sequence[str]] = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
    "model": "$__all",
    "instance": "$__all",
}
_VARIABLE = re.compile(
    r"\$\{(?P<braced>\w+)(?::(?P<format>\w+))?\}|\[\[(?P<bracket>\w+)(?::(?P<bformat>\w+))?\]\]"
    r"|\$(?P<plain>\w+)"
)
_REGEX_SPECIAL = re.compile(r"([\\^$*+?.()|\[\]{}])")


def _regex_escape(value: str) -> str:
    # as Grafana's Prometheus datasource does: a backslash doubled for the PromQL string
    return _REGEX_SPECIAL.sub(r"\\\\\1", value)


def _format(values: Sequence[str], style: str | None) -> str:
    if not values or values[0] in ("$__all", "All"):
        return ".*"  # the allValue of otelkit's variables, whatever the format
    if style in ("raw", "csv"):
        return ",".join(values)
    if style == "pipe":
        return "|".join(values)
    escaped = [_regex_escape(value) for value in values]
    return escaped[0] if len(escaped) == 1 else f"({'|'.join(escaped)})"


def substitute(expr: str, values: Mapping[str, str | Sequence[str]] | None = None) -> str:
    """``expr`` with Grafana's variables replaced, ready to send to Prometheus.

    ``values`` overrides ``DEFAULT_VALUES`` (``$__rate_interval`` 1m, ``$__interval`` 15s,
    ``$__range`` 1h, ``$model`` and ``$instance`` All). A multi-value variable becomes a
    regex alternation, All becomes ``.*``; ``${var:regex}``, ``:pipe``, ``:csv`` and ``:raw``
    work as in Grafana. An unknown variable raises ``KeyError`` naming it.
    """
    known = {**DEFAULT_VALUES, **(values or {})}

    def replace(match: re.Match[str]) -> str:
        name = match["braced"] or match["bracket"] or match["plain"]
        if name not in known:
            raise KeyError(f"no value for Grafana variable ${name} in {expr!r}")
        value = known[name]
        if name.startswith("__"):
            return str(value)
        chosen = [value] if isinstance(value, str) else list(value)
        return _format(chosen, match["format"] or match["bformat"])

    return _VARIABLE.sub(replace, expr)
