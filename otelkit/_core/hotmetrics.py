"""Per-call metrics, cheap enough for every inference call: histograms and sums in plain lists.

An OpenTelemetry SDK ``Histogram.record()`` looks up its series by attributes and takes its
locks on every record, more than an inference call can spare on all of its telemetry. So the
client's per-call metrics live here instead: a caller gets a series once per label values and
keeps it, and an observation is a ``bisect``, a lock and two list stores.

>>> duration = HOT.histogram(semconv.CLIENT_DURATION, ("model", "model_version", "server"))
>>> series = duration.series(("identity", "", "127.0.0.1:8001"))
>>> series.observe(0.0031, trace_id, span_id)  # 0, 0 when the call was not sampled

Series that change together (a call's duration, bytes and in-flight count) can share one lock,
so a call takes it once: ``HOT.calls(...)`` gives such a ``CallSeries``.

``HOT.collect()`` snapshots every instrument as SDK ``Metric`` data, cumulative since the process
started (or a forked child began), which both the Prometheus bridge and the OTLP pusher export
under the instrument's ``semconv`` name.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from abc import ABC, abstractmethod
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Generic, NamedTuple, TypeVar

from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otelkit import semconv
from otelkit._core.deps.otel import exemplar_class
from otelkit._core.worker import LATER, Later

# The SDK's metric data types are needed only to collect (a scrape, an export), never to
# observe: a process that times stages without exporting metrics does not import them.
if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import (
        Histogram,
        HistogramDataPoint,
        Metric,
        MetricsData,
        NumberDataPoint,
        Sum,
    )
    from opentelemetry.sdk.resources import Resource

__all__ = [
    "HOT",
    "CallSeries",
    "CallSpecs",
    "HistogramSeries",
    "HotCounter",
    "HotHistogram",
    "HotRegistry",
    "HotUpDownCounter",
    "SumSeries",
    "UpDownSeries",
    "with_hot_metrics",
]

Clock = Callable[[], int]
_SCOPE = InstrumentationScope("otelkit")


class _Guard:
    """The lock of one series, or of several that change together; replaced after a fork."""

    __slots__ = ("lock",)

    def __init__(self) -> None:
        self.lock = threading.Lock()


class HistogramSeries:
    """One label-value combination of a ``HotHistogram``: bucket counts, sum, min, max, and
    the newest exemplar of each bucket as ``(value, trace_id, span_id, time_unix_nano)``."""

    __slots__ = ("_bounds", "_clock", "_counts", "_exemplars", "_guard", "_max", "_min", "_sum")

    def __init__(
        self, bounds: tuple[float, ...], clock: Clock, guard: _Guard | None = None
    ) -> None:
        self._bounds = bounds
        self._clock = clock
        self._guard = guard or _Guard()
        self._reset()

    def _reset(self) -> None:
        self._guard.lock = threading.Lock()
        self._counts = [0] * (len(self._bounds) + 1)
        self._exemplars: list[tuple[float, int, int, int] | None] = [None] * len(self._counts)
        self._sum = 0.0
        self._min = float("inf")
        self._max = float("-inf")

    def observe(self, value: float, trace_id: int = 0, span_id: int = 0) -> None:
        """Count ``value``; a non-zero ``trace_id`` makes it its bucket's exemplar."""
        lock = self._guard.lock
        lock.acquire()  # cheaper than ``with``, and fork-safe because _reset replaces it
        try:
            self._add(value, trace_id, span_id)
        finally:
            lock.release()

    def _add(self, value: float, trace_id: int, span_id: int) -> None:
        """``observe`` with the lock held by the caller."""
        # Buckets are (lower, upper], as in OpenTelemetry; the bridge files exemplars the same way.
        index = bisect_left(self._bounds, value)
        self._counts[index] += 1
        self._sum += value
        if value < self._min:
            self._min = value
        if value > self._max:
            self._max = value
        if trace_id:
            self._exemplars[index] = (value, trace_id, span_id, self._clock())

    def _point(self, attributes: dict[str, str], start_ns: int, now_ns: int) -> HistogramDataPoint:
        from opentelemetry.sdk.metrics.export import HistogramDataPoint

        with self._guard.lock:
            counts, total = list(self._counts), self._sum
            low, high, newest = self._min, self._max, list(self._exemplars)
        exemplar = exemplar_class()
        exemplars = [
            exemplar({}, value, time_unix_nano=at, span_id=span_id, trace_id=trace_id)
            for value, trace_id, span_id, at in filter(None, newest)
            if exemplar is not None
        ]
        return HistogramDataPoint(
            attributes,
            start_ns,
            now_ns,
            count=sum(counts),
            sum=total,
            bucket_counts=counts,
            explicit_bounds=self._bounds,
            min=low,
            max=high,
            exemplars=exemplars,
        )


class SumSeries:
    """One label-value combination of a ``HotCounter`` or ``HotUpDownCounter``."""

    __slots__ = ("_guard", "_value")

    def __init__(self, guard: _Guard | None = None) -> None:
        self._guard = guard or _Guard()
        self._reset()

    def _reset(self) -> None:
        self._guard.lock = threading.Lock()
        self._value: float = 0

    def add(self, amount: float) -> None:
        """Add ``amount``; a counter's must not be negative, which is not checked here."""
        lock = self._guard.lock
        lock.acquire()
        try:
            self._value += amount
        finally:
            lock.release()

    def _point(self, attributes: dict[str, str], start_ns: int, now_ns: int) -> NumberDataPoint:
        from opentelemetry.sdk.metrics.export import NumberDataPoint

        return NumberDataPoint(attributes, start_ns, now_ns, self._value)


class UpDownSeries(SumSeries):
    """A ``SumSeries`` that also counts one up without taking its lock: ``begin()``.

    ``begin`` is ``next()`` on an ``itertools.count``, one step of C code under the GIL (so
    atomic, and no Python frame for the caller); reading the series takes one more number
    from the count, which ``_reads`` discounts. Calls in flight begin this way and end under
    their series' lock.
    """

    __slots__ = ("_begun", "_reads", "begin")

    def _reset(self) -> None:
        super()._reset()
        self._begun = itertools.count()
        self._reads = 0
        self.begin = self._begun.__next__

    def _point(self, attributes: dict[str, str], start_ns: int, now_ns: int) -> NumberDataPoint:
        from opentelemetry.sdk.metrics.export import NumberDataPoint

        with self._guard.lock:
            begun = next(self._begun) - self._reads
            self._reads += 1
            value = self._value + begun
        return NumberDataPoint(attributes, start_ns, now_ns, value)


S = TypeVar("S", HistogramSeries, SumSeries, UpDownSeries)


class CallSeries:
    """The metrics of one call target's label values: calls in flight, request and response
    bytes, and the duration histogram (with its exemplar). A call begins without a lock
    (``in_flight.begin()``) and ends under one, taken once for all four."""

    __slots__ = ("_guard", "duration", "in_flight", "request_bytes", "response_bytes")

    def __init__(
        self,
        guard: _Guard,
        duration: HistogramSeries,
        in_flight: UpDownSeries,
        request_bytes: SumSeries,
        response_bytes: SumSeries,
    ) -> None:
        self._guard = guard
        self.duration, self.in_flight = duration, in_flight
        self.request_bytes, self.response_bytes = request_bytes, response_bytes

    def end(
        self,
        seconds: float,
        request_bytes: int,
        response_bytes: int,
        trace_id: int = 0,
        span_id: int = 0,
    ) -> None:
        """A call ended after ``seconds``: one less in flight, its bytes and its duration."""
        lock = self._guard.lock
        lock.acquire()
        try:
            self.in_flight._value -= 1
            self.request_bytes._value += request_bytes
            self.response_bytes._value += response_bytes
            self.duration._add(seconds, trace_id, span_id)
        finally:
            lock.release()


class CallSpecs(NamedTuple):
    """The ``semconv`` specs of the four metrics a ``CallSeries`` keeps."""

    duration: semconv.MetricSpec
    in_flight: semconv.MetricSpec
    request_bytes: semconv.MetricSpec
    response_bytes: semconv.MetricSpec


class _Instrument(ABC, Generic[S]):
    kind: semconv.InstrumentKind

    def __init__(self, spec: semconv.MetricSpec, labels: tuple[str, ...], clock: Clock) -> None:
        self.spec = spec
        self.labels = labels
        self._clock = clock
        self._series: dict[tuple[str, ...], S] = {}
        self._lock = threading.Lock()

    def series(self, values: tuple[str, ...], guard: _Guard | None = None) -> S:
        """The series of one tuple of label values, in the order of ``labels``; keep it.

        A new series takes ``guard`` as its lock holder when one is given."""
        found = self._series.get(values)
        if found is None:
            if len(values) != len(self.labels):
                raise ValueError(f"{self.spec.name}: {values!r} are not values of {self.labels}")
            with self._lock:
                found = self._series.setdefault(values, self._new_series(guard))
        if guard is not None and found._guard is not guard:
            raise ValueError(f"{self.spec.name}: the series {values!r} has a lock of its own")
        return found

    @abstractmethod
    def _new_series(self, guard: _Guard | None) -> S:
        """A fresh series of this instrument's kind."""

    def _reset(self) -> None:
        self._lock = threading.Lock()
        for series in self._series.values():  # callers hold these: zero them, keep them
            series._reset()

    def _labelled(self) -> list[tuple[dict[str, str], S]]:
        return [
            (dict(zip(self.labels, values, strict=True)), s)
            for values, s in list(self._series.items())
        ]


class HotHistogram(_Instrument[HistogramSeries]):
    """A histogram with the fixed buckets of its ``semconv`` spec and an exemplar per bucket."""

    kind = "histogram"

    def _new_series(self, guard: _Guard | None) -> HistogramSeries:
        assert self.spec.buckets is not None  # checked by HotRegistry.histogram
        return HistogramSeries(self.spec.buckets, self._clock, guard)

    def metric(self, start_ns: int, now_ns: int) -> Metric | None:
        """The series observed at least once; an empty one has no min or max to report."""
        from opentelemetry.sdk.metrics.export import AggregationTemporality, Histogram

        found = (s._point(labels, start_ns, now_ns) for labels, s in self._labelled())
        points = [point for point in found if point.count]
        data = Histogram(points, AggregationTemporality.CUMULATIVE)
        return _metric(self.spec, data) if points else None


class HotCounter(_Instrument[SumSeries]):
    """A monotonic sum, such as tensor bytes sent."""

    kind: semconv.InstrumentKind = "counter"

    def _new_series(self, guard: _Guard | None) -> SumSeries:
        return SumSeries(guard)

    def metric(self, start_ns: int, now_ns: int) -> Metric | None:
        """Every series, zeros included: a counter at 0 is news to a ``rate()``."""
        from opentelemetry.sdk.metrics.export import AggregationTemporality, Sum

        points = [s._point(labels, start_ns, now_ns) for labels, s in self._labelled()]
        data = Sum(points, AggregationTemporality.CUMULATIVE, is_monotonic=self.kind == "counter")
        return _metric(self.spec, data) if points else None


class HotUpDownCounter(HotCounter):
    """A sum that goes up and down, such as calls in flight."""

    kind = "up_down_counter"

    def _new_series(self, guard: _Guard | None) -> UpDownSeries:
        return UpDownSeries(guard)

    def series(self, values: tuple[str, ...], guard: _Guard | None = None) -> UpDownSeries:
        found = super().series(values, guard)
        assert isinstance(found, UpDownSeries)  # every series of this kind is made here
        return found


def _metric(spec: semconv.MetricSpec, data: Histogram | Sum) -> Metric:
    from opentelemetry.sdk.metrics.export import Metric

    return Metric(spec.name, spec.description, spec.unit, data)


Instrument = TypeVar("Instrument", HotHistogram, HotCounter, HotUpDownCounter)


class HotRegistry:
    """Every hot instrument of the process, by ``semconv`` name, so that clients share series."""

    def __init__(self, clock: Clock = time.time_ns, later: Later = LATER) -> None:
        self._clock = clock
        self._later = later
        self._instruments: dict[str, HotHistogram | HotCounter] = {}
        self._calls: dict[tuple[CallSpecs, tuple[str, ...]], CallSeries] = {}
        self._lock = threading.Lock()
        self._calls_lock = threading.Lock()
        self.start_time_ns = clock()

    def histogram(self, spec: semconv.MetricSpec, labels: tuple[str, ...]) -> HotHistogram:
        if spec.kind == "histogram" and spec.buckets is None:
            raise ValueError(f"{spec.name}: a hot histogram needs the buckets of its spec")
        return self._get(HotHistogram, spec, labels)

    def counter(self, spec: semconv.MetricSpec, labels: tuple[str, ...]) -> HotCounter:
        return self._get(HotCounter, spec, labels)

    def up_down_counter(
        self, spec: semconv.MetricSpec, labels: tuple[str, ...]
    ) -> HotUpDownCounter:
        return self._get(HotUpDownCounter, spec, labels)

    def calls(
        self, specs: CallSpecs, labels: tuple[str, ...], values: tuple[str, ...]
    ) -> CallSeries:
        """The ``CallSeries`` of ``values`` (in the order of ``labels``); keep it."""
        key = (specs, values)
        found = self._calls.get(key)
        if found is not None:
            return found
        duration = self.histogram(specs.duration, labels)
        in_flight = self.up_down_counter(specs.in_flight, labels)
        request_bytes = self.counter(specs.request_bytes, labels)
        response_bytes = self.counter(specs.response_bytes, labels)
        with self._calls_lock:
            found = self._calls.get(key)
            if found is None:
                guard = _Guard()
                found = self._calls[key] = CallSeries(
                    guard,
                    duration.series(values, guard),
                    in_flight.series(values, guard),
                    request_bytes.series(values, guard),
                    response_bytes.series(values, guard),
                )
        return found

    def _get(
        self, kind: type[Instrument], spec: semconv.MetricSpec, labels: tuple[str, ...]
    ) -> Instrument:
        if spec.kind != kind.kind:
            raise ValueError(f"{spec.name} is a {spec.kind}, not a {kind.kind}")
        with self._lock:
            found = self._instruments.setdefault(spec.name, kind(spec, labels, self._clock))
        if not isinstance(found, kind) or (found.spec, found.labels) != (spec, labels):
            raise ValueError(
                f"{spec.name} exists with labels {found.labels}; asked for {labels} ({spec})"
            )
        return found

    def collect(self) -> list[Metric]:
        """A cumulative snapshot of every instrument that has data, calls that ended but wait
        in its ``Later`` included."""
        self._later.drain()
        now_ns = self._clock()
        found = (i.metric(self.start_time_ns, now_ns) for i in list(self._instruments.values()))
        return [metric for metric in found if metric is not None]

    def reset(self) -> None:
        """Zero every series (keeping the ones callers hold) and restart the clock.

        Runs in every forked child, where a lock may be held by a thread that did not survive
        the fork: each lock is replaced, never waited on.
        """
        self._lock = threading.Lock()
        self._calls_lock = threading.Lock()
        for instrument in self._instruments.values():
            instrument._reset()
        self.start_time_ns = self._clock()


def with_hot_metrics(
    data: MetricsData | None, metrics: Sequence[Metric], resource: Resource
) -> MetricsData | None:
    """``data`` with ``metrics`` added under the ``otelkit`` scope of its first resource."""
    from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics

    if not metrics:
        return data
    if data is None or not data.resource_metrics:
        scope = ScopeMetrics(_SCOPE, list(metrics), "")
        return MetricsData([ResourceMetrics(resource, [scope], "")])
    first, *rest = data.resource_metrics
    scopes = [s for s in first.scope_metrics if s.scope.name != _SCOPE.name]
    ours = [s for s in first.scope_metrics if s.scope.name == _SCOPE.name]
    merged = ScopeMetrics(
        ours[0].scope if ours else _SCOPE,
        [m for s in ours for m in s.metrics] + list(metrics),
        ours[0].schema_url if ours else "",
    )
    return MetricsData(
        [ResourceMetrics(first.resource, [*scopes, merged], first.schema_url), *rest]
    )


HOT = HotRegistry()
os.register_at_fork(after_in_child=HOT.reset)
