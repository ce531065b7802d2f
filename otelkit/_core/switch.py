"""Tracer and meter providers that follow ``configure()``, whatever it was called before.

OpenTelemetry lets a process set its global providers once. otelkit installs these switches as
the globals and points them at the SDK providers of the latest ``configure()``; tracers, meters
and instruments handed out earlier follow along at the cost of one integer comparison per call.
Before otelkit is configured they follow OpenTelemetry's own globals, so otelkit's
instrumentation also works under ``opentelemetry-instrument`` or a user's own SDK set-up.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.trace import NoOpTracerProvider

__all__ = ["SWITCH", "ProviderSwitch"]


class ProviderSwitch:
    """The current SDK providers and a generation number that changes with them."""

    def __init__(self) -> None:
        self.generation = 0
        self._tracer_provider: trace.TracerProvider | None = None
        self._meter_provider: metrics.MeterProvider | None = None
        #: what otelkit's own spans add from the configuration (GPU attributes on server spans)
        self.span_attributes: Callable[[], dict[str, Any]] | None = None
        self._observables: list[Callable[[metrics.MeterProvider], None]] = []
        self._processors: list[Any] = []  # span processors other libraries added to the global
        self._lock = threading.Lock()
        self.tracers = SwitchingTracerProvider(self)
        self.meters = SwitchingMeterProvider(self)
        # A forked child's provider has its own resource (process.pid): what was cached from
        # the parent's is read again.
        os.register_at_fork(after_in_child=self._after_fork_in_child)

    def _after_fork_in_child(self) -> None:
        self.generation += 1

    def set(
        self,
        tracer_provider: trace.TracerProvider | None,
        meter_provider: metrics.MeterProvider | None,
        span_attributes: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """Point every switch at new providers (``None``: follow OpenTelemetry's globals)."""
        with self._lock:
            self._tracer_provider = tracer_provider
            self._meter_provider = meter_provider
            self.span_attributes = span_attributes
            self.generation += 1
            for register in self._observables:
                register(self.meter_provider())
            for processor in self._processors:
                _add_processor(self.tracer_provider(), processor)

    def configured_tracer_provider(self) -> trace.TracerProvider | None:
        """The provider of otelkit's own configuration; ``None`` while it is not configured."""
        return self._tracer_provider

    def tracer_provider(self) -> trace.TracerProvider:
        if self._tracer_provider is not None:
            return self._tracer_provider
        provider = trace.get_tracer_provider()
        return NoOpTracerProvider() if provider is self.tracers else provider

    def meter_provider(self) -> metrics.MeterProvider:
        if self._meter_provider is not None:
            return self._meter_provider
        provider = metrics.get_meter_provider()
        return NoOpMeterProvider() if provider is self.meters else provider

    def add_span_processor(self, processor: Any) -> None:
        """A span processor another library adds to the global provider (Ray Serve's tracing
        adds its exporter's wherever its own provider could not be set): added to the current
        SDK provider and to every later one."""
        with self._lock:
            self._processors.append(processor)
            _add_processor(self.tracer_provider(), processor)

    def add_observable(self, register: Callable[[metrics.MeterProvider], None]) -> None:
        """Create an observable instrument now and again on every future provider."""
        with self._lock:
            self._observables.append(register)
            register(self.meter_provider())


def _add_processor(provider: trace.TracerProvider, processor: Any) -> None:
    add = getattr(provider, "add_span_processor", None)
    if add is not None:  # a no-op provider has none: its spans are not recorded
        add(processor)


class SwitchingTracerProvider(trace.TracerProvider):
    def __init__(self, switch: ProviderSwitch) -> None:
        self._switch = switch

    def add_span_processor(self, processor: Any) -> None:
        """As the SDK's ``TracerProvider.add_span_processor``, for the providers it follows."""
        self._switch.add_span_processor(processor)

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _SwitchingTracer(self._switch, args, kwargs)


class _SwitchingTracer(trace.Tracer):
    def __init__(self, switch: ProviderSwitch, args: tuple[Any, ...], kwargs: dict[str, Any]):
        self._switch = switch
        self._args = args
        self._kwargs = kwargs
        self._generation = -1
        self._tracer: trace.Tracer = trace.NoOpTracer()

    def current(self) -> trace.Tracer:
        """The SDK tracer of the current configuration."""
        if self._generation != self._switch.generation:
            self._tracer = self._switch.tracer_provider().get_tracer(*self._args, **self._kwargs)
            self._generation = self._switch.generation
        return self._tracer

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self.current().start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return self.current().start_as_current_span(*args, **kwargs)


class SwitchingMeterProvider(metrics.MeterProvider):
    def __init__(self, switch: ProviderSwitch) -> None:
        self._switch = switch

    def get_meter(self, *args: Any, **kwargs: Any) -> metrics.Meter:
        return _SwitchingMeter(self._switch, args, kwargs)


class _SwitchingInstrument:
    """A synchronous instrument that re-creates itself on the current meter provider."""

    def __init__(self, switch: ProviderSwitch, create: Callable[[], Any]) -> None:
        self._switch = switch
        self._create = create
        self._generation = -1
        self._real: Any = None

    def current(self) -> Any:
        if self._generation != self._switch.generation:
            self._real = self._create()
            self._generation = self._switch.generation
        return self._real

    def add(self, amount: float, attributes: Any = None, context: Any = None) -> None:
        self.current().add(amount, attributes, context)

    def record(self, amount: float, attributes: Any = None, context: Any = None) -> None:
        self.current().record(amount, attributes, context)

    def set(self, amount: float, attributes: Any = None, context: Any = None) -> None:
        self.current().set(amount, attributes, context)


class _SwitchingMeter(metrics.Meter):
    def __init__(self, switch: ProviderSwitch, args: tuple[Any, ...], kwargs: dict[str, Any]):
        super().__init__(*args[:3], **{k: v for k, v in kwargs.items() if k != "attributes"})
        self._switch = switch
        self._args = args
        self._kwargs = kwargs

    def _meter(self) -> metrics.Meter:
        return self._switch.meter_provider().get_meter(*self._args, **self._kwargs)

    def _sync(self, method: str, name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        return _SwitchingInstrument(
            self._switch, lambda: getattr(self._meter(), method)(name, *args, **kwargs)
        )

    def _observable(
        self, method: str, name: str, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> Any:
        def register(provider: metrics.MeterProvider) -> None:
            meter = provider.get_meter(*self._args, **self._kwargs)
            getattr(meter, method)(name, *args, **kwargs)

        self._switch.add_observable(register)
        return None

    def create_counter(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._sync("create_counter", name, args, kwargs)

    def create_up_down_counter(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._sync("create_up_down_counter", name, args, kwargs)

    def create_histogram(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._sync("create_histogram", name, args, kwargs)

    def create_gauge(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._sync("create_gauge", name, args, kwargs)

    def create_observable_counter(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._observable("create_observable_counter", name, args, kwargs)

    def create_observable_up_down_counter(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._observable("create_observable_up_down_counter", name, args, kwargs)

    def create_observable_gauge(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._observable("create_observable_gauge", name, args, kwargs)


SWITCH = ProviderSwitch()
