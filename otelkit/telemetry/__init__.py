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
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from opentelemetry import metrics, propagate, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.resources import Resource

from otelkit import semconv
from otelkit._config import Settings, resolve, takes_options
from otelkit._core import guard
from otelkit._core.deps.otel import merge_resource
from otelkit._core.switch import SWITCH
from otelkit._core.worker import LATER
from otelkit._propagation import W3CPropagator
from otelkit.export._processor import within
from otelkit.gpu import _cuda_events as cuda_events
from otelkit.gpu import _instruments as gpu_instruments
from otelkit.telemetry._pipeline import Telemetry, build

__all__ = ["Telemetry", "configure", "current", "flush", "shutdown"]

logger = logging.getLogger("otelkit")

_lock = threading.RLock()
_state: Telemetry | None = None
_globals_installed = False
_lifecycle_hooks_installed = False


def current() -> Telemetry | None:
    """The active configuration, or ``None`` before ``configure()`` and after ``shutdown()``."""
    return _state


@takes_options(Settings)
def configure(**options: Any) -> Telemetry:
    """Set up tracing and metrics for this process; every option also comes from the environment.

    The keyword arguments are the options of docs/configuration.md, declared once in ``Settings``
    (``otelkit/_config.py``), each optional: mypy rejects a misspelt one, and at run time it raises
    ``ConfigError`` naming the closest. With no endpoint configured anywhere, traces go to
    OTLP-JSON-lines files under ``./otelkit-traces``.

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
        settings.service_name,
        _state.traces_destination,
        f", metrics at {_state.prometheus_url}" if _state.prometheus else "",
    )
    return _state


def flush(timeout_s: float = 10.0) -> bool:
    """Export every span ended so far (e.g. before ``os._exit``); ``True`` when done in time."""
    state = _state
    return state.flush(timeout_s) if state is not None else True


def shutdown(timeout_s: float | None = None) -> None:
    """Flush and stop every exporter within ``timeout_s`` (default: the ``exit_timeout_s``
    option, 5 s), whatever the backends do; what is not sent by then is counted as dropped and
    logged. otelkit's tracers and meters become no-ops."""
    global _state
    with _lock:
        state, _state = _state, None
        if state is not None:
            SWITCH.set(None, None)
            _stop(state, state.settings.exit_timeout_s if timeout_s is None else timeout_s)


def _gpu_span_attributes(state: Telemetry) -> Callable[[], dict[str, Any]] | None:
    """What server spans add from the GPU sampler, when configured to."""
    sampler = state.gpu_sampler
    if sampler is None or not state.settings.gpu_span_attributes:
        return None
    return lambda: sampler.latest.span_attributes


def _stop(state: Telemetry, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    # Calls still ending on the worker and GPU-timed stages first, then the spans they made,
    # each within the bound.
    if not LATER.drain(left()):
        logger.warning("otelkit: calls still ending when shutdown ran out of time")
    if not cuda_events.wait_idle(left()):
        state.span_loss.add(semconv.DROP_REASON_SHUTDOWN, cuda_events.abandon())
    if state.span_processor is not None:
        state.span_processor.shutdown(left() * 1000)
    state.tracer_provider.shutdown()  # the processors are shut down: returns at once
    if state.metric_pusher is not None:
        state.metric_pusher.shutdown(left())
    if state.prometheus is not None:
        state.prometheus.close()
    within(deadline, state.meter_provider.shutdown, "meter provider shutdown")
    if state.gpu_sampler is not None:
        state.gpu_sampler.stop(left())
    _log_final_counts(state)


def _log_final_counts(state: Telemetry) -> None:
    """One line that accounts for every span: exported, or dropped by reason."""
    if state.span_processor is None:
        return
    stats = state.stats()
    dropped = {k.removeprefix("dropped_"): n for k, n in stats.items() if k.startswith("dropped_")}
    log = logger.warning if dropped and sum(dropped.values()) else logger.info
    log(
        "otelkit: shut down; spans exported %d, dropped %d (%s)",
        stats["exported"],
        sum(dropped.values()),
        ", ".join(f"{reason}: {n}" for reason, n in sorted(dropped.items()) if n) or "none",
    )


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
    return [Observation(state.stats()["queued"])]


def _in_export_observations(state: Telemetry) -> list[Observation]:
    return [Observation(state.stats()["in_export"])]


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
    (semconv.TELEMETRY_IN_EXPORT, _in_export_observations),
)


def _install_lifecycle_hooks(settings: Settings) -> None:
    global _lifecycle_hooks_installed
    if _lifecycle_hooks_installed:
        return
    _lifecycle_hooks_installed = True
    atexit.register(shutdown)
    os.register_at_fork(after_in_child=_child_resource)
    # A multiprocessing child leaves through os._exit, which skips atexit: flush in its finalizer.
    multiprocessing.util.register_after_fork(_finalize_child, _register_child_finalizer)
    if settings.install_signal_handler:
        _install_sigterm_handler()


def _child_resource() -> None:
    """A forked child's spans say which process made them: its own ``process.pid``."""
    state = _state
    if state is None:
        return
    provider = state.tracer_provider
    pid = Resource({semconv.PROCESS_PID: os.getpid()})
    merge_resource(provider, pid)


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
    shutdown()  # within the exit_timeout_s option
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)  # die of SIGTERM, as the sender expects
