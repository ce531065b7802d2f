"""``Study``: sweep a deployment, measure every point, derive the figures, name what caps it.

This module is the run: the points of a sweep (``expand``, checked up front by ``check``), the
study that measures them one by one (``Study``, with ``measure.measure_point``), and the
progress it shows on the terminal (``Progress``).

>>> study = Study(
...     model="sleep_fp32",
...     server=Triton("tests/models"),
...     load=Load(seconds=5, warmup_s=1),
...     sweep={"instances": [1, 2], "concurrency": [1, 2, 4]},
...     tracing=Tracing(per_second=20),
...     out="study.jsonl",
... )  # doctest: +SKIP
>>> print(study.run().summary())  # doctest: +SKIP

**The points.** A sweep is either a mapping of parameters to their values, whose product gives
the points (the first parameter changes slowest: put ``instances`` first so the server restarts
least), or an explicit list of points (strong scaling: concurrency and instances side by side).

Parameters a study knows: ``concurrency``, ``rate`` (the load), ``batch_size`` (the inputs),
``instances`` (the server) and ``server`` (a label among the study's servers). Any other one
(``option``, say) must be taken by the user's request factory or the server's reconfigure hook.
Each point is checked up front; a bad value is an error that names the point.

>>> [point_label(p) for p in expand({"instances": [1, 2], "concurrency": [1, 4]})][:3]
['instances=1 concurrency=1', 'instances=1 concurrency=4', 'instances=2 concurrency=1']
>>> check([{"concurrency": 0}], Load(), takers={})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
otelkit._errors.StudyError: otelkit study: point concurrency=0: concurrency is the number ...

**Progress.** On a terminal the running point's line is redrawn twice a second: the point's bar
(its planned warm-up and measured time), requests so far, then the sweep's bar (points done,
with the time left estimated from the points so far). Elsewhere (a log file, CI) only the
finished points are written.

>>> import io
>>> out = io.StringIO()
>>> progress = Progress(2, stream=out)
>>> progress.start(0, "concurrency=1", planned_s=6.0)
>>> progress.done(0, "concurrency=1", "95.0 requests/s, p99 12.1 ms")
>>> print(out.getvalue().strip())
[1/2] concurrency=1: 95.0 requests/s, p99 12.1 ms
>>> sweep_bar(done=3, total=8, elapsed_s=60.0)
'sweep [#######.............] 3/8, 1m00s, ~1m40s left'
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import os
import sys
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from otelkit._errors import StudyError
from otelkit._resource import installed_version
from otelkit.receiver import ReceiverProcess
from otelkit.study._drive import Load
from otelkit.study._measure import measure_point
from otelkit.study._overload import settle
from otelkit.study._point import Point, point_label
from otelkit.study._repeats import merge_repeats
from otelkit.study._results import ResultsWriter, StudyResults
from otelkit.study._servers import Remote, Server, WireProtocol
from otelkit.study._traces import segment_names
from otelkit.study._workload import FunctionCalls, Inputs, ModelCalls, RequestFactory, Workload
from otelkit.telemetry import configure, shutdown

__all__ = [
    "LOAD_PARAMS",
    "Progress",
    "Study",
    "SweepSpec",
    "Tracing",
    "check",
    "expand",
    "run",
    "sweep_bar",
]


_log = logging.getLogger("otelkit.study")


@dataclass(frozen=True)
class Tracing:
    """How a study traces: ``per_second`` sampled requests a second (otelkit's rate-limiting
    sampler: Triton traces what carries a context, and 2.51 crashes under traced load, the
    more rarely the lower the rate: docs/known-issues.md), sent to an embedded receiver
    on ``port`` (0: any) whose files the study reads back — or to ``endpoint`` (a Collector's
    OTLP/HTTP traces URL), read back from ``directory`` (its file exporter's output)."""

    per_second: float = 20.0
    port: int = 0
    endpoint: str | None = None
    directory: str | None = None
    service_name: str = "otelkit-study"


@dataclass(frozen=True)
class _Attempt:
    """One measurement of a point: its ``turn`` in the study's order (its slot in a shared
    schedule), whether it is the point's ``last`` repeat (its traces are read then, for the
    ``sampled_before`` of the earlier ones too, from the segments not in ``since``)."""

    index: int
    turn: int
    params: dict[str, Any]
    run_id: str
    repeat: int = 0
    last: bool = True
    sampled_before: int = 0
    since: frozenset[str] | None = None

    def label(self, repeats: int) -> str:
        label = point_label(self.params)
        return label if repeats == 1 else f"{label} (repeat {self.repeat + 1} of {repeats})"


class Study:
    """A sweep of a deployment, measured point by point into a results file.

    Give ``model`` (requests made from its metadata, or from ``inputs(index, batch_size)``) or
    ``request`` (a factory ``request(params, endpoint)`` returning ``call(index)``, or a
    ``Workload``). ``server`` is a ``Triton`` to launch, a ``Remote``, or ``"host:port"``;
    ``servers`` are labelled servers for a ``server`` sweep. ``unit`` names a request in the
    verdicts ("event"); ``tolerance`` is the knee's and the verdicts' flatness (0.1: ±10 %).

    Client processes that drive the same points side by side (on one node or many: a Slurm job
    array, Ray tasks) share a schedule: point ``k`` starts at ``start_at + k * slot_s`` (epoch
    seconds) in each, and ``otelkit study merge`` makes one point of their parts.
    ``gpu_metrics_url`` is a page of otelkit's GPU metrics (``otelkit gpu-exporter``): each
    point then records GPU memory and utilisation per Triton model instance.

    ``restarts``: a point cut short by the failure of a server the study launched (a crash of
    Triton 2.51's tracer, say) is measured again on a restarted server, at most this often. The
    point records each failure (``Point.restarts``); each server's log stays in the study's
    files. 0 (the default): the failure ends the sweep.

    ``link_gbps``: the rate of the network link between the clients and the servers, one way
    (10 for 10 GbE): the capacity model then weighs each request's tensor bytes against it.

    ``Load(repeats=3)``: every point is measured three times, one pass over the whole sweep
    after another, and each point's repeats merged into one (``_repeats``), written once its
    last is done: the spread between them is its noise, which then holds a state of the client
    or the host that lasts a point.
    """

    def __init__(
        self,
        *,
        model: str | None = None,
        request: RequestFactory | Workload | None = None,
        server: Server | str | None = None,
        servers: Mapping[str, Server | str] | None = None,
        protocol: WireProtocol = "http",
        inputs: Inputs | None = None,
        batch_size: int = 1,
        load: Load | None = None,
        sweep: SweepSpec | None = None,
        tracing: Tracing | None = None,
        out: str | Path = "study.jsonl",
        unit: str = "request",
        tolerance: float = 0.1,
        progress: bool = True,
        timeout_s: float = 60.0,
        start_at: float | None = None,
        slot_s: float | None = None,
        gpu_metrics_url: str | None = None,
        restarts: int = 0,
        link_gbps: float | None = None,
    ) -> None:
        if (model is None) == (request is None):
            raise StudyError("give model (a model to call) or request (what one request does)")
        self.load = load or Load()
        self.sweep, self.tracing, self.out = sweep, tracing, Path(out)
        self.unit, self.tolerance, self.progress = unit, tolerance, progress
        if (start_at is None) != (slot_s is None) or (slot_s is not None and slot_s <= 0):
            raise StudyError("start_at and slot_s go together, slot_s above 0")
        self.start_at, self.slot_s = start_at, slot_s
        self.gpu_metrics_url = gpu_metrics_url
        if link_gbps is not None and not link_gbps > 0:
            raise StudyError(f"link_gbps is the network's rate in Gb/s, above 0, not {link_gbps}")
        self.link_gbps = link_gbps
        if restarts < 0:
            raise StudyError(f"restarts is a count, 0 or more, not {restarts}")
        self.restarts = restarts
        self.servers = {k: _server(v) for k, v in (servers or {}).items()}
        self.server = _server(server) if server is not None else None
        if self.server is None and not self.servers:
            raise StudyError("give server (a Triton to launch, a Remote or 'host:port')")
        self.workload: Workload
        if model is not None:
            self.workload = ModelCalls(
                model, protocol=protocol, inputs=inputs, batch_size=batch_size, timeout_s=timeout_s
            )
            for each in [self.server, *self.servers.values()]:
                if each is not None:
                    each.with_models([model])
        elif isinstance(request, Workload):
            self.workload = request
        else:
            assert request is not None
            self.workload = FunctionCalls(request)

    def points(self) -> list[dict[str, Any]]:
        """The sweep's points, each checked: a bad value raises ``StudyError`` naming it."""
        points = expand(self.sweep)
        takers: dict[str, str] = {}
        for axis in self.workload.axes if self.workload.axes is not None else ("*",):
            takers[axis] = "request"
        for server in [self.server, *self.servers.values()]:
            for axis in server.axes if server is not None else ():
                takers[axis] = "server"
        check(points, self.load, takers=takers, servers=self.servers)
        if any("server" not in p for p in points) and self.server is None:
            raise StudyError("points without a server parameter need server=")
        return points

    def run(self) -> StudyResults:
        """Measure every point, writing each to ``out`` as it is done; derive and judge.

        Ctrl-C stops the sweep: the points done are kept and the results say ``interrupted``.
        A point that fails (server unreachable, model missing, every request failed, server
        died) ends the sweep with ``StudyError`` naming it, after the file is written; the
        error's ``results`` hold the points done.
        """
        points = self.points()
        files = self.out.parent / f"{self.out.stem}-files"
        run_id = uuid.uuid4().hex[:16]
        receiver: ReceiverProcess | None = None
        traces_url = traces_dir = None
        if self.tracing is not None:
            receiver, traces_url, traces_dir = _start_tracing(self.tracing, files)
        for each in [self.server, *self.servers.values()]:
            if each is not None:
                each.keep_logs(files)
        header = self._header(run_id, points)
        # where the traces are, relative to the results file: `otelkit report --study` reads
        # them from there, and the two move together
        header["traces"] = _relative(traces_dir, self.out.parent) if traces_dir else None
        results = StudyResults(header, [], path=self.out)
        repeats = self.load.repeats
        progress = Progress(len(points) * repeats, enabled=self.progress)
        failure: StudyError | None = None
        writer = ResultsWriter(self.out, header)
        # each point's repeats so far, and the segments written before its first: its traces
        # are read once, after its last repeat, for every repeat's sampled requests
        measured: dict[int, list[Point]] = {}
        since: dict[int, frozenset[str]] = {}

        def write(index: int) -> Point:
            point = merge_repeats(measured.pop(index), self.load.max_error_share)
            results.points.append(point)
            writer.point(point)
            return point

        try:
            for turn, (index, params) in enumerate(
                (i, p) for _ in range(repeats) for i, p in enumerate(points)
            ):
                earlier = measured.setdefault(index, [])
                if not earlier and traces_dir is not None:
                    since[index] = segment_names(traces_dir)
                attempt = _Attempt(
                    index,
                    turn,
                    params,
                    run_id,
                    repeat=len(earlier),
                    last=len(earlier) == repeats - 1,
                    sampled_before=sum(p.sampled for p in earlier),
                    since=since.get(index),
                )
                point, failed = self._point(attempt, traces_url, traces_dir, progress, receiver)
                restarts: list[str] = []
                while failed and len(restarts) < self.restarts:
                    restarts.append(point.error)
                    progress.note(f"the server failed; restart {len(restarts)}")
                    point, failed = self._point(attempt, traces_url, traces_dir, progress, receiver)
                point.restarts = restarts
                earlier.append(point)
                label = attempt.label(repeats)
                if point.status == "failed":  # a point with too many errors is a result
                    progress.done(turn, label, _done_text(point, self.unit))
                    failure = StudyError(point.error, point=point.label)
                    break
                if attempt.last:
                    point = write(index)
                progress.done(turn, label, _done_text(point, self.unit))
        except KeyboardInterrupt:
            results.status, results.message = "interrupted", "stopped by Ctrl-C"
        finally:
            for index in sorted(measured):  # a sweep cut short: the repeats it measured
                if measured[index]:
                    write(index)
            for each in [self.server, *self.servers.values()]:
                if each is not None:
                    each.close()
            if self.tracing is not None:
                shutdown()
            if receiver is not None:
                receiver.stop()
        if failure is not None:
            results.status, results.message = "failed", str(failure)
        results.derive(self.tolerance, self.unit)
        writer.finish(results)
        if failure is not None:
            failure.results = results
            raise failure
        return results

    def _point(
        self,
        attempt: _Attempt,
        traces_url: str | None,
        traces_dir: Path | None,
        progress: Progress,
        receiver: ReceiverProcess | None,
    ) -> tuple[Point, bool]:
        """The point measured, and whether the server failed during it; ``receiver``: the
        study's own, flushed as each point's traces are read."""
        params = attempt.params
        server = self.servers[params["server"]] if "server" in params else self.server
        assert server is not None
        load = self.load.at(params)
        planned = load.warmup_s + (load.seconds or 0.0)
        progress.start(attempt.turn, attempt.label(self.load.repeats), planned)
        try:
            progress.note("preparing the server")
            endpoint = server.prepare(params, traces_url)
            point = measure_point(
                attempt.index,
                params,
                workload=self.workload,
                endpoint=endpoint,
                load=self.load,
                run_id=attempt.run_id,
                traces_dir=traces_dir,
                ready_s=server.ready_s,
                progress=progress.tick,
                before_load=lambda: self._wait_for_slot(attempt.turn),
                gpu_metrics_url=self.gpu_metrics_url,
                flush_traces=receiver.flush if receiver is not None else None,
                traces=(attempt.last, attempt.sampled_before, attempt.since),
            )
            settle(point, endpoint.http_url)  # refused connections: overload, or a server gone
        except StudyError as error:  # every request failed, say: perhaps the server did
            point = Point(attempt.index, dict(params), status="failed", error=error.reason)
        dead = server.failure()
        if dead is not None:
            why = f"; {point.error}" if point.error else ""
            point.status = "failed"
            point.error = f"the server died during the point: {dead.splitlines()[0]}{why}"
        point.link_gbps = self.link_gbps
        return point, dead is not None

    def _wait_for_slot(self, index: int) -> None:
        if self.start_at is None or self.slot_s is None:
            return
        begin = self.start_at + index * self.slot_s
        late = time.time() - begin
        if late > 0.5:
            raise StudyError(f"the point's slot began {late:.1f} s ago: give a longer slot")
        time.sleep(max(0.0, begin - time.time()))

    def _header(self, run_id: str, points: list[dict[str, Any]]) -> dict[str, Any]:
        servers = {k: v.describe() for k, v in self.servers.items()}
        return {
            "run_id": run_id,
            "otelkit_version": installed_version("otelkit"),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "model": self.workload.model,
            "protocol": self.workload.protocol,
            "load": asdict(self.load),
            "sweep": points,
            "server": self.server.describe() if self.server is not None else None,
            "servers": servers,
            "tracing": asdict(self.tracing) if self.tracing is not None else None,
            "unit": self.unit,
            "link_gbps": self.link_gbps,
            "tolerance": self.tolerance,
        }


def run(**options: Any) -> StudyResults:
    """``Study(**options).run()``."""
    return Study(**options).run()


def _relative(path: Path, start: Path) -> str:
    return os.path.relpath(path.resolve(), start.resolve())


def _server(server: Server | str) -> Server:
    return Remote(server) if isinstance(server, str) else server


def _start_tracing(tracing: Tracing, files: Path) -> tuple[ReceiverProcess | None, str, Path]:
    receiver = None
    if tracing.endpoint is None:
        # A process of its own: decoding what arrives is about 10 µs of Python a span, which
        # in this process would take the GIL the driver's threads need, and its CPU would be
        # the client's. It writes the span store's segments where DuckDB and pyarrow are
        # installed (otelkit[store]), each point reading only those written during it.
        store = all(importlib.util.find_spec(m) for m in ("duckdb", "pyarrow"))
        formats = ("parquet",) if store else ("jsonl",)
        receiver = ReceiverProcess(
            files / "traces", port=tracing.port, formats=formats, max_concurrent=8
        )
        try:
            receiver.start()
        except OSError as exc:
            raise StudyError(f"the study's trace receiver: {exc}") from exc
        traces_url, traces_dir = receiver.traces_url, receiver.out_dir
    else:
        if tracing.directory is None:
            raise StudyError("Tracing(endpoint=...) needs directory=: where its traces are read")
        traces_url, traces_dir = tracing.endpoint, Path(tracing.directory)
    configure(
        service_name=tracing.service_name,
        traces_endpoint=traces_url,
        sampler="parentbased_ratelimiting",
        sampler_arg=tracing.per_second,
        bsp_schedule_delay_ms=200.0,
        metrics_exporter="none",
    )
    return receiver, traces_url, traces_dir


def _done_text(point: Point, unit: str) -> str:
    if point.status == "failed":
        return f"failed: {point.error}"
    errors = f", {point.failed} errors" if point.failed else ""
    if point.refused:
        errors += f", {point.refused_per_s:.1f}/s refused ({', '.join(sorted(point.refused))})"
    if point.status == "errors":
        errors = f"; too many errors: {point.error}"
    return (
        f"{point.throughput:.1f} {unit}s/s, p50 {point.latency_ms(0.5):.2f} ms, "
        f"p99 {point.latency_ms(0.99):.2f} ms{errors}"
    )


SweepSpec = Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]]
LOAD_PARAMS = ("concurrency", "rate")
MAX_INSTANCES = 256


def expand(sweep: SweepSpec | None) -> list[dict[str, Any]]:
    """The points of ``sweep``, in order (one empty point for no sweep)."""
    if not sweep:
        return [{}]
    if isinstance(sweep, Mapping):
        for name, values in sweep.items():
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
                raise StudyError(f"sweep parameter {name!r} needs a list of values, not {values!r}")
        names = list(sweep)
        return [
            dict(zip(names, combo, strict=True)) for combo in itertools.product(*sweep.values())
        ]
    points = [dict(point) for point in sweep]
    if not all(isinstance(point, dict) for point in points):
        raise StudyError("a sweep is a mapping of parameters to values, or a list of points")
    return points


def _whole(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def check(
    points: Sequence[Mapping[str, Any]],
    load: Load,
    *,
    takers: Mapping[str, str],
    servers: Collection[str] = (),
) -> None:
    """Raise ``StudyError`` naming the first point with a parameter that nothing takes or a
    value that makes no sense. ``takers`` maps each parameter the study's parts take to the
    part (``"*"`` for a request factory that takes any)."""
    for params in points:
        label = point_label(params)
        for name in params:
            if name in LOAD_PARAMS or name == "server":
                continue
            if name not in takers and "*" not in takers:
                known = ", ".join(sorted({*LOAD_PARAMS, *takers, *(["server"] if servers else [])}))
                raise StudyError(
                    f"nothing in this study takes the parameter {name!r} (it takes: {known})",
                    point=label,
                )
        problems = load.at(dict(params)).problems()
        if problems:
            raise StudyError(problems[0], point=label)
        if "concurrency" in params and "rate" in params:
            raise StudyError(
                "a point has a concurrency (closed loop) or a rate (open loop), not both",
                point=label,
            )
        if "batch_size" in params and not _whole(params["batch_size"], 1, 1 << 20):
            raise StudyError(
                "batch_size is a whole number of inferences, 1 or more, "
                f"not {params['batch_size']!r}",
                point=label,
            )
        if "instances" in params and not _whole(params["instances"], 1, MAX_INSTANCES):
            raise StudyError(
                f"instances is a whole number of model instances, 1 to {MAX_INSTANCES}, "
                f"not {params['instances']!r}",
                point=label,
            )
        if "server" in params and params["server"] not in servers:
            names = ", ".join(sorted(servers)) or "none: pass servers={label: server}"
            raise StudyError(
                f"no server labelled {params['server']!r} (servers: {names})", point=label
            )


def bar(share: float, width: int = 20) -> str:
    """``[####......]``: ``share`` (0 to 1) of ``width`` filled."""
    filled = int(min(1.0, max(0.0, share)) * width)
    return f"[{'#' * filled}{'.' * (width - filled)}]"


def _clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{rest}s"


def sweep_bar(done: int, total: int, elapsed_s: float, running_s: float = 0.0) -> str:
    """The sweep's bar: ``done`` of ``total`` points in ``elapsed_s``; the time left is the
    mean time of the points done for each point to come, less the running one's ``running_s``."""
    left = ""
    if 0 < done < total:
        per_point = (elapsed_s - running_s) / done
        left = f", ~{_clock(max(0.0, per_point * (total - done) - running_s))} left"
    return f"sweep {bar(done / total if total else 1.0)} {done}/{total}, {_clock(elapsed_s)}{left}"


class Progress:
    """Reports on ``total`` points to ``stream`` (standard error by default)."""

    def __init__(self, total: int, *, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self._live = enabled and self.stream.isatty()
        self._label = ""
        self._index = 0
        self._planned = 0.0
        self._started = time.monotonic()
        self._sweep_started = self._started
        self._done = 0

    def start(self, index: int, label: str, planned_s: float) -> None:
        """A point begins; ``planned_s`` is its warm-up and measured time (0 when unknown)."""
        self._index, self._label, self._planned = index, label, planned_s
        self._started = time.monotonic()
        self._draw("starting")

    def tick(self, elapsed_s: float, done: int) -> None:
        """Called by the driver twice a second: ``done`` requests answered so far."""
        point = f"{bar(elapsed_s / self._planned)} " if self._planned > 0 else ""
        self._draw(f"{point}{elapsed_s:.1f} s, {done} requests")

    def note(self, text: str) -> None:
        """A step between the load and the next point (restarting a server, reading traces)."""
        self._draw(text)

    def done(self, index: int, label: str, text: str) -> None:
        """A point is over: its line stays."""
        self._done = index + 1
        if not self.enabled:
            return
        end = "\r\033[K" if self._live else ""
        self.stream.write(f"{end}[{index + 1}/{self.total}] {label}: {text}\n")
        if self._live and self._done < self.total:
            self.stream.write(self._sweep(0.0))
        self.stream.flush()

    def _sweep(self, running_s: float) -> str:
        elapsed = time.monotonic() - self._sweep_started
        return sweep_bar(self._done, self.total, elapsed, running_s)

    def _draw(self, text: str) -> None:
        if not self._live:
            return
        running = time.monotonic() - self._started
        line = f"[{self._index + 1}/{self.total}] {self._label}: {text} | {self._sweep(running)}"
        self.stream.write(f"\r\033[K{line}")
        self.stream.flush()
