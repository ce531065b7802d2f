"""Set-up and lifecycle: tracer and meter providers, their exporters, flush and shutdown.

``configure()`` builds everything once per distinct configuration; calling it again with the
same options returns what exists, with other options replaces it (never adding a second
exporter). Spans are flushed by ``shutdown()``, at interpreter exit, on SIGTERM, and when a
``multiprocessing`` child exits; a forked child exports with clients of its own.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

from opentelemetry import metrics, propagate, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)

from otelkit import resource as resource_detection
from otelkit import semconv
from otelkit._export import BatchExportProcessor, LossCounter, MetricPusher, PullReader
from otelkit._exporters import JsonHttpSpanExporter, JsonLinesSpanExporter
from otelkit._prometheus import PrometheusEndpoint
from otelkit._switch import SWITCH
from otelkit.config import Settings, resolve
from otelkit.propagation import W3CPropagator

__all__ = ["Telemetry", "configure", "current", "flush", "shutdown"]

logger = logging.getLogger("otelkit")
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
    span_loss: LossCounter = field(default_factory=lambda: _span_loss(60.0))

    @property
    def prometheus_url(self) -> str | None:
        """URL of the scrape endpoint, or ``None`` when there is none."""
        return self.prometheus.url if self.prometheus else None

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Export every span ended so far; ``False`` if that did not finish in time."""
        ok = self.tracer_provider.force_flush(int(timeout_s * 1000))
        if self.metric_pusher is not None:
            ok = self.metric_pusher.push() and ok
        return ok

    def stats(self) -> dict[str, int]:
        """Spans exported and lost so far, by reason: the figures behind the health metrics."""
        processor = self.span_processor
        counts = {"exported": processor.exported if processor else 0}
        counts.update({f"dropped_{r}": n for r, n in self.span_loss.totals.items()})
        return counts


_lock = threading.RLock()
_state: Telemetry | None = None
_globals_installed = False
_lifecycle_hooks_installed = False


def current() -> Telemetry | None:
    """The active configuration, or ``None`` before ``configure()`` and after ``shutdown()``."""
    return _state


def configure(**options: Any) -> Telemetry:
    """Set up tracing and metrics for this process; every option also comes from the environment.

    Options are listed in ``otelkit.config.OPTIONS``. With no endpoint configured anywhere,
    traces go to OTLP-JSON-lines files under ``./otelkit-traces``.

    >>> telemetry = otelkit.configure(service_name="tracking-client", prometheus_port=9464)
    """
    global _state
    settings = resolve(options)
    with _lock:
        if _state is not None and _state.settings == settings:
            return _state
        if _state is not None:
            _stop(_state, timeout_s=10.0)
        _state = _build(settings)
        SWITCH.set(_state.tracer_provider, _state.meter_provider)
        _install_globals()
        _install_lifecycle_hooks(settings)
    logger.info(
        "otelkit: service %s, traces to %s%s",
        settings.service_name, _state.traces_destination,
        f", metrics at {_state.prometheus_url}" if _state.prometheus else "",
    )  # fmt: skip
    return _state


def flush(timeout_s: float = 10.0) -> bool:
    """Export every span ended so far (e.g. before ``os._exit``); ``True`` when done in time."""
    state = _state
    return state.flush(timeout_s) if state is not None else True


def shutdown(timeout_s: float = 10.0) -> None:
    """Flush and stop every exporter; otelkit's tracers and meters become no-ops."""
    global _state
    with _lock:
        state, _state = _state, None
        if state is not None:
            SWITCH.set(None, None)
            _stop(state, timeout_s)


def _stop(state: Telemetry, timeout_s: float) -> None:
    state.tracer_provider.shutdown()  # flushes and shuts down the span processor
    if state.metric_pusher is not None:
        state.metric_pusher.shutdown(timeout_s)
    if state.prometheus is not None:
        state.prometheus.close()
    state.meter_provider.shutdown(timeout_millis=timeout_s * 1000)


# -- building ---------------------------------------------------------------------------------


def _span_loss(interval_s: float) -> LossCounter:
    return LossCounter(interval_s, "spans", semconv.TELEMETRY_SPANS_DROPPED)


def _resource(settings: Settings) -> Resource:
    attributes: dict[str, Any] = {
        "telemetry.sdk.language": "python",
        "telemetry.sdk.name": "opentelemetry",
        "telemetry.sdk.version": metadata.version("opentelemetry-sdk"),
        semconv.TELEMETRY_DISTRO_VERSION: metadata.version("otelkit"),
        **resource_detection.detect(),
        **settings.resource_attributes,
        semconv.SERVICE_NAME: settings.service_name,
    }
    return Resource(attributes)


def _sampler(settings: Settings) -> Sampler:
    name, ratio = settings.sampler, settings.sampler_arg
    root = {"always_on": ALWAYS_ON, "always_off": ALWAYS_OFF}.get(
        name.removeprefix("parentbased_"), TraceIdRatioBased(ratio)
    )
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
    if settings.protocol == "http/json":
        return (lambda: JsonHttpSpanExporter(url, settings.headers, timeout_s)), f"OTLP/JSON {url}"
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

        insecure = url.startswith("http://")
        return (
            lambda: Grpc(url, insecure=insecure, headers=settings.headers, timeout=timeout_s)
        ), f"OTLP/gRPC {url}"
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    return (lambda: Http(url, headers=settings.headers, timeout=timeout_s)), f"OTLP/HTTP {url}"


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


def _build(settings: Settings) -> Telemetry:
    resource = _resource(settings)
    make_span_exporter, destination = _span_exporter(settings)
    tracer_provider = TracerProvider(resource=resource, sampler=_sampler(settings))
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
    if push_reader is not None:
        metric_loss = LossCounter(
            settings.drop_log_interval_s, "metric exports", semconv.TELEMETRY_EXPORT_ERRORS
        )
        state.metric_pusher = MetricPusher(
            push_reader,
            _metric_exporter(settings),
            settings.metric_export_interval_ms / 1000,
            metric_loss,
        )
    if prometheus_reader is not None:
        port = settings.prometheus_port
        state.prometheus = PrometheusEndpoint(
            prometheus_reader,
            settings.prometheus_host,
            _DEFAULT_PROMETHEUS_PORT if port is None else port,
            {k: v for k, v in resource.attributes.items() if isinstance(v, (str, int))},
        )
    return state


# -- process-wide hooks -----------------------------------------------------------------------


def _health_callback(read: Callable[[Telemetry], list[Observation]]) -> Callable[..., Any]:
    def callback(options: CallbackOptions) -> list[Observation]:
        state = _state
        return read(state) if state is not None else []

    return callback


def _install_globals() -> None:
    global _globals_installed
    if _globals_installed:
        return
    _globals_installed = True
    trace.set_tracer_provider(SWITCH.tracers)
    metrics.set_meter_provider(SWITCH.meters)
    if trace.get_tracer_provider() is not SWITCH.tracers:
        logger.warning(
            "otelkit: another TracerProvider is already installed globally; otelkit's own spans "
            "use otelkit's provider, other instrumentations keep theirs"
        )
    if not os.environ.get("OTEL_PROPAGATORS"):
        propagate.set_global_textmap(W3CPropagator())
    meter = SWITCH.meters.get_meter("otelkit")
    meter.create_observable_counter(
        semconv.TELEMETRY_SPANS_EXPORTED.name,
        [_health_callback(lambda s: [Observation(s.stats()["exported"])])],
        unit=semconv.TELEMETRY_SPANS_EXPORTED.unit,
        description=semconv.TELEMETRY_SPANS_EXPORTED.description,
    )
    meter.create_observable_counter(
        semconv.TELEMETRY_SPANS_DROPPED.name,
        [_health_callback(_dropped_observations)],
        unit=semconv.TELEMETRY_SPANS_DROPPED.unit,
        description=semconv.TELEMETRY_SPANS_DROPPED.description,
    )
    meter.create_observable_counter(
        semconv.TELEMETRY_EXPORT_ERRORS.name,
        [_health_callback(_export_error_observations)],
        unit=semconv.TELEMETRY_EXPORT_ERRORS.unit,
        description=semconv.TELEMETRY_EXPORT_ERRORS.description,
    )
    meter.create_observable_up_down_counter(
        semconv.TELEMETRY_QUEUE_SIZE.name,
        [_health_callback(_queued_observations)],
        unit=semconv.TELEMETRY_QUEUE_SIZE.unit,
        description=semconv.TELEMETRY_QUEUE_SIZE.description,
    )


def _queued_observations(state: Telemetry) -> list[Observation]:
    return [Observation(state.span_processor.queued() if state.span_processor else 0)]


def _dropped_observations(state: Telemetry) -> list[Observation]:
    reasons = (
        semconv.DROP_REASON_QUEUE_FULL,
        semconv.DROP_REASON_EXPORT_FAILED,
        semconv.DROP_REASON_SHUTDOWN,
    )
    totals = state.span_loss.totals
    return [Observation(totals.get(r, 0), {semconv.DROP_REASON: r}) for r in reasons]


def _export_error_observations(state: Telemetry) -> list[Observation]:
    spans = state.span_processor.export_errors if state.span_processor else 0
    pusher = state.metric_pusher
    metric_errors = sum(pusher.loss.totals.values()) if pusher is not None else 0
    return [
        Observation(spans, {semconv.EXPORTER: "traces"}),
        Observation(metric_errors, {semconv.EXPORTER: "metrics"}),
    ]


def _install_lifecycle_hooks(settings: Settings) -> None:
    global _lifecycle_hooks_installed
    if _lifecycle_hooks_installed:
        return
    _lifecycle_hooks_installed = True
    atexit.register(shutdown)
    # A multiprocessing child leaves through os._exit, which skips atexit: flush in its finalizer.
    multiprocessing.util.register_after_fork(_finalize_child, _register_child_finalizer)
    if settings.install_signal_handler:
        _install_sigterm_handler()


class _ChildMarker:
    """An object for multiprocessing's after-fork registry, which wants a weak-referencable one."""


_finalize_child = _ChildMarker()


def _register_child_finalizer(_marker: object) -> None:
    multiprocessing.util.Finalize(None, shutdown, exitpriority=-100)


def _install_sigterm_handler() -> None:
    if threading.current_thread() is not threading.main_thread():
        logger.debug("otelkit: configure() not called from the main thread; no SIGTERM flush")
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # the program handles SIGTERM itself; it should call otelkit.shutdown()
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    shutdown(timeout_s=5.0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)  # die of SIGTERM, as the sender expects
