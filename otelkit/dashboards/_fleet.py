"""*Fleet*: many servers behind Envoy as one: who is registered and who is healthy, each
server's heartbeat, requests, errors and latency through Envoy, saturation per server and for
the fleet, and who is drained.

Three sources: the renderer's metrics (``otelkit fleet render --metrics-port``: registered
servers, heartbeat ages, drains), Envoy's ``/stats/prometheus`` (membership, per-server requests
with the clusters' per-endpoint stats, its latency histogram, retries, ejections) and each
server's Triton metrics, which carry the ``otelkit_server`` label of the renderer's ``file_sd``.
"""

from __future__ import annotations

from typing import Any

from otelkit import semconv
from otelkit.dashboards._grafana import (
    INSTANCE,
    MODEL,
    Q,
    dashboard,
    rate,
    selector,
    stat,
    sum_by,
    timeseries,
)
from otelkit.dashboards._options import DashboardOptions

__all__ = ["build", "fleet_saturation_ms", "server_saturation_ms"]

_CLUSTERS = f'{semconv.ENVOY_CLUSTER}=~"otelkit_(http|grpc)"'
_HTTP = f'{semconv.ENVOY_CLUSTER}="otelkit_http"'
_HOST = semconv.ENVOY_HOSTNAME
_SERVER = semconv.FLEET_SERVER_LABEL
_HOST_LEGEND = "{{envoy_endpoint_hostname}}"


def _name(spec: semconv.MetricSpec) -> str:
    return semconv.prometheus_name(spec)


def server_saturation_ms(by: tuple[str, ...] = (_SERVER,)) -> str:
    """Queue milliseconds per execution of each server (SuperSONIC's signal), from Triton."""
    queue = sum_by(by, rate(semconv.TRITON_QUEUE_DURATION_US, MODEL, INSTANCE))
    executions = sum_by(by, rate(semconv.TRITON_EXECUTION_COUNT, MODEL, INSTANCE))
    return f"{queue} / ({executions} > 0) / 1e3"


def fleet_saturation_ms() -> str:
    """The same over the whole fleet."""
    queue = f"sum({rate(semconv.TRITON_QUEUE_DURATION_US, MODEL, INSTANCE)})"
    executions = f"sum({rate(semconv.TRITON_EXECUTION_COUNT, MODEL, INSTANCE)})"
    return f"{queue} / ({executions} > 0) / 1e3"


def _membership() -> list[Any]:
    registered = f"sum({_name(semconv.FLEET_SERVERS)})"
    healthy = f"sum({selector(semconv.ENVOY_MEMBERSHIP_HEALTHY, _HTTP)})"
    drained = f"sum({_name(semconv.FLEET_DRAINED)}) or vector(0)"
    refused = f"max({_name(semconv.FLEET_REFUSED)})"
    by_cluster = (semconv.ENVOY_CLUSTER,)
    return [
        stat("Registered servers", [Q(registered)], description="With a live heartbeat."),
        stat(
            "Healthy in Envoy",
            [Q(healthy)],
            description="Servers Envoy routes to: registered, ready, not ejected or drained.",
        ),
        stat("Drained for saturation", [Q(drained)]),
        stat(
            "Registrations refused",
            [Q(refused)],
            description="Malformed or hostile entries of the registry: nothing rendered.",
        ),
        timeseries(
            "Registered against healthy",
            [
                Q(sum_by((semconv.M_SITE,), _name(semconv.FLEET_SERVERS)), "registered {{site}}"),
                Q(
                    sum_by(by_cluster, selector(semconv.ENVOY_MEMBERSHIP_TOTAL, _CLUSTERS)),
                    "in Envoy {{envoy_cluster_name}}",
                ),
                Q(
                    sum_by(by_cluster, selector(semconv.ENVOY_MEMBERSHIP_HEALTHY, _CLUSTERS)),
                    "healthy {{envoy_cluster_name}}",
                ),
            ],
            steps=True,
            description="A registered server that stays unhealthy is alerted on.",
        ),
        timeseries(
            "Heartbeat age",
            [
                Q(
                    f"max by (server, site) ({_name(semconv.FLEET_HEARTBEAT_AGE)})",
                    "{{server}} {{site}}",
                ),
            ],
            unit="s",
            description="Seconds since each server's last heartbeat; it leaves the "
            "fleet when its lease runs out.",
        ),
    ]


def _traffic() -> list[Any]:
    by_host = (_HOST,)
    requests = sum_by(by_host, rate(semconv.ENVOY_ENDPOINT_REQUESTS, _CLUSTERS))
    errors = sum_by(by_host, rate(semconv.ENVOY_ENDPOINT_ERRORS, _CLUSTERS))
    active = sum_by(by_host, selector(semconv.ENVOY_ENDPOINT_ACTIVE, _CLUSTERS))
    buckets = rate(f"{semconv.ENVOY_REQUEST_TIME_MS}_bucket", _CLUSTERS)
    p95 = f"histogram_quantile(0.95, {sum_by((semconv.ENVOY_CLUSTER, 'le'), buckets)})"
    triton = (
        f"{sum_by((_SERVER,), rate(semconv.TRITON_REQUEST_DURATION_US, MODEL, INSTANCE))} / "
        f"({sum_by((_SERVER,), rate(semconv.TRITON_REQUEST_SUCCESS, MODEL, INSTANCE))} > 0) / 1e3"
    )
    return [
        timeseries(
            "Requests/s per server through Envoy",
            [Q(requests, _HOST_LEGEND)],
            unit="reqps",
            stack=True,
        ),
        timeseries(
            "Errors/s per server through Envoy",
            [Q(errors, _HOST_LEGEND)],
            unit="reqps",
            width=6,
        ),
        timeseries(
            "Requests in flight per server",
            [Q(active, _HOST_LEGEND)],
            width=6,
            steps=True,
        ),
        timeseries(
            "Latency",
            [
                Q(p95, "Envoy p95 {{envoy_cluster_name}}"),
                Q(triton, "Triton mean {{otelkit_server}}"),
            ],
            unit="ms",
            description="Through Envoy (client side of the servers, per cluster) and "
            "each server's own mean request time (queue and compute).",
        ),
        timeseries(
            "Retries, ejections, failed health checks",
            [
                Q(
                    sum_by((semconv.ENVOY_CLUSTER,), rate(semconv.ENVOY_RETRIES, _CLUSTERS)),
                    "retries/s {{envoy_cluster_name}}",
                ),
                Q(
                    sum_by(
                        (semconv.ENVOY_CLUSTER,),
                        selector(semconv.ENVOY_EJECTIONS_ACTIVE, _CLUSTERS),
                    ),
                    "ejected {{envoy_cluster_name}}",
                ),
                Q(
                    sum_by(
                        (semconv.ENVOY_CLUSTER,),
                        rate(semconv.ENVOY_HEALTH_CHECK_FAILURES, _CLUSTERS),
                    ),
                    "failed checks/s {{envoy_cluster_name}}",
                ),
            ],
        ),
    ]


def _saturation() -> list[Any]:
    drained = f"max by (server) ({_name(semconv.FLEET_DRAINED)})"
    return [
        timeseries(
            "Saturation per server",
            [
                Q(server_saturation_ms(), "{{otelkit_server}}"),
                Q(f"max by (server) ({_name(semconv.FLEET_SATURATION)})", "{{server}} (renderer)"),
            ],
            unit="ms",
            description="Queue milliseconds per execution (SuperSONIC's signal): from "
            "each server's Triton metrics, and as the renderer's draining reads it.",
        ),
        timeseries(
            "Fleet saturation",
            [Q(fleet_saturation_ms(), "fleet")],
            unit="ms",
            width=6,
            description="The same over every server: alerted on when it stays high.",
        ),
        timeseries(
            "Drained servers",
            [Q(drained, "{{server}}")],
            width=6,
            steps=True,
            description="1 while the renderer keeps a server out of rotation.",
        ),
        timeseries(
            "Renderer",
            [
                Q(f"rate({_name(semconv.FLEET_RENDERS)}[$__rate_interval])", "renders/s"),
                Q(
                    f"rate({_name(semconv.FLEET_REGISTRY_ERRORS)}[$__rate_interval])",
                    "registry errors/s",
                ),
                Q(_name(semconv.FLEET_UNRESOLVED), "unresolved servers"),
            ],
            description="Registry errors leave Envoy on the last servers rendered.",
        ),
    ]


def build(options: DashboardOptions) -> Any:
    """The *Fleet* dashboard as a grafanalib ``Dashboard``."""
    return dashboard(
        options,
        "fleet",
        "Fleet",
        "Servers behind Envoy as one: registered against healthy, heartbeats, requests, errors "
        "and latency per server, saturation per server and for the fleet, drained servers.",
        semconv.TRITON_REQUEST_SUCCESS,
        [
            ("Membership", _membership()),
            ("Traffic per server", _traffic()),
            ("Saturation and draining", _saturation()),
        ],
    )
