"""Client overhead: a bare and an instrumented tritonclient, interleaved call by call.

Both clients call the same model on the same real tritonserver, alternating, in one process,
so drift of the machine touches both alike. Phase one traces every call (100 % sampling) with
metrics on; phase two runs the instrumented client with its calls not sampled (``always_off``);
phase three samples 1 % of them (``parentbased_traceidratio``, the usual production setting:
the median call is one not sampled, decided by its trace id). Triton's own
tracing is off unless ``--server-tracing``: a propagated context would make the *server* do more
work for the traced client, and this measures the client. The last line is JSON.

``--ablate`` adds phases that tell where the overhead goes against the real server: otelkit's
own time on the caller's thread, before and after the client's own ``infer`` (in situ, calls
not sampled and sampled); the bare client against a second bare client (the noise floor of the
method), against a bare client sending a fixed ``traceparent`` and one sending a new
``traceparent`` per call (the header's own cost, with and without HPACK's table serving it
again), OpenTelemetry's contrib gRPC client interceptor around the bare client's channel
(gRPC only: spans to the same files, 100 % sampled; what the tool users know costs), a
wrapper that only times the call and counts it in one histogram (the floor of any
instrumentation in Python), sampled calls whose spans are built but exported nowhere
(``traces_exporter=none``: the export thread's share), and sampled calls that send no trace
context (``otelkit.instrument(client, send_context=False)``: the share of the extra metadata on
the wire). Each uses what otelkit, tritonclient and OpenTelemetry offer a user; nothing of
theirs is patched.

Each phase prints the difference of medians with its 95 % interval (``medians``: a
moving-block bootstrap over the pairs), and the last line judges the client's overhead
targets (docs/performance.md) on those intervals: ``met``, ``missed`` or ``undecided`` (a
longer run, ``--calls 20000``, resolves about 1 us).

``--event`` calls the reference deployment's ``tracking`` ensemble with one event (a call of
about 10 ms on this CPU, the kind a reconstruction job makes) instead of the identity model
with 16 floats (about 0.5 ms: the smallest call there is, where a fixed overhead weighs most).

``--asyncio`` measures the asyncio clients (``tritonclient.grpc.aio``, ``tritonclient.http.aio``):
each call is awaited to its end on one event loop, the bare one's as the instrumented one's.

``--server-tracing`` turns Triton's own tracing on for every request (rate 1, exported to an
embedded receiver in a process of its own), as in a deployment whose server spans join the
client's traces: both clients' requests are traced by the server, the instrumented client's
as children of its spans.

``--between idle|sweep`` has the job sleep or work between calls, outside their timing: after
either, the same code on the caller's path runs several times slower than between back-to-back
calls (``--ablate``'s own time shows it).

    python benchmarks/bench_client.py [--calls 4000] [--protocol grpc|http] [--event]
                                      [--between nothing|idle|sweep] [--asyncio]
                                      [--server-tracing] [--profile] [--ablate]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import cProfile
import functools
import importlib
import json
import pstats
import queue
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from medians import difference_interval, verdict  # benchmarks/, this script's directory

import otelkit
from otelkit import semconv
from otelkit._core.hotmetrics import HotRegistry
from otelkit.tritonserver import TritonServer, free_port

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "models"
MODULES = {"grpc": grpcclient, "http": httpclient}
RAW_DATA = {"grpc": "_raw_content", "http": "_raw_data"}  # where an InferInput keeps its bytes
ASYNCIO_MODULES = {"grpc": "tritonclient.grpc.aio", "http": "tritonclient.http.aio"}


class Awaited:
    """An asyncio client behind the synchronous ``infer`` the phases call: each call runs its
    coroutine to the end on one event loop, so both clients of a pair pay the loop alike and the
    difference is the instrumentation's. ``client``: the asyncio client itself."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client: Any) -> None:
        self.loop = loop
        self.client = client

    def infer(self, *args: Any, **kwargs: Any) -> Any:
        return self.loop.run_until_complete(self.client.infer(*args, **kwargs))

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())


def asyncio_clients(protocol: str, url: str) -> tuple[Awaited, Awaited]:
    """A bare and an instrumented asyncio client (``--asyncio``), made on the loop they use."""
    module = importlib.import_module(ASYNCIO_MODULES[protocol])
    loop = asyncio.new_event_loop()

    async def made() -> Any:
        return module.InferenceServerClient(url)

    return (
        Awaited(loop, loop.run_until_complete(made())),
        Awaited(loop, otelkit.instrument(loop.run_until_complete(made()))),
    )


class Waited:
    """A synchronous client's ``async_infer`` behind the ``infer`` the phases call: the call is
    started and its result waited for (gRPC: the callback, on gRPC's thread; HTTP:
    ``get_result``), as a job does that overlaps its work with the call."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def infer(self, *args: Any) -> Any:
        if not isinstance(self.client, grpcclient.InferenceServerClient):
            return self.client.async_infer(*args).get_result()
        answered: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
        self.client.async_infer(*args[:2], lambda result, error: answered.put((result, error)))
        result, error = answered.get()
        if error is not None:
            raise error
        return result

    def close(self) -> None:
        self.client.close()


class Workload(NamedTuple):
    """What each call sends: ``client.infer(*workload)``."""

    model: str
    inputs: list[Any]


def identity_workload(module: Any, elements: int) -> Workload:
    """``elements`` float32 to the identity model (16: the smallest call there is)."""
    data = np.arange(elements, dtype=np.float32).reshape(1, elements)
    tensor = module.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return Workload("identity_fp32", [tensor])


def event_workload(module: Any) -> Workload:
    """One event of the reference deployment (``examples/gnn_tracking``: 444 hits, the demo's
    default size) to its ``tracking`` ensemble: embed, graph building, edge filter, GNN and
    labelling in one call, as a job reconstructing that event sends it."""
    from gnn_tracking.physics.events import generate_event

    features = generate_event(seed=1).features.numpy()
    tensor = module.InferInput("FEATURES", list(features.shape), "FP32")
    tensor.set_data_from_numpy(features)
    return Workload("tracking", [tensor])


def serve(event: bool, traces_url: str | None) -> TritonServer:
    """The tritonserver the benchmark calls, not started; Triton traces every request to
    ``traces_url``, or none (``None``)."""
    if not event:  # the models' own otelkit exports nothing: this measures the client
        env = {"OTELKIT_TRACES_EXPORTER": "none"}
        return TritonServer(MODELS, env=env, trace_url=traces_url, trace_rate=1)
    from gnn_tracking.physics.models import load_models  # examples/ is on the path (main)
    from gnn_tracking.serving.serve import triton_server

    load_models()  # the weights exist (trained once if missing) before the models load them
    return triton_server(traces_url)


@contextlib.contextmanager
def trace_receiver(wanted: bool) -> Iterator[str | None]:
    """With ``wanted``, an embedded OTLP/HTTP receiver in a process of its own (``otelkit
    receive``: its CPU is not the client's) for Triton's spans; its traces URL."""
    if not wanted:
        yield None
        return
    port = free_port()
    out = tempfile.mkdtemp(prefix="bench-client-triton-")
    command = [sys.executable, "-m", "otelkit.cli", "receive", "--port", str(port), "--out", out]
    with subprocess.Popen(command, stderr=subprocess.DEVNULL) as receiver:
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if receiver.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("otelkit receive did not start") from None
                    time.sleep(0.1)
            yield f"http://127.0.0.1:{port}/v1/traces"
        finally:
            receiver.terminate()


# Each client's last results stay alive, as in a job that uses them after the call; freed at
# once, 600 kB results make the allocator return and fault their pages in again on every
# call (about +1.3 ms of CPU per call for the bare client alone on this host), and otelkit's
# worker, which holds a result until it is counted, would change that for the traced client
# only. Each result is freed outside the timing of any call.
HELD = 8
_kept: collections.defaultdict[Any, collections.deque[Any]] = collections.defaultdict(
    lambda: collections.deque(maxlen=HELD)
)


def keep(client: Any, result: Any) -> None:
    """Keep ``result`` with ``client``'s last ``HELD`` results (the oldest is freed here), then
    do what the job does between calls (``BETWEEN``), outside any call's timing."""
    _kept[client].append(result)
    between()


def _sweep(data: np.ndarray) -> Callable[[], None]:
    def sweep() -> None:
        np.add(data, 1.0, out=data)

    return sweep


# What the job does between two calls (``--between``): nothing (back-to-back calls, warm
# caches: the best case for any code on the caller's path), wait idle for 10 ms, or work for
# about 2 ms through 32 MB, as a reconstruction does between offloads. Either of the last two
# leaves the caller's next few microseconds of Python several times slower.
BETWEEN: dict[str, Callable[[], None]] = {
    "nothing": lambda: None,
    "idle": functools.partial(time.sleep, 0.01),
    "sweep": _sweep(np.zeros(4 << 20)),
}
between = BETWEEN["nothing"]


def interleave(
    bare: Any, traced: Any, work: Workload, calls: int
) -> tuple[list[float], list[float]]:
    """Per-call latencies in microseconds, bare and traced, alternating who goes first."""
    bare_us: list[float] = []
    traced_us: list[float] = []
    clock = time.perf_counter_ns
    for index in range(calls):
        order = ((bare, bare_us), (traced, traced_us))
        for client, out in order if index % 2 else reversed(order):
            start = clock()
            result = client.infer(*work)
            out.append((clock() - start) / 1000)
            keep(client, result)
    return bare_us, traced_us


def cpu_per_call(bare: Any, traced: Any, work: Workload, calls: int) -> tuple[float, float]:
    """This process's CPU time per call (us), bare and traced, in alternating blocks.

    Latency is what the caller waits; CPU is what a CPU-bound job (a reconstruction that
    offloads inference) gives up. It counts every thread of the client process (gRPC's, and
    otelkit's: the worker that ends calls off the caller's path and the thread that exports
    spans are flushed at the end of each block, so that their work is counted in the block that
    made it, not in the next, bare one), not the server's."""
    spent = {"bare": 0, "traced": 0}
    blocks, per_block = 10, max(1, calls // 20)
    for block in range(blocks):
        order = [("bare", bare), ("traced", traced)]
        for name, client in order if block % 2 else reversed(order):
            start = time.process_time_ns()
            for _ in range(per_block):
                keep(client, client.infer(*work))
            otelkit.flush()
            spent[name] += time.process_time_ns() - start
    return spent["bare"] / blocks / per_block / 1000, spent["traced"] / blocks / per_block / 1000


def phase(name: str, bare: Any, traced: Any, work: Workload, calls: int) -> dict[str, Any]:
    interleave(bare, traced, work, max(200, calls // 10))  # warm both paths and channels
    bare_us, traced_us = interleave(bare, traced, work, calls)
    bare_median, traced_median = statistics.median(bare_us), statistics.median(traced_us)
    difference = traced_median - bare_median
    paired = statistics.median(t - b for b, t in zip(bare_us, traced_us, strict=True))
    interval, interval_pct = difference_interval(bare_us, traced_us)
    bare_cpu, traced_cpu = cpu_per_call(bare, traced, work, calls)
    print(
        f"{name:>10}: bare median {bare_median:8.1f} us, instrumented {traced_median:8.1f} us, "
        f"difference of medians {difference:+6.1f} us "
        f"(95 % interval {interval[0]:+.1f} to {interval[1]:+.1f}), "
        f"median paired difference {paired:+6.1f} us ({calls} pairs); "
        f"CPU per call {bare_cpu:.1f} / {traced_cpu:.1f} us ({traced_cpu - bare_cpu:+.1f})",
        flush=True,
    )
    return {
        "bare": bare_median,
        "traced": traced_median,
        "difference": difference,
        "difference_pct": 100 * difference / bare_median,
        "paired": paired,
        "cpu": traced_cpu - bare_cpu,
        "interval": interval,
        "interval_pct": interval_pct,
    }


# Issue 3's targets: (key in the result, what is measured, its bound)
TARGETS = (
    ("sampled_us", "overhead, every call sampled (us)", 25.0),
    ("sampled_pct", "overhead, every call sampled (% of the bare median)", 1.0),
    ("unsampled_us", "overhead, calls not sampled (us)", 5.0),
)


def targets(sampled: dict[str, Any], unsampled: dict[str, Any]) -> dict[str, Any]:
    measured = {
        "sampled_us": (sampled["difference"], sampled["interval"]),
        "sampled_pct": (sampled["difference_pct"], sampled["interval_pct"]),
        "unsampled_us": (unsampled["difference"], unsampled["interval"]),
    }
    found = {}
    for key, text, bound in TARGETS:
        found[key] = verdict(*measured[key], bound)
        low, high = found[key]["interval95"]
        print(
            f"target: {text} {measured[key][0]:.1f} (95 % {low:.1f} to {high:.1f}), "
            f"at most {bound:g}: {found[key]['verdict']}",
            flush=True,
        )
    return found


def own_timed_client(module: Any, url: str, stamps: list[int]) -> Any:
    """An instrumented client whose own ``infer`` notes in ``stamps`` when it starts and when it
    returns: a subclass's ``infer`` around tritonclient's, which otelkit wraps as it wraps any
    client's own method."""
    own = module.InferenceServerClient.infer
    clock = time.perf_counter_ns

    class Timed(module.InferenceServerClient):  # type: ignore[misc]
        @functools.wraps(own)  # otelkit reads its signature: tritonclient's
        def infer(self, *args: Any, **kwargs: Any) -> Any:
            stamps[0] = clock()
            result = own(self, *args, **kwargs)
            stamps[1] = clock()
            return result

    return otelkit.instrument(Timed(url))


def own_time(bare: Any, module: Any, url: str, work: Workload, calls: int) -> tuple[float, float]:
    """otelkit's own time on the caller's thread (medians, us): from entering the instrumented
    ``infer`` to entering the client's own, and from leaving that to returning; interleaved
    with the bare client as in ``phase``, on a client of its own (``own_timed_client``). The
    transport hooks, which run inside the client's own call, are not in it."""
    stamps = [0, 0]
    traced = own_timed_client(module, url, stamps)
    clock = time.perf_counter_ns
    before: list[int] = []
    after: list[int] = []
    for _ in range(max(200, calls // 10)):  # its channel up and its series made
        traced.infer(*work)
    for index in range(calls):
        if index % 2:
            keep(bare, bare.infer(*work))
        start = clock()
        result = traced.infer(*work)
        end = clock()
        keep(traced, result)
        if not index % 2:
            keep(bare, bare.infer(*work))
        before.append(stamps[0] - start)
        after.append(end - stamps[1])
    traced.close()
    return statistics.median(before) / 1000, statistics.median(after) / 1000


def profile(traced: Any, work: Workload, calls: int) -> None:
    """Where the instrumented call spends time in otelkit's own code."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        traced.infer(*work)
    profiler.disable()
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime")
    stats.print_stats(r"otelkit|opentelemetry", 15)


class _WithTraceparent:
    """A bare client that sends a ``traceparent``: what the header alone costs. ``fresh``: a
    new one per call, as a traced client sends (no HPACK table entry serves twice); else
    one fixed header."""

    FIXED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    def __init__(self, client: Any, fresh: bool) -> None:
        self.client = client
        self.fresh = fresh

    def infer(self, *args: Any, **kwargs: Any) -> Any:
        header = (
            f"00-{random.getrandbits(128):032x}-{random.getrandbits(64):016x}-01"
            if self.fresh
            else self.FIXED
        )
        return self.client.infer(*args, headers={"traceparent": header}, **kwargs)


def contrib_intercepted(module: Any, url: str) -> Any:
    """A bare gRPC client made while OpenTelemetry's contrib gRPC client instrumentation is on
    (``opentelemetry-instrumentation-grpc``'s ``GrpcInstrumentorClient``, as
    ``opentelemetry-instrument`` turns it on; spans only, to the tracer provider otelkit set):
    its channel passes the contrib interceptor. What a user gets from the tools they know."""
    from opentelemetry.instrumentation.grpc import GrpcInstrumentorClient

    instrumentor = GrpcInstrumentorClient()
    instrumentor.instrument()
    try:
        return module.InferenceServerClient(url)
    finally:
        instrumentor.uninstrument()  # channels opened from here on are bare again


class _Floor:
    """The least an instrumented call can do: time it and count it in one lock-guarded
    histogram series (no bytes, no span, no sampling decision, no context)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.series = HotRegistry().histogram(semconv.CLIENT_DURATION, ()).series(())

    def infer(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        result = self.client.infer(*args, **kwargs)
        self.series.observe((time.perf_counter_ns() - start) / 1e9)
        return result


def ablations(
    bare: Any, traced: Any, work: Workload, calls: int, url: str, module: Any, traces: str
) -> dict[str, float]:
    """Overhead (difference of medians, us) with one piece of the instrumented path removed."""
    found: dict[str, float] = {}
    for sampler in ("always_off", "always_on"):
        otelkit.configure(
            service_name="bench-client", traces_exporter="none", prometheus_port=0, sampler=sampler
        )
        before, after = own_time(bare, module, url, work, calls)
        print(
            f"{'own time':>10}: {sampler}: otelkit's own time on the caller's thread "
            f"{before:.1f} us before the client's infer, {after:.1f} us after (medians)",
            flush=True,
        )
        prefix = "sampled" if sampler == "always_on" else "unsampled"
        found[f"{prefix}_own_time_before_us"], found[f"{prefix}_own_time_after_us"] = before, after
    other_bare = module.InferenceServerClient(url)
    result = phase("a/a", bare, other_bare, work, calls)
    found["bare_vs_bare_us"] = result["difference"]
    result = phase("header", bare, _WithTraceparent(other_bare, fresh=False), work, calls)
    found["bare_with_traceparent_us"] = result["difference"]
    result = phase("new header", bare, _WithTraceparent(other_bare, fresh=True), work, calls)
    found["bare_with_new_traceparent_us"] = result["difference"]
    result = phase("floor", bare, _Floor(other_bare), work, calls)
    found["timed_and_counted_only_us"] = result["difference"]
    other_bare.close()
    if module is grpcclient:
        otelkit.configure(
            service_name="bench-client",
            traces_dir=traces,
            prometheus_port=0,
            bsp_max_queue_size=100_000,
        )
        contrib = contrib_intercepted(module, url)
        result = phase("contrib", bare, contrib, work, calls)
        found["contrib_interceptor_us"] = result["difference"]
        found["contrib_interceptor_cpu_us"] = result["cpu"]
        contrib.close()
    otelkit.configure(service_name="bench-client", traces_exporter="none", prometheus_port=0)
    result = phase("no export", bare, traced, work, calls)
    found["sampled_no_export_us"] = result["difference"]
    otelkit.configure(
        service_name="bench-client",
        traces_dir=traces,
        prometheus_port=0,
        bsp_max_queue_size=100_000,
    )
    no_context = otelkit.instrument(module.InferenceServerClient(url), send_context=False)
    result = phase("no context", bare, no_context, work, calls)
    found["sampled_no_context_us"] = result["difference"]
    no_context.close()
    return {key: round(value, 1) for key, value in found.items()}


SWITCHES = {
    "--profile": "profile otelkit's share",
    "--ablate": "where the overhead goes",
    "--event": "call the reference deployment's tracking ensemble with one event (444 hits), "
    "a call of about 10 ms on a 2-core CPU, instead of the identity model",
    "--asyncio": "the asyncio clients (tritonclient.grpc.aio, tritonclient.http.aio), each call "
    "awaited on one event loop; not with --ablate",
    "--async-infer": "the synchronous clients' async_infer, each call waited for (gRPC: its "
    "callback; HTTP: get_result); not with --ablate",
    "--server-tracing": "Triton traces every request (rate 1, to a receiver in a process of its "
    "own), as a deployment whose traces join the client's does; default: Triton's tracing off",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4000, help="interleaved pairs per phase")
    parser.add_argument("--protocol", choices=sorted(MODULES), default="grpc")
    for flag, text in SWITCHES.items():
        parser.add_argument(flag, action="store_true", help=text)
    parser.add_argument(
        "--elements",
        type=int,
        default=16,
        help="float32 elements per request (16: the smallest call; 150000: a 600 kB event, "
        "about a mid-size tracking event of 50k space points with 3 features)",
    )
    parser.add_argument(
        "--held",
        type=int,
        default=HELD,
        help="results each client keeps alive (0: each is freed as soon as it is timed)",
    )
    parser.add_argument(
        "--between",
        choices=sorted(BETWEEN),
        default="nothing",
        help="what the job does between calls, outside their timing (idle: sleeps 10 ms; "
        "sweep: about 2 ms of work through 32 MB)",
    )
    args = parser.parse_args()
    if (args.asyncio or args.async_infer) and args.ablate:
        parser.error("--ablate measures the synchronous clients only")
    global between
    between = BETWEEN[args.between]
    if args.event:
        sys.path.insert(0, str(ROOT / "examples"))
    _kept.default_factory = lambda: collections.deque(maxlen=args.held)
    module = MODULES[args.protocol]
    traces = tempfile.mkdtemp(prefix="bench-client-")
    with (
        trace_receiver(args.server_tracing) as triton_traces,
        serve(args.event, triton_traces) as server,
    ):
        url = server.grpc_url if args.protocol == "grpc" else server.http_url
        if args.asyncio:
            bare, traced = asyncio_clients(args.protocol, url)
        elif args.async_infer:
            bare = Waited(module.InferenceServerClient(url))
            traced = Waited(otelkit.instrument(module.InferenceServerClient(url)))
        else:
            bare = module.InferenceServerClient(url)
            traced = otelkit.instrument(module.InferenceServerClient(url))
        work = event_workload(module) if args.event else identity_workload(module, args.elements)
        style = "asyncio " if args.asyncio else "async_infer " if args.async_infer else ""
        print(f"tritonserver up; {style}{args.protocol} client; spans to {traces}", flush=True)
        otelkit.configure(
            service_name="bench-client",
            traces_dir=traces,
            prometheus_port=0,
            bsp_max_queue_size=100_000,
        )
        sampled = phase("sampled", bare, traced, work, args.calls)
        if args.profile:
            profile(traced, work, 2000)
        stats = otelkit.telemetry.current().stats()  # type: ignore[union-attr]
        otelkit.configure(
            service_name="bench-client", traces_dir=traces, prometheus_port=0, sampler="always_off"
        )
        unsampled = phase("unsampled", bare, traced, work, args.calls)
        otelkit.configure(
            service_name="bench-client",
            traces_dir=traces,
            prometheus_port=0,
            sampler="parentbased_traceidratio",
            sampler_arg=0.01,
        )
        one_pct = phase("1% sampled", bare, traced, work, args.calls)
        parts = {}
        if args.ablate:
            parts = ablations(bare, traced, work, args.calls, url, module, traces)
        bare.close()
        traced.close()
    otelkit.shutdown()
    raw = RAW_DATA[args.protocol]
    result = {
        "protocol": args.protocol,
        "asyncio": args.asyncio,
        "async_infer": args.async_infer,
        "calls": args.calls,
        "model": work.model,
        "between_calls": args.between,
        "server_tracing": args.server_tracing,
        "request_bytes": sum(len(getattr(tensor, raw) or b"") for tensor in work.inputs),
        "bare_median_us": round(sampled["bare"], 1),
        "instrumented_median_us": round(sampled["traced"], 1),
        "overhead_us": round(sampled["difference"], 1),
        "overhead_pct": round(sampled["difference_pct"], 2),
        "paired_overhead_us": round(sampled["paired"], 1),
        "unsampled_overhead_us": round(unsampled["difference"], 1),
        "unsampled_paired_overhead_us": round(unsampled["paired"], 1),
        "cpu_overhead_us": round(sampled["cpu"], 1),
        "unsampled_cpu_overhead_us": round(unsampled["cpu"], 1),
        "one_pct_sampled_overhead_us": round(one_pct["difference"], 1),
        "one_pct_sampled_cpu_overhead_us": round(one_pct["cpu"], 1),
        "overhead_interval95_us": [round(bound, 1) for bound in sampled["interval"]],
        "unsampled_interval95_us": [round(bound, 1) for bound in unsampled["interval"]],
        "one_pct_sampled_interval95_us": [round(bound, 1) for bound in one_pct["interval"]],
        "targets": targets(sampled, unsampled),
        "spans_dropped": sum(n for k, n in stats.items() if k.startswith("dropped")),
        **parts,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
