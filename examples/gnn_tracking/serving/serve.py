"""Launch Triton on the pipeline's model repository, traced and with metrics on.

    python -m gnn_tracking.serving.serve                      # CPU, traces to an embedded receiver
    python -m gnn_tracking.serving.serve --gpu --http-port 8000 --grpc-port 8001 --metrics-port 8002
    OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 python -m gnn_tracking.serving.serve

It runs the ``tritonserver`` bundled with nvidia-pytriton (``otelkit.tritonserver`` builds
its backend directory and library path), with Triton's OpenTelemetry tracing sent to the
configured OTLP endpoint — or, when none is set, to an embedded receiver writing
``./otelkit-traces`` — and its Prometheus metrics on. The stage models export their spans to
the same place and serve their stage metrics on ``--models-metrics-port`` + 1..5.
Unset ports are picked free; a taken port or a model that fails to load is a clear error.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from gnn_tracking.physics.models import load_models
from gnn_tracking.serving.repository import GPU_CONFIG, REPOSITORY
from gnn_tracking.serving.stages import STAGE_ORDER
from otelkit.receiver import Receiver
from otelkit.tritonserver import TritonServer, TritonStartError, free_port

__all__ = ["configured_traces_url", "models_metrics_base", "triton_server"]


def configured_traces_url() -> str | None:
    """The OTLP/HTTP traces URL from ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``, if set."""
    url = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if url:
        return url
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return f"{base.rstrip('/')}/v1/traces" if base else None


def models_metrics_base(host: str = "127.0.0.1", attempts: int = 50) -> int:
    """A port P with P+1..P+5 free: the stage models' Prometheus endpoints."""
    for _ in range(attempts):
        base = free_port(host)
        if base + len(STAGE_ORDER) < 65536 and all(
            _is_free(host, base + i) for i in range(1, len(STAGE_ORDER) + 1)
        ):
            return base
    raise RuntimeError(f"no {len(STAGE_ORDER)} consecutive free ports found on {host}")


def _is_free(host: str, port: int) -> bool:

    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


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
) -> TritonServer:
    """A ``TritonServer`` (not started) for the pipeline; models trace to ``traces_url``.

    Triton traces every request that carries a trace context, and one in ``trace_rate`` of
    the others (1: all of them).
    """
    models_env = {
        "OTEL_SERVICE_NAME": "gnn-tracking-models",
        # stage spans follow the caller: a request Triton does not trace gets none
        "OTEL_TRACES_SAMPLER": "parentbased_always_off",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTELKIT_METRICS_EXPORTER": "prometheus",
        "OTELKIT_PROMETHEUS_HOST": host,
        "OTELKIT_PROMETHEUS_PORT": str(models_metrics_port or models_metrics_base(host)),
    }
    if traces_url:
        models_env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = traces_url
    return TritonServer(
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
    print(
        f"ready: http {server.http_url}  grpc {server.grpc_url}  metrics {server.metrics_url}\n"
        f"traces -> {traces_url}; Ctrl-C stops",
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
