"""Ray Serve as a study's server: replicas swept as Triton's instances are.

``RayServe(build)`` starts a local Ray (unless one is connected) and Serve's HTTP proxy on a
free port, and deploys the application ``build(params, env_vars)`` returns for each point
whose ``instances`` differs from the last one's: the builder sets its deployments'
``num_replicas`` from ``params["instances"]`` and passes ``env_vars`` (where the study's
traces go) to ``otelkit.server.ray_serve.instrument_deployment``. ``serve.run`` of the same
application name updates it in place; the point is served once every replica is up.

>>> server = RayServe("gnn_tracking.serving.ray_app:study_app")  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from otelkit.errors import StudyError
from otelkit.study.servers import Endpoint, Server
from otelkit.tritonserver import free_port

__all__ = ["AppBuilder", "RayServe"]

#: ``(params, env_vars) -> application`` (what ``Deployment.bind()`` returns)
AppBuilder = Callable[[Mapping[str, Any], Mapping[str, str]], Any]


def _builder(application: AppBuilder | str) -> AppBuilder:
    if callable(application):
        return application
    module, _, name = application.partition(":")
    try:
        found: AppBuilder = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise StudyError(f"no application builder {application!r}: {error}") from error
    return found


class RayServe(Server):
    """A Ray Serve application the study deploys (and redeploys as ``instances`` changes).

    ``application``: the builder, or its ``module:function`` name. ``num_cpus``: the local Ray
    started when none is connected (``None``: every core). ``metrics``: Ray's metrics are served
    on a free port for the study to read (only on a Ray this server starts).
    """

    axes = ("instances",)

    def __init__(
        self,
        application: AppBuilder | str,
        *,
        name: str = "otelkit-study",
        num_cpus: int | None = None,
        metrics: bool = True,
    ) -> None:
        self._build = _builder(application)
        self.name, self._num_cpus, self._metrics = name, num_cpus, metrics
        self._port: int | None = None
        self._metrics_port: int | None = None
        self._started_ray = False
        self._key: tuple[Any, ...] | None = None

    def prepare(self, params: Mapping[str, Any], traces_url: str | None) -> Endpoint:
        from ray import serve

        self._start()
        key = (params.get("instances"), traces_url)
        if key != self._key:
            env: dict[str, str] = {}
            if traces_url is not None:
                env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = traces_url
                env["OTEL_BSP_SCHEDULE_DELAY"] = "200"
                env["OTEL_TRACES_SAMPLER"] = "parentbased_always_off"  # the client decides
            try:
                serve.run(self._build(params, env), name=self.name, route_prefix="/")
            except Exception as error:  # Serve's deployment failures have many types
                raise StudyError(f"Ray Serve could not deploy {self.name}: {error}") from error
            self._key = key
        metrics = f"http://127.0.0.1:{self._metrics_port}/metrics" if self._metrics_port else None
        replicas = self._replicas()
        # the actor table may name a replica's process a moment after Serve says it runs
        deadline = time.monotonic() + 3.0
        while True:
            processes = self._processes()
            counted = sum(len(p) for p in processes.values())
            if counted >= sum(replicas.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        return Endpoint(
            http_url=f"127.0.0.1:{self._port}",
            metrics_url=metrics,
            parallelism=replicas,
            processes=processes,
        )

    def _replicas(self) -> dict[str, int]:
        """Each deployment's running replicas: the capacity model's parallelism."""
        from ray import serve

        try:
            deployments = serve.status().applications[self.name].deployments
        except Exception:  # the figures go without it
            return {}
        running = {
            name: sum(n for state, n in d.replica_states.items() if state == "RUNNING")
            for name, d in deployments.items()
        }
        return {name: n for name, n in running.items() if n}

    def _processes(self) -> dict[str, tuple[int, ...]]:
        """Each deployment's replica processes, from Ray's actor table: the one place otelkit
        reads Ray's private state (``ray._private.state.actors``, checked on Ray 2.60; Serve
        names a replica's actor class ``ServeReplica:<application>:<deployment>``). Without it,
        a deployment's demand comes from its stages alone."""
        try:
            from ray._private import state

            actors = state.actors()
        except Exception:  # a Ray that moved it: the figures go without the replicas' CPU
            return {}
        prefix = f"ServeReplica:{self.name}:"
        found: dict[str, list[int]] = {}
        for actor in actors.values():
            name = str(actor.get("ActorClassName", ""))
            if name.startswith(prefix) and actor.get("State") == "ALIVE" and actor.get("Pid"):
                found.setdefault(name[len(prefix) :], []).append(int(actor["Pid"]))
        return {k: tuple(v) for k, v in found.items()}

    def _start(self) -> None:
        import ray
        from ray import serve

        if self._port is not None:
            return
        if not ray.is_initialized():
            options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if self._metrics:
                self._metrics_port = free_port()
                options["_metrics_export_port"] = self._metrics_port
            ray.init(num_cpus=self._num_cpus, **options)
            self._started_ray = True
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        self._port = port

    def close(self) -> None:
        import ray
        from ray import serve

        if self._port is None:
            return
        serve.shutdown()  # type: ignore[no-untyped-call]
        if self._started_ray:
            ray.shutdown()
        self._port, self._key, self._started_ray = None, None, False

    def describe(self) -> dict[str, Any]:
        return {"kind": "ray_serve", "application": self.name}
