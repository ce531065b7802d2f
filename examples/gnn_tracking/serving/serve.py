"""Launch Triton on the pipeline's model repository, traced and with metrics on.

    python -m gnn_tracking.serving.serve                      # CPU, traces to an embedded receiver
    python -m gnn_tracking.serving.serve --gpu --http-port 8000 --grpc-port 8001 --metrics-port 8002
    OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 python -m gnn_tracking.serving.serve

It runs the ``tritonserver`` bundled with nvidia-pytriton (``otelkit.tritonserver`` builds
its backend directory and library path), with Triton's OpenTelemetry tracing sent to the
configured OTLP endpoint — or, when none is set, to an embedded receiver writing
``./otelkit-traces`` — and its Prometheus metrics on. The stage models export their spans to
the same place and serve their stage metrics on ``--models-metrics-port`` + 1..5, or, without
it, each on a free port it binds and reports (printed once Triton is ready).
Unset ports are picked free; a taken port or a model that fails to load is a clear error.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gnn_tracking.physics.models import load_models
from gnn_tracking.serving.repository import GPU_CONFIG, REPOSITORY
from gnn_tracking.serving.stages import STAGE_ORDER
from gnn_tracking.serving.triton_model import METRICS_PORTS
from otelkit.receiver import Receiver
from otelkit.tritonserver import TritonServer, TritonStartError

__all__ = ["TrackingTriton", "configured_traces_url", "triton_server"]


def configured_traces_url() -> str | None:
    """The OTLP/HTTP traces URL from ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``, if set."""
    url = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if url:
        return url
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return f"{base.rstrip('/')}/v1/traces" if base else None


class TrackingTriton(TritonServer):
    """The pipeline's tritonserver: once started, ``stage_metrics_ports`` maps each stage
    model to the port its ``/metrics`` serves on, as the model reported it.

    Each stage model binds its own port (a free one, unless ``OTELKIT_PROMETHEUS_PORT`` fixes
    them) and writes it to a directory of this server's (``triton_model.METRICS_PORTS``): a
    port picked here and handed over could be taken before the model binds it. Every stage
    model initialises before Triton is ready, so the reports are there by then; a model that
    has not reported ``reports_timeout_s`` after that fails the start, named.
    """

    def __init__(
        self,
        model_repository: Path,
        *,
        env: Mapping[str, str] | None = None,
        reports_timeout_s: float = 10.0,
        **options: Any,
    ) -> None:
        self._reports = Path(tempfile.mkdtemp(prefix="gnn-tracking-metrics-ports-"))
        weakref.finalize(self, shutil.rmtree, self._reports, True)
        self._reports_timeout_s = reports_timeout_s
        self.stage_metrics_ports: dict[str, int] = {}
        super().__init__(
            model_repository, env={**(env or {}), METRICS_PORTS: str(self._reports)}, **options
        )

    def start(self) -> TrackingTriton:
        if self.running:
            return self
        for report in self._reports.iterdir():  # a restart's models report anew
            report.unlink()
        self.stage_metrics_ports = {}
        super().start()
        try:
            self.stage_metrics_ports = self._reported_ports()
        except BaseException:
            self.stop(timeout=5)
            raise
        return self

    def stage_metrics_url(self, stage: str) -> str:
        """The ``/metrics`` URL of one stage model (``STAGE_ORDER``), as started."""
        host = urlsplit(self.metrics_url).netloc.rsplit(":", 1)[0]  # Triton's, as clients reach it
        return f"http://{host}:{self.stage_metrics_ports[stage]}/metrics"

    def _reported_ports(self) -> dict[str, int]:
        deadline = time.monotonic() + self._reports_timeout_s
        while True:
            ports = {}
            for stage in STAGE_ORDER:
                report = self._reports / stage
                if report.exists():
                    ports[stage] = int(report.read_text())
            if len(ports) == len(STAGE_ORDER):
                return ports
            if time.monotonic() > deadline or not self.running:
                silent = [stage for stage in STAGE_ORDER if stage not in ports]
                raise TritonStartError(
                    f"stage model(s) {', '.join(silent)} reported no /metrics port within "
                    f"{self._reports_timeout_s:g} s of Triton's readiness (log: {self.log_path})"
                    f":\n{self.log_tail(20)}",
                    reason="timeout",
                    log_tail=self.log_tail(),
                    model=silent[0],
                )
            time.sleep(0.05)


def triton_server(
    traces_url: str | None,
    *,
    gpu: bool = False,
    host: str = "127.0.0.1",
    http_port: int | None = None,
    grpc_port: int | None = None,
    metrics_port: int | None = None,
    models_metrics_port: int | None = None,
    log_path: Path | None = None,
    repository: Path = REPOSITORY,
    trace_rate: int = 1,
) -> TrackingTriton:
    """A ``TrackingTriton`` (not started) for the pipeline; models trace to ``traces_url``.

    Triton traces every request that carries a trace context, and one in ``trace_rate`` of
    the others (1: all of them). Stage model ``i`` (``STAGE_ORDER``, from 1) serves its
    ``/metrics`` on ``models_metrics_port + i`` when that is given, else on a port of its own
    choosing; ``stage_metrics_ports`` tells them once the server started.
    """
    models_env = {
        "OTEL_SERVICE_NAME": "gnn-tracking-models",
        # stage spans follow the caller: a request Triton does not trace gets none
        "OTEL_TRACES_SAMPLER": "parentbased_always_off",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTELKIT_METRICS_EXPORTER": "prometheus",
        "OTELKIT_PROMETHEUS_HOST": host,
    }
    if models_metrics_port is not None:
        models_env["OTELKIT_PROMETHEUS_PORT"] = str(models_metrics_port)
    if traces_url:
        models_env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = traces_url
    return TrackingTriton(
        repository,
        host=host,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        trace_url=traces_url,
        trace_rate=trace_rate,
        trace_resource={"service.name": "triton"},
        extra_args=[f"--model-config-name={GPU_CONFIG}"] if gpu else [],
        env=models_env,
        log_path=log_path,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="GPU instance groups (configs/gpu)")
    parser.add_argument("--host", default="127.0.0.1")
    for name in ("http", "grpc", "metrics", "models-metrics"):
        parser.add_argument(f"--{name}-port", type=int, default=None, help="default: a free one")
    parser.add_argument("--traces-dir", type=Path, default=Path("otelkit-traces"))
    parser.add_argument("--log", type=Path, default=None, help="tritonserver's log file")
    args = parser.parse_args(argv)
    receiver = None
    traces_url = configured_traces_url()
    if traces_url is None:
        receiver = Receiver(args.traces_dir).start()
        traces_url = receiver.traces_url
        print(f"embedded receiver: {traces_url} -> {receiver.out_path}")
    server = triton_server(
        traces_url,
        gpu=args.gpu,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        models_metrics_port=args.models_metrics_port,
        log_path=args.log,
    )
    load_models()  # the weights exist (trained once if missing) before five models load them
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        print("starting tritonserver (loads six models)...", flush=True)
        server.start()
    except TritonStartError as error:
        print(f"tritonserver did not start: {error}", file=sys.stderr)
        return 1
    finally:
        if not server.running and receiver is not None:
            receiver.stop()
    stages = "  ".join(f"{stage} {server.stage_metrics_url(stage)}" for stage in STAGE_ORDER)
    print(
        f"ready: http {server.http_url}  grpc {server.grpc_url}  metrics {server.metrics_url}\n"
        f"stage metrics: {stages}\ntraces -> {traces_url}; Ctrl-C stops",
        flush=True,
    )
    try:
        while not stop.wait(1.0):
            if not server.running:
                print(f"tritonserver exited:\n{server.log_tail(20)}", file=sys.stderr)
                return 1
    finally:
        server.stop()
        if receiver is not None:
            receiver.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
