"""The Prometheus scrape endpoint: OpenTelemetry SDK metrics served by prometheus_client.

OpenTelemetry's own Prometheus exporter drops exemplars. This bridge reads the SDK's metrics on
each scrape and hands them to prometheus_client as metric families, with each histogram
bucket's exemplar carrying the ``trace_id`` and ``span_id`` of a sampled span that fell in it.
prometheus_client negotiates the OpenMetrics exposition when Prometheus asks for it, which is
the only format that carries exemplars.
"""

from __future__ import annotations

import bisect
import logging
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from wsgiref.simple_server import WSGIServer

from opentelemetry.sdk.metrics.export import Gauge, Histogram, HistogramDataPoint, Metric, Sum
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    Exemplar,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.core import (
    Metric as PromMetric,
)

from otelkit import semconv
from otelkit._core.hotmetrics import HOT, HotRegistry
from otelkit.export._processor import PullReader

logger = logging.getLogger("otelkit")

__all__ = ["PrometheusEndpoint", "to_families"]

_INVALID_LABEL = re.compile(r"[^a-zA-Z0-9_]")


def _label(key: str) -> str:
    label = _INVALID_LABEL.sub("_", key)
    return f"_{label}" if label[:1].isdigit() else label


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(float(value))


def _exemplars(point: HistogramDataPoint) -> dict[int, Exemplar]:
    """The newest exemplar of each bucket, keyed by bucket index."""
    by_bucket: dict[int, Exemplar] = {}
    for exemplar in sorted(point.exemplars or (), key=lambda e: e.time_unix_nano):
        if exemplar.trace_id is None or exemplar.span_id is None:
            continue
        index = bisect.bisect_left(point.explicit_bounds, exemplar.value)
        by_bucket[index] = Exemplar(
            {"trace_id": f"{exemplar.trace_id:032x}", "span_id": f"{exemplar.span_id:016x}"},
            exemplar.value,
            exemplar.time_unix_nano / 1e9,
        )
    return by_bucket


def _label_keys(points: Iterable[Any]) -> list[str]:
    return sorted({key for point in points for key in (point.attributes or {})})


def _label_values(point: Any, keys: list[str]) -> list[str]:
    attributes = point.attributes or {}
    return [str(attributes.get(key, "")) for key in keys]


def _histogram(name: str, metric: Metric, data: Histogram) -> HistogramMetricFamily:
    keys = _label_keys(data.data_points)
    family = HistogramMetricFamily(name, metric.description or "", labels=[_label(k) for k in keys])
    for point in data.data_points:
        exemplars = _exemplars(point)
        buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
        cumulative = 0
        bounds = [*point.explicit_bounds, float("inf")]
        for index, (bound, count) in enumerate(zip(bounds, point.bucket_counts, strict=True)):
            cumulative += count
            if index in exemplars:
                buckets.append((_bound(bound), cumulative, exemplars[index]))
            else:
                buckets.append((_bound(bound), cumulative))
        family.add_metric(_label_values(point, keys), buckets, point.sum)
    return family


def _scalar(name: str, metric: Metric, data: Sum | Gauge) -> PromMetric:
    keys = _label_keys(data.data_points)
    labels = [_label(k) for k in keys]
    family: CounterMetricFamily | GaugeMetricFamily
    if isinstance(data, Sum) and data.is_monotonic:
        family = CounterMetricFamily(name, metric.description or "", labels=labels)
    else:
        family = GaugeMetricFamily(name, metric.description or "", labels=labels)
    for point in data.data_points:
        family.add_metric(_label_values(point, keys), point.value)
    return family


def to_families(metrics: Iterable[Metric]) -> Iterator[PromMetric]:
    """Translate SDK metrics to Prometheus families, named as ``semconv.prometheus_name``."""
    for metric in metrics:
        data = metric.data
        counter = isinstance(data, Sum) and data.is_monotonic
        name = semconv.prometheus_metric_name(metric.name, metric.unit or "", counter=counter)
        if isinstance(data, Histogram):
            yield _histogram(name, metric, data)
        elif isinstance(data, (Sum, Gauge)):
            yield _scalar(name, metric, data)


class _Bridge:
    """A prometheus_client collector that reads the SDK and the hot instruments on every scrape."""

    def __init__(
        self, reader: PullReader, resource: dict[str, str | int], hot: HotRegistry
    ) -> None:
        self.reader = reader
        self.resource = resource
        self.hot = hot
        self.clashed: set[str] = set()

    def collect(self) -> Iterator[PromMetric]:
        info = GaugeMetricFamily(
            "target_info", "Resource of the process", labels=[_label(k) for k in self.resource]
        )
        info.add_metric([str(v) for v in self.resource.values()], 1)
        yield info
        hot = list(to_families(self.hot.collect()))
        taken = {family.name for family in hot} | {info.name}
        data = self.reader.read()
        for resource_metrics in data.resource_metrics if data is not None else ():
            for scope_metrics in resource_metrics.scope_metrics:
                for family in to_families(scope_metrics.metrics):
                    if family.name in taken:  # two families of one name break the whole scrape
                        self._clash(family.name, scope_metrics.scope.name)
                        continue
                    taken.add(family.name)
                    yield family
        yield from hot

    def _clash(self, name: str, scope: str) -> None:
        if name not in self.clashed:
            self.clashed.add(name)
            logger.warning(
                "otelkit: metric %s from %r has the name of another and is left out of the "
                "Prometheus exposition (FastAPI >= 0.165 records http.server.request.duration "
                "itself: otelkit.instrument(app) turns that off)",
                name,
                scope,
            )


class PrometheusEndpoint:
    """An HTTP server on ``host:port`` serving ``/metrics`` from a ``PullReader`` and ``hot``."""

    def __init__(
        self,
        reader: PullReader,
        host: str,
        port: int,
        resource: Mapping[str, Any],
        hot: HotRegistry = HOT,
    ):
        """``resource``: the attributes of ``target_info``; those not str or int are left out."""
        self.registry = CollectorRegistry(auto_describe=False)
        labels = {k: v for k, v in resource.items() if isinstance(v, (str, int))}
        self.registry.register(_Bridge(reader, labels, hot))
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        self._server: WSGIServer = server
        self._thread: threading.Thread = thread
        self.host = host
        self.port: int = server.server_address[1]

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
