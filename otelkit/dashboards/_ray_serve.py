"""Ray Serve rows of the *Inference service* and *Pipeline stages* dashboards.

Ray's own metrics (on Ray's metrics export port) give the fleet's view per deployment: requests,
errors, processing latency (which excludes queueing), requests queued in callers' routers and
healthy replicas. otelkit's ``otelkit_ray_serve_call_duration_seconds`` gives each handle call
as the called replica ran it, per deployment and method, with exemplars that open the trace.
"""

from __future__ import annotations

from typing import Any

from otelkit import semconv
from otelkit.dashboards._grafana import INSTANCE, Q, quantile, rate, selector, sum_by, timeseries

__all__ = ["inference_panels", "stage_panels"]

_DEPLOYMENT = [semconv.RAY_SERVE_LABEL_DEPLOYMENT]
_LEGEND = "{{deployment}}"
_CALL = semconv.prometheus_name(semconv.RAY_SERVE_CALL_DURATION)
_CALL_BY = [semconv.M_DEPLOYMENT, semconv.M_METHOD]
_CALL_LEGEND = "{{deployment}}.{{method}}"


def _per_deployment(metric: str) -> str:
    return sum_by(_DEPLOYMENT, rate(metric, INSTANCE))


def inference_panels() -> list[Any]:
    """Request rate, errors, processing latency, queued requests and replicas per deployment."""
    processing = semconv.RAY_SERVE_PROCESSING_MS
    mean_ms = f"{_per_deployment(f'{processing}_sum')} / {_per_deployment(f'{processing}_count')}"
    queued = sum_by(_DEPLOYMENT, selector(semconv.RAY_SERVE_QUEUED, INSTANCE))
    replicas = sum_by(_DEPLOYMENT, selector(semconv.RAY_SERVE_REPLICAS_HEALTHY, INSTANCE))
    return [
        timeseries(
            "Ray Serve requests/s",
            [
                Q(_per_deployment(semconv.RAY_SERVE_REQUESTS), f"{_LEGEND} requests"),
                Q(_per_deployment(semconv.RAY_SERVE_ERRORS), f"{_LEGEND} errors"),
            ],
            unit="reqps",
            width=8,
            description="Requests each deployment's replicas finished, "
            "and those that raised (Ray Serve's counters).",
        ),
        timeseries(
            "Ray Serve processing latency",
            [
                Q(quantile(0.95, f"{processing}_bucket", _DEPLOYMENT, INSTANCE), f"{_LEGEND} p95"),
                Q(mean_ms, f"{_LEGEND} mean"),
            ],
            unit="ms",
            width=8,
            description="Time in the replica, queueing excluded (Ray "
            "Serve's histogram): read beside the queued requests.",
        ),
        timeseries(
            "Ray Serve queued requests and replicas",
            [
                Q(queued, f"{_LEGEND} queued"),
                Q(replicas, f"{_LEGEND} healthy replicas"),
            ],
            width=8,
            steps=True,
            description="Requests waiting in callers' routers for a replica "
            "(the saturation signal), and the replicas serving.",
        ),
    ]


def stage_panels() -> list[Any]:
    """Handle calls per deployment and method, as the called replicas ran them (otelkit's)."""
    mean = f"{sum_by(_CALL_BY, rate(f'{_CALL}_sum', INSTANCE))} / " + sum_by(
        _CALL_BY, rate(f"{_CALL}_count", INSTANCE)
    )
    return [
        timeseries(
            "Ray Serve handle calls p95",
            [
                Q(
                    quantile(0.95, f"{_CALL}_bucket", _CALL_BY, INSTANCE),
                    _CALL_LEGEND,
                    exemplar=True,
                ),
            ],
            unit="s",
            width=8,
            description="Each deployment method called through a "
            "DeploymentHandle; exemplars (dots) open their trace.",
        ),
        timeseries("Ray Serve handle call mean", [Q(mean, _CALL_LEGEND)], unit="s", width=8),
        timeseries(
            "Ray Serve handle calls/s",
            [
                Q(
                    sum_by([*_CALL_BY, semconv.M_ERROR_TYPE], rate(f"{_CALL}_count", INSTANCE)),
                    f"{_CALL_LEGEND} {{{{error_type}}}}",
                ),
            ],
            unit="ops",
            width=8,
            description="error_type is empty for calls that succeeded.",
        ),
    ]
