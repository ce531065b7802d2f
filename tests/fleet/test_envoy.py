"""Envoy in front of real tritonservers, its endpoints rendered from a real etcd: traffic,
ejection of a killed server, a heartbeat stopped, a newcomer, one trace through it all."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry import trace

import otelkit
from otelkit import semconv
from otelkit.analysis import Span, build_traces
from otelkit.analysis._breakdown import LOAD_BALANCER, NETWORK, Breakdown, breakdown
from otelkit.dashboards import render
from otelkit.fleet import (
    Draining,
    EtcdRegistry,
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
from otelkit.testing import ReceiverCapture, wait_until
from otelkit.tritonserver import TritonServer, free_port
from tests.fleet.components import EnvoyProxy, LoadThreads
from tests.paths import MODELS, ROOT
from tests.prometheus import PrometheusServer, evaluated_queries, without_data
from tests.support import require_binary

pytestmark = pytest.mark.triton

HEALTH_INTERVAL_S = 1.0
TTL_S = 5.0  # a heartbeat every 1.7 s: this process also runs the load on 2 busy cores
MODEL = "identity_fp32"
SLOW = "sleep_fp32"  # 0.5 s a batch of up to 8: a queue on demand
DRAIN_ABOVE_MS = 100.0
RULES = ROOT / "collector" / "prometheus" / "rules" / "otelkit.rules.yml"


@dataclass
class Fleet:
    servers: dict[str, TritonServer]
    registrations: dict[str, Registration]
    registry: EtcdRegistry
    renderer: Renderer
    envoy: EnvoyProxy
    http_url: str
    grpc_url: str
    eds_dir: Path
    traces: Path
    receiver: Receiver
    metrics: RendererMetrics
    extra: list[TritonServer] = field(default_factory=list)

    def register(self, name: str, server: TritonServer) -> Registration:
        metrics = server.metrics_url.split("//", 1)[1].split("/", 1)[0]
        record = ServerRecord(
            name,
            http=server.http_url,
            grpc=server.grpc_url,
            metrics=metrics,
            models=(MODEL,),
            site="tests",
        )
        registration = Registration(record, self.registry, ttl_s=TTL_S).start()
        self.registrations[name] = registration
        return registration

    def requests(self) -> dict[str, int]:
        """Requests Envoy sent to each server so far, both clusters."""
        hosts = envoy_hosts(self.envoy.admin_url)
        return {
            name: sum(c["requests"] for c in clusters.values()) for name, clusters in hosts.items()
        }

    def diagnose(self) -> str:
        """Envoy's hosts and the rendered endpoints, for a failure's message."""
        with urllib.request.urlopen(f"{self.envoy.admin_url}/clusters", timeout=2) as response:
            clusters = [
                line
                for line in response.read().decode().splitlines()
                if "::health_flags::" in line
                or "::rq_total::" in line
                or "::cx_connect_fail::" in line
            ]
        rendered = {
            c: (self.eds_dir / f"{c}.json").read_text() for c in ("otelkit_http", "otelkit_grpc")
        }
        ports = {n: (s.http_url, s.grpc_url, s.running) for n, s in self.servers.items()}
        return f"envoy: {clusters}\nservers: {ports}\nrendered: {rendered}"

    def healthy(self) -> dict[str, bool]:
        """Whether Envoy routes to each server it knows, in both clusters."""
        hosts = envoy_hosts(self.envoy.admin_url)
        return {
            name: len(each) == 2 and all(c["healthy"] for c in each.values())
            for name, each in hosts.items()
        }


def triton(tmp: Path, name: str, receiver: Receiver) -> TritonServer:
    return TritonServer(
        MODELS,
        model_control="explicit",
        load_models=[MODEL, SLOW],
        trace_url=receiver.traces_url,
        trace_rate=1_000_000,
        trace_resource={"service.name": name},
        log_path=tmp / f"{name}.log",
    )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, etcd: object) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    receiver = Receiver(tmp / "traces", max_concurrent=16).start()
    registry = EtcdRegistry(etcd.url, prefix=f"/tests/fleet-{secrets.token_hex(4)}/")  # type: ignore[attr-defined]
    eds = tmp / "eds"
    servers = {f"triton-{i}": triton(tmp, f"triton-{i}", receiver) for i in range(3)}
    for server in servers.values():
        server.start()
    # Envoy's ports picked once the servers are up: one picked before may be theirs now
    http_port, grpc_port, admin_port = free_port(), free_port(), free_port()
    config = envoy_config(
        http_port=http_port,
        grpc_port=grpc_port,
        admin_port=admin_port,
        eds_dir=eds,
        host="127.0.0.1",
        traces_url=receiver.traces_url,
        health_interval_s=HEALTH_INTERVAL_S,
        trace_flush_ms=200,
    )
    path = write_config(tmp / "envoy.json", config)
    draining = Draining(
        high_ms=DRAIN_ABOVE_MS, low_ms=20.0, window_s=2.0, sustain_s=1.0, interval_s=0.5
    )
    renderer = Renderer(
        registry,
        eds_dir=eds,
        file_sd=tmp / "fleet-targets.json",
        resync_s=5,
        draining=draining,
        ages=True,
    ).start()
    metrics = RendererMetrics(renderer, "127.0.0.1", 0)
    envoy = EnvoyProxy(path, admin_port, tmp / "envoy.log")
    state = Fleet(
        servers,
        {},
        registry,
        renderer,
        envoy,
        f"127.0.0.1:{http_port}",
        f"127.0.0.1:{grpc_port}",
        eds,
        tmp / "traces",
        receiver,
        metrics,
    )
    try:
        for name, server in servers.items():
            state.register(name, server)
        # Envoy starts on the whole fleet rendered (servers joining while it starts are the
        # newcomer test's)
        wait_until(lambda: set(renderer.listing.servers) == set(servers), 5, "all rendered")
        envoy.start()
        wait_until(lambda: state.healthy() == dict.fromkeys(servers, True), 10, "all healthy")
        yield state
    finally:
        metrics.close()
        envoy.stop()
        for registration in state.registrations.values():
            registration.close()
        renderer.close()
        for server in [*servers.values(), *state.extra]:
            server.stop()
        receiver.stop()


Client = grpcclient.InferenceServerClient | httpclient.InferenceServerClient


def call(client: Client, headers: dict[str, str] | None = None) -> None:
    """One identity call over ``client``'s protocol; its answer checked."""
    module: Any = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    tensor = module.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer(MODEL, [tensor], headers=headers)
    assert np.array_equal(result.as_numpy("OUTPUT0"), data)


class Load(LoadThreads):
    """``threads`` clients calling through Envoy over gRPC until stopped; errors counted."""

    def __init__(self, url: str, threads: int = 4, *, traced: bool = False) -> None:
        super().__init__(threads)
        self.url, self.errors = url, []  # type: ignore[var-annotated]
        self.traced = traced  # each call with a sampled context of its own

    def _run(self) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        while not self._stop.is_set():
            headers = None
            if self.traced:
                parent = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
                headers = {"traceparent": parent}
            try:
                call(client, headers)
                with self._lock:
                    self.calls += 1
            except Exception as error:  # every failure is a finding: counted, never hidden
                with self._lock:
                    self.errors.append(str(error)[:200])
            time.sleep(0.005)
        client.close()


def envoy_counter(fleet: Fleet, name: str) -> float:
    """The gRPC cluster's value of one of Envoy's counters."""
    cluster = f'{semconv.ENVOY_CLUSTER}="otelkit_grpc"'
    for line in fleet.envoy.stats().splitlines():
        if line.startswith(f"{name}{{") and cluster in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def validates(config: Path) -> None:
    binary = envoy_binary()
    assert binary is not None
    done = subprocess.run(
        [binary, "--mode", "validate", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


def test_the_configuration_validates(fleet: Fleet) -> None:
    validates(fleet.envoy.config)


SHIPPED = ROOT / "examples" / "gnn_tracking" / "deploy" / "fleet" / "envoy.json"
SHIPPED_EDS = "/run/otelkit/eds"


def test_the_reference_deployments_envoy_configuration_is_current_and_validates(
    tmp_path: Path,
) -> None:
    """The file a site starts from is what ``otelkit fleet envoy-config`` writes today (the
    command is in the deployment's README), and Envoy takes it with its EDS files in place."""
    current = envoy_config(
        http_port=8000,
        grpc_port=8001,
        admin_port=9901,
        eds_dir=SHIPPED_EDS,
        traces_url="http://127.0.0.1:4318/v1/traces",
    )
    shipped = json.loads(SHIPPED.read_text())
    assert shipped == current, "regenerate it: see examples/gnn_tracking/deploy/fleet/README.md"
    here = json.loads(SHIPPED.read_text().replace(SHIPPED_EDS, str(tmp_path / "eds")))
    validates(write_config(tmp_path / "envoy.json", here))


def test_requests_through_envoy_reach_every_server_over_both_protocols(fleet: Fleet) -> None:
    before = fleet.requests()
    grpc_client = grpcclient.InferenceServerClient(fleet.grpc_url)
    http_client = httpclient.InferenceServerClient(fleet.http_url)
    with Load(fleet.grpc_url, threads=3) as load:
        for _ in range(60):
            call(http_client)
            call(grpc_client)
    grpc_client.close()
    http_client.close()
    after = fleet.requests()
    served = {name: after[name] - before.get(name, 0) for name in fleet.servers}
    assert load.errors == [] and load.calls > 0
    assert all(count > 0 for count in served.values()), (served, fleet.diagnose())
    assert sum(served.values()) == load.calls + 120


def test_a_killed_server_is_ejected_and_its_calls_go_elsewhere(fleet: Fleet) -> None:
    capture = ReceiverCapture(fleet.receiver)
    victim = fleet.servers["triton-1"]
    retried = envoy_counter(fleet, semconv.ENVOY_RETRIES)
    with Load(fleet.grpc_url, threads=4, traced=True) as load:
        wait_until(lambda: load.calls >= 20, 10, "calls under way")
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        # ejected by the health check within its interval and a second
        wait_until(lambda: not fleet.healthy()["triton-1"], HEALTH_INTERVAL_S + 1.0, "ejected")
        routed, calls = fleet.requests()["triton-1"], load.calls
        wait_until(lambda: load.calls >= calls + 50, 20, "50 calls once ejected")
    assert fleet.requests()["triton-1"] == routed  # nothing routed to it once ejected
    # a call in flight to it, and any sent before the ejection, was retried on another server
    retries = [
        line
        for line in fleet.envoy.stats().splitlines()
        if "retry" in line and "grpc" in line and not line.startswith("#")
    ]
    assert load.errors == [], (load.errors[:3], retries)
    assert load.calls > 20
    # each attempt Envoy made to the dead server is an error span in the call's trace, under
    # the call's ingress span that another server answered
    retried = envoy_counter(fleet, semconv.ENVOY_RETRIES) - retried
    assert retried > 0
    by_id: dict[str, Span] = {}

    def failed_attempts_and_their_calls() -> list[Span]:
        spans = capture.spans()
        by_id.update((s.span_id, s) for s in spans)
        failed = [
            s
            for s in spans
            if s.resource.get("service.name") == "envoy"
            and s.kind.name == "CLIENT"
            and s.attributes.get(semconv.PROXY_UPSTREAM_ADDRESS) == victim.grpc_url
            and s.attributes.get("error") == "true"
        ]
        # Envoy exports an attempt as it ends, the call's span above it later
        return failed if all(s.parent_span_id in by_id for s in failed) else []

    failed = wait_until(failed_attempts_and_their_calls, 10, "error spans of the killed server")
    for attempt in failed:  # the call's own span succeeded: another server answered it
        ingress = by_id[attempt.parent_span_id or ""]
        assert ingress.attributes.get("http.status_code") == "200", ingress.attributes
        assert attempt.attributes.get("response_flags") in ("UF", "UC", "UR", "URX")
    victim.stop(timeout=5)
    victim.start()  # back on its ports; its registration never stopped
    wait_until(lambda: fleet.healthy()["triton-1"], HEALTH_INTERVAL_S + 1.0 + 1.0, "back")


def test_a_stopped_heartbeat_takes_a_live_server_out_and_a_newcomer_serves(
    fleet: Fleet, tmp_path: Path
) -> None:
    fleet.registrations.pop("triton-2").close(leave=False)  # hung: alive, but no heartbeat
    stopped = time.monotonic()
    wait_until(lambda: "triton-2" not in fleet.requests(), TTL_S + 1.0 + 1.0, "out of Envoy")
    assert time.monotonic() - stopped <= TTL_S + 1.0 + 1.0  # TTL, a render, Envoy's reload
    with Load(fleet.grpc_url, threads=2) as load:
        wait_until(lambda: load.calls >= 30, 20, "30 calls without it")
    assert "triton-2" not in fleet.requests() and load.errors == []
    # a new server joins: serving within a render, a health check and a second
    server = triton(tmp_path, "triton-3", fleet.receiver).start()
    fleet.extra.append(server)
    fleet.register("triton-3", server)
    joined = time.monotonic()
    with Load(fleet.grpc_url, threads=2) as load:
        wait_until(
            lambda: fleet.requests().get("triton-3", 0) > 0,
            1.0 + HEALTH_INTERVAL_S + 1.0,
            "3 serves",
        )
    assert time.monotonic() - joined <= 1.0 + HEALTH_INTERVAL_S + 1.0 + 0.5
    assert load.errors == []
    fleet.register("triton-2", fleet.servers["triton-2"])  # back for the other tests
    wait_until(lambda: fleet.healthy().get("triton-2") is True, TTL_S + 2.0, "triton-2 back")


def service(span: Span) -> str:
    return str(span.resource.get("service.name"))


def sampled_call(client: httpclient.InferenceServerClient) -> str:
    """A call the client sampled (its context says so); its trace id."""
    trace_id = secrets.token_hex(16)
    call(client, {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"})
    return trace_id


def test_one_trace_through_envoy_and_nothing_for_unsampled_calls(fleet: Fleet) -> None:
    capture = ReceiverCapture(fleet.receiver)
    client = httpclient.InferenceServerClient(fleet.http_url)
    traced = sampled_call(client)

    def whole() -> list[Span]:  # Envoy's SERVER span ends, and is exported, last
        spans = capture.trace(traced)
        envoy = {s.kind.name for s in spans if service(s) == "envoy"}
        return spans if envoy == {"CLIENT", "SERVER"} and len({*map(service, spans)}) >= 2 else []

    joined = wait_until(whole, 10, f"trace {traced} through Envoy to a server")
    by_service: dict[str, list[str]] = {}
    for span in joined:
        by_service.setdefault(service(span), []).append(span.name)
    assert "envoy" in by_service, by_service  # Envoy's OTLP exporter: chunked bodies taken
    envoy_kinds = sorted({s.kind.name for s in joined if service(s) == "envoy"})
    assert envoy_kinds == ["CLIENT", "SERVER"], (envoy_kinds, by_service)
    assert len([s for s in by_service if s.startswith("triton-")]) == 1, by_service
    # calls the client did not sample carry no context (otelkit's clients send none): Envoy,
    # parent-based, samples none of them, and Triton, which traces any context it gets, none
    for _ in range(20):
        call(client)
    # then sampled calls, until their traces came through Envoy and every server it routes to:
    # each exporter sends in order, so what the unsampled calls made has arrived by then
    markers: set[str] = set()
    routed = {name for name, healthy in fleet.healthy().items() if healthy}

    def marked_everywhere() -> bool:
        markers.add(sampled_call(client))
        arrived = {service(s) for s in capture.spans() if s.trace_id in markers}
        return {"envoy", *routed} <= arrived

    wait_until(marked_everywhere, 30, f"sampled traces through Envoy to {sorted(routed)}")
    client.close()
    capture.assert_absent(
        lambda s: s.trace_id not in {traced, *markers}, after=lambda s: s.trace_id in markers
    )


def test_a_saturated_server_is_drained_until_its_queue_empties(fleet: Fleet) -> None:
    hot = fleet.servers["triton-0"]
    flooding = threading.Event()

    def flood() -> None:  # straight to triton-0, not through Envoy: its queue only
        client = httpclient.InferenceServerClient(hot.http_url, network_timeout=30)
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        while flooding.is_set():
            client.infer(SLOW, [tensor])
        client.close()

    flooding.set()
    threads = [threading.Thread(target=flood) for _ in range(16)]
    for thread in threads:
        thread.start()
    draining = fleet.renderer.draining
    assert draining is not None
    try:
        # 16 in flight for batches of 8 that take 0.5 s: seconds queued per execution
        wait_until(lambda: draining.drained == {"triton-0"}, 10, "triton-0 drained")
        assert draining.saturation()["triton-0"] > DRAIN_ABOVE_MS
        wait_until(lambda: fleet.healthy()["triton-0"] is False, 3, "DRAINING in Envoy")
        before = fleet.requests()
        with Load(fleet.grpc_url, threads=2) as load:
            wait_until(lambda: load.calls >= 30, 20, "30 calls while it drains")
        after = fleet.requests()
        assert after["triton-0"] == before["triton-0"]  # no new request to it
        assert after["triton-1"] > before["triton-1"] and load.errors == []
    finally:
        flooding.clear()
        for thread in threads:
            thread.join(timeout=30)
    # its queue empties: back after the window and the time held
    wait_until(lambda: fleet.healthy()["triton-0"] is True, 2.0 + 1.0 + 3.0, "triton-0 back")
    assert draining.drained == set()


def test_the_breakdown_names_the_load_balancer_and_the_server_that_answered(fleet: Fleet) -> None:
    capture = ReceiverCapture(fleet.receiver)
    otelkit.configure(
        service_name="fleet-tests",
        traces_endpoint=fleet.receiver.traces_url,
        bsp_schedule_delay_ms=50,
        metrics_exporter="none",
    )
    try:
        client = otelkit.instrument(httpclient.InferenceServerClient(fleet.http_url))
        tracer = trace.get_tracer("fleet-tests")
        events = []
        for _ in range(6):
            with tracer.start_as_current_span("event") as event:
                call(client)
                events.append(format(event.get_span_context().trace_id, "032x"))
        client.close()
    finally:
        otelkit.uninstrument()
        otelkit.shutdown()

    def complete() -> dict[tuple[str, ...], Breakdown]:  # no call's server spans missing
        traces = build_traces(capture.spans())
        joined = [traces[t] for t in events if t in traces]
        groups = breakdown(joined, group_by=(semconv.ANSWERED_BY,), root_name="event")
        whole = sum(g.traces for g in groups.values()) == len(events)
        return groups if whole and all(g.incomplete == 0 for g in groups.values()) else {}

    groups = wait_until(complete, 10, "every event's trace, whole")
    addresses = {s.http_url for s in [*fleet.servers.values(), *fleet.extra]}
    assert groups and set(k[0] for k in groups) <= addresses, (groups.keys(), addresses)
    for group in groups.values():
        assert group.incomplete == 0 and group.problems == []
        assert group.mean(LOAD_BALANCER) > 0  # Envoy's time, apart from the wire and Triton's
        assert group.mean(NETWORK) > 0 and group.mean("server frontend") > 0
        assert abs(group.mean("server other")) < 1e-9  # Triton's time cut at its timestamps
    assert sum(g.traces for g in groups.values()) == len(events)


@pytest.mark.prometheus
def test_every_fleet_panel_shows_the_running_fleet(fleet: Fleet, tmp_path: Path) -> None:
    """A real Prometheus scrapes what a site's would: Envoy's /stats/prometheus, the renderer's
    metrics and, through the renderer's file_sd, each registered Triton; under load through
    Envoy, every query of every panel of the fleet dashboard must return a series."""
    admin = urllib.parse.urlsplit(fleet.envoy.admin_url).netloc
    file_sd = fleet.renderer.file_sd
    assert file_sd is not None
    jobs = {"fleet-renderer": [urllib.parse.urlsplit(fleet.metrics.url).netloc]}
    configs = [
        {
            "job_name": "envoy",
            "metrics_path": "/stats/prometheus",
            "static_configs": [{"targets": [admin]}],
        },
        {
            "job_name": "triton",
            "file_sd_configs": [{"files": [str(file_sd)], "refresh_interval": "1s"}],
        },
    ]
    dashboards = {"fleet": render()["fleet"]}
    queries = evaluated_queries(dashboards)
    binary = require_binary("prometheus")
    with (
        PrometheusServer(
            binary, jobs, tmp_path, scrape_configs=configs, rule_files=[RULES]
        ) as prometheus,
        Load(fleet.grpc_url, threads=2) as load,
    ):
        targets = prometheus.wait_for_targets(timeout=30)
        servers = {t["labels"].get(semconv.FLEET_SERVER_LABEL) for t in targets}
        assert set(fleet.servers) <= servers  # file_sd: each Triton labelled with its name
        empty: list[tuple[str, str, str]] = []

        def all_panels_have_data() -> bool:
            empty[:] = without_data(prometheus, queries)
            return not empty

        wait_until(all_panels_have_data, 30, "data in every panel", interval=1.0)
        # the fleet's recording rules, on the same series: one value a server, and the fleet's
        per_server = "otelkit_server:nv_inference_queue_duration_ms:per_execution_5m"
        registered = set(fleet.renderer.listing.servers)
        wait_until(
            lambda: len(prometheus.query(per_server)["result"]) == len(registered),
            20,
            "a recorded value for each server",
            interval=1.0,
        )
        recorded = {
            r["metric"][semconv.FLEET_SERVER_LABEL] for r in prometheus.query(per_server)["result"]
        }
        fleetwide = prometheus.query("fleet:nv_inference_queue_duration_ms:per_execution_5m")
        # and a healthy fleet fires no fleet alert
        alerts = prometheus.query('ALERTS{alertname=~"OtelkitFleet.*"}')["result"]
    assert load.errors == []
    assert empty == [], "queries without data:\n" + "\n".join(
        f"{dashboard} / {title}: {expr}" for dashboard, title, expr in empty
    )
    assert len(queries) >= 20
    assert recorded == registered and len(fleetwide["result"]) == 1
    assert alerts == []


def test_clients_count_and_trace_their_errors_while_envoy_restarts(fleet: Fleet) -> None:
    capture = ReceiverCapture(fleet.receiver)
    telemetry = otelkit.configure(
        service_name="fleet-tests",
        traces_endpoint=fleet.receiver.traces_url,
        bsp_schedule_delay_ms=50,
        metrics_exporter="prometheus",
        prometheus_port=0,
        prometheus_host="127.0.0.1",
    )
    failed: list[str] = []
    assert telemetry.prometheus_url is not None
    scrape = telemetry.prometheus_url

    def counted() -> float:  # the process's count so far: earlier tests' failures included
        with urllib.request.urlopen(scrape, timeout=5) as response:
            page = response.read().decode()
        name = semconv.prometheus_name(semconv.CLIENT_ERRORS) + "{"
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith(name)
        )

    try:
        client = otelkit.instrument(httpclient.InferenceServerClient(fleet.http_url))
        call(client)
        before = counted()
        fleet.envoy.stop()  # a restart: nothing listens on Envoy's ports for a while
        for _ in range(5):
            try:
                call(client)
            except Exception as error:  # what the user's code sees: tritonclient's own error
                failed.append(type(error).__name__)
        client.close()
        fleet.envoy.start()
        wait_until(lambda: all(fleet.healthy().values()), 10, "all healthy again")
        client = otelkit.instrument(httpclient.InferenceServerClient(fleet.http_url))
        call(client)  # served again
        client.close()
        after = counted()
        otelkit.flush()
    finally:
        otelkit.uninstrument()
        otelkit.shutdown()
    assert len(failed) == 5
    assert after - before == 5  # each failure counted once

    def error_spans() -> list[Span]:
        return [
            s
            for s in capture.spans()
            if s.resource.get("service.name") == "fleet-tests"
            and s.kind.name == "CLIENT"
            and s.status_code.name == "ERROR"
        ]

    wait_until(lambda: len(error_spans()) >= 5, 10, "5 error spans")
    assert len(error_spans()) == 5  # and traced once each, saying why
    assert all(s.status_message for s in error_spans())
