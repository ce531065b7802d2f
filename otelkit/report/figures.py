"""Figures for papers: each chart as SVG and PNG, sized for one column, without a browser.

vl-convert renders Vega-Lite with its own embedded engine (Deno and resvg), so figures come
out the same on a login node with no display and no Chromium. A column of a two-column paper is
about 3.4 in (245 pt) wide; the SVG is drawn at that size in points and the PNG at 300 dpi.

>>> from otelkit.report.charts import line_chart
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

from otelkit._core.extras import require
from otelkit.report.charts import Chart, sized

__all__ = ["COLUMN", "DPI", "write_figures"]

COLUMN = (190, 120)  # plot area in points: with axes and a legend the figure is a column wide
DPI = 300
_FONT = 8  # points: the size of a paper's captions


def write_figures(charts: Sequence[Chart], folder: Path) -> list[Path]:
    """``<name>.svg`` and ``<name>.png`` per chart in ``folder``; returns the paths written."""
    vl_convert = require("vl_convert", extra="report", feature="otelkit report --figures")
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for chart in charts:
        spec = sized(chart.spec, *COLUMN, font=_FONT)
        svg = folder / f"{chart.name}.svg"
        svg.write_text(vl_convert.vegalite_to_svg(spec), encoding="utf-8")
        png = folder / f"{chart.name}.png"
        # ppi is recorded in the PNG; scale draws it at that density (72 points per inch)
        png.write_bytes(vl_convert.vegalite_to_png(spec, scale=DPI / 72, ppi=DPI))
        written += [svg, png]
    return written
