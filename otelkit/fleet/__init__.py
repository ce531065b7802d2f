"""The fleet: many inference servers behind Envoy, registered with heartbeats, as one.

>>> from otelkit.fleet import EtcdRegistry, Registration, Renderer, ServerRecord
>>> record = ServerRecord("triton-0", http="10.0.0.5:8000", grpc="10.0.0.5:8001",
...                       metrics="10.0.0.5:8002", models=("tracking",), site="perlmutter")
>>> etcd = EtcdRegistry("http://etcd:2379")
>>> registration = Registration(record, etcd, ttl_s=10).start()  # doctest: +SKIP
>>> renderer = Renderer(EtcdRegistry("http://etcd:2379"), eds_dir="/run/otelkit/eds",
...                     file_sd="/run/otelkit/servers.json").start()  # doctest: +SKIP

A server registers its record under an etcd lease and renews it (``Registration``); the
renderer watches the registry and writes Envoy's endpoints and Prometheus' targets from it
(``Renderer``), so a server whose heartbeat stops leaves both within its lease's time plus one
render. ``DirectoryRegistry`` is the same on a shared file system, for a site without etcd.
``Draining`` takes a server whose queue stays long out of Envoy's rotation until it recovers.
``envoy_config`` is the Envoy in front of them; ``LocalEnvoy`` runs one as a child process
(``LocalEtcd`` an etcd), ``envoy_hosts`` reads which servers it routes to.
The command: ``otelkit fleet register|render|status|envoy-config`` (docs/fleet.md).
"""

from __future__ import annotations

from otelkit._errors import FleetError, RegistrationError
from otelkit.fleet._drain import Draining
from otelkit.fleet._envoy import LocalEnvoy, envoy_binary, envoy_config, envoy_hosts, write_config
from otelkit.fleet._etcd import LocalEtcd
from otelkit.fleet._record import ServerRecord
from otelkit.fleet._registry import DirectoryRegistry, EtcdRegistry, Listing, Registration, Registry
from otelkit.fleet._render import Renderer, RendererMetrics

__all__ = [
    "DirectoryRegistry",
    "Draining",
    "EtcdRegistry",
    "FleetError",
    "Listing",
    "LocalEnvoy",
    "LocalEtcd",
    "Registration",
    "RegistrationError",
    "Registry",
    "Renderer",
    "RendererMetrics",
    "ServerRecord",
    "envoy_binary",
    "envoy_config",
    "envoy_hosts",
    "write_config",
]
