"""``otelkit gpu-exporter``: a Prometheus exporter of NVML readings for GPU nodes without DCGM.

One per node (see ``exporters/`` for its systemd unit, Slurm job step and Kubernetes DaemonSet):
it samples every GPU and MIG instance each ``--interval`` seconds and serves the last sample on
``/metrics`` (OpenMetrics when asked), with the same names as otelkit's in-process sampler.
``--replay FILE`` serves a recording instead (demos, tests on machines without a GPU). Without
NVML or a GPU it still serves, with ``otelkit_gpu_available 0``.

    otelkit gpu-exporter --port 9400
    otelkit gpu-exporter --port 9400 --replay tests/fixtures/gpu/h100x8.json
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from opentelemetry.sdk.metrics import MeterProvider

from otelkit._config import resolve
from otelkit._core.signals import stop_on_signals
from otelkit._errors import ConfigError
from otelkit._resource import make_resource
from otelkit.export._processor import PullReader
from otelkit.export._prometheus import PrometheusEndpoint
from otelkit.gpu._backend import GpuBackend
from otelkit.gpu._instruments import observe
from otelkit.gpu._replay import RecordingError, ReplayBackend
from otelkit.gpu._sampler import GpuSampler

__all__ = ["GpuExporter", "add_arguments", "run"]

logger = logging.getLogger("otelkit")

DEFAULT_PORT = 9400  # DCGM exporter's port: run one of the two on a node, not both


class GpuExporter:
    """A sampler and the endpoint that serves it; ``close()`` stops both."""

    def __init__(
        self,
        backend: GpuBackend | None = None,
        host: str = "0.0.0.0",
        port: int = DEFAULT_PORT,
        interval_s: float = 1.0,
    ) -> None:
        # host, Slurm and Kubernetes attributes as every otelkit process has them (target_info)
        resource = make_resource(resolve({"service_name": "otelkit-gpu-exporter"}))
        self.sampler = GpuSampler(backend, interval_s, torch_cuda=False).start()
        reader = PullReader()
        self._provider = MeterProvider(metric_readers=[reader], resource=resource)
        observe(self._provider.get_meter("otelkit.gpu"), lambda: self.sampler)
        try:
            self.endpoint = PrometheusEndpoint(reader, host, port, resource.attributes)
        except OSError:
            self.sampler.stop()
            raise

    @property
    def url(self) -> str:
        return self.endpoint.url

    def close(self) -> None:
        self.endpoint.close()
        self.sampler.stop()
        self._provider.shutdown()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--host``, ``--port``, ``--interval`` and ``--replay``."""
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (9400)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples (1.0)")
    parser.add_argument(
        "--replay", type=Path, help="serve a recording of `otelkit gpu record` instead of NVML"
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT; 2 on a bad recording or resource, 1 on a taken port."""
    if not args.interval > 0:
        logger.error("--interval must be positive, not %s", args.interval)
        return 2
    try:
        backend = ReplayBackend(args.replay) if args.replay else None
    except RecordingError as error:
        logger.error("cannot replay: %s", error)
        return 2
    try:
        exporter = GpuExporter(backend, args.host, args.port, args.interval)
    except ConfigError as error:  # a bad OTEL_RESOURCE_ATTRIBUTES, say
        logger.error("%s", error)
        return 2
    except OSError as error:
        logger.error("cannot serve on %s:%s: %s", args.host, args.port, error.strerror or error)
        return 1
    sampler = exporter.sampler
    logger.info(
        "serving %d GPU device(s)%s at %s",
        len(sampler.devices),
        f" replayed from {args.replay}" if args.replay else "",
        exporter.url,
    )
    with stop_on_signals() as stop:
        try:
            stop.wait()
        finally:
            exporter.close()
    logger.info("stopped")
    return 0
