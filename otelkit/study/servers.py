"""The servers a study talks to: a Triton it launches, or one it is given.

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
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otelkit.errors import StudyError, TritonStartError
from otelkit.tritonserver import TritonServer

__all__ = ["Endpoint", "Remote", "Server", "Triton", "set_instance_count"]

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

    def url(self, protocol: str) -> str:
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


class Triton(Server):
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
        self.repository = Path(repository).resolve()
        if not self.repository.is_dir():
            raise StudyError(f"no model repository at {repository}")
        self.models = tuple(models)
        self._env, self._extra_args = dict(env or {}), tuple(extra_args)
        self._startup_timeout = startup_timeout
        self.log_dir = Path(log_dir) if log_dir else None
        self._server: TritonServer | None = None
        self._key: tuple[Any, ...] | None = None
        self._staged: tempfile.TemporaryDirectory[str] | None = None
        self._starts = 0

    def with_models(self, models: Sequence[str]) -> Triton:
        if not self.models:
            self.models = tuple(models)
        return self

    def keep_logs(self, directory: Path) -> None:
        if self.log_dir is None:
            self.log_dir = directory

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
        repository = self.repository
        if instances is not None:
            missing = [m for m in self.models if not (self.repository / m / _CONFIG).is_file()]
            if missing:
                raise StudyError(f"no {_CONFIG} for model {missing[0]!r} in {self.repository}")
            self._staged = tempfile.TemporaryDirectory(prefix="otelkit-study-repository-")
            repository = Path(self._staged.name)
            stage_repository(self.repository, repository, dict.fromkeys(self.models, instances))
        env = dict(self._env)
        if traces_url is not None:  # the stages inside Python-backend models export there too
            env.setdefault("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces_url)
            env.setdefault("OTEL_BSP_SCHEDULE_DELAY", "200")
        self._starts += 1
        log = self.log_dir / f"tritonserver-{self._starts}.log" if self.log_dir else None
        # Triton traces every request that carries a context (the sampled share) and, with this
        # rate, none of the others.
        self._server = TritonServer(
            repository, trace_url=traces_url, trace_rate=1_000_000, env=env,
            extra_args=self._extra_args, startup_timeout=self._startup_timeout, log_path=log,
        )  # fmt: skip
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
        if self._staged is not None:
            self._staged.cleanup()
            self._staged = None

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
