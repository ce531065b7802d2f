"""*Telemetry health*: is the telemetry itself complete? Spans dropped, exports failing, scrapes
down, GPU reads failing: each of these makes the other dashboards lie by omission.
"""

from __future__ import annotations

from typing import Any

from otelkit import semconv
from otelkit.dashboards._grafana import (
    INSTANCE,
    SCRAPE_DURATION,
    UP,
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

__all__ = ["build"]

_TARGET = ("job", "instance")
_TARGET_LEGEND = "{{job}} {{instance}}"


def _rate(metric: semconv.MetricSpec | str, *labels: str) -> str:
    name = metric if isinstance(metric, str) else semconv.prometheus_name(metric)
    return sum_by([*_TARGET, *labels], rate(name, INSTANCE))


def _overview() -> list[Any]:
    up = selector(UP, INSTANCE)
    dropped = f"sum({_rate(semconv.TELEMETRY_SPANS_DROPPED)}) or vector(0)"
    errors = f"sum({_rate(semconv.TELEMETRY_EXPORT_ERRORS)}) or vector(0)"
    return [
        stat("Targets up", [Q(f"sum({up})", "up")]),
        stat("Targets down", [Q(f"count({up} == 0) or vector(0)", "down")]),
        stat("Spans dropped/s", [Q(dropped, "dropped")], unit="ops"),
        stat("Export errors/s", [Q(errors, "errors")], unit="ops"),
    ]


def _spans() -> list[Any]:
    queued = sum_by(
        _TARGET, selector(semconv.prometheus_name(semconv.TELEMETRY_QUEUE_SIZE), INSTANCE)
    )
    exporting = sum_by(
        _TARGET, selector(semconv.prometheus_name(semconv.TELEMETRY_IN_EXPORT), INSTANCE)
    )
    return [
        timeseries(
            "Spans exported/s",
            [
                Q(_rate(semconv.TELEMETRY_SPANS_EXPORTED), _TARGET_LEGEND),
            ],
            unit="ops",
            width=8,
        ),
        timeseries(
            "Spans dropped/s by reason",
            [
                Q(
                    _rate(semconv.TELEMETRY_SPANS_DROPPED, semconv.DROP_REASON),
                    f"{_TARGET_LEGEND} {{{{{semconv.DROP_REASON}}}}}",
                ),
            ],
            unit="ops",
            width=8,
            stack=True,
            description="queue_full: the batch processor's "
            "queue overflowed (raise OTEL_BSP_MAX_QUEUE_SIZE or sample less); export_failed: the "
            "backend refused or was unreachable; shutdown: spans left at exit.",
        ),
        timeseries(
            "Export queue",
            [
                Q(queued, f"{_TARGET_LEGEND} queued"),
                Q(exporting, f"{_TARGET_LEGEND} exporting"),
            ],
            width=8,
            description="Spans waiting to be exported, and in the export under way.",
        ),
        timeseries(
            "Export errors/s by exporter",
            [
                Q(
                    _rate(semconv.TELEMETRY_EXPORT_ERRORS, semconv.EXPORTER),
                    f"{_TARGET_LEGEND} {{{{{semconv.EXPORTER}}}}}",
                ),
            ],
            unit="ops",
            width=12,
            stack=True,
        ),
        timeseries(
            "otelkit's own failures/s",
            [
                Q(_rate(semconv.TELEMETRY_INTERNAL_ERRORS), _TARGET_LEGEND),
            ],
            unit="ops",
            width=12,
            stack=True,
            description="Failures of otelkit's code, caught: "
            "the calls went on, but their telemetry may be missing. The process logs the first "
            "at each place with its traceback; please report it.",
        ),
    ]


def _scrapes() -> list[Any]:
    return [
        timeseries(
            "Scrape health (up)",
            [Q(selector(UP, INSTANCE), _TARGET_LEGEND)],
            steps=True,
            description="1 when Prometheus scraped the target last time.",
        ),
        timeseries(
            "Scrape duration",
            [Q(selector(SCRAPE_DURATION, INSTANCE), _TARGET_LEGEND)],
            unit="s",
            description="A scrape near its timeout loses whole scrapes.",
        ),
    ]


def _gpu_sampler() -> list[Any]:
    sample = semconv.prometheus_name(semconv.GPU_SAMPLE_DURATION)
    mean = f"{_rate(f'{sample}_sum')} / {_rate(f'{sample}_count')}"
    return [
        timeseries(
            "GPU read errors/s by field",
            [
                Q(
                    _rate(semconv.GPU_READ_ERRORS, semconv.M_FIELD),
                    f"{_TARGET_LEGEND} {{{{{semconv.M_FIELD}}}}}",
                ),
            ],
            unit="ops",
            stack=True,
        ),
        timeseries(
            "GPU sample duration",
            [
                Q(quantile(0.95, f"{sample}_bucket", _TARGET, INSTANCE), f"{_TARGET_LEGEND} p95"),
                Q(mean, f"{_TARGET_LEGEND} mean"),
            ],
            unit="s",
            description="Wall time of one NVML sample of every GPU.",
        ),
    ]


def build(options: DashboardOptions) -> Any:
    """The *Telemetry health* dashboard as a grafanalib ``Dashboard``."""
    return dashboard(
        options,
        "health",
        "Telemetry health",
        "Spans exported and dropped by reason, export errors by exporter, the export queue, "
        "scrape health per target, and the GPU sampler's read errors and sample duration.",
        semconv.TRITON_REQUEST_SUCCESS,
        [
            ("Overview", _overview()),
            ("Spans and exports", _spans()),
            ("Scrapes", _scrapes()),
            ("GPU sampler", _gpu_sampler()),
        ],
    )
