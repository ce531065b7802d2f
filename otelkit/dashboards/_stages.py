"""*Pipeline stages*: where the server's time goes, stage by stage, and how it grows with load.

Every series comes from ``otelkit.stage``: wall time, GPU time between CUDA events, stages in
flight and stage errors, labelled by model and stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from otelkit import semconv
from otelkit.dashboards import _ray_serve as ray_serve
from otelkit.dashboards._grafana import (
    INSTANCE,
    MODEL,
    Q,
    dashboard,
    quantile,
    rate,
    selector,
    sum_by,
    timeseries,
)
from otelkit.dashboards._options import DashboardOptions

__all__ = ["build"]

_BY = (semconv.M_MODEL, semconv.M_STAGE)
_LEGEND = "{{model}} {{stage}}"
_WALL = semconv.prometheus_name(semconv.STAGE_DURATION)
_GPU = semconv.prometheus_name(semconv.STAGE_GPU_DURATION)
_IN_FLIGHT = semconv.prometheus_name(semconv.STAGE_IN_FLIGHT)
_ERRORS = semconv.prometheus_name(semconv.STAGE_ERRORS)


def _rate(metric: str, by: Sequence[str] = _BY) -> str:
    return sum_by(by, rate(metric, MODEL, INSTANCE))


def _mean(histogram: str) -> str:
    return f"{_rate(f'{histogram}_sum')} / {_rate(f'{histogram}_count')}"


def _percentiles() -> list[Any]:
    return [
        timeseries(
            f"Stage p{p}",
            [
                Q(quantile(q, f"{_WALL}_bucket", _BY, MODEL, INSTANCE), _LEGEND, exemplar=True),
            ],
            unit="s",
            width=8,
            description="Wall time of each stage; exemplars (dots) open their trace in Jaeger.",
        )
        for q, p in ((0.5, 50), (0.95, 95), (0.99, 99))
    ]


def _share() -> list[Any]:
    total = _rate(f"{_WALL}_sum", [semconv.M_MODEL])
    share = f"{_rate(f'{_WALL}_sum')} / ignoring ({semconv.M_STAGE}) group_left {total}"
    in_flight = sum_by(_BY, selector(_IN_FLIGHT, MODEL, INSTANCE))
    return [
        timeseries(
            "Share of stage time",
            [Q(share, _LEGEND)],
            unit="percentunit",
            stack=True,
            description="Each stage's part of the time all stages of a model took: the "
            "stage that dominates is the one to speed up or to serve apart.",
        ),
        timeseries(
            "Stages in flight",
            [Q(in_flight, _LEGEND)],
            steps=True,
            description="Stages started and not yet finished, as otelkit counts them.",
        ),
    ]


def _growth() -> list[Any]:
    mean = _mean(_WALL)
    slowdown = f"{mean} / min_over_time(({mean})[$__range:$__rate_interval])"
    return [
        timeseries(
            "Mean stage time",
            [Q(mean, _LEGEND)],
            unit="s",
            width=8,
            description="Read beside the two panels on its right: a stage whose time "
            "grows with its rate is contended (GPU, locks, memory, too few instances).",
        ),
        timeseries("Stage runs/s", [Q(_rate(f"{_WALL}_count"), _LEGEND)], unit="ops", width=8),
        timeseries(
            "Slowdown: mean time over its best of the range",
            [Q(slowdown, _LEGEND)],
            width=8,
            description="1 while a stage runs as fast as it ever did in the "
            "time range; 2 when it takes twice that. Rising with the rate: contention.",
        ),
    ]


def _gpu_and_errors() -> list[Any]:
    gpu_share = f"{_rate(f'{_GPU}_sum')} / {_rate(f'{_WALL}_sum')}"
    errors_by = [*_BY, semconv.M_ERROR_TYPE]
    return [
        timeseries(
            "GPU time per stage",
            [
                Q(_mean(_GPU), f"{_LEGEND} mean"),
                Q(
                    quantile(0.95, f"{_GPU}_bucket", _BY, MODEL, INSTANCE),
                    f"{_LEGEND} p95",
                    exemplar=True,
                ),
            ],
            unit="s",
            width=8,
            description="GPU time between CUDA events around stages declared with gpu=True.",
        ),
        timeseries(
            "GPU share of stage wall time",
            [Q(gpu_share, _LEGEND)],
            unit="percentunit",
            width=8,
            description="Low: the stage waits on the CPU, the host or transfers.",
        ),
        timeseries(
            "Stage errors/s",
            [
                Q(_rate(_ERRORS, errors_by), "{{model}} {{stage}} {{error_type}}"),
            ],
            unit="ops",
            width=8,
        ),
    ]


def build(options: DashboardOptions) -> Any:
    """The *Pipeline stages* dashboard as a grafanalib ``Dashboard``."""
    return dashboard(
        options,
        "stages",
        "Pipeline stages",
        "Per model and stage: percentiles, share of the total, stages in flight, how stage time "
        "grows with load, GPU time and errors, from otelkit.stage.",
        f"{_WALL}_count",
        [
            ("Stage latency", _percentiles()),
            ("Where the time goes", _share()),
            ("Time growth with load", _growth()),
            ("GPU time and errors", _gpu_and_errors()),
            ("Ray Serve deployments", ray_serve.stage_panels()),
        ],
    )
