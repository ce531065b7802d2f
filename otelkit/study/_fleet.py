"""A fleet the study runs: tritonservers behind Envoy, joined and removed through a registry.

``Fleet(repository)`` takes the sweep parameter ``servers`` (and ``instances``, as ``Triton``
does). Each server is a ``tritonserver`` on the repository that registers itself with a
heartbeat (``otelkit.fleet.Registration``) in ``registry``: a site's etcd (``EtcdRegistry``) or,
by default, a directory of its own (``DirectoryRegistry``). A ``Renderer`` writes Envoy's
endpoints from the registry, and an Envoy the study starts balances the requests over them
(``LEAST_REQUEST``, health checks on Triton's readiness: ``otelkit.fleet._envoy``). So a point
with more servers starts and registers the new ones, and one with fewer deregisters the last
ones and stops each once Envoy routes nothing more to it: the way a site's servers join and
leave. A point is served once Envoy health-checks exactly its servers, in both clusters.

What the study reads of a fleet:

- the requests go through Envoy: the client's latency holds the load balancer, and a traced
  request's breakdown shows it (Envoy's tracer is parent-based, as the clients decide);
- Triton's counters are read from every server and summed: the fleet as one server, whose
  models have ``servers`` times their configured instances;
- the servers' processes (and their stubs) are the server's CPU; Envoy's process is the load
  balancer's, one more resource in the capacity model, its parallelism Envoy's worker threads
  (``balancer_workers``, Envoy's ``--concurrency``).

>>> fleet = Fleet("examples/gnn_tracking/model_repository")  # doctest: +SKIP
>>> Study(model="tracking", server=fleet, sweep={"servers": [1, 2, 4], "concurrency": [8]})
... # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otelkit._errors import FleetError, RegistrationError, StudyError, TritonStartError
from otelkit.fleet._envoy import LocalEnvoy, envoy_config, envoy_hosts, write_config
from otelkit.fleet._record import ServerRecord
from otelkit.fleet._registry import DirectoryRegistry, Registration, Registry
from otelkit.fleet._render import Renderer, cluster_names
from otelkit.study._servers import Endpoint, RepositoryServer
from otelkit.tritonserver import TritonServer, free_port

__all__ = ["MAX_SERVERS", "Fleet"]

_log = logging.getLogger(__name__)

MAX_SERVERS = 64


@dataclass
class _Member:
    """One server of the fleet: its process and its registration."""

    name: str
    server: TritonServer
    registration: Registration


class Fleet(RepositoryServer):
    """Tritonservers on ``repository`` behind an Envoy the study starts, as many as a point's
    ``servers`` (see the module's text). ``models``: those an ``instances`` sweep sets, and the
    only ones each server loads (default: the study's model). ``http_filters`` go ahead of
    Envoy's router and ``balancer_choices`` is its least request's (``envoy_config``'s)."""

    axes = ("servers", "instances")
    ready_s = 10.0

    def __init__(
        self,
        repository: str | Path,
        *,
        models: Sequence[str] = (),
        registry: Registry | None = None,
        ttl_s: float = 3.0,
        balancer_workers: int = 1,
        balancer_choices: int | None = None,
        http_filters: Sequence[Mapping[str, Any]] = (),
        health_interval_s: float = 0.5,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 120.0,
        routed_timeout_s: float = 30.0,
        log_dir: str | Path | None = None,
        name: str = "study",
    ) -> None:
        super().__init__(repository, models, log_dir)
        if not 1 <= balancer_workers <= 256:
            raise StudyError(f"balancer_workers is 1 to 256 threads, not {balancer_workers}")
        self._work = tempfile.TemporaryDirectory(prefix="otelkit-study-fleet-")
        work = Path(self._work.name)
        self.registry = registry or DirectoryRegistry(work / "registry", poll_s=0.2)
        self.ttl_s, self.balancer_workers = ttl_s, balancer_workers
        self.balancer_choices = balancer_choices
        self._filters, self._health_s = tuple(http_filters), health_interval_s
        self._env, self._extra_args = dict(env or {}), tuple(extra_args)
        self._startup_timeout, self._routed_timeout_s = startup_timeout, routed_timeout_s
        self.name = name
        self._eds = work / "eds"
        self._clusters = cluster_names(f"otelkit_{name}")
        self._renderer: Renderer | None = None
        self._envoy: LocalEnvoy | None = None
        self._envoy_key: str | None = None
        self._ports: dict[str, int] = {}
        self._members: list[_Member] = []
        self._key: tuple[Any, ...] | None = None
        self._served = self.repository
        self._joined = 0

    @property
    def members(self) -> list[str]:
        """The names of the servers serving now, as registered."""
        return [m.name for m in self._members]

    def prepare(self, params: Mapping[str, Any], traces_url: str | None) -> Endpoint:
        count = params.get("servers", 1)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_SERVERS:
            raise StudyError(f"servers is a whole number of servers, 1 to {MAX_SERVERS}: {count!r}")
        key = (params.get("instances"), traces_url)
        if key != self._key:
            self._leave_all()
            self._served = self.staged(params.get("instances"))
            self._key = key
        for member in [m for m in self._members if m.server.failure() is not None]:
            _log.warning("otelkit study: fleet server %s failed: replaced", member.name)
            self._members.remove(member)
            self._leave(member, routed=False)
        self._balancer(traces_url)
        while len(self._members) > count:
            self._leave(self._members.pop())
        while len(self._members) < count:
            self._members.append(self._join(traces_url))
        self._wait_routed()
        assert self._envoy is not None and self._envoy.pid is not None
        pids = tuple(m.server.pid for m in self._members if m.server.pid is not None)
        return Endpoint(
            f"127.0.0.1:{self._ports['http']}",
            f"127.0.0.1:{self._ports['grpc']}",
            server_pids=pids,
            metrics_urls=tuple(m.server.metrics_url for m in self._members),
            servers=count,
            balancer_pids=(self._envoy.pid,),
            balancer_workers=self.balancer_workers,
        )

    def _balancer(self, traces_url: str | None) -> None:
        """The renderer, and Envoy with its tracer sending to ``traces_url``: started once,
        and Envoy again when the traces go elsewhere or it died."""
        envoy_key = traces_url or ""
        if self._envoy is not None and self._envoy.running and envoy_key == self._envoy_key:
            return
        if self._envoy is not None:
            self._envoy.stop()
        self._ports = {"http": free_port(), "grpc": free_port(), "admin": free_port()}
        work = Path(self._work.name)
        config = envoy_config(
            http_port=self._ports["http"],
            grpc_port=self._ports["grpc"],
            admin_port=self._ports["admin"],
            eds_dir=self._eds,
            host="127.0.0.1",
            cluster_prefix=f"otelkit_{self.name}",
            traces_url=traces_url,
            service_name="envoy",
            health_interval_s=self._health_s,
            http_filters=self._filters,
            choices=self.balancer_choices,
        )
        try:
            # before the renderer runs: the EDS files Envoy needs to start are written here
            # first, and the renderer replaces them
            path = write_config(work / "envoy.json", config)
            if self._renderer is None:
                self._renderer = Renderer(
                    self.registry,
                    eds_dir=self._eds,
                    cluster_prefix=f"otelkit_{self.name}",
                    resync_s=1.0,
                ).start()
        except FleetError as error:
            raise StudyError(f"the fleet's load balancer: {error}") from error
        log = (self.log_dir or work) / "envoy.log"
        envoy = LocalEnvoy(
            path, admin_port=self._ports["admin"], log=log, concurrency=self.balancer_workers
        )
        try:
            self._envoy = envoy.start()
        except FleetError as error:
            raise StudyError(f"the fleet's Envoy did not start: {error}") from error
        self._envoy_key = envoy_key

    def _join(self, traces_url: str | None) -> _Member:
        self._joined += 1
        name = f"{self.name}-{self._joined}"
        env = dict(self._env)
        if traces_url is not None:  # the stages inside Python-backend models export there too
            env.setdefault("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces_url)
            env.setdefault("OTEL_BSP_SCHEDULE_DELAY", "200")
        log = self.log_dir / f"tritonserver-{name}.log" if self.log_dir else None
        server = TritonServer(
            self._served,
            trace_url=traces_url,
            trace_rate=1_000_000,  # the requests that carry a context (the sampled), no other
            model_control="explicit" if self.models else "none",
            load_models=self.models,
            env=env,
            extra_args=self._extra_args,
            startup_timeout=self._startup_timeout,
            log_path=log,
        )
        try:
            server.start()
        except TritonStartError as error:
            raise StudyError(f"fleet server {name}: {error}") from error
        record = ServerRecord(
            name,
            http=server.http_url,
            grpc=server.grpc_url,
            metrics=server.metrics_url.removeprefix("http://").removesuffix("/metrics"),
            models=self.models,
            site="study",
        )
        try:
            registration = Registration(record, self.registry, ttl_s=self.ttl_s).start()
        except RegistrationError as error:
            server.stop(timeout=3.0)
            raise StudyError(f"fleet server {name} could not register: {error}") from error
        if not registration.wait(self._routed_timeout_s):
            registration.close(leave=False)
            server.stop(timeout=3.0)
            raise StudyError(
                f"fleet server {name} could not register in {self.registry.describe()}"
            )
        return _Member(name, server, registration)

    def _leave(self, member: _Member, *, routed: bool = True) -> None:
        """Deregister ``member``, then stop it once Envoy routes nothing more to it (its
        requests in flight end first, as a draining server's would)."""
        member.registration.close(leave=True)
        if routed and self._envoy is not None:
            deadline = time.monotonic() + self._routed_timeout_s
            while time.monotonic() < deadline and member.name in self._hosts():
                time.sleep(0.05)
        member.server.stop(timeout=3.0)

    def _leave_all(self) -> None:
        while self._members:
            self._leave(self._members.pop(), routed=False)

    def _hosts(self) -> dict[str, dict[str, Any]]:
        assert self._envoy is not None
        try:
            return envoy_hosts(self._envoy.admin_url)
        except FleetError:
            return {}

    def _wait_routed(self) -> None:
        """Until Envoy health-checks exactly the members as healthy, in both clusters, and
        then until each member has answered a readiness probe sent through Envoy on each
        protocol: Envoy 1.40's balancing took a joined server about a second after its admin
        called it healthy (measured here), and a point must not begin short of a server."""
        wanted = set(self.members)
        deadline = time.monotonic() + self._routed_timeout_s
        while True:
            hosts = self._hosts()
            healthy = {
                cluster: {n for n, c in hosts.items() if c.get(cluster, {}).get("healthy")}
                for cluster in self._clusters.values()
            }
            if set(hosts) == wanted and all(h == wanted for h in healthy.values()):
                break
            self._late(deadline, f"it holds {hosts}")
            time.sleep(0.05)
        before = hosts
        for protocol, cluster in self._clusters.items():
            probe = self._probe(protocol)
            while True:
                hosts = self._hosts()
                counts = {n: hosts.get(n, {}).get(cluster, {}).get("requests", 0) for n in wanted}
                if all(counts[n] > before[n].get(cluster, {}).get("requests", 0) for n in wanted):
                    break
                self._late(deadline, f"probes over {protocol} reached {counts}")
                probe()

    def _late(self, deadline: float, holds: str) -> None:
        if time.monotonic() > deadline:
            raise StudyError(
                f"Envoy did not route to exactly {sorted(self.members)} within "
                f"{self._routed_timeout_s:g} s: {holds}"
            )

    def _probe(self, protocol: str) -> Callable[[], None]:
        """One readiness call through Envoy on ``protocol``; a failed one is just no probe."""
        url = f"127.0.0.1:{self._ports[protocol]}"
        if protocol == "grpc":
            import tritonclient.grpc as grpcclient

            client = grpcclient.InferenceServerClient(url)

            def ready() -> None:
                with contextlib.suppress(Exception):  # a server still joining: ask again
                    client.is_server_ready()

            return ready

        def ready_http() -> None:
            ready_url = f"http://{url}/v2/health/ready"
            with (
                contextlib.suppress(OSError, http.client.HTTPException),
                urllib.request.urlopen(ready_url, timeout=2) as page,
            ):
                page.read()

        return ready_http

    def failure(self) -> str | None:
        if self._envoy is not None and self._envoy_key is not None and not self._envoy.running:
            return f"the fleet's Envoy exited (log: {self._envoy.log})"
        for member in self._members:
            failure = member.server.failure()
            if failure is not None:
                return f"fleet server {member.name}: {failure}:\n{member.server.log_tail(20)}"
        return None

    def close(self) -> None:
        self._leave_all()
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        if self._envoy is not None:
            self._envoy.stop()
            self._envoy, self._envoy_key = None, None
        self.unstage()
        self._key = None

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "fleet",
            "repository": str(self.repository),
            "models": list(self.models),
            "registry": self.registry.describe(),
            "balancer": "envoy",
            "balancer_workers": self.balancer_workers,
            "balancer_choices": self.balancer_choices,
        }
