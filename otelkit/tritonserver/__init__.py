"""Run the ``tritonserver`` bundled in the nvidia-pytriton wheel as a child process, on the CPU.

Tests and demos need a real Triton serving Python-backend models, with Triton's own
OpenTelemetry tracing exporting OTLP/HTTP to a URL we choose. ``triton_install()`` locates the
binary and prepares its backend directory and environment (see ``otelkit.tritonserver._install``);
``TritonServer`` runs it, waits until it is ready and stops it with every stub it started.

Example::

    with TritonServer("tests/models", trace_url="http://127.0.0.1:4318/v1/traces") as server:
        client = tritonclient.http.InferenceServerClient(server.http_url)
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal

from otelkit._errors import ConfigError, StartFailure, TritonStartError
from otelkit.tritonserver._install import TritonInstall, triton_install

__all__ = ["TritonInstall", "TritonServer", "TritonStartError", "free_port", "triton_install"]

ModelControl = Literal["none", "poll", "explicit"]

_PORT_IN_USE = re.compile(
    r"failed to start (\w+) service: \w+ - Socket '(.*):(\d+)' already in use"
)
_MODEL_FAILED = re.compile(
    r"(?:failed to load '([^']+)' version \d+|Poll failed for model directory '([^']+)'): (.*)$",
    re.MULTILINE,
)
_LIBRARY_MISSING = re.compile(r"^(\S+): error while loading shared libraries: (.*)$", re.MULTILINE)
_ERROR_LINE = re.compile(r"^E\d{4} .*$", re.MULTILINE)
_NOISE = ("CudaDriverHelper has not been initialized",)  # logged by every CPU-only start
_STARTED = {"http": "Started HTTPService", "grpc": "Started GRPCInferenceService"}
_STARTED_METRICS = "Started Metrics Service"
_CRASH_HANDLER = re.compile(r"Signal \(\d+\) received\.?")
_SERVER_VERSION = re.compile(r"^\|\s*server_version\s*\|\s*(\S+)\s*\|", re.MULTILINE)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now (another process may still take it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class TritonServer:
    """A ``tritonserver`` child process serving ``model_repository``; a context manager.

    Ports left as ``None`` are picked free (and picked again if another process takes one
    first). ``trace_url`` (the full OTLP/HTTP traces URL) turns on Triton's OpenTelemetry
    tracing; its batch span processor exports every ``trace_export_delay_ms``.

    >>> with TritonServer("tests/models") as server:
    ...     client = tritonclient.grpc.InferenceServerClient(server.grpc_url)
    """

    def __init__(
        self,
        model_repository: str | Path,
        *,
        host: str = "127.0.0.1",
        http_port: int | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        trace_url: str | None = None,
        trace_rate: int = 1,
        trace_level: str = "TIMESTAMPS",
        trace_resource: Mapping[str, str] | None = None,
        trace_export_delay_ms: int = 200,
        model_control: ModelControl = "none",
        load_models: Sequence[str] = (),
        auto_complete_config: bool = True,
        exit_timeout: int = 5,
        log_verbose: int = 0,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 120.0,
        log_path: Path | None = None,
        install: TritonInstall | None = None,
    ):
        self.model_repository = Path(model_repository).resolve()
        if not self.model_repository.is_dir():
            raise ConfigError(
                "model_repository", (), str(model_repository), "an existing directory"
            )
        if trace_level.upper() not in ("TIMESTAMPS", "OFF"):
            raise ConfigError(
                "trace_level", (), trace_level, "TIMESTAMPS or OFF (OpenTelemetry mode)"
            )
        if model_control not in ("none", "poll", "explicit"):
            raise ConfigError("model_control", (), model_control, "none, poll or explicit")
        self.host = host
        self._fixed = {"http": http_port, "grpc": grpc_port, "metrics": metrics_port}
        self._ports = self._pick_ports()
        self._trace = (trace_url, trace_rate, trace_level.upper(), dict(trace_resource or {}))
        self._trace_delay = trace_export_delay_ms
        self._model_control, self._load_models = model_control, tuple(load_models)
        self._auto_complete, self._exit_timeout = auto_complete_config, exit_timeout
        self._log_verbose, self._extra_args = log_verbose, tuple(extra_args)
        self._env, self._startup_timeout, self._install = dict(env or {}), startup_timeout, install
        self._log_path = Path(log_path) if log_path else None
        self._version: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes], float], TritonServer] | None = (
            None
        )

    @property
    def http_port(self) -> int:
        return self._ports["http"]

    @property
    def grpc_port(self) -> int:
        return self._ports["grpc"]

    @property
    def metrics_port(self) -> int:
        return self._ports["metrics"]

    @property
    def http_url(self) -> str:
        """``host:port`` of the HTTP endpoint, as ``tritonclient.http`` takes it."""
        return f"{self._client_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` of the gRPC endpoint, as ``tritonclient.grpc`` takes it."""
        return f"{self._client_host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """Full URL of Triton's Prometheus ``/metrics`` page."""
        return f"http://{self._client_host}:{self.metrics_port}/metrics"

    @property
    def log_path(self) -> Path | None:
        """The server's stdout and stderr: ``log_path``, or a temporary file made at start."""
        return self._log_path

    @property
    def traced(self) -> bool:
        """Whether the server runs Triton's OpenTelemetry tracer: a ``trace_url`` was given and
        ``trace_level`` is not ``OFF``.

        True whatever ``trace_rate``: at rate 0 Triton samples none of its own, yet still traces
        every request that carries a ``traceparent`` (docs/known-issues.md).
        """
        url, _, level, _ = self._trace
        return url is not None and level != "OFF"

    @property
    def version(self) -> str | None:
        """The version the server reported at its last start (``2.51.0``), or ``None`` before
        one; kept after it stops, so a crashed server's still says which build crashed."""
        return self._version

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> TritonServer:
        """Start the server and wait until ``/v2/health/ready``; raise ``TritonStartError``."""
        if self.running:
            return self
        self.stop(timeout=5)  # reap what a server that died since its start left behind
        install = self._install or triton_install()
        attempts = 3
        while True:
            attempts -= 1
            try:
                self._launch(install)
                self._wait_ready()
                return self
            except TritonStartError as exc:
                self.stop(timeout=5)
                taken = [name for name, port in self._ports.items() if port == exc.port]
                if (
                    exc.reason != "port_in_use"
                    or not attempts
                    or any(self._fixed[n] for n in taken)
                ):
                    raise
                self._ports = self._pick_ports()  # a free port we picked was taken meanwhile
            except BaseException:
                self.stop(timeout=5)
                raise

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL the server and its stubs. Idempotent."""
        proc, self._proc = self._proc, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if proc is not None:
            _terminate(proc, timeout)

    def failure(self) -> str | None:
        """Why the server stopped serving by itself, or ``None`` while it serves (or was stopped).

        A tritonserver that crashes logs ``Signal (N) received.`` from its own handler and may
        then hang there instead of exiting (2.51 under traced load, upstream issue 7795): that
        counts as a failure too, with the exit status when there is one."""
        status = self._proc.poll() if self._proc is not None else None
        handled = _CRASH_HANDLER.search(self._read_log()) if self._proc is not None else None
        if status is None and handled is None:
            return None
        if status is None:
            how = "hangs in its crash handler"
        elif status < 0:
            how = f"was killed by signal {-status} ({signal.strsignal(-status)})"
        else:
            how = f"exited with status {status}"
        logged = f" after logging '{handled.group(0)}'" if handled else ""
        return f"tritonserver {how}{logged} (log: {self.log_path})"

    def log_tail(self, lines: int = 50) -> str:
        """The last ``lines`` lines of the server's log."""
        try:
            with open(self._log_path or "", "rb") as log:
                tail = deque(log, maxlen=lines)
        except FileNotFoundError:
            return ""
        return b"".join(tail).decode("utf-8", "replace").replace("\x00", "")

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        return f"<TritonServer {self.model_repository} http={self.http_url} {state}>"

    @property
    def _client_host(self) -> str:
        if self.host in ("", "0.0.0.0"):
            return "127.0.0.1"
        if self.host == "::":
            return "[::1]"
        return f"[{self.host}]" if ":" in self.host else self.host

    def _pick_ports(self) -> dict[str, int]:
        ports: dict[str, int] = {}
        for name, fixed in self._fixed.items():
            port = fixed
            while port is None or (fixed is None and port in ports.values()):
                port = free_port(self._client_host.strip("[]"))
            ports[name] = port
        return ports

    def command(self, install: TritonInstall) -> list[str]:
        """The ``tritonserver`` command line this server runs."""
        args = [
            str(install.binary),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={install.backend_directory}",
            f"--model-control-mode={self._model_control}",
            *(f"--load-model={name}" for name in self._load_models),
            *(
                arg
                for name in ("http", "grpc", "metrics")
                for arg in (f"--{name}-address={self.host}", f"--{name}-port={self._ports[name]}")
            ),
            "--exit-on-error=true",
            "--strict-readiness=true",
            f"--exit-timeout-secs={self._exit_timeout}",
            f"--log-verbose={self._log_verbose}",
        ]
        if not self._auto_complete:
            args.append("--disable-auto-complete-config")
        url, rate, level, resource = self._trace
        if self.traced:
            config = [
                "mode=opentelemetry",
                f"rate={rate}",
                f"level={level}",
                f"opentelemetry,url={url}",
                f"opentelemetry,bsp_schedule_delay={self._trace_delay}",
                *(f"opentelemetry,resource={key}={value}" for key, value in resource.items()),
            ]
            args += [arg for setting in config for arg in ("--trace-config", setting)]
        return [*args, *self._extra_args]

    def _launch(self, install: TritonInstall) -> None:
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        # O_APPEND: the server and its stubs write to the same file without clobbering.
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        with open(os.open(self._log_path, flags, 0o644), "wb") as log:
            self._proc = subprocess.Popen(
                self.command(install),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=install.environ({**os.environ, **self._env}),
                start_new_session=True,  # its own process group: stop() reaps the stubs too
                preexec_fn=_die_with_parent,
            )
        self._finalizer = weakref.finalize(self, _terminate, self._proc, 5.0)

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self._startup_timeout
        # Readiness alone could come from another server on a taken port: our own log must
        # also say that every service started.
        markers = [_STARTED["http"]]
        if "--allow-grpc=false" not in self._extra_args:
            markers.append(_STARTED["grpc"])
        if "--allow-metrics=false" not in self._extra_args:
            markers.append(_STARTED_METRICS)
        while True:
            code = self._proc.poll()
            if code is not None:
                raise self._failure(f"exited with code {code} before it was ready", "exited")
            text = self._read_log()
            if _LIBRARY_MISSING.search(text):  # a stub that cannot start hangs the model load
                raise self._failure("could not start a Python-backend stub", "not_found")
            if all(m in text for m in markers) and self._ready():
                reported = _SERVER_VERSION.search(text)
                self._version = reported[1] if reported else None
                return
            if time.monotonic() > deadline:
                raise self._failure(
                    f"was not ready within {self._startup_timeout:g} s "
                    f"(http://{self.http_url}/v2/health/ready)",
                    "timeout",
                )
            time.sleep(0.05)

    def _ready(self) -> bool:
        conn = http.client.HTTPConnection(self._client_host.strip("[]"), self.http_port, timeout=2)
        try:
            conn.request("GET", "/v2/health/ready")
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def _read_log(self) -> str:
        try:
            with open(self._log_path or "", "rb") as log:
                return log.read().decode("utf-8", "replace").replace("\x00", "")
        except FileNotFoundError:
            return ""

    def _failure(self, what: str, reason: StartFailure) -> TritonStartError:
        text, tail = self._read_log(), self.log_tail()
        where = f"(log: {self.log_path})"
        if port_in_use := _PORT_IN_USE.search(text):
            service, address, port = port_in_use.groups()
            return TritonStartError(
                f"otelkit: tritonserver could not start its {service} service: port {port} "
                f"on {address} is already in use {where}",
                reason="port_in_use",
                log_tail=tail,
                port=int(port),
            )
        if missing := _LIBRARY_MISSING.search(text):
            return TritonStartError(
                f"otelkit: {missing[1]} cannot load its libraries ({missing[2]}): "
                f"start it with triton_install().environ() {where}",
                reason="not_found",
                log_tail=tail,
            )
        failed = {(m[1] or m[2]): _unescape(m[3]) for m in _MODEL_FAILED.finditer(text)}
        if failed:
            lines = "\n".join(f"  {model}: {error}" for model, error in failed.items())
            names = ", ".join(f"'{model}'" for model in failed)
            return TritonStartError(
                f"otelkit: tritonserver failed to load model {names} {where}:\n{lines}",
                reason="model_failed",
                log_tail=tail,
                model=next(iter(failed)),
            )
        errors = [line for line in _ERROR_LINE.findall(text) if not any(n in line for n in _NOISE)]
        first = f": {errors[0]}" if errors else ""
        return TritonStartError(
            f"otelkit: tritonserver {what}{first}\n--- last lines of {self.log_path} ---\n{tail}",
            reason=reason,
            log_tail=tail,
        )


def _terminate(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Stop ``proc`` gracefully, then make sure nothing of its process group survives."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        # Wait without reaping: while the leader is a zombie its pid (= the group id) cannot be
        # reused, so killing the group below cannot hit a stranger.
        while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # stubs left behind, or the server itself on timeout
    proc.wait()


def _unescape(error: str) -> str:
    """Triton logs an error as one quoted line with ``\\n`` escapes: keep its message part."""
    message = error.rstrip().removesuffix('"').split("\\n\\nAt:")[0]
    return message.replace("\\n", "\n").replace('\\"', '"').strip()


_libc: ctypes.CDLL | None = None


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when the thread that started it exits."""
    if _libc is not None:
        _libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError):
        _libc = ctypes.CDLL(None, use_errno=True)  # loaded here, never between fork and exec
