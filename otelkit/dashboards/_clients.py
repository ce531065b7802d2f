"""*Clients*: who calls, how often, how many calls wait, what fails, and what offloading costs.

The client's service and host are resource attributes: otelkit's Prometheus endpoint puts
them on ``target_info`` only, so per-service panels join on the scrape target's job and
instance.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from otelkit import semconv
from otelkit.dashboards._grafana import (
    INSTANCE,
    MODEL,
    TARGET_INFO,
    Q,
    dashboard,
    rate,
    selector,
    sum_by,
    timeseries,
)
from otelkit.dashboards._inference import triton_seconds_per_request
from otelkit.dashboards._options import DashboardOptions

__all__ = ["build", "with_service"]

_CLIENT = semconv.prometheus_name(semconv.CLIENT_DURATION)
_RESOURCE = ("service_name", "host_name")  # service.name, host.name as target_info labels
_SERVICE_LEGEND = "{{service_name}}@{{host_name}} {{model}}"


def with_service(expr: str) -> str:
    """``expr`` with the service and host of its scrape target (from ``target_info``)."""
    return f"{expr} * on (job, instance) group_left ({', '.join(_RESOURCE)}) {TARGET_INFO}"


def _rate(metric: str, by: Sequence[str] = (semconv.M_MODEL,)) -> str:
    return sum_by(by, rate(metric, MODEL, INSTANCE))


def _calls() -> list[Any]:
    by_service = sum_by(
        [*_RESOURCE, semconv.M_MODEL], with_service(rate(f"{_CLIENT}_count", MODEL, INSTANCE))
    )
    by_server = _rate(f"{_CLIENT}_count", [semconv.M_SERVER, semconv.M_PROTOCOL, semconv.M_MODEL])
    return [
        timeseries(
            "Calls/s by client service and host",
            [Q(by_service, _SERVICE_LEGEND)],
            unit="reqps",
            stack=True,
        ),
        timeseries(
            "Calls/s by server and protocol",
            [
                Q(by_server, "{{server}} {{protocol}} {{model}}"),
            ],
            unit="reqps",
            stack=True,
        ),
    ]


def _latency() -> list[Any]:
    buckets = with_service(rate(f"{_CLIENT}_bucket", MODEL, INSTANCE))
    p95 = f"histogram_quantile(0.95, {sum_by([*_RESOURCE, semconv.M_MODEL, 'le'], buckets)})"
    client_mean = f"{_rate(f'{_CLIENT}_sum')} / {_rate(f'{_CLIENT}_count')}"
    server_mean = triton_seconds_per_request(semconv.TRITON_REQUEST_DURATION_US)
    return [
        timeseries(
            "Client p95 by service and host",
            [
                Q(p95, f"{_SERVICE_LEGEND} p95", exemplar=True),
            ],
            unit="s",
            description="Exemplars (dots) open their trace in Jaeger.",
        ),
        timeseries(
            "Offload overhead per call",
            [
                Q(f"({client_mean}) - ({server_mean})", "{{model}} overhead"),
                Q(client_mean, "{{model}} client mean"),
                Q(server_mean, "{{model}} Triton mean request"),
            ],
            unit="s",
            description="Client mean time minus Triton's mean request time: "
            "serialisation, network and waiting in the client, per call.",
        ),
    ]


def _load_and_errors() -> list[Any]:
    in_flight = sum_by(
        [*_RESOURCE, semconv.M_MODEL],
        with_service(selector(semconv.prometheus_name(semconv.CLIENT_IN_FLIGHT), MODEL, INSTANCE)),
    )
    errors = semconv.prometheus_name(semconv.CLIENT_ERRORS)
    sent = semconv.prometheus_name(semconv.CLIENT_REQUEST_BYTES)
    received = semconv.prometheus_name(semconv.CLIENT_RESPONSE_BYTES)
    return [
        timeseries(
            "Calls in flight",
            [Q(in_flight, _SERVICE_LEGEND)],
            width=8,
            steps=True,
            description="Calls started and not yet finished, per client service.",
        ),
        timeseries(
            "Errors/s by error type",
            [
                Q(
                    _rate(errors, [semconv.M_MODEL, semconv.M_ERROR_TYPE]),
                    "{{model}} {{error_type}}",
                ),
            ],
            unit="ops",
            width=8,
            stack=True,
        ),
        timeseries(
            "Tensor bytes/s",
            [
                Q(_rate(sent), "{{model}} sent"),
                Q(_rate(received), "{{model}} received"),
            ],
            unit="Bps",
            width=8,
        ),
    ]


def build(options: DashboardOptions) -> Any:
    """The *Clients* dashboard as a grafanalib ``Dashboard``."""
    return dashboard(
        options,
        "clients",
        "Clients",
        "Inference calls by client service and host, by server, calls in flight, errors by "
        "type, client percentiles and the offload overhead per call.",
        f"{_CLIENT}_count",
        [
            ("Calls", _calls()),
            ("Latency and offload overhead", _latency()),
            ("Load and errors", _load_and_errors()),
        ],
    )
