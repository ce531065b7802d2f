"""Figures for papers: each chart as SVG and PNG, sized for one column, without a browser.

vl-convert renders Vega-Lite with its own embedded engine (Deno and resvg), so figures come
out the same on a login node with no display and no Chromium. A column of a two-column paper is
about 3.4 in (245 pt) wide; the SVG is drawn at that size in points and the PNG at 300 dpi,
the legend below the plot.

>>> from otelkit.report._charts import line_chart
>>> chart = line_chart("t", "T", [{"x": 1, "y": 2.0, "series": "a"}], ("x", "threads"),
...                    ("y", "throughput (requests/s)"))
>>> import tempfile, pathlib
>>> paths = write_figures([chart], pathlib.Path(tempfile.mkdtemp()))
>>> [p.suffix for p in paths]
['.svg', '.png']
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from otelkit._core.extras import require
from otelkit.report._charts import Chart, sized

__all__ = ["COLUMN", "DPI", "write_figures"]

COLUMN = (245, 190)  # points, axes and legend included: one column of a two-column paper
DPI = 300
_FONT = 8  # points: the size of a paper's captions
_LABELS = 125  # points left of a bar chart's plot for its bars' labels


def _bars(chart: Chart) -> int:
    """How many bars a bar chart has (0: not one): their labels sit left of the plot."""
    y = chart.spec.get("encoding", {}).get("y", {})
    rows = chart.spec.get("data", {}).get("values", [])
    return len({row[y["field"]] for row in rows}) if y.get("type") == "nominal" else 0


def _column_spec(chart: Chart) -> dict[str, Any]:
    spec = sized(chart.spec, *COLUMN, font=_FONT)
    legend = {**spec["config"]["legend"], "columns": 2, "labelLimit": 95, "symbolSize": 40}
    bars = _bars(chart)
    if bars:
        # the group labels take the column's left half: the plot the rest, 10 pt a bar, and
        # the legend goes under both, from the left edge
        spec.update(width=COLUMN[0] - _LABELS, height=10 * bars)
        legend.update(orient="none", legendX=-_LABELS, legendY=10 * bars + 32)
        if "row" in spec.get("encoding", {}):  # panels: each as tall as its bars
            spec["height"] = {"step": 10}
            legend.update(orient="bottom", legendX=None, legendY=None)
            legend = {k: v for k, v in legend.items() if v is not None}
        spec["config"]["axisY"] = {"labelLimit": _LABELS - 8}
    else:  # the whole figure, axes and legend, in the column; the legend below the plot
        spec["autosize"] = {"type": "fit", "contains": "padding"}
        legend["orient"] = "bottom"
    spec["config"]["legend"] = legend
    return spec


def write_figures(charts: Sequence[Chart], folder: Path) -> list[Path]:
    """``<name>.svg`` and ``<name>.png`` per chart in ``folder``; returns the paths written."""
    vl_convert = require("vl_convert", extra="report", feature="otelkit report --figures")
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for chart in charts:
        spec = _column_spec(chart)
        svg = folder / f"{chart.name}.svg"
        svg.write_text(vl_convert.vegalite_to_svg(spec), encoding="utf-8")
        png = folder / f"{chart.name}.png"
        # ppi both draws at that density (72 points per inch) and is recorded in the PNG
        png.write_bytes(vl_convert.vegalite_to_png(spec, ppi=DPI))
        written += [svg, png]
    return written
