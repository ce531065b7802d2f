"""The plots of a study's results: scaling, latency, utilisation, attribution, saturation, GPUs,
and a refusing server's offered, served and refused requests.

Read through ``otelkit.study``'s results API (``StudyResults``: its points, derived rows and
verdicts), so the page says what ``otelkit study show`` says. A plot appears only when its data
does: ε needs a sweep of instances, T = N/ℓ one of batch sizes, GPU plots GPU readings. T = N/ℓ
is derived (the batch over the mean latency, as at one request in flight): its plot says so and
draws the measured inferences a second beside it.

>>> from otelkit.study import StudyResults
>>> study_charts(StudyResults({"unit": "request"}, []))
[]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from otelkit.analysis._breakdown import TOTAL
from otelkit.report._charts import Chart, line_chart
from otelkit.study import Point, StudyResults
from otelkit.study._capacity import resources
from otelkit.study._derived import LOAD_AXES, curves

__all__ = ["axis_title", "study_charts", "swept"]

_AXIS_TITLES = {
    "concurrency": "client threads (requests in flight)",
    "rate": "offered load (requests/s)",
    "instances": "model instances",
    "servers": "servers behind the load balancer",
    "batch_size": "batch size (inferences per request)",
}


def axis_title(axis: str) -> str:
    """The axis title of a swept parameter, with its unit.

    >>> axis_title("rate"), axis_title("option")
    ('offered load (requests/s)', 'option')
    """
    return _AXIS_TITLES.get(axis, axis)


def swept(points: Iterable[Point]) -> list[str]:
    """The numeric parameters that take more than one value, load axes first."""
    values: dict[str, set[Any]] = {}
    for point in points:
        for key, value in point.params.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                values.setdefault(key, set()).add(value)
    axes = [k for k, v in values.items() if len(v) > 1]
    return sorted(axes, key=lambda k: LOAD_AXES.index(k) if k in LOAD_AXES else len(LOAD_AXES))


def _series(curve: str) -> str:
    return curve or "all points"


def study_charts(results: StudyResults, prefix: str = "study") -> list[Chart]:
    """Every plot the results hold data for, in the page's order."""
    ok = [p for p in results.points if p.status == "ok"]
    unit = str(results.header.get("unit", "request"))
    charts: list[Chart] = []
    for axis in swept(ok):
        charts += _throughput_and_latency(results, ok, axis, unit, prefix)
        charts += _overload(ok, axis, unit, prefix)
    charts += _derived(results, prefix)
    charts += _throughput_by_batch(results, prefix)
    load_axis = next(iter(swept(ok)), None)
    if load_axis is not None:
        charts += _utilisation(results, ok, prefix)
        charts += _attribution(results, ok, prefix)
        charts += _saturation_and_gpus(ok, load_axis, prefix)
    return charts


def _throughput_and_latency(
    results: StudyResults, ok: list[Point], axis: str, unit: str, prefix: str
) -> list[Chart]:
    rows, latency = [], []
    for curve, members in curves(ok, axis).items():
        for p in members:
            at = p.params[axis]
            rows.append({axis: at, f"{unit}s/s": round(p.throughput, 3), "series": _series(curve)})
            for q, name in ((0.5, "p50"), (0.99, "p99")):
                latency.append(
                    {
                        axis: at,
                        "ms": round(p.latency_ms(q), 3),
                        "series": _series(curve),
                        "percentile": name,
                    }
                )
    if not rows:
        return []
    knees = [
        {axis: row.at, f"{unit}s/s": row.value, "label": "knee"}
        for row in results.figure("knee")
        if row.axis == axis
    ]
    return [
        line_chart(
            f"{prefix}-throughput-{axis}",
            f"Throughput against {axis}",
            rows,
            (axis, axis_title(axis)),
            (f"{unit}s/s", f"throughput ({unit}s/s)"),
            marks=knees,
            note="Rings mark each curve's knee: beyond it, more load pays less than the tolerance.",
        ),
        line_chart(
            f"{prefix}-latency-{axis}",
            f"Latency p50 and p99 against {axis}",
            latency,
            (axis, axis_title(axis)),
            ("ms", "latency (ms)"),
            dash="percentile",
        ),
    ]


def _overload(ok: list[Point], axis: str, unit: str, prefix: str) -> list[Chart]:
    """Offered, served (goodput) and refused a second along a load axis where the server
    refused requests: whether goodput holds or collapses past the refusals' onset."""
    if axis not in ("rate", "concurrency") or not any(p.refused for p in ok):
        return []
    rows = []
    for curve, members in curves(ok, axis).items():
        for p in members:
            for what, value in (
                ("offered", p.offered),
                ("served", p.throughput),
                ("refused", p.refused_per_s),
            ):
                rows.append(
                    {axis: p.params[axis], f"{unit}s/s": round(value, 3), "series": what}
                    | ({"curve": curve} if curve else {})
                )
    return [
        line_chart(
            f"{prefix}-overload-{axis}",
            f"Offered, served and refused against {axis}",
            rows,
            (axis, axis_title(axis)),
            (f"{unit}s/s", f"{unit}s/s"),
            dash="curve" if any("curve" in row for row in rows) else None,
            note="Served is goodput: past the refusals' onset it holds or collapses.",
        )
    ]


def _derived(results: StudyResults, prefix: str) -> list[Chart]:
    charts = []
    specs = (
        ("efficiency", "Throughput scaling efficiency ε = (Tᵢ/i)/T₁", "ε (1 = ideal)", 1.0),
        ("server_efficiency", "Scaling over servers (Tₛ/s)/T₁", "ε (1 = ideal)", 1.0),
        ("strong_scaling", "Strong scaling (t₁/n)/tₙ", "strong scaling (1 = ideal)", 1.0),
    )
    for figure, title, y_title, ideal in specs:
        found = results.figure(figure)
        if not found:
            continue
        rows = [{"at": r.at, "value": round(r.value, 4), "series": _series(r.curve)} for r in found]
        x_axis = found[0].axis
        x_title = (
            axis_title(x_axis)
            if x_axis != "concurrency=instances"
            else ("client threads = model instances")
        )
        name = f"{prefix}-{figure.replace('_', '-')}"
        charts.append(
            line_chart(name, title, rows, ("at", x_title), ("value", y_title), rule_y=ideal)
        )
    return charts


def _utilisation(results: StudyResults, ok: list[Point], prefix: str) -> list[Chart]:
    """Per verdict: each resource's utilisation U = X.D/m along its curve, the bottleneck in
    bold, the plateau measured beside the one predicted (the utilisation and bottleneck laws)."""
    charts = []
    unit = str(results.header.get("unit", "request"))
    for n, verdict in enumerate(results.verdicts):
        members = curves(ok, verdict.axis).get(verdict.curve, [])
        locks = [e for e in verdict.evidence if e.kind in ("lock", "pool")]
        rows: list[dict[str, Any]] = []
        for p in members:
            at = p.params[verdict.axis]
            for resource in resources(p).values():
                if resource.utilisation is not None and resource.kind != "stage":
                    rows.append(
                        {
                            verdict.axis: at,
                            "U": round(resource.utilisation, 4),
                            "resource": resource.name,
                        }
                    )
            for lock in locks:  # k at a time: its hold, the low-load time, at this X
                k = lock.servers or 1
                rows.append(
                    {
                        verdict.axis: at,
                        "U": round(p.throughput * lock.low_ms / 1e3 / k, 4),
                        "resource": f"{lock.name} ({_at_once(k)} at a time)",
                    }
                )
        if not rows:
            continue
        limit = verdict.limit
        held = next((e for e in locks if e.name == verdict.limit), None)
        if verdict.resource in ("lock", "pool") and held is not None:
            limit = f"{limit} ({_at_once(held.servers or 1)} at a time)"
        measured = (
            f"plateau measured {verdict.plateau_per_s:.0f} {unit}s/s"
            if verdict.plateau_per_s
            else "no plateau within the sweep"
        )
        predicted = (
            f"; predicted m/D {verdict.predicted_per_s:.0f} {unit}s/s (derived)"
            if verdict.predicted_per_s
            else ""
        )
        title = f"Utilisation of each resource ({_series(verdict.curve)}): {verdict.kind}"
        charts.append(
            line_chart(
                f"{prefix}-utilisation-{n}",
                title,
                rows,
                (verdict.axis, axis_title(verdict.axis)),
                ("U", "utilisation U = X·D/m (1 = always busy)"),
                series="resource",
                highlight=limit,
                rule_y=1.0,
                note=f"{measured}{predicted}. {verdict.kind}: {verdict.sentence}",
            )
        )
    return charts


def _throughput_by_batch(results: StudyResults, prefix: str) -> list[Chart]:
    """T = N/ℓ, derived, and the inferences a second measured at the same points."""
    rows = []
    for row in results.figure("throughput_n_over_l"):
        series = _series(row.curve)
        rows.append(
            {
                "at": row.at,
                "inferences/s": round(row.value, 3),
                "series": f"{series}: T = N/ℓ (derived)",
            }
        )
        rows.append(
            {
                "at": row.at,
                "inferences/s": round(row.detail["measured_items_per_s"], 3),
                "series": f"{series}: measured",
            }
        )
    if not rows:
        return []
    return [
        line_chart(
            f"{prefix}-throughput-n-over-l",
            "T = N/ℓ (derived) and measured inferences/s against batch size",
            rows,
            ("at", axis_title("batch_size")),
            ("inferences/s", "inferences/s"),
            note="T = N/ℓ is derived: the batch over the mean latency, what the server gives with "
            "one request in flight. The measured inferences a second are at each point's load.",
        )
    ]


def _matches(component: str, limit: str | None) -> bool:
    return limit is not None and (component == limit or component.endswith(f" {limit}"))


def _attribution(results: StudyResults, ok: list[Point], prefix: str) -> list[Chart]:
    """Per verdict: each component's ms per request along its curve, the culprit in bold."""
    charts = []
    for n, verdict in enumerate(results.verdicts):
        members = curves(ok, verdict.axis).get(verdict.curve, [])
        rows = []
        for p in members:
            for component, stat in p.traces.components.items() if p.traces else ():
                if component != TOTAL:
                    rows.append(
                        {
                            verdict.axis: p.params[verdict.axis],
                            "component": component,
                            "ms": round(stat.mean_ms, 4),
                        }
                    )
        if not rows:
            continue
        culprit = next(
            (str(r["component"]) for r in rows if _matches(str(r["component"]), verdict.limit)),
            None,
        )
        title = f"What caps throughput ({_series(verdict.curve)}): {verdict.kind}"
        charts.append(
            line_chart(
                f"{prefix}-attribution-{n}",
                title,
                rows,
                (verdict.axis, axis_title(verdict.axis)),
                ("ms", "time per request (ms)"),
                series="component",
                highlight=culprit,
                note=f"{verdict.kind}: {verdict.sentence}",
            )
        )
    return charts


def _saturation_and_gpus(ok: list[Point], axis: str, prefix: str) -> list[Chart]:
    saturation, utilisation, memory = [], [], []
    for curve, members in curves(ok, axis).items():
        for p in members:
            at = p.params[axis]
            for model, figures in p.triton.items():
                saturation.append(
                    {
                        axis: at,
                        "ms": round(figures.saturation_ms, 4),
                        "series": f"{model} {curve}".strip(),
                    }
                )
            instances = float(p.params.get("instances", 1)) or 1.0
            for gpu, gauges in p.gpus.items():
                series = f"GPU {gpu[-8:]} {curve}".strip()
                if "utilization" in gauges:
                    utilisation.append(
                        {axis: at, "pct": 100 * gauges["utilization"], "series": series}
                    )
                if "memory_used_bytes" in gauges:
                    memory.append(
                        {
                            axis: at,
                            "GiB": gauges["memory_used_bytes"] / 2**30 / instances,
                            "series": series,
                        }
                    )
    charts = []
    x = (axis, axis_title(axis))
    if saturation:
        charts.append(
            line_chart(
                f"{prefix}-saturation",
                "Saturation against load",
                saturation,
                x,
                ("ms", "queue time per execution (ms)"),
                note="Triton's queue time per execution, as SuperSONIC scales on it.",
            )
        )
    if utilisation:
        charts.append(
            line_chart(
                f"{prefix}-gpu-utilisation",
                "GPU utilisation",
                utilisation,
                x,
                ("pct", "GPU utilisation (%)"),
            )
        )
    if memory:
        charts.append(
            line_chart(
                f"{prefix}-gpu-memory",
                "GPU memory per model instance",
                memory,
                x,
                ("GiB", "GPU memory per instance (GiB)"),
            )
        )
    return charts


def _at_once(k: float) -> str:
    return "one" if k == 1 else f"{k:g}"
