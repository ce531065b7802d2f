"""Measure one point: drive the load, scrape the server around it, read its traces back.

Every request runs under a root span (when the study traces) that says which run, point and
phase it belongs to; the rate-limiting sampler decides which are sampled, and only those send
a trace context to the server. Triton's counters are scraped when the measured window opens
and when it closes, so they cover the same requests as the client's throughput; they and the
processes' CPU are read at each edge of the window's parts too, so that each part holds its own
figures (the spread of a resource's utilisation over the parts is its noise, ``capacity.py``).
"""

from __future__ import annotations

import itertools
import json
import logging
import time
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from opentelemetry import trace

from otelkit import semconv
from otelkit.study._counters import (
    CpuSample,
    HostUsage,
    ModelFigures,
    Snapshot,
    combine,
    difference,
    host_cores,
    idle_cores,
    is_local,
    listening_pids,
    python_pids,
    scrape,
    scrape_instances,
    server_sample,
)
from otelkit.study._drive import Load, LoadRun, drive, drive_tasks, scheduled_at
from otelkit.study._point import Point, Window
from otelkit.study._servers import Endpoint
from otelkit.study._traces import collect, segment_names
from otelkit.study._workload import Workload
from otelkit.telemetry import flush

__all__ = ["measure_point"]

_log = logging.getLogger("otelkit.study")


def measure_point(
    index: int,
    params: dict[str, Any],
    *,
    workload: Workload,
    endpoint: Endpoint,
    load: Load,
    run_id: str,
    traces_dir: Path | None,
    ready_s: float = 0.0,
    progress: Callable[[float, int], None] | None = None,
    traces_timeout_s: float = 10.0,
    before_load: Callable[[], None] = lambda: None,
    gpu_metrics_url: str | None = None,
    other_cpu_s: Callable[[], float | None] | None = None,
    flush_traces: Callable[[], object] | None = None,
    traces: tuple[bool, int, frozenset[str] | None] = (True, 0, None),
) -> Point:
    """One point at ``params``; a point whose requests all failed comes back ``failed``, one
    with more than ``load.max_error_share`` of its measured requests failed ``errors``.

    ``traces_dir``: where the study's traces arrive, ``None`` when it does not trace.
    Raises ``StudyError`` (without the point's name) when the server or model is not there.
    ``before_load`` runs once the requests are ready, just before the load starts (a wait for
    the point's slot in a shared schedule). ``gpu_metrics_url``: a page of otelkit's GPU
    metrics, read for each model instance's GPU memory and utilisation at the window's end.
    ``other_cpu_s``: the CPU seconds so far of threads in this process that are not the
    client's (the study's embedded receiver), left out of the point's client CPU.
    ``flush_traces``: makes the traces received so far readable (the receiver's segment).
    ``traces``: whether the point's traces are read now, the earlier repeats' sampled requests
    that they include, and the segments written before its first repeat (``None``: before
    this one); an earlier repeat's are read with its last.
    """
    traced = traces_dir is not None
    read_traces, sampled_before, since = traces
    # the segments written before the point: none holds its spans, none is read for it
    old = since
    if old is None:
        old = segment_names(traces_dir) if traces_dir is not None else frozenset()
    workload.open(params, endpoint, traced=traced, ready_s=ready_s)
    url = endpoint.http_url or endpoint.grpc_url
    local = is_local(url)
    idle = idle_cores() if local else None  # before the slot: parts start their loads together
    before_load()
    sampled = itertools.count()
    attributes = _root_attributes(run_id, index, params)
    call = _traced_call(workload, attributes, sampled) if traced else _bare_call(workload)
    snapshots: list[Snapshot | None] = []  # at each edge of the window's parts
    problems: list[str] = []
    # the host's cores are the server's only when it runs here; its own processes' CPU is
    # read wherever the study started them
    pids = endpoint.server_pids or (listening_pids(url) if local else ())

    pythons = python_pids(pids)
    # the server's Python interpreters, a model's own processes and the load balancer's, read
    # at the window's edges (a few reads of /proc, cheap enough for its hooks): their rate over
    # the whole load would count the warm-up's start and the drain, when the server idles, and
    # give less CPU per request the longer those take (a loaded CI host: 4.70 instead of 5.33
    # ms)
    edges: list[_Edge] = []
    pages = endpoint.metrics_urls or ((endpoint.metrics_url,) if endpoint.metrics_url else ())

    def take() -> None:
        edges.append(
            _Edge(
                server_sample(pythons, children=False),
                server_sample(endpoint.balancer_pids, children=False),
                {m: server_sample(p, children=False) for m, p in endpoint.processes.items()},
            )
        )
        read = []
        for page in pages:
            try:
                read.append(scrape(page))
            except Exception as error:  # the figures are missing, the point is not lost
                problems.append(f"metrics at {page}: {error}")
                break
        snapshots.append(combine(read) if read and len(read) == len(pages) else None)

    point_load = load.at(params)
    server_cpu = [server_sample(pids)]
    try:
        if point_load.asyncio:
            workload.in_flight(point_load.concurrency)
            acall = (
                _traced_acall(workload, attributes, sampled) if traced else _bare_acall(workload)
            )
            run = drive_tasks(
                acall,
                point_load,
                on_window_start=take,
                on_window_end=take,
                progress=progress,
                finish=workload.aclose,
                other_cpu_s=other_cpu_s,
                on_part=lambda part: take(),
            )
        else:
            run = drive(
                call,
                point_load,
                on_window_start=take,
                on_window_end=take,
                progress=progress,
                other_cpu_s=other_cpu_s,
                on_part=lambda part: take(),
            )
    finally:
        workload.close()
    server_cpu.append(server_sample(pids))
    first, last = edges[0], edges[-1]
    batch_size = int(params.get("batch_size", workload.batch_size))
    point = Point.from_run(index, params, run, load.windows, batch_size)
    point.sampled = next(sampled)
    point.parallelism = dict(endpoint.parallelism)
    point.payload_bytes = workload.payload_bytes()
    for model, begun in first.models.items():
        cores = begun.rate(last.models[model])
        if cores is not None:
            point.process_cores[model] = cores
    before, after = snapshots[0], snapshots[-1]
    if before is not None and after is not None:
        point.triton = difference(before, after)
        point.gpus = after.gpus
        point.triton = {m: _with_config(f, endpoint, m) for m, f in point.triton.items()}
    if run.host is not None:
        server = (server_cpu[0], server_cpu[1])
        python = (len(pythons), first.python, last.python)
        usage = HostUsage.between(run.host, server, host_cores(), python)
        if endpoint.balancer_pids and endpoint.balancer_workers:
            usage = replace(
                usage,
                balancer_workers=endpoint.balancer_workers,
                balancer_cores=first.balancer.rate(last.balancer),
            )
        point.host = (
            replace(usage, idle_cores=idle) if local else replace(usage, cores=0, busy_cores=None)
        )
    if len(edges) == len(point.windows) + 1 == len(run.edges):
        point.windows = _parts_figures(point, run, edges, snapshots, local=local)
    if gpu_metrics_url is not None:
        try:
            point.gpu_instances = scrape_instances(gpu_metrics_url)
        except Exception as error:  # the figures are missing, the point is not lost
            problems.append(f"GPU metrics at {gpu_metrics_url}: {error}")
    for problem in problems[:1]:
        _log.warning("otelkit study: point %s: %s", point.label, problem)
    if traced and read_traces and point.sampled + sampled_before:
        flush(timeout_s=5.0)
        assert traces_dir is not None
        point.traces = collect(
            traces_dir,
            run_id,
            index,
            sampled=point.sampled + sampled_before,
            timeout_s=traces_timeout_s,
            flush=flush_traces,
            old=old,
        )
    _judge(point, run)
    point.check_errors(load.max_error_share)
    return point


Attributes = dict[str, str | int | float | bool]


def _root_attributes(
    run_id: str, index: int, params: Mapping[str, Any]
) -> tuple[Attributes, Attributes]:
    """The attributes of a request's root span in the warm-up, and in the measured window:
    the point's parameters too, so that a trace reader (``otelkit report --group-by
    otelkit.study.param.concurrency``) groups a study's traces by them."""
    warmup: Attributes = {
        semconv.STUDY_RUN: run_id,
        semconv.STUDY_POINT: index,
        semconv.STUDY_PHASE: semconv.STUDY_PHASE_WARMUP,
    }
    for name, value in params.items():
        if isinstance(value, str | int | float | bool):
            warmup[f"{semconv.STUDY_PARAM}.{name}"] = value
    return warmup, {**warmup, semconv.STUDY_PHASE: semconv.STUDY_PHASE_MEASURE}


def _traced_call(
    workload: Workload, attributes: tuple[Attributes, Attributes], sampled: itertools.count[int]
) -> Callable[[int, bool], None]:
    tracer = trace.get_tracer("otelkit.study")
    warmup, measure = attributes

    def call(request: int, measured: bool) -> None:
        attributes = measure if measured else warmup
        due = scheduled_at()
        # an open loop's request starts when it was due: the wait for a client thread shows
        start = time.time_ns() - int((time.perf_counter() - due) * 1e9) if due else None
        with tracer.start_as_current_span(
            semconv.STUDY_SPAN, attributes=attributes, start_time=start
        ) as span:
            if measured and span.is_recording():
                next(sampled)
            if start is not None and span.is_recording():
                backlog = {semconv.STAGE_NAME: semconv.STUDY_BACKLOG_STAGE}
                tracer.start_span(
                    semconv.STUDY_BACKLOG_STAGE, start_time=start, attributes=backlog
                ).end()
            workload(request)

    return call


def _traced_acall(
    workload: Workload, attributes: tuple[Attributes, Attributes], sampled: itertools.count[int]
) -> Callable[[int, bool], Awaitable[None]]:
    tracer = trace.get_tracer("otelkit.study")
    warmup, measure = attributes

    async def call(request: int, measured: bool) -> None:
        attributes = measure if measured else warmup
        with tracer.start_as_current_span(semconv.STUDY_SPAN, attributes=attributes) as span:
            if measured and span.is_recording():
                next(sampled)
            await workload.acall(request)

    return call


def _bare_acall(workload: Workload) -> Callable[[int, bool], Awaitable[None]]:
    async def call(request: int, measured: bool) -> None:
        await workload.acall(request)

    return call


def _bare_call(workload: Workload) -> Callable[[int, bool], None]:
    def call(request: int, measured: bool) -> None:
        workload(request)

    return call


@dataclass(frozen=True)
class _Edge:
    """The CPU of the server's Python processes, of its load balancer and of each model's
    processes, read at one edge of a point's window."""

    python: CpuSample
    balancer: CpuSample
    models: dict[str, CpuSample]


def _parts_figures(
    point: Point,
    run: LoadRun,
    edges: Sequence[_Edge],
    snapshots: Sequence[Snapshot | None],
    *,
    local: bool,
) -> list[Window]:
    """The point's windows with what each part's edges read: the host's busy cores (when it
    serves), the server's Python processes', the balancer's, each model's processes' and
    Triton's counters; a part whose edge lacks a read lacks that figure.

    The host's cores are not capped at its count in a part, as they are in the point: a part
    of 0.2 s on a busy host may read a tick (10 ms) of each core more than it had, which is
    noise its spread should show, and the parts add up to the point's busy time."""
    host, balancer = point.host, point.host is not None and point.host.balancer_workers > 0
    parts = []
    for k, window in enumerate(point.windows):
        begun, ended = edges[k], edges[k + 1]
        seconds = window.seconds or 0.0
        busy = _cores(run.edges[k].host, run.edges[k + 1].host, seconds) if local else None
        before, after = snapshots[k], snapshots[k + 1]
        models = {m: _cores(c, ended.models[m], seconds) for m, c in begun.models.items()}
        parts.append(
            replace(
                window,
                busy_cores=busy,
                python_cores=_cores(begun.python, ended.python, seconds) if host else None,
                balancer_cores=_cores(begun.balancer, ended.balancer, seconds)
                if balancer
                else None,
                process_cores={m: c for m, c in models.items() if c is not None},
                triton=difference(before, after) if before and after else {},
            )
        )
    return parts


def _cores(first: CpuSample, last: CpuSample, seconds: float) -> float | None:
    """The cores kept busy over a part: its CPU over the part's own length (not the reads'
    span), so that a part's CPU per request is its CPU over its requests, and the parts' CPU
    adds up to the point's."""
    if first.seconds is None or last.seconds is None or seconds <= 0:
        return None
    grown = last.seconds - first.seconds
    return grown / seconds if grown >= 0 else None


def _with_config(figures: ModelFigures, endpoint: Endpoint, model: str) -> ModelFigures:
    """Triton's figures with what the model's configuration says: its instances, whether it is
    an ensemble, and its batching (the capacity model's parallelism and the batcher's delay)."""
    if endpoint.http_url is None:
        return figures
    url = f"http://{endpoint.http_url}/v2/models/{model}/config"
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            config = json.loads(response.read())
        # one server's configuration, through the balancer when there are several alike
        count = sum(int(g.get("count", 1)) for g in config.get("instance_group", []))
        count *= endpoint.servers
        batcher = config.get("dynamic_batching")
        delay_ms = None
        if isinstance(batcher, dict):
            delay_ms = float(batcher.get("max_queue_delay_microseconds", 0)) / 1e3
        return replace(
            figures,
            instances=count or None,
            ensemble=config.get("platform") == "ensemble",
            max_batch_size=int(config.get("max_batch_size", 0)),
            batch_delay_ms=delay_ms,
        )
    except Exception:  # the figures stand without the configuration
        return figures


def _judge(point: Point, run: LoadRun) -> None:
    """Mark the point failed when no request succeeded or errors stopped it; one whose
    requests the server refused is a point with a goodput of 0, not a failed one."""
    if (run.completed > 0 or run.refused) and run.stopped is None:
        return
    kinds: dict[str, int] = dict(run.errors)
    if run.warmup_failed and not kinds:
        kinds = {k: 0 for k in run.error_samples}
    worst = max(kinds, key=lambda k: kinds[k], default=None)
    failed = run.failed + run.warmup_failed
    if worst is None:
        point.status, point.error = "failed", "no request completed within the measured window"
        return
    why = f"{worst} ({run.error_samples.get(worst, '')})"
    stopped = "stopped after" if run.stopped == "errors" else "every request failed:"
    point.status = "failed"
    point.error = f"{stopped} {failed} failed requests, most {why}"
