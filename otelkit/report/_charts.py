"""The report's charts as Vega-Lite specifications, and the breakdown's stacked bars.

A ``Chart`` is a plain Vega-Lite dict with its data inline: the page hands it to vega-embed,
``figures`` hands it to vl-convert for PNG and SVG, and both draw the same thing. Every axis
title names its unit. The specs are written as dicts rather than through altair: the page needs
nothing altair adds, and importing it costs a second of the report's time budget.

>>> chart = breakdown_chart({"option=3": {"server frnn": 4.0, "server queue": 1.0}})
>>> chart.spec["encoding"]["x"]["title"]
'mean time per request (ms)'
>>> [row["component"] for row in chart.spec["data"]["values"]]
['server queue', 'server frnn']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from otelkit.analysis._breakdown import CLIENT_OTHER, NETWORK, SERVER_OTHER, SERVER_QUEUE

__all__ = ["Chart", "breakdown_chart", "line_chart"]

SCHEMA = "https://vega.github.io/schema/vega-lite/v6.json"  # an identifier: never fetched
#: Vega's tableau20, then set3's twelve: 32 colours, one per component of a breakdown
_PALETTE = " ".join(
    (
        "#4c78a8 #9ecae9 #f58518 #ffbf79 #54a24b #88d27a #b79a20 #f2cf5b #439894 #83bcb6",
        "#e45756 #ff9d98 #79706e #bab0ac #d67195 #fcbfd2 #b279a2 #d6a5c9 #9e765f #d8b5a5",
        "#8dd3c7 #ffffb3 #bebada #fb8072 #80b1d3 #fdb462 #b3de69 #fccde5 #d9d9d9 #bc80bd",
        "#ccebc5 #ffed6f",
    )
).split()
_RANK = {"client serialize": 1, NETWORK: 2, SERVER_QUEUE: 3, SERVER_OTHER: 5}
_RANK.update({"client deserialize": 6, CLIENT_OTHER: 7})


@dataclass
class Chart:
    """One plot: ``name`` (its file name in ``--figures``), title, spec and a note in words."""

    name: str
    title: str
    spec: dict[str, Any]
    note: str = ""


def component_order(name: str) -> tuple[int, str]:
    """Where a breakdown component sits in the bars: client, wire, queue, stages, back; by name
    within a rank, so a page and a figure come out the same from run to run.

    >>> sorted(["client other", "server gnn", "server queue"], key=component_order)
    ['server queue', 'server gnn', 'client other']
    """
    if name in _RANK:
        return _RANK[name], name
    return (0 if name.startswith("client ") else 4), name


def breakdown_chart(
    groups: Mapping[str, Mapping[str, float]],
    name: str = "breakdown",
    facets: Mapping[str, tuple[str, str]] | None = None,
) -> Chart:
    """Stacked bars: one per group, each component's mean ms per request, in pipeline order.

    ``facets`` (group -> facet, bar label) splits the bars into panels, one per facet in the
    order of ``groups``, on one time axis: thirty groups stay readable, related ones side by
    side (one server's options and threads in its panel), labels whole.
    """
    rows: list[dict[str, Any]] = []
    names: set[str] = set()
    facets = facets or {}
    for group, components in groups.items():
        names.update(components)
        total = sum(max(0.0, ms) for ms in components.values()) or 1.0
        facet, bar = facets.get(group, ("", group))
        for component in sorted(components, key=component_order):
            ms = components[component]
            rows.append(
                {
                    "group": group,
                    "facet": facet,
                    "bar": bar,
                    "component": component,
                    "ms": round(ms, 4),
                    "share": round(100 * max(0.0, ms) / total, 1),
                    "order": component_order(component)[0],
                }
            )
    spec: dict[str, Any] = {
        "$schema": SCHEMA,
        "data": {"values": rows},
        "mark": {"type": "bar"},
        "height": {"step": 16},
        "encoding": {
            "y": {
                "field": "bar",
                "type": "nominal",
                "title": "group",
                "sort": None,
                "axis": {"labelLimit": 0},
            },
            "x": {
                "field": "ms",
                "type": "quantitative",
                "stack": "zero",
                "title": "mean time per request (ms)",
            },
            "color": {
                "field": "component",
                "type": "nominal",
                "title": "component",
                # the server's parts can bring more components than tableau20's colours
                "scale": {"range": _PALETTE} if len(names) > 20 else {"scheme": "tableau20"},
                "sort": sorted(names, key=component_order),
                # ten rows at most: the server's parts would make it taller than the bars
                "legend": {"columns": -(-len(names) // 10)} if len(names) > 16 else {},
            },
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [
                {"field": "group", "type": "nominal"},
                {"field": "component", "type": "nominal"},
                {"field": "ms", "type": "quantitative", "title": "ms per request", "format": ".3f"},
                {"field": "share", "type": "quantitative", "title": "share (%)"},
            ],
        },
    }
    panels = list(dict.fromkeys(row["facet"] for row in rows))
    if panels != [""]:
        spec["encoding"]["row"] = {
            "field": "facet",
            "type": "nominal",
            "title": None,
            "sort": panels,
            # each panel's name above it, so that the bars' labels keep the left side whole
            "header": {
                "labelOrient": "top",
                "labelAnchor": "start",
                "labelAngle": 0,
                "labelLimit": 0,
                "labelFontWeight": "bold",
            },
        }
        spec["resolve"] = {"scale": {"y": "independent"}}
    return Chart(name, "Where the time of a request goes, per group", spec)


def line_chart(
    name: str,
    title: str,
    rows: Sequence[Mapping[str, Any]],
    x: tuple[str, str],
    y: tuple[str, str],
    series: str = "series",
    *,
    dash: str | None = None,
    marks: Sequence[Mapping[str, Any]] = (),
    rule_y: float | None = None,
    highlight: str | None = None,
    note: str = "",
) -> Chart:
    """Lines with points: ``x`` and ``y`` are (field, axis title with unit), one line per
    ``series`` (and per ``dash``, drawn dashed); ``marks`` are rows drawn as labelled rings
    (knees); ``rule_y`` a dotted reference line (ideal scaling); ``highlight`` a series drawn
    bold, the others faded (the culprit of an attribution chart)."""
    encoding: dict[str, Any] = {
        "x": {"field": x[0], "type": "quantitative", "title": x[1]},
        "y": {"field": y[0], "type": "quantitative", "title": y[1]},
        "color": {"field": series, "type": "nominal", "title": series},
        "tooltip": [
            {"field": k, "type": "nominal" if isinstance(v, str) else "quantitative"}
            for k, v in rows[0].items()
        ]
        if rows
        else [],
    }
    if dash is not None:
        encoding["strokeDash"] = {"field": dash, "type": "nominal", "title": dash}
    if highlight is not None:
        test = {"field": series, "equal": highlight}
        encoding["strokeWidth"] = {"condition": {"test": test, "value": 3.5}, "value": 1.2}
        encoding["opacity"] = {"condition": {"test": test, "value": 1.0}, "value": 0.45}
    layers: list[dict[str, Any]] = [
        {
            "data": {"values": list(rows)},
            "mark": {"type": "line", "point": True},
            "encoding": encoding,
        },
    ]
    if marks:
        at = {"x": encoding["x"], "y": encoding["y"]}
        layers.append(
            {
                "data": {"values": list(marks)},
                "encoding": at,
                "mark": {
                    "type": "point",
                    "shape": "circle",
                    "size": 220,
                    "filled": False,
                    "color": "#d62728",
                    "strokeWidth": 2,
                },
            }
        )
        layers.append(
            {
                "data": {"values": list(marks)},
                "encoding": {**at, "text": {"field": "label", "type": "nominal"}},
                "mark": {"type": "text", "dy": -14, "color": "#d62728", "fontWeight": "bold"},
            }
        )
    if rule_y is not None:
        layers.append(
            {
                "data": {"values": [{"y": rule_y}]},
                "encoding": {"y": {"field": "y", "type": "quantitative"}},
                "mark": {"type": "rule", "strokeDash": [4, 4], "color": "#888"},
            }
        )
    return Chart(name, title, {"$schema": SCHEMA, "layer": layers}, note)


def sized(spec: Mapping[str, Any], width: int, height: int, font: int = 11) -> dict[str, Any]:
    """``spec`` at a size, with fonts for it (the page and a paper column want different ones).

    >>> sized({"mark": "bar"}, 240, 150)["width"]
    240
    """
    config = {
        "axis": {"labelFontSize": font - 1, "titleFontSize": font},
        "legend": {"labelFontSize": font - 1, "titleFontSize": font, "labelLimit": 260},
        "font": "sans-serif",
    }
    # a chart that sizes itself by its bars (a step per bar) keeps that height
    keep = isinstance(spec.get("height"), Mapping)
    return {**spec, "width": width, "height": spec["height"] if keep else height, "config": config}
