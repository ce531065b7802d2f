"""The renderer: watches the registry and writes, from the servers in it, Envoy's endpoints
(EDS) and Prometheus' scrape targets (``file_sd``).

For each cluster of Envoy's configuration (``envoy.py``: ``otelkit_http`` and
``otelkit_grpc``) it writes ``<eds_dir>/<cluster>.json``, a discovery response holding the
cluster's ``ClusterLoadAssignment``: each registered server's endpoint, its health checked on
its HTTP port, its name and site in the endpoint's metadata. Envoy reloads such a file only
when one is moved into place, so each is written to a temporary file and renamed (``watched
_directory`` in Envoy's configuration). ``file_sd`` is one JSON file of the servers' metrics
endpoints, labelled with their names and sites.

With ``draining`` (``drain.py``), each pass also reads every server's saturation, and a server
drained for it is written with Envoy's ``DRAINING`` status.

A file is rewritten only when what it says changes. The renderer reads the registry again
whenever it changes (an etcd watch) and every ``resync_s`` anyway; a registry it cannot read
leaves the files as they were (Envoy keeps routing to the last servers known), is logged once
an outage and counted in ``errors``, and is tried again with a growing pause (up to
``resync_s``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider

from otelkit import semconv
from otelkit._config import resolve
from otelkit._errors import FleetError
from otelkit._resource import make_resource
from otelkit.export._processor import PullReader
from otelkit.export._prometheus import PrometheusEndpoint
from otelkit.fleet._drain import Draining
from otelkit.fleet._record import ServerRecord, parse_address
from otelkit.fleet._registry import Listing, Registry

__all__ = [
    "CLUSTERS",
    "Renderer",
    "cluster_names",
    "eds_response",
    "file_sd_targets",
    "observe",
    "write_if_changed",
]

_log = logging.getLogger("otelkit.fleet")

CLUSTERS = ("http", "grpc")  # the protocols Envoy's listeners serve, a cluster each
_ASSIGNMENT = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"

#: An address resolved for Envoy (EDS takes IP addresses only), or None where it cannot be.
Resolve = Callable[[str, int], "str | None"]


def cluster_names(prefix: str = "otelkit") -> dict[str, str]:
    """Each protocol's cluster name: ``{"http": "otelkit_http", "grpc": "otelkit_grpc"}``."""
    return {protocol: f"{prefix}_{protocol}" for protocol in CLUSTERS}


def resolve_address(host: str, port: int) -> str | None:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    return str(infos[0][4][0]) if infos else None


def eds_response(
    cluster: str,
    protocol: str,
    servers: Mapping[str, ServerRecord],
    *,
    resolve: Resolve = resolve_address,
    drained: Collection[str] = (),
) -> tuple[dict[str, Any], list[str]]:
    """The discovery response of ``cluster`` (servers that have a ``protocol`` endpoint), and
    the names of those left out because their address did not resolve.

    >>> record = ServerRecord("t0", http="127.0.0.1:8000", grpc="127.0.0.1:8001", started=0)
    >>> response, _ = eds_response("otelkit_grpc", "grpc", {"t0": record})
    >>> endpoint = response["resources"][0]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    >>> endpoint["address"]["socket_address"], endpoint["health_check_config"]
    ({'address': '127.0.0.1', 'port_value': 8001}, {'port_value': 8000})
    """
    endpoints, unresolved = [], []
    for name, record in sorted(servers.items()):
        address = getattr(record, protocol)
        if address is None:
            continue
        host, port = parse_address(address)
        http_host, http_port = parse_address(record.http)
        ip = resolve(host, port)
        if ip is None:
            unresolved.append(name)
            continue
        endpoint: dict[str, Any] = {
            "address": {"socket_address": {"address": ip, "port_value": port}},
            "hostname": name,
        }
        if (http_host, http_port) != (host, port):  # health checked where it serves HTTP
            endpoint["health_check_config"] = {"port_value": http_port}
            if http_host != host:
                http_ip = resolve(http_host, http_port)
                if http_ip is None:
                    unresolved.append(name)
                    continue
                endpoint["health_check_config"]["address"] = {
                    "socket_address": {"address": http_ip, "port_value": http_port}
                }
        entry: dict[str, Any] = {
            "endpoint": endpoint,
            "metadata": {"filter_metadata": {"otelkit": {"server": name, "site": record.site}}},
        }
        if name in drained:  # Envoy sends it no new request; those it has finish
            entry["health_status"] = "DRAINING"
        endpoints.append(entry)
    assignment = {
        "@type": _ASSIGNMENT,
        "cluster_name": cluster,
        "endpoints": [{"lb_endpoints": endpoints}] if endpoints else [],
    }
    return {"version_info": "0", "resources": [assignment]}, unresolved


def file_sd_targets(servers: Mapping[str, ServerRecord]) -> list[dict[str, Any]]:
    """Prometheus ``file_sd``: one target group a server with a metrics endpoint.

    >>> file_sd_targets({"t0": ServerRecord("t0", http="h:8000", metrics="h:8002", site="s")})
    [{'targets': ['h:8002'], 'labels': {'otelkit_server': 't0', 'otelkit_site': 's'}}]
    """
    return [
        {
            "targets": [record.metrics],
            "labels": {"otelkit_server": name, "otelkit_site": record.site},
        }
        for name, record in sorted(servers.items())
        if record.metrics is not None
    ]


def write_if_changed(path: Path, document: Any) -> bool:
    """Write ``document`` as JSON to ``path`` by a rename (a reader never sees half a file),
    unless the file says that already; True when it was written."""
    text = json.dumps(document, indent=1, sort_keys=True) + "\n"
    try:
        if path.read_text() == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    # one temporary file per writer: the renderer's thread and a write_config in the same
    # process may write the same file at once
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        temporary.write_text(text)
        temporary.replace(path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise FleetError(f"cannot write {path}: {error.strerror or error}") from None
    return True


class Renderer:
    """Writes Envoy's EDS files and Prometheus' targets from ``registry``, kept current."""

    def __init__(
        self,
        registry: Registry,
        *,
        eds_dir: str | Path,
        file_sd: str | Path | None = None,
        cluster_prefix: str = "otelkit",
        resync_s: float = 5.0,
        resolve: Resolve = resolve_address,
        draining: Draining | None = None,
        ages: bool = False,
    ) -> None:
        if not resync_s > 0:
            raise FleetError(f"resync_s is a period in seconds, above 0, not {resync_s}")
        self.registry, self.resync_s, self._resolve = registry, resync_s, resolve
        self.eds_dir = Path(eds_dir)
        self.file_sd = Path(file_sd) if file_sd is not None else None
        self.clusters = cluster_names(cluster_prefix)
        self.draining, self.ages = draining, ages  # ages: each server's heartbeat age, read
        # from the registry each pass (one etcd call a server): for the metrics
        self.renders = 0  # times a file was rewritten
        self.errors = 0  # reads of the registry or writes of a file that failed
        self.listing = Listing()  # as last rendered
        self.unresolved: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self._rendered = threading.Condition()
        self._passes = 0

    def render_once(self) -> Listing:
        """Read the registry and write what changed; ``FleetError`` when either fails."""
        listing = self.registry.listing(ages=self.ages)
        for key, reason in listing.refused.items():
            if key not in self.listing.refused:
                _log.warning(
                    "fleet: registration %r refused, nothing rendered from it: %s", key, reason
                )
        self.eds_dir.mkdir(parents=True, exist_ok=True)
        drained = self.draining.poll(listing.servers) if self.draining is not None else set()
        unresolved: set[str] = set()
        changed = False
        for protocol, cluster in self.clusters.items():
            response, left_out = eds_response(
                cluster, protocol, listing.servers, resolve=self._resolve, drained=drained
            )
            unresolved.update(left_out)
            changed |= write_if_changed(self.eds_dir / f"{cluster}.json", response)
        if self.file_sd is not None:
            changed |= write_if_changed(self.file_sd, file_sd_targets(listing.servers))
        for name in sorted(unresolved - set(self.unresolved)):
            _log.warning("fleet: %s left out: its address does not resolve", name)
        self.unresolved = sorted(unresolved)
        if changed:
            self.renders += 1
            before, after = set(self.listing.servers), set(listing.servers)
            _log.info(
                "fleet: %d servers%s%s",
                len(after),
                "".join(f" +{n}" for n in sorted(after - before)),
                "".join(f" -{n}" for n in sorted(before - after)),
            )
        self.listing = listing
        with self._rendered:
            self._passes += 1
            self._rendered.notify_all()
        return listing

    def start(self) -> Renderer:
        self._thread = threading.Thread(target=self.run, name="otelkit-fleet-renderer", daemon=True)
        self._thread.start()
        return self

    def run(self) -> None:
        """Render until ``close()``: at each change of the registry, and every ``resync_s``."""
        pause = 0.1
        while not self._stop.is_set():
            try:
                listing = self.render_once()
            except FleetError as error:
                self.errors += 1
                if not self._failing:
                    _log.warning(
                        "fleet: %s; Envoy and Prometheus keep the last servers rendered, retrying",
                        error,
                    )
                self._failing = True
                self._stop.wait(pause)
                pause = min(self.resync_s, pause * 2)
                continue
            if self._failing:
                _log.info("fleet: the registry answers again")
            self._failing, pause = False, 0.1
            every = self.resync_s
            if self.draining is not None:  # saturation is read at each pass
                every = min(every, self.draining.interval_s)
            try:
                self.registry.wait_for_change(listing, every)
            except FleetError:
                self._stop.wait(pause)  # the next render says what is wrong

    def wait_for_render(self, timeout_s: float) -> bool:
        """Wait for the next pass of the renderer over the registry (tests, ``status``)."""
        with self._rendered:
            passes = self._passes
            return self._rendered.wait_for(lambda: self._passes > passes, timeout_s)

    def close(self) -> None:
        self._stop.set()
        self.registry.interrupt()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> Renderer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def observe(meter: Meter, renderer: Renderer) -> None:
    """``renderer``'s state as the fleet's metrics (``semconv.FLEET_METRICS``), read at each
    collection from what its last pass saw."""

    def servers(_: CallbackOptions) -> list[Observation]:
        sites: dict[str, int] = {}
        for record in renderer.listing.servers.values():
            sites[record.site] = sites.get(record.site, 0) + 1
        return [Observation(n, {semconv.M_SITE: site}) for site, n in sorted(sites.items())]

    def ages(_: CallbackOptions) -> list[Observation]:
        listing = renderer.listing
        return [
            Observation(age, {semconv.M_SERVER: name, semconv.M_SITE: listing.servers[name].site})
            for name, age in sorted(listing.ages_s.items())
            if name in listing.servers
        ]

    def one(value: Callable[[], float]) -> Callable[[CallbackOptions], list[Observation]]:
        return lambda _: [Observation(value())]

    def spec(metric: semconv.MetricSpec) -> dict[str, str]:
        return {"name": metric.name, "unit": metric.unit, "description": metric.description}

    meter.create_observable_gauge(callbacks=[servers], **spec(semconv.FLEET_SERVERS))
    meter.create_observable_gauge(callbacks=[ages], **spec(semconv.FLEET_HEARTBEAT_AGE))
    meter.create_observable_gauge(
        callbacks=[one(lambda: len(renderer.listing.refused))], **spec(semconv.FLEET_REFUSED)
    )
    meter.create_observable_gauge(
        callbacks=[one(lambda: len(renderer.unresolved))], **spec(semconv.FLEET_UNRESOLVED)
    )
    meter.create_observable_counter(
        callbacks=[one(lambda: renderer.renders)], **spec(semconv.FLEET_RENDERS)
    )
    draining = renderer.draining
    if draining is not None:

        def saturation(_: CallbackOptions) -> list[Observation]:
            return [
                Observation(ms, {semconv.M_SERVER: name})
                for name, ms in sorted(draining.saturation().items())
            ]

        def drained(_: CallbackOptions) -> list[Observation]:
            out = draining.drained
            return [
                Observation(int(name in out), {semconv.M_SERVER: name})
                for name in sorted(renderer.listing.servers)
            ]

        meter.create_observable_gauge(callbacks=[saturation], **spec(semconv.FLEET_SATURATION))
        meter.create_observable_gauge(callbacks=[drained], **spec(semconv.FLEET_DRAINED))
    meter.create_observable_counter(
        callbacks=[one(lambda: renderer.errors)], **spec(semconv.FLEET_REGISTRY_ERRORS)
    )


class RendererMetrics:
    """``renderer``'s metrics on a Prometheus endpoint at ``host:port`` (0: a free port);
    ``close()`` stops it. ``OSError`` when the port is taken, ``ConfigError`` for a bad
    ``OTEL_RESOURCE_ATTRIBUTES``."""

    def __init__(self, renderer: Renderer, host: str = "0.0.0.0", port: int = 0) -> None:
        resource = make_resource(resolve({"service_name": "otelkit-fleet-renderer"}))
        reader = PullReader()
        self._provider = MeterProvider(metric_readers=[reader], resource=resource)
        observe(self._provider.get_meter("otelkit.fleet"), renderer)
        try:
            self.endpoint = PrometheusEndpoint(reader, host, port, resource.attributes)
        except OSError:
            self._provider.shutdown()
            raise

    @property
    def url(self) -> str:
        return self.endpoint.url

    def close(self) -> None:
        self.endpoint.close()
        self._provider.shutdown()
