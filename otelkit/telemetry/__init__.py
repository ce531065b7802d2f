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
from types import FrameType
from typing import Any

from opentelemetry import metrics, propagate, trace
from opentelemetry.metrics import CallbackOptions, Observation

from otelkit import semconv
from otelkit._core import guard
from otelkit._core.switch import SWITCH
from otelkit._core.worker import LATER
from otelkit.config import Settings, resolve
from otelkit.gpu import instruments as gpu_instruments
from otelkit.propagation import W3CPropagator
from otelkit.telemetry.pipeline import Telemetry, build

__all__ = ["Telemetry", "configure", "current", "flush", "shutdown"]

logger = logging.getLogger("otelkit")

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
        _state = build(settings)
        SWITCH.set(_state.tracer_provider, _state.meter_provider, _gpu_span_attributes(_state))
        _install_globals()
        _install_lifecycle_hooks(settings)
        LATER.start()
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


def _gpu_span_attributes(state: Telemetry) -> Callable[[], dict[str, Any]] | None:
    """What server spans add from the GPU sampler, when configured to."""
    sampler = state.gpu_sampler
    if sampler is None or not state.settings.gpu_span_attributes:
        return None
    return lambda: sampler.latest.span_attributes


def _stop(state: Telemetry, timeout_s: float) -> None:
    state.tracer_provider.shutdown()  # flushes and shuts down the span processor
    if state.metric_pusher is not None:
        state.metric_pusher.shutdown(timeout_s)
    if state.prometheus is not None:
        state.prometheus.close()
    state.meter_provider.shutdown(timeout_millis=timeout_s * 1000)
    if state.gpu_sampler is not None:
        state.gpu_sampler.stop(timeout_s)


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
    for spec, read in _HEALTH:
        create = (
            meter.create_observable_counter
            if spec.kind == "counter"
            else meter.create_observable_up_down_counter
        )
        create(spec.name, [_health_callback(read)], unit=spec.unit, description=spec.description)
    gpu_instruments.observe(meter, lambda: _state.gpu_sampler if _state is not None else None)


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


def _internal_error_observations(state: Telemetry) -> list[Observation]:
    return [Observation(guard.INTERNAL_ERRORS.total)]  # the whole process's, like the log


_HEALTH: tuple[tuple[semconv.MetricSpec, Callable[[Telemetry], list[Observation]]], ...] = (
    (semconv.TELEMETRY_SPANS_EXPORTED, lambda state: [Observation(state.stats()["exported"])]),
    (semconv.TELEMETRY_SPANS_DROPPED, _dropped_observations),
    (semconv.TELEMETRY_EXPORT_ERRORS, _export_error_observations),
    (semconv.TELEMETRY_INTERNAL_ERRORS, _internal_error_observations),
    (semconv.TELEMETRY_QUEUE_SIZE, _queued_observations),
)


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
