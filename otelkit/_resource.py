"""Resource attributes: who emitted the telemetry (service, host, process, Slurm job, k8s pod).

Detection reads its sources as arguments (the environment, a namespace file) so tests feed it
recorded values, the way prometheus_client's process collector takes its ``/proc``.

>>> detect({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0"}, pid=1, host="nid001")["slurm.job.id"]
'4242'
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import sys
import uuid
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.resources import Resource

from otelkit import semconv

if TYPE_CHECKING:
    from otelkit._config import Settings

__all__ = ["detect", "installed_version", "make_resource", "sampler_text"]

_SLURM_VARIABLES = {
    "SLURM_JOB_ID": semconv.SLURM_JOB_ID,
    "SLURM_STEP_ID": semconv.SLURM_STEP_ID,
    "SLURM_ARRAY_TASK_ID": semconv.SLURM_ARRAY_TASK_ID,
    "SLURMD_NODENAME": semconv.SLURM_NODE_NAME,
    "SLURM_CLUSTER_NAME": semconv.SLURM_CLUSTER_NAME,
}
# Kubernetes exposes pod facts only through variables the manifest chooses (downward API);
# these are the names in common use, otelkit's own first.
_K8S_VARIABLES = {
    semconv.K8S_POD_NAME: ("OTELKIT_K8S_POD_NAME", "K8S_POD_NAME", "POD_NAME"),
    semconv.K8S_NAMESPACE_NAME: ("OTELKIT_K8S_NAMESPACE", "K8S_NAMESPACE", "POD_NAMESPACE"),
    semconv.K8S_NODE_NAME: ("OTELKIT_K8S_NODE_NAME", "K8S_NODE_NAME", "NODE_NAME"),
}
_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# One id per process lifetime: tells apart the replicas of one service on one host.
_INSTANCE_ID = str(uuid.uuid4())


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    return next((environ[name] for name in names if environ.get(name)), None)


def detect(
    environ: Mapping[str, str] | None = None,
    *,
    pid: int | None = None,
    host: str | None = None,
    namespace_file: Path = _SERVICE_ACCOUNT_NAMESPACE,
) -> dict[str, str | int]:
    """Attributes of this process: host, process, runtime, and Slurm/Kubernetes when present."""
    env = os.environ if environ is None else environ
    attributes: dict[str, str | int] = {
        semconv.SERVICE_INSTANCE_ID: _INSTANCE_ID,
        semconv.HOST_NAME: host if host is not None else socket.gethostname(),
        semconv.PROCESS_PID: pid if pid is not None else os.getpid(),
        semconv.PROCESS_EXECUTABLE_NAME: os.path.basename(sys.executable),
        semconv.PROCESS_RUNTIME_NAME: sys.implementation.name,
        semconv.PROCESS_RUNTIME_VERSION: platform.python_version(),
        semconv.TELEMETRY_DISTRO_NAME: "otelkit",
    }
    for variable, key in _SLURM_VARIABLES.items():
        if env.get(variable):
            attributes[key] = env[variable]
    if env.get("KUBERNETES_SERVICE_HOST"):
        for key, names in _K8S_VARIABLES.items():
            value = _first(env, names)
            if value:
                attributes[key] = value
        if semconv.K8S_POD_NAME not in attributes and env.get("HOSTNAME"):
            attributes[semconv.K8S_POD_NAME] = env["HOSTNAME"]  # a pod's hostname is its name
        if semconv.K8S_NAMESPACE_NAME not in attributes:
            with contextlib.suppress(OSError):
                attributes[semconv.K8S_NAMESPACE_NAME] = namespace_file.read_text().strip()
    return attributes


def installed_version(distribution: str) -> str:
    """``distribution``'s version, or ``"unknown"`` where it runs from a source tree that was
    never installed (a checkout on ``PYTHONPATH``, a Triton model's stub): no metadata is no
    reason to fail a process's telemetry."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


def sampler_text(sampler: str, arg: float) -> str:
    """The head sampler as the resource names it.

    >>> sampler_text("parentbased_ratelimiting", 10.0), sampler_text("traceidratio", 0.01)
    ('parentbased_ratelimiting 10/s', 'traceidratio 0.01')
    """
    if sampler.endswith("ratelimiting"):
        return f"{sampler} {arg:g}/s"
    return f"{sampler} {arg:g}" if sampler.endswith("traceidratio") else sampler


def make_resource(settings: Settings) -> Resource:
    """The resource of every span and metric: detected, configured, then ``service.name``."""
    attributes: dict[str, Any] = {
        "telemetry.sdk.language": "python",
        "telemetry.sdk.name": "opentelemetry",
        "telemetry.sdk.version": installed_version("opentelemetry-sdk"),
        semconv.TELEMETRY_DISTRO_VERSION: installed_version("otelkit"),
        semconv.OTELKIT_SAMPLER: sampler_text(settings.sampler, settings.sampler_arg),
        **detect(),
        **settings.resource_attributes,
        semconv.SERVICE_NAME: settings.service_name,
    }
    return Resource(attributes)
