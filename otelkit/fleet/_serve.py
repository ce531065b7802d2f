"""A server that joins the fleet while it runs and drains before it stops.

``otelkit fleet serve [registration options] -- tritonserver ...`` runs the server as its child,
registers it (with heartbeats) once it answers ``/v2/health/ready``, and on SIGTERM (Slurm's
``scancel``, Kubernetes stopping a pod) leaves in order, so that no request is lost:

1. it leaves the registry at once: the renderer takes it out of Envoy's endpoints, and Envoy
   sends it nothing new (Envoy's ``ignore_health_on_host_removal``; the render and Envoy's
   reload of the file take about a second here);
2. it waits ``settle_s`` for that, then until the server has no request in flight (Triton's
   ``nv_inference_pending_request_count`` on its metrics page, summed over models) or
   ``drain_s`` passes;
3. it sends the server SIGTERM, waits for it (Triton finishes what it holds within its own
   ``--exit-timeout-secs``), and exits with the server's status.

A server that dies by itself leaves the registry at once and its status is the command's. The
whole drain must fit the scheduler's grace: Slurm's ``KillWait`` (30 s by default), Kubernetes'
``terminationGracePeriodSeconds``.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from otelkit._errors import FleetError
from otelkit.fleet._record import ServerRecord
from otelkit.fleet._registry import Registration, Registry

__all__ = ["Drain", "in_flight", "serve"]

_log = logging.getLogger("otelkit.fleet")

_PENDING = "nv_inference_pending_request_count"


def in_flight(metrics: str, timeout_s: float = 2.0) -> float | None:
    """Requests the Triton whose metrics are at ``host:port`` holds now (queued or running),
    ``None`` when its page cannot be read."""
    try:
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=timeout_s) as page:
            text = page.read().decode(errors="replace")
    except OSError:
        return None
    total = 0.0
    for line in text.splitlines():
        if line.startswith(_PENDING):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
    return total


def _ready(http: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=1) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@dataclass(frozen=True)
class Drain:
    """How a server leaves: ``settle_s`` for Envoy to stop sending, at most ``drain_s`` in all
    for its requests in flight to end, then at most ``stop_s`` for it to exit."""

    settle_s: float = 2.0
    drain_s: float = 20.0
    stop_s: float = 5.0


def serve(
    command: Sequence[str],
    record: ServerRecord,
    registry: Registry,
    *,
    ttl_s: float = 10.0,
    drain: Drain = Drain(),
    stop: threading.Event | None = None,
    startup_s: float = 600.0,
    poll_s: float = 0.2,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run ``command`` registered as ``record`` until it exits or ``stop`` is set; the
    server's exit status (see the module's text). ``FleetError`` when it cannot start."""
    stop = stop or threading.Event()
    try:
        process = subprocess.Popen(list(command))
    except OSError as error:
        raise FleetError(f"cannot start {command[0]!r}: {error.strerror or error}") from None
    registration = Registration(record, registry, ttl_s=ttl_s)
    deadline = clock() + startup_s
    left = False
    try:
        while not _ready(record.http):
            if process.poll() is not None or stop.is_set():
                return _end(process, drain.stop_s)
            if clock() > deadline:
                _log.error("%s: not ready after %.0f s: stopping it", record.name, startup_s)
                return _end(process, drain.stop_s)
            stop.wait(poll_s)
        registration.start()
        _log.info("%s serves and is registered", record.name)
        while process.poll() is None and not stop.wait(poll_s):
            pass
        if process.poll() is not None:
            _log.warning("%s exited by itself (%s): left the fleet", record.name, process.poll())
            return process.returncode
        registration.close(leave=True)
        left = True
        _drain(record, drain, clock, poll_s)
        return _end(process, drain.stop_s)
    finally:
        if not left:
            registration.close(leave=True)


def _drain(record: ServerRecord, drain: Drain, clock: Callable[[], float], poll_s: float) -> None:
    began = clock()
    _log.info("%s left the registry: draining", record.name)
    time.sleep(drain.settle_s)
    held = None
    while record.metrics is not None and clock() - began < drain.drain_s:
        held = in_flight(record.metrics)
        if not held:  # none in flight, or the page is gone (the server is)
            break
        time.sleep(poll_s)
    if held:
        _log.warning(
            "%s: %d requests still in flight after %.0f s", record.name, held, drain.drain_s
        )
    _log.info("%s drained in %.1f s", record.name, clock() - began)


def _end(process: subprocess.Popen[bytes], stop_s: float) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=stop_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=stop_s)
    return process.returncode
