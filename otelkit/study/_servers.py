"""The servers a study talks to: a Triton it launches, a Ray Serve application it deploys, or one
it is given.

``Triton(repository)`` is a ``tritonserver`` the study starts on a copy of a model repository;
an ``instances`` sweep rewrites the ``instance_group`` counts of the copy's ``config.pbtxt``
files and restarts it. ``Remote(url)`` is any KServe v2 server that runs already (a Triton
elsewhere, the FastAPI twin, another server that speaks the protocol); between points the study
can run a hook or a command that reconfigures it (``{instances}`` in a command is replaced by
the point's value, and every parameter is in the environment as ``OTELKIT_STUDY_<NAME>``).

>>> print(set_instance_count('instance_group [ { kind: KIND_CPU, count: 1 } ]', 3))
instance_group [ { kind: KIND_CPU, count: 3 } ]
>>> print(set_instance_count('backend: "python"', 2), end="")
backend: "python"
instance_group [ { count: 2 } ]

**Ray Serve**, its replicas swept as Triton's instances are: ``RayServe(build)`` starts a local
Ray (unless one is connected) and Serve's HTTP proxy on a free port, and deploys the application
``build(params, env_vars)`` returns for each point whose ``instances`` differs from the last
one's: the builder sets its deployments' ``num_replicas`` from ``params["instances"]`` and
passes ``env_vars`` (where the study's traces go) to
``otelkit.server.ray_serve.instrument_deployment``. ``serve.run`` of the same application name
updates it in place; the point is served once every replica is up.

>>> server = RayServe("gnn_tracking.serving.ray_app:study_app")  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from otelkit._core.deps import ray as ray_private
from otelkit._errors import StudyError, TritonStartError
from otelkit.tritonserver import TritonServer, free_port

#: the protocols a study calls a server by (KServe v2 over HTTP or gRPC)
WireProtocol = Literal["http", "grpc"]

__all__ = [
    "AppBuilder",
    "Endpoint",
    "RayServe",
    "Remote",
    "RepositoryServer",
    "Server",
    "Triton",
    "set_instance_count",
]


_COUNT = re.compile(r"\bcount\s*:\s*\d+")
_CONFIG = "config.pbtxt"


@dataclass(frozen=True)
class Endpoint:
    """Where a point's requests go: ``host:port`` per protocol, and the Prometheus page."""

    http_url: str | None = None
    grpc_url: str | None = None
    metrics_url: str | None = None
    # the server's processes, when the study started them: their CPU (and their children's,
    # a Triton's Python-backend stubs) is the server's demand on its host's cores
    server_pids: tuple[int, ...] = ()
    # the servers each model or deployment has, where the server says (Ray Serve's replicas;
    # Triton's instances are read from each model's configuration)
    parallelism: Mapping[str, int] = field(default_factory=dict)
    # the processes of each model or deployment, where the server says (Ray Serve's replicas,
    # each a Python process under one GIL): their CPU is the model's demand
    processes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # several identical servers behind a load balancer (a fleet): each one's Prometheus page,
    # their counters summed, and how many there are (a model's instances are this many times
    # its configuration's)
    metrics_urls: tuple[str, ...] = ()
    servers: int = 1
    # the load balancer the study started in front of them: its processes (their CPU is its
    # demand) and its worker threads (its parallelism)
    balancer_pids: tuple[int, ...] = ()
    balancer_workers: int | None = None

    def url(self, protocol: WireProtocol) -> str:
        url = self.http_url if protocol == "http" else self.grpc_url
        if url is None:
            raise StudyError(f"the server has no {protocol} endpoint")
        return url


class Server:
    """What a study needs of a server; ``Triton`` and ``Remote`` are the two kinds.

    ``axes`` are the sweep parameters the server takes (``instances``): a point whose values of
    them differ from the last point's reconfigures it.
    """

    axes: tuple[str, ...] = ()
    ready_s: float = 0.0  # how long a point waits for the server to answer after ``prepare``

    def prepare(self, params: Mapping[str, Any], traces_url: str | None) -> Endpoint:
        """Make the server serve ``params`` (start it, restart or reconfigure it)."""
        raise NotImplementedError

    def with_models(self, models: Sequence[str]) -> Server:
        """The models an ``instances`` sweep sets, when none were named (the study's model)."""
        return self

    def keep_logs(self, directory: Path) -> None:
        """Where the server's logs go when the study starts it and none was given."""

    def failure(self) -> str | None:
        """Why the server cannot serve any more (it died, or hangs after a crash), or ``None``;
        its first line says it in one line. ``prepare`` starts a failed server afresh."""
        return None

    def close(self) -> None:
        """Stop what the study started."""

    def describe(self) -> dict[str, Any]:
        """What the results file records about the server."""
        return {"kind": type(self).__name__}


def set_instance_count(config: str, count: int) -> str:
    """``config.pbtxt`` text with every ``instance_group`` entry's ``count`` set to ``count``.

    A model without ``instance_group`` gets one; an entry without ``count`` gets it too.
    """
    start = config.find("instance_group")
    if start < 0:
        return f"{config.rstrip()}\ninstance_group [ {{ count: {count} }} ]\n"
    open_at = config.index("[", start)
    depth, end = 0, open_at
    for end in range(open_at, len(config)):
        depth += {"[": 1, "]": -1}.get(config[end], 0)
        if depth == 0:
            break
    block = config[open_at : end + 1]
    entries = re.split(r"(\{[^{}]*\})", block)
    for n, entry in enumerate(entries):
        if entry.startswith("{"):
            if _COUNT.search(entry):
                entries[n] = _COUNT.sub(f"count: {count}", entry)
            else:
                entries[n] = "{ " + f"count: {count}, " + entry[1:].lstrip()
    return config[:open_at] + "".join(entries) + config[end + 1 :]


def stage_repository(source: Path, target: Path, counts: Mapping[str, int]) -> None:
    """A copy of ``source`` in ``target``: files linked, the named models' configs rewritten."""
    for model in sorted(p for p in source.iterdir() if p.is_dir()):
        (target / model.name).mkdir(parents=True)
        for entry in model.iterdir():
            link = target / model.name / entry.name
            if entry.name == _CONFIG and model.name in counts:
                link.write_text(set_instance_count(entry.read_text(), counts[model.name]))
            else:
                link.symlink_to(entry.resolve())


class RepositoryServer(Server):
    """What the servers a study launches on a model repository share: the ``models`` an
    ``instances`` sweep sets (default: the study's model), where their logs go, and the copy of
    the repository with those counts that a point serves (``staged``)."""

    def __init__(
        self, repository: str | Path, models: Sequence[str], log_dir: str | Path | None
    ) -> None:
        self.repository = Path(repository).resolve()
        if not self.repository.is_dir():
            raise StudyError(f"no model repository at {repository}")
        self.models = tuple(models)
        self.log_dir = Path(log_dir) if log_dir else None
        self._staged: tempfile.TemporaryDirectory[str] | None = None

    def with_models(self, models: Sequence[str]) -> RepositoryServer:
        if not self.models:
            self.models = tuple(models)
        return self

    def keep_logs(self, directory: Path) -> None:
        if self.log_dir is None:
            self.log_dir = directory

    def staged(self, instances: int | None) -> Path:
        """The repository to serve: the original, or (for an ``instances`` point) a copy whose
        models have that many instances; the copy before it is removed."""
        self.unstage()
        if instances is None:
            return self.repository
        missing = [m for m in self.models if not (self.repository / m / _CONFIG).is_file()]
        if missing:
            raise StudyError(f"no {_CONFIG} for model {missing[0]!r} in {self.repository}")
        self._staged = tempfile.TemporaryDirectory(prefix="otelkit-study-repository-")
        served = Path(self._staged.name)
        stage_repository(self.repository, served, dict.fromkeys(self.models, instances))
        return served

    def unstage(self) -> None:
        if self._staged is not None:
            self._staged.cleanup()
            self._staged = None


class Triton(RepositoryServer):
    """A ``tritonserver`` the study launches on ``repository``, restarted when ``instances``
    changes; ``models`` are those whose instance counts an ``instances`` sweep sets (default:
    the model under study). ``env`` and ``extra_args`` go to the server as ``TritonServer``
    takes them.

    >>> server = Triton("tests/models", models=["sleep_fp32"])  # doctest: +SKIP
    """

    axes = ("instances",)

    def __init__(
        self,
        repository: str | Path,
        *,
        models: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 120.0,
        log_dir: str | Path | None = None,
    ) -> None:
        super().__init__(repository, models, log_dir)
        self._env, self._extra_args = dict(env or {}), tuple(extra_args)
        self._startup_timeout = startup_timeout
        self._server: TritonServer | None = None
        self._key: tuple[Any, ...] | None = None
        self._starts = 0

    @property
    def server(self) -> TritonServer | None:
        """The running ``TritonServer``, if any."""
        return self._server

    def prepare(self, params: Mapping[str, Any], traces_url: str | None) -> Endpoint:
        instances = params.get("instances")
        key = (instances, traces_url)
        if self._server is None or key != self._key or self._server.failure() is not None:
            self._restart(instances, traces_url)
            self._key = key
        assert self._server is not None
        server = self._server
        pids = (server.pid,) if server.pid is not None else ()
        return Endpoint(server.http_url, server.grpc_url, server.metrics_url, pids)

    def _restart(self, instances: int | None, traces_url: str | None) -> None:
        self.close()
        repository = self.staged(instances)
        env = dict(self._env)
        if traces_url is not None:  # the stages inside Python-backend models export there too
            env.setdefault("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces_url)
            env.setdefault("OTEL_BSP_SCHEDULE_DELAY", "200")
        self._starts += 1
        log = self.log_dir / f"tritonserver-{self._starts}.log" if self.log_dir else None
        # Triton traces every request that carries a context (the sampled share) and, with this
        # rate, none of the others.
        self._server = TritonServer(
            repository,
            trace_url=traces_url,
            trace_rate=1_000_000,
            env=env,
            extra_args=self._extra_args,
            startup_timeout=self._startup_timeout,
            log_path=log,
        )
        try:
            self._server.start()
        except TritonStartError as error:
            self._server = None
            raise StudyError(str(error)) from error

    def failure(self) -> str | None:
        server = self._server
        failure = server.failure() if server is not None else None
        if server is None or failure is None:
            return None
        return f"{failure}:\n{server.log_tail(20)}"

    def close(self) -> None:
        if self._server is not None:
            self._server.stop(timeout=3.0)  # the point's traces were read already
            self._server = None
        self.unstage()

    def describe(self) -> dict[str, Any]:
        return {"kind": "triton", "repository": str(self.repository), "models": list(self.models)}


Reconfigure = Callable[[Mapping[str, Any]], None] | str | Sequence[str]


class Remote(Server):
    """A KServe v2 server the study does not launch, at ``url`` (``host:port``).

    ``metrics_url`` is its Prometheus page (Triton's ``http://host:8002/metrics``), if any.
    ``reconfigure`` runs before a point whose ``axes`` values differ from the last point's:
    a Python function of the point's parameters, or a command (``{instances}`` replaced).

    >>> twin = Remote("127.0.0.1:8010")
    >>> scaled = Remote("gpu-node:8001", reconfigure="scale-triton --instances {instances}")
    """

    def __init__(
        self,
        url: str,
        *,
        metrics_url: str | None = None,
        reconfigure: Reconfigure | None = None,
        axes: Sequence[str] = ("instances",),
        timeout_s: float = 600.0,
    ) -> None:
        self.url, self.metrics_url = url, metrics_url
        self._reconfigure = reconfigure
        self.axes = tuple(axes) if reconfigure is not None else ()
        self._timeout_s = timeout_s
        self.ready_s = 60.0 if reconfigure is not None else 0.0  # a reconfigured server restarts
        self._last: dict[str, Any] | None = None

    def prepare(self, params: Mapping[str, Any], traces_url: str | None) -> Endpoint:
        values = {axis: params[axis] for axis in self.axes if axis in params}
        if self._reconfigure is not None and values != self._last:
            self._run_reconfigure(params)
            self._last = values
        return Endpoint(self.url, self.url, self.metrics_url)

    def _run_reconfigure(self, params: Mapping[str, Any]) -> None:
        hook = self._reconfigure
        if callable(hook):
            hook(params)
            return
        assert hook is not None
        words = shlex.split(hook) if isinstance(hook, str) else list(hook)
        try:
            command = [word.format(**params) for word in words]
        except (KeyError, IndexError) as error:
            raise StudyError(
                f"the reconfigure command {words} names {error}, no parameter"
            ) from error
        env = dict(os.environ)
        env.update({f"OTELKIT_STUDY_{k.upper()}": str(v) for k, v in params.items()})
        try:
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=self._timeout_s
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise StudyError(f"the reconfigure command {command} failed: {error}") from error
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip()[-500:]
            raise StudyError(
                f"the reconfigure command {command} exited with {done.returncode}: {tail}"
            )

    def describe(self) -> dict[str, Any]:
        return {"kind": "remote", "url": self.url, "metrics_url": self.metrics_url}


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
            actors = ray_private.actor_table()
        except Exception:  # Ray not started: the figures go without the replicas' CPU
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
