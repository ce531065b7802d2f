"""*Inference service*: per model, what the clients asked, what Triton did, and how loaded it is.

Triton's counters give the server's view (requests, queue, compute, batches, pending); otelkit's
client histogram gives the percentiles Triton lacks, with exemplars that open the slow trace.
"""

from __future__ import annotations

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
    stat,
    sum_by,
    timeseries,
)
from otelkit.dashboards._options import DashboardOptions

__all__ = ["build", "triton_requests_per_s", "triton_seconds_per_request"]

_BY = [semconv.M_MODEL]
_CLIENT = semconv.prometheus_name(semconv.CLIENT_DURATION)
_HTTP = semconv.prometheus_name(semconv.HTTP_SERVER_DURATION)
_HTTP_BY = [semconv.M_HTTP_METHOD, semconv.M_HTTP_ROUTE, semconv.M_HTTP_STATUS]
_RPC = semconv.prometheus_name(semconv.RPC_SERVER_DURATION)
_RPC_BY = [semconv.M_RPC_METHOD]
_RPC_FAILED = f'{semconv.M_RPC_STATUS}=~"{"|".join(semconv.RPC_SERVER_ERROR_CODES)}"'


def _rate(metric: str) -> str:
    return sum_by(_BY, rate(metric, MODEL, INSTANCE))


def triton_requests_per_s() -> str:
    """Requests Triton finished per second and model, successful or failed."""
    success = _rate(semconv.TRITON_REQUEST_SUCCESS)
    return f"({success} + {_rate(semconv.TRITON_REQUEST_FAILURE)})"


def triton_seconds_per_request(cumulative_us: str) -> str:
    """Mean seconds per request of one of Triton's cumulative microsecond counters."""
    return f"{_rate(cumulative_us)} / {triton_requests_per_s()} / 1e6"


def _per_execution(cumulative_us: str, scale: str) -> str:
    return f"{_rate(cumulative_us)} / {_rate(semconv.TRITON_EXECUTION_COUNT)} / {scale}"


def _client_quantiles() -> list[Q]:
    return [
        Q(
            quantile(q, f"{_CLIENT}_bucket", _BY, MODEL, INSTANCE),
            f"{{{{model}}}} client p{p}",
            exemplar=True,
        )
        for q, p in ((0.5, 50), (0.95, 95), (0.99, 99))
    ]


def _saturation() -> str:
    return _per_execution(semconv.TRITON_QUEUE_DURATION_US, "1000")


def _overview() -> list[Any]:
    failures = f"{_rate(semconv.TRITON_REQUEST_FAILURE)} / {triton_requests_per_s()}"
    return [
        stat(
            "Requests/s (Triton)",
            [Q(f"sum({triton_requests_per_s()})", "requests/s")],
            unit="reqps",
        ),
        stat(
            "Failed requests",
            [Q(f"max({failures})", "worst model")],
            unit="percentunit",
            description="Share of Triton's requests that failed, for the worst model.",
        ),
        stat(
            "Client p95",
            [Q(quantile(0.95, f"{_CLIENT}_bucket", [], MODEL, INSTANCE), "p95")],
            unit="s",
            description="95th percentile of inference calls as clients saw them.",
        ),
        stat(
            "Saturation",
            [Q(f"max({_saturation()})", "worst model")],
            unit="ms",
            description="Queue milliseconds per execution for the most loaded model.",
        ),
    ]


def _throughput() -> list[Any]:
    return [
        timeseries(
            "Requests/s",
            [
                Q(triton_requests_per_s(), "{{model}} Triton"),
                Q(_rate(f"{_CLIENT}_count"), "{{model}} client calls"),
            ],
            unit="reqps",
            description="Requests Triton finished (success + failure) and "
            "inference calls otelkit-instrumented clients made.",
        ),
        timeseries(
            "Success vs failure",
            [
                Q(_rate(semconv.TRITON_REQUEST_SUCCESS), "{{model}} success"),
                Q(_rate(semconv.TRITON_REQUEST_FAILURE), "{{model}} failure"),
            ],
            unit="reqps",
            stack=True,
        ),
    ]


def _latency() -> list[Any]:
    server = triton_seconds_per_request(semconv.TRITON_REQUEST_DURATION_US)
    return [
        timeseries(
            "Client percentiles vs Triton request time",
            [
                *_client_quantiles(),
                Q(server, "{{model}} Triton mean request"),
            ],
            unit="s",
            width=24,
            description="Client-side p50/p95/p99 against the mean time "
            "Triton spent on a request. The gap is serialisation, network and client queueing. "
            "Exemplars (dots) open their trace in Jaeger.",
        ),
        timeseries(
            "Queue time per request",
            [
                Q(triton_seconds_per_request(semconv.TRITON_QUEUE_DURATION_US), "{{model}} queue"),
            ],
            unit="s",
            width=8,
        ),
        timeseries(
            "Compute per execution",
            [
                Q(_per_execution(semconv.TRITON_COMPUTE_INPUT_US, "1e6"), "{{model}} input"),
                Q(_per_execution(semconv.TRITON_COMPUTE_INFER_US, "1e6"), "{{model}} infer"),
                Q(_per_execution(semconv.TRITON_COMPUTE_OUTPUT_US, "1e6"), "{{model}} output"),
            ],
            unit="s",
            width=16,
            stack=True,
        ),
    ]


def _load() -> list[Any]:
    batch = f"{_rate(semconv.TRITON_INFERENCE_COUNT)} / {_rate(semconv.TRITON_EXECUTION_COUNT)}"
    pending = sum_by(_BY, selector(semconv.TRITON_PENDING_REQUESTS, MODEL, INSTANCE))
    return [
        timeseries(
            "Saturation: queue ms per execution",
            [Q(_saturation(), "{{model}}")],
            unit="ms",
            width=8,
            description="Mean queue time per model execution, "
            "the signal SuperSONIC scales on: it grows when requests wait for an "
            "instance, whatever the GPU utilisation says.",
        ),
        timeseries(
            "Mean batch size",
            [Q(batch, "{{model}}")],
            width=8,
            description="Inferences per execution: what dynamic batching achieves.",
        ),
        timeseries("Pending requests", [Q(pending, "{{model}}")], width=8, steps=True),
    ]


def _python_servers() -> list[Any]:
    http = f"{_HTTP}_bucket"
    return [
        timeseries(
            "HTTP requests/s",
            [
                Q(
                    sum_by(_HTTP_BY, rate(f"{_HTTP}_count", INSTANCE)),
                    "{{http_request_method}} {{http_route}} {{http_response_status_code}}",
                ),
            ],
            unit="reqps",
        ),
        timeseries(
            "HTTP p95 by route",
            [
                Q(
                    quantile(0.95, http, [semconv.M_HTTP_ROUTE], INSTANCE),
                    "{{http_route}} p95",
                    exemplar=True,
                ),
            ],
            unit="s",
            description="Python model servers instrumented with otelkit.instrument(app).",
        ),
    ]


def _grpc_servers() -> list[Any]:
    rpc_quantiles = [
        Q(
            quantile(q, f"{_RPC}_bucket", _RPC_BY, INSTANCE),
            f"{{{{rpc_method}}}} p{p}",
            exemplar=True,
        )
        for q, p in ((0.5, 50), (0.95, 95), (0.99, 99))
    ]
    return [
        timeseries(
            "gRPC requests/s",
            [
                Q(
                    sum_by([*_RPC_BY, semconv.M_RPC_STATUS], rate(f"{_RPC}_count", INSTANCE)),
                    "{{rpc_method}} {{rpc_response_status_code}}",
                ),
            ],
            unit="reqps",
            width=8,
            description="RPCs Python gRPC servers answered, by method "
            "and status (otelkit.server.grpc's interceptor).",
        ),
        timeseries(
            "gRPC latency percentiles",
            rpc_quantiles,
            unit="s",
            width=8,
            description="p50/p95/p99 of each method as the server saw it; exemplars "
            "(dots) open their trace.",
        ),
        timeseries(
            "gRPC server errors/s",
            [
                Q(
                    sum_by(
                        [*_RPC_BY, semconv.M_RPC_STATUS],
                        rate(f"{_RPC}_count", INSTANCE, _RPC_FAILED),
                    ),
                    "{{rpc_method}} {{rpc_response_status_code}}",
                ),
            ],
            unit="reqps",
            width=8,
            description="RPCs that ended with a code meaning the server "
            "failed (INTERNAL, UNKNOWN, UNAVAILABLE, ...); a bad request (INVALID_ARGUMENT, "
            "NOT_FOUND) is the caller's error and shows under requests/s only.",
        ),
    ]


def build(options: DashboardOptions) -> Any:
    """The *Inference service* dashboard as a grafanalib ``Dashboard``."""
    return dashboard(
        options,
        "inference",
        "Inference service",
        "Per model: request rates, success and failure, client percentiles against Triton's "
        "server time, queue and compute time, batch size, pending requests and saturation.",
        semconv.TRITON_REQUEST_SUCCESS,
        [
            ("Overview", _overview()),
            ("Throughput", _throughput()),
            ("Latency", _latency()),
            ("Load and saturation", _load()),
            ("Python model servers (FastAPI)", _python_servers()),
            ("Python gRPC servers (KServe v2 gRPC)", _grpc_servers()),
            ("Ray Serve", ray_serve.inference_panels()),
        ],
    )
