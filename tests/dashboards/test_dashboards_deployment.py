"""Every panel of every dashboard shows data from the running reference deployment.

A real Prometheus (exemplar storage on) scrapes what an operator's would: Triton's metrics
and the five stage models' ``/metrics`` (``examples/gnn_tracking`` on a real tritonserver),
the FastAPI twin in its own process, this process as the instrumented client, and three
``otelkit gpu-exporter`` processes replaying recorded GPUs (one with NVML read errors). A GPU
exporter on a recording with a lost GPU and one with no GPU at all feed the "lost" and "without
GPU" panels, and a scrape target that is down feeds "Targets down". Load runs through Triton and
the twin, with failing requests among it, through a Ray Serve application (Ray's own
metrics and its replicas' otelkit metrics scraped too) and through a KServe v2 gRPC server
in this process (``otelkit.server.grpc``'s interceptor); then EVERY query of every panel is
evaluated through Prometheus's HTTP API and must return a series — a query with an
``or vector(0)`` fallback also without it, so that the fallback cannot stand in for a missing
series — and the trace ids of the latency histograms' exemplars must be traces the embedded
receiver holds.

The queries that cannot have data on a machine without a GPU are listed in ``NO_DATA_HERE``,
each with why; the test also fails when one of them does show data (the list is stale).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import torch
from gnn_tracking.driving.client import event_pool
from gnn_tracking.driving.options import OPTIONS, Remote, reconstruct
from gnn_tracking.serving.stages import STAGE_ORDER, STAGES
from gnn_tracking.serving.twin import twin_process
from tritonclient.utils import InferenceServerException

import otelkit
from otelkit import semconv
from otelkit.analysis import load_spans
from otelkit.dashboards import render
from otelkit.receiver import Receiver
from otelkit.testing import wait_until
from otelkit.tritonserver import free_port
from tests.gpu.test_gpu import FIXTURES as GPU_FIXTURES
from tests.gpu.test_gpu import run_exporter
from tests.gpu.test_gpu import stop as stop_exporter
from tests.prometheus import PrometheusServer, evaluated_queries, without_data
from tests.support import LocalRay, TrackingServer, require_binary

pytestmark = [pytest.mark.triton, pytest.mark.prometheus]
pytest.importorskip("grafanalib")

# (dashboard, panel title, a piece of the query's PromQL) -> why it has no data on a machine
# without a GPU. Every other query of every panel must return data.
_TRITON_GPU = "Triton exports nv_gpu_* only for the GPUs it uses; tritonserver runs on the CPU here"
NO_DATA_HERE: dict[tuple[str, str, str], str] = {
    ("gpu", "torch memory per process", "torch"): "torch's CUDA allocator: no CUDA device here",
    ("stages", "GPU share of stage wall time", "stage_gpu"): "stage GPU time is read from CUDA "
    "events, which need a CUDA device",
    ("stages", "GPU time per stage", "stage_gpu"): "stage GPU time is read from CUDA events",
    ("gpu", "GPU utilisation: otelkit and Triton", "nv_gpu_utilization"): _TRITON_GPU,
    ("gpu", "Memory used and total", "nv_gpu_memory_used_bytes"): _TRITON_GPU,
    ("gpu", "Memory used and total", "nv_gpu_memory_total_bytes"): _TRITON_GPU,
    ("gpu", "Power usage vs limit", "nv_gpu_power_usage"): _TRITON_GPU,
    ("gpu", "Power usage vs limit", "nv_gpu_power_limit"): _TRITON_GPU,
}
# processes and GPM, clocks held down (idle); a GPU lost mid-run (the "GPUs lost" panel)
GPU_REPLAYS = ("h100x1.json", "h100x8.json", "a100x2-lost.json")
LATENCY_HISTOGRAMS = (
    semconv.CLIENT_DURATION,
    semconv.STAGE_DURATION,
    semconv.HTTP_SERVER_DURATION,
    semconv.RAY_SERVE_CALL_DURATION,
    semconv.RPC_SERVER_DURATION,
)
SAMPLED = 0.25  # share of events traced: exemplars come only from sampled spans
PANELS_TIMEOUT_S = 60.0


def replay_with_read_errors(out: Path) -> Path:
    """``a100x2.json`` with GPU 1's power reading failing in every other sample, as NVML's
    ``NVML_ERROR_UNKNOWN`` does; the other fields and GPU 0 keep their recorded values."""
    recording = json.loads((GPU_FIXTURES / "a100x2.json").read_text())
    second = recording["devices"][1]["uuid"]
    samples = []
    for number, sample in enumerate(recording["samples"]):
        sample = copy.deepcopy(sample)
        if number % 2:
            sample["fields"][second]["power.usage"] = "error: Unknown Error"
        samples.append(sample)
    recording["samples"] = samples
    path = out / "a100x2-read-errors.json"
    path.write_text(json.dumps(recording))
    return path


def bad_filter_inputs() -> dict[str, torch.Tensor]:
    """A ``filter`` request whose edges name hits that do not exist: the stage raises."""
    return {
        "FEATURES": torch.zeros(4, 3),
        "EMBEDDING": torch.zeros(4, 8),
        "EDGE_INDEX": torch.tensor([[99], [98]], dtype=torch.int64),
    }


class Load:
    """Threads reconstructing events through a ``Remote`` until stopped, every ``fail_every``-th
    call a failing ``filter`` request; counts what succeeded and keeps what failed."""

    def __init__(self, remotes: list[Remote], events: list[torch.Tensor]) -> None:
        self.remotes, self.events = remotes, events
        self.stop = threading.Event()
        self.done = 0
        self.failed: list[BaseException] = []
        self.unexpected: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._run, args=(remote,), name=f"load-{i}")
            for i, remote in enumerate(remotes)
        ]

    def _run(self, remote: Remote, fail_every: int = 5) -> None:
        for number in itertools.count():
            if self.stop.is_set():
                return
            try:
                if number % fail_every == fail_every - 1:
                    self._fail(remote)
                else:
                    option = OPTIONS[3 if number % 2 else 4]  # each stage alone, and the ensemble
                    reconstruct(option, self.events[number % len(self.events)], None, remote)
                    self.done += 1
            except BaseException as error:  # a thread's failure must reach the test
                self.unexpected.append(error)
                return
            time.sleep(0.01)

    def _fail(self, remote: Remote) -> None:
        try:
            remote.infer(STAGES["filter"], bad_filter_inputs())
        except InferenceServerException as error:
            self.failed.append(error)
        else:
            raise AssertionError("a filter request with unknown hits succeeded")

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(30)


@pytest.fixture
def client_telemetry(receiver: Receiver) -> Iterator[otelkit.Telemetry]:
    """otelkit in this process as the deployment's client: sampled share, Prometheus endpoint."""
    yield otelkit.configure(
        service_name="gnn-tracking-client",
        traces_endpoint=receiver.traces_url,
        sampler="parentbased_traceidratio",
        sampler_arg=SAMPLED,
        metrics_exporter="prometheus",
        prometheus_port=0,
        prometheus_host="127.0.0.1",
        bsp_schedule_delay_ms=50,
    )
    otelkit.shutdown()


@contextmanager
def ray_serve_under_load(receiver: Receiver) -> Iterator[list[str]]:
    """The Ray Serve test application (``tests/server/ray_apps.py``) on the session's Ray,
    each deployment's replica serving otelkit's metrics on its own port, requests (doubling,
    batched, failing) sent until the block ends; yields the replicas' scrape targets."""
    from ray import serve

    from otelkit.server.ray_serve import instrument_deployment
    from tests.server.ray_apps import Batched, Child, Ingress

    ports = {name: free_port() for name in ("Ingress", "Child", "Batched")}

    def env(name: str) -> dict[str, str]:
        return LocalRay.replica_env(
            receiver.traces_url,
            OTELKIT_PROMETHEUS_PORT=str(ports[name]),
            OTELKIT_PROMETHEUS_HOST="127.0.0.1",
        )

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    child, batched = (instrument_deployment(d, env(d.name)).bind() for d in (Child, Batched))
    serve.run(
        instrument_deployment(Ingress, env("Ingress")).bind(child, batched),
        name="dashboards",
        route_prefix="/ray",
    )
    stop = threading.Event()

    def load() -> None:
        for number in itertools.count():
            action, body = [("double", [1.0]), ("batch", [1.0, 2.0]), ("fail", [0.0])][number % 3]
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/ray/{action}",
                json.dumps({"x": body}).encode(),
                method="POST",
            )
            with contextlib.suppress(urllib.error.HTTPError):
                urllib.request.urlopen(request, timeout=30).close()
            if stop.wait(0.05):
                return

    sender = threading.Thread(target=load, name="ray-load")
    sender.start()
    try:
        yield [f"127.0.0.1:{p}" for p in ports.values()]
    finally:
        stop.set()
        sender.join(60)
        serve.shutdown()


@contextmanager
def grpc_server_under_load() -> Iterator[None]:
    """A KServe v2 gRPC server in this process, traced by ``server_interceptor()`` (its
    metrics on this process's endpoint, the "client" job), called by an instrumented
    ``tritonclient.grpc`` client until the block ends: a doubling model, and every third call
    a failing one (``INTERNAL``, for the errors panel)."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    from gnn_tracking.serving.kserve import ModelSpec, TensorSpec
    from gnn_tracking.serving.kserve_grpc import KServeServicer, grpc_server

    from otelkit.server.grpc import server_interceptor

    def fail(inputs: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("refused")

    x, y = (TensorSpec(name, "FP32", (-1,)) for name in ("x", "y"))
    models = [
        ModelSpec("grpc_double", (x,), (y,), lambda inputs: {"y": inputs["x"] * 2}),
        ModelSpec("grpc_fail", (x,), (y,), fail),
    ]
    port = free_port()
    server = grpc_server(
        KServeServicer(models), port, interceptors=[server_interceptor()], workers=2
    )
    client = otelkit.instrument(grpcclient.InferenceServerClient(f"127.0.0.1:{port}"))
    data = grpcclient.InferInput("x", [2], "FP32")
    data.set_data_from_numpy(np.ones(2, dtype=np.float32))
    stop = threading.Event()

    def load() -> None:
        for number in itertools.count():
            with contextlib.suppress(InferenceServerException):
                client.infer("grpc_fail" if number % 3 == 2 else "grpc_double", [data])
            if stop.wait(0.1):
                return

    sender = threading.Thread(target=load, name="grpc-load")
    sender.start()
    try:
        yield
    finally:
        stop.set()
        sender.join(30)
        client.close()
        server.stop(1)


def excuse(dashboard: str, panel: str, expr: str) -> str | None:
    for (where, title, piece), why in NO_DATA_HERE.items():
        if (where, title) == (dashboard, panel) and piece in expr:
            return why
    return None


def exemplar_trace_ids(prometheus: PrometheusServer, since: float) -> dict[str, set[str]]:
    """Histogram name -> the trace ids on its exemplars since ``since``."""
    found: dict[str, set[str]] = {}
    for histogram in LATENCY_HISTOGRAMS:
        series = prometheus.query_exemplars(
            f"{semconv.prometheus_name(histogram)}_bucket", since, time.time()
        )
        found[histogram.name] = {
            exemplar["labels"]["trace_id"]
            for one in series
            for exemplar in one["exemplars"]
            if "trace_id" in exemplar["labels"]
        }
    return found


def test_every_panel_shows_the_running_reference_deployment(
    tracking_triton: TrackingServer,
    ray_local: LocalRay,
    receiver: Receiver,
    client_telemetry: otelkit.Telemetry,
    tmp_path: Path,
) -> None:
    assert client_telemetry.prometheus_url is not None
    replays = [GPU_FIXTURES / name for name in GPU_REPLAYS] + [replay_with_read_errors(tmp_path)]
    exporters = [run_exporter("--replay", str(path), "--interval", "0.5") for path in replays]
    exporters.append(run_exporter("--interval", "0.5"))  # no GPU here: available 0
    twin_metrics_port = free_port()
    triton = tracking_triton.server
    models = tracking_triton.models_metrics_port
    jobs = {
        "triton": [f"127.0.0.1:{triton.metrics_port}"],
        "triton-models": [f"127.0.0.1:{models + i}" for i in range(1, len(STAGE_ORDER) + 1)],
        "fastapi": [f"127.0.0.1:{twin_metrics_port}"],
        "client": [urlsplit(client_telemetry.prometheus_url).netloc],
        "gpu-exporter": [urlsplit(url).netloc for _, url in exporters],
        "down": [f"127.0.0.1:{free_port()}"],  # nothing listens: "Targets down" has a target
        "ray": [f"127.0.0.1:{ray_local.metrics_port}"],  # Ray's own, ray_serve_* among them
    }
    # the fleet's dashboard needs Envoy and a registry: tests/fleet/test_envoy.py shows it
    queries = evaluated_queries({k: v for k, v in render().items() if k != "fleet"})
    events = event_pool(8, 20, seed=321)
    started = time.time()
    try:
        with (
            twin_process(
                receiver.traces_url, tmp_path / "twin.log", metrics_port=twin_metrics_port
            ) as twin_url,
            ray_serve_under_load(receiver) as ray_replicas,
            grpc_server_under_load(),
            PrometheusServer(
                require_binary("prometheus"), jobs | {"ray-serve": ray_replicas}, tmp_path
            ) as prometheus,
        ):
            remotes = [Remote(triton.http_url, "http"), Remote(twin_url, "http")]
            with Load(remotes, events) as load:
                prometheus.wait_for_targets(timeout=30, down_jobs=frozenset({"down"}))
                empty: list[tuple[str, str, str]] = []

                def only_excused_queries_empty() -> bool:
                    empty[:] = without_data(prometheus, queries)
                    return all(excuse(*query) for query in empty)

                wait_until(
                    only_excused_queries_empty,
                    PANELS_TIMEOUT_S,
                    "data for every panel's query but the excused",
                    interval=1.0,
                    explain=lambda: [query for query in empty if not excuse(*query)],
                )
            for remote in remotes:
                remote.close()
            exemplars = exemplar_trace_ids(prometheus, started)
    finally:
        for process, _ in exporters:
            stop_exporter(process)
    assert load.unexpected == []
    assert load.done > 0 and load.failed, (load.done, load.failed)
    assert all("filter" in str(error) for error in load.failed)
    missing = [query for query in empty if not excuse(*query)]
    assert missing == [], "queries without data:\n" + "\n".join(
        f"{dashboard} / {title}: {expr}" for dashboard, title, expr in missing
    )
    excused = {
        (d, t, piece)
        for d, t, expr in empty
        for (dd, tt, piece) in NO_DATA_HERE
        if (d, t) == (dd, tt) and piece in expr
    }
    assert excused == set(NO_DATA_HERE), f"stale exceptions: {set(NO_DATA_HERE) - excused}"
    assert len(queries) > 80  # every panel's queries were evaluated

    for histogram, trace_ids in exemplars.items():
        assert trace_ids, f"no exemplar on {histogram}"
    wanted = set().union(*exemplars.values())
    otelkit.flush()
    stored: set[str] = set()

    def all_exemplar_traces_stored() -> bool:
        stored.update(span.trace_id for span in load_spans(receiver.out_dir))
        return wanted <= stored

    wait_until(
        all_exemplar_traces_stored,
        20.0,
        f"a stored trace for each of {len(wanted)} exemplars' trace ids",
        interval=1.0,
        explain=lambda: f"{len(wanted - stored)} missing: {sorted(wanted - stored)[:5]}",
    )
