"""Building one configuration's pipeline: resource, sampler, exporters, readers, views.

``build(settings)`` returns a ``Telemetry``: the providers and everything that feeds them.
Nothing here touches process-wide state; ``otelkit.telemetry`` does that.
"""

from __future__ import annotations

# Imported before any TracerProvider exists, so that its lock is re-made in a forked child
# before the provider's own at-fork handler (which runs resource detectors on a thread pool)
# needs it: the other order hangs a child forked while another thread used a pool (OTLP/gRPC).
import concurrent.futures.thread  # noqa: F401
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)

from otelkit import semconv
from otelkit._config import Settings
from otelkit._core.sampling import RateLimitingSampler
from otelkit._core.worker import LATER, DrainFirst
from otelkit._resource import make_resource
from otelkit.export._processor import BatchExportProcessor, LossCounter, MetricPusher, PullReader
from otelkit.export._span_exporters import (
    HttpSpanExporter,
    JsonLinesSpanExporter,
    grpc_span_exporter,
)
from otelkit.gpu import _cuda_events as cuda_events

# What only some configurations use is imported when one of them is built: the Prometheus
# endpoint (prometheus_client, wsgiref) and the GPU sampler.
if TYPE_CHECKING:
    from otelkit.export._prometheus import PrometheusEndpoint
    from otelkit.gpu._sampler import GpuSampler

_log = logging.getLogger("otelkit")

__all__ = ["Telemetry", "build"]

_DEFAULT_PROMETHEUS_PORT = 9464  # the OpenTelemetry specification's default for Prometheus


@dataclass
class Telemetry:
    """What ``configure()`` built: providers, exporters and where the telemetry goes."""

    settings: Settings
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    traces_destination: str
    span_processor: BatchExportProcessor | None = None
    metric_pusher: MetricPusher | None = None
    prometheus: PrometheusEndpoint | None = None
    gpu_sampler: GpuSampler | None = None
    span_loss: LossCounter = field(default_factory=lambda: _span_loss(60.0))

    @property
    def prometheus_url(self) -> str | None:
        """URL of the scrape endpoint, or ``None`` when there is none."""
        return self.prometheus.url if self.prometheus else None

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Export every span ended so far (GPU-timed stages' included, once their CUDA events
        are read); ``False`` if that did not finish in time."""
        deadline = time.monotonic() + timeout_s
        ok = cuda_events.wait_idle(timeout_s)
        left_ms = max(0.0, deadline - time.monotonic()) * 1000
        ok = self.tracer_provider.force_flush(int(left_ms)) and ok
        if self.metric_pusher is not None:
            ok = self.metric_pusher.push() and ok
        return ok

    def stats(self) -> dict[str, int]:
        """Spans exported, queued, in export and lost so far, by reason: the figures behind the
        health metrics. Every sampled span ended is in exactly one of them."""
        processor = self.span_processor
        counts = (
            processor.counts()
            if processor is not None
            else {"exported": 0, "queued": 0, "in_export": 0}
        )
        counts.update({f"dropped_{r}": n for r, n in self.span_loss.totals.items()})
        return counts


def _span_loss(interval_s: float) -> LossCounter:
    return LossCounter(interval_s, "spans", semconv.TELEMETRY_SPANS_DROPPED)


def _sampler(settings: Settings) -> Sampler:
    name, arg = settings.sampler, settings.sampler_arg
    base = name.removeprefix("parentbased_")
    root: Sampler
    if base == "ratelimiting":
        root = RateLimitingSampler(arg)
    else:
        root = {"always_on": ALWAYS_ON, "always_off": ALWAYS_OFF}.get(base, TraceIdRatioBased(arg))
    return ParentBased(root) if name.startswith("parentbased_") else root


def _otlp_url(settings: Settings, specific: str | None, path: str) -> str | None:
    if specific:
        return specific
    if settings.endpoint is None:
        return None
    return (
        settings.endpoint if settings.protocol == "grpc" else settings.endpoint.rstrip("/") + path
    )


def _span_exporter(settings: Settings) -> tuple[Callable[[], SpanExporter] | None, str]:
    """A factory for the configured span exporter, and where it sends spans, in words."""
    url = _otlp_url(settings, settings.traces_endpoint, "/v1/traces")
    kind = settings.traces_exporter or ("otlp" if url else "jsonl")
    timeout_s = settings.export_timeout_ms / 1000
    if kind == "none":
        return None, "nowhere (traces_exporter=none)"
    if kind == "console":
        return ConsoleSpanExporter, "the console"
    if kind == "jsonl":
        exporter = JsonLinesSpanExporter(Path(settings.traces_dir).resolve(), settings.service_name)
        return (lambda: exporter), f"OTLP-JSON lines in {exporter.path}"
    if url is None:
        url = (
            "http://localhost:4317"
            if settings.protocol == "grpc"
            else "http://localhost:4318/v1/traces"
        )
    encoding = "json" if settings.protocol == "http/json" else "protobuf"
    if settings.protocol == "grpc":
        insecure = url.startswith("http://")
        return (
            lambda: grpc_span_exporter(url, insecure, settings.headers, timeout_s)
        ), f"OTLP/gRPC {url}"
    return (
        lambda: HttpSpanExporter(url, settings.headers, timeout_s, encoding)
    ), f"OTLP/HTTP ({encoding}) {url}"


def _metric_exporter(settings: Settings) -> Callable[[], MetricExporter]:
    url = _otlp_url(settings, settings.metrics_endpoint, "/v1/metrics")
    timeout_s = settings.export_timeout_ms / 1000
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as G

        grpc_url = url or "http://localhost:4317"
        insecure = grpc_url.startswith("http://")
        return lambda: G(grpc_url, insecure=insecure, headers=settings.headers, timeout=timeout_s)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as H

    http_url = url or "http://localhost:4318/v1/metrics"
    return lambda: H(http_url, headers=settings.headers, timeout=timeout_s)


def _metric_exporters(settings: Settings) -> frozenset[str]:
    if settings.metrics_exporter is not None:
        return settings.metrics_exporter
    chosen = set()
    if settings.metrics_endpoint or settings.endpoint:
        chosen.add("otlp")
    if settings.prometheus_port is not None:
        chosen.add("prometheus")
    return frozenset(chosen)


def _views() -> list[View]:
    """Bucket boundaries: every histogram in seconds (users' too) gets ``DURATION_BUCKETS_S``.

    The SDK's default buckets (0, 5, 10, ... 10000) suit milliseconds and would put every
    sub-5-second call in one bucket. Other units get the buckets their ``semconv`` entry names.
    """
    seconds = ExplicitBucketHistogramAggregation(semconv.DURATION_BUCKETS_S)
    views = [View(instrument_type=HistogramInstrument, instrument_unit="s", aggregation=seconds)]
    for spec in semconv.METRICS:
        if spec.kind == "histogram" and spec.unit != "s" and spec.buckets is not None:
            aggregation = ExplicitBucketHistogramAggregation(spec.buckets)
            views.append(View(instrument_name=spec.name, aggregation=aggregation))
    return views


def _gpu_sampler(settings: Settings) -> GpuSampler | None:
    """The GPU sampler, started; a recording that cannot be replayed is logged, not raised."""
    from otelkit.gpu._replay import RecordingError, ReplayBackend
    from otelkit.gpu._sampler import GpuSampler

    backend = None
    if settings.gpu_replay:
        try:
            backend = ReplayBackend(settings.gpu_replay)
        except RecordingError as error:
            _log.error("otelkit: no GPU metrics: %s", error)
            return None
    return GpuSampler(backend, settings.gpu_interval_s).start(wait=backend is not None)


def build(settings: Settings) -> Telemetry:
    """Everything one configuration needs, started; the caller installs it."""
    resource = make_resource(settings)
    make_span_exporter, destination = _span_exporter(settings)
    # Exit is otelkit's to bound (telemetry.shutdown): the SDK's own exit hook would wait for
    # the exporter as long as it takes.
    tracer_provider = TracerProvider(
        resource=resource, sampler=_sampler(settings), shutdown_on_exit=False
    )
    tracer_provider.add_span_processor(DrainFirst(LATER, settings.exit_timeout_s))
    loss = _span_loss(settings.drop_log_interval_s)
    processor = None
    if make_span_exporter is not None:
        processor = BatchExportProcessor(
            make_span_exporter,
            max_queue_size=settings.bsp_max_queue_size,
            max_batch_size=settings.bsp_max_export_batch_size,
            schedule_delay_s=settings.bsp_schedule_delay_ms / 1000,
            loss=loss,
        )
        tracer_provider.add_span_processor(processor)

    exporters = _metric_exporters(settings)
    readers: list[PullReader] = []
    prometheus_reader = PullReader() if "prometheus" in exporters else None
    push_reader = PullReader() if "otlp" in exporters else None
    readers = [r for r in (prometheus_reader, push_reader) if r is not None]
    meter_provider = MeterProvider(resource=resource, metric_readers=readers, views=_views())
    state = Telemetry(
        settings, tracer_provider, meter_provider, destination, processor, span_loss=loss
    )
    if settings.gpu or settings.gpu_span_attributes or settings.gpu_replay:
        state.gpu_sampler = _gpu_sampler(settings)
    if push_reader is not None:
        metric_loss = LossCounter(
            settings.drop_log_interval_s, "metric exports", semconv.TELEMETRY_EXPORT_ERRORS
        )
        state.metric_pusher = MetricPusher(
            push_reader,
            _metric_exporter(settings),
            settings.metric_export_interval_ms / 1000,
            metric_loss,
            resource,
        )
    if prometheus_reader is not None:
        from otelkit.export._prometheus import PrometheusEndpoint

        port = (
            _DEFAULT_PROMETHEUS_PORT
            if settings.prometheus_port is None
            else settings.prometheus_port
        )
        try:
            state.prometheus = PrometheusEndpoint(
                prometheus_reader,
                settings.prometheus_host,
                port,
                resource.attributes,
            )
        except OSError as error:  # a taken port (another worker of the same server) must not
            _log.error(  # stop the program: metrics are still recorded and pushed if configured
                "otelkit: no Prometheus endpoint on %s:%d (%s); this process's metrics are not"
                " served (give each process its own OTELKIT_PROMETHEUS_PORT)",
                settings.prometheus_host,
                port,
                error.strerror or error,
            )
    return state
