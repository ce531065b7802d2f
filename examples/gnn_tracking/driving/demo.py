"""``make demo``: the reference deployment end to end, on embedded defaults.

    python -m gnn_tracking.driving.demo [--seconds 5] [--threads 1 8] [--out demo-output]

1. starts otelkit's embedded OTLP receiver (the local stand-in for a Collector);
2. starts Triton on the pipeline's model repository, traced to the receiver, and the FastAPI
   twin beside it;
3. checks that the ensemble (option 4) and the in-process pipeline (option 0) label the same
   events identically;
4. drives the five service options at each client concurrency (over HTTP by default; at most
   ``--traces-per-s`` events a second traced end to end, by otelkit's rate-limiting sampler),
   then the whole pipeline as one model of the FastAPI twin and of Ray Serve (``--no-ray``),
   each over HTTP and over gRPC (KServe v2 both ways);
5. asks ``otelkit study`` what caps the whole pipeline's throughput on Triton: the ensemble at
   1 to 8 events in flight, untraced (``--no-study`` leaves it out), its verdicts with their
   evidence, what to change and the plateau the operational laws predict;
6. snapshots every ``/metrics`` page, stops the servers, and prints the per-stage time
   breakdown computed from the collected traces (``otelkit.analysis._breakdown``), the
   throughput per option, and where the traces and metrics went; writes the same traces as
   one HTML page (``otelkit report``: breakdown bars, trace waterfalls, the study's figures and
   verdicts) and prints its path;
7. exits non-zero, naming each check that failed: labels that differ between options 0 and 4,
   broken nesting in the traces, a run with failed events or none at all, a Triton that could
   not be kept alive, a study that failed or gave no verdict.

tritonserver 2.51 (bundled with nvidia-pytriton) can still crash under traced load (upstream
issue 7795): the demo then keeps the crashed server's log (``triton-crash-N.log``), restarts
it, runs the cut run again, and leaves the cut run's traces out of the breakdown. Each restart
is printed with its cause (the signal and the log's lines from the crash on) and listed under
``restarts`` in ``summary.json``. Triton failing any other way ends the demo with an error.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch

import otelkit
from gnn_tracking.driving.client import RunReport, drive, event_pool
from gnn_tracking.driving.http_parse import keep_response_heads
from gnn_tracking.driving.options import (
    OPTION_ATTRIBUTE,
    OPTIONS,
    ROOT_SPAN,
    SERVER_ATTRIBUTE,
    THREADS_ATTRIBUTE,
    Remote,
    ServiceOption,
    reconstruct,
)
from gnn_tracking.physics.models import Models, load_models
from gnn_tracking.serving.serve import TrackingTriton, triton_server
from gnn_tracking.serving.stages import ENSEMBLE, FEATURES, STAGE_ORDER
from gnn_tracking.serving.twin import twin_process
from otelkit.analysis import Breakdown, breakdown, build_traces, format_breakdowns, load_spans
from otelkit.receiver import Receiver
from otelkit.report import Report
from otelkit.study import Load, Study, StudyError, StudyResults
from otelkit.study import Remote as StudyRemote
from otelkit.tritonserver import TritonServer, free_port

__all__ = ["Restart", "after_failure", "crash_excerpt", "known_crash", "main", "race_known_on"]

PROTOCOL_ATTRIBUTE = "gnn_tracking.protocol"
RUN_ATTRIBUTE = "gnn_tracking.run"  # one id per run attempt: a crashed attempt's traces go
# Triton traces every request that carries a context and 1 in UNTRACED of the others: the
# client's sampler decides. Under traced load the bundled tritonserver 2.51 segfaults
# (upstream issue 7795, fixed by PR 8144 in 2.57), so the client's sampler caps the traced
# events per second (docs/known-issues.md has the rates measured).
UNTRACED = 1_000_000
MAX_RESTARTS = 3  # a safety net: a run a crash cut short is run again, at most this often
# How that crash ends a server (TritonServer.failure()'s words): killed by a crash signal
# (SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGSEGV), or caught by Triton's own handler, which logs
# "Signal (N) received." and may hang there. A SIGKILL, SIGTERM or an exit is something else.
_KNOWN_CRASH = re.compile(r"killed by signal (4|6|7|8|11) |after logging 'Signal \((\d+)\)")
_T0 = time.monotonic()


@dataclass(frozen=True)
class Restart:
    """One restart of Triton after the known crash, and why."""

    run: str  # the run the crash cut short
    cause: str  # how the server ended (``TritonServer.failure()``)
    signal: int
    log_excerpt: str  # the crashed server's log from the crash on
    log: str  # where the crashed server's whole log is kept

    def line(self) -> str:
        excerpt = "\n".join(f"    | {line}" for line in self.log_excerpt.splitlines())
        return f"{self.run}: {self.cause}\n{excerpt}"


def known_crash(failure: str) -> int | None:
    """The signal of tritonserver 2.51's crash under traced load (upstream issue 7795) when
    ``failure`` is that crash, else ``None``.

    >>> known_crash("tritonserver was killed by signal 11 (Segmentation fault) (log: x)")
    11
    >>> known_crash("tritonserver exited with status 1 (log: x)") is None
    True
    """
    match = _KNOWN_CRASH.search(failure)
    return int(match[1] or match[2]) if match else None


def race_known_on(version: str | None) -> bool:
    """Whether a tritonserver that reported ``version`` has that crash: from 2.51, fixed in
    2.57 (upstream PR 8144).

    >>> race_known_on("2.51.0"), race_known_on("2.57.0"), race_known_on(None)
    (True, False, False)
    """
    numbers = re.match(r"(\d+)\.(\d+)", version or "")
    return numbers is not None and (2, 51) <= (int(numbers[1]), int(numbers[2])) < (2, 57)


def crash_excerpt(log: str, lines: int = 12) -> str:
    """The log's lines from Triton's first ``Signal (N) received.`` on (the crash: stopping a
    server that hangs in its handler logs another), else its last lines."""
    logged = log.splitlines()
    starts = [i for i, line in enumerate(logged) if "Signal (" in line]
    first = starts[0] if starts else max(len(logged) - lines, 0)
    return "\n".join(logged[first : first + lines])


def after_failure(
    server: TritonServer, failed: str, run: str, out: Path, restarts: list[Restart]
) -> str | None:
    """Stop a server that failed (``failed``: how) during ``run`` and keep its log in ``out``;
    after tritonserver 2.51's known crash (a crash signal, of a traced server whose version
    has the race), record the restart to come in ``restarts`` and return ``None``; else
    (another failure, or too many crashes) why the demo stops."""
    kept = out / f"triton-crash-{len(restarts) + 1}.log"
    server.stop(timeout=5)
    if server.log_path is not None and server.log_path.exists():
        shutil.copy(server.log_path, kept)  # the restart starts a new log
    signal = known_crash(failed)
    if signal is None or not server.traced or not race_known_on(server.version):
        unlike = (
            "no crash signal"
            if signal is None
            else "its tracer was off"
            if not server.traced
            else f"it reported version {server.version}"
        )
        why = (
            f"during {run}, {failed}: not tritonserver 2.51's crash under traced load "
            f"({unlike}), so no restart; its log is kept in {kept}"
        )
        say(why)
        return why
    excerpt = crash_excerpt(kept.read_text(errors="replace")) if kept.exists() else ""
    restarts.append(Restart(run, failed, signal, excerpt, str(kept)))
    say(
        f"restart {len(restarts)} of at most {MAX_RESTARTS}, after 2.51's crash under traced "
        f"load (upstream issue 7795), during {restarts[-1].line()}"
    )
    if len(restarts) > MAX_RESTARTS:
        return f"crashed {len(restarts)} times; the last log is {kept}"
    return None


def say(message: str) -> None:
    print(f"[{time.monotonic() - _T0:6.1f} s] {message}", flush=True)


def url_of(server: TritonServer, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def _snapshot(url: str, path: Path) -> None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            path.write_bytes(response.read())
    except OSError as error:
        path.write_text(f"# not reachable: {error}\n")


def _settle(receiver: Receiver, quiet_s: float = 1.0, limit_s: float = 20.0) -> None:
    """Wait until no span has arrived for ``quiet_s`` (servers flush on their own schedule)."""
    deadline = time.monotonic() + limit_s
    last, since = receiver.spans_stored, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if receiver.spans_stored != last:
            last, since = receiver.spans_stored, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return


def _check_labels(events: list[torch.Tensor], models: Models, remote: Remote) -> str | None:
    """``None`` when options 0 and 4 label every event alike, else what differs."""
    direct, ensemble = OPTIONS[0], OPTIONS[4]
    differing = 0
    for features in events:
        local = reconstruct(direct, features, models, None, {SERVER_ATTRIBUTE: "check"})
        served = reconstruct(ensemble, features, None, remote, {SERVER_ATTRIBUTE: "check"})
        differing += int(not torch.equal(local, served))
    if differing:
        return f"{differing} of {len(events)} events labelled differently by options 0 and 4"
    return None


def failed_checks(
    label_problem: str | None,
    reports: list[tuple[str, RunReport]],
    nesting_problems: int,
    gave_up: str | None = None,
    study_problem: str | None = None,
    unexplained: Sequence[str] = (),
) -> list[str]:
    """Every check of the demo that failed, in words; empty when all hold. ``unexplained``:
    the groups whose ``server other`` or ``client other`` is over 5 % of their time.

    >>> for check in failed_checks("2 of 4 events labelled differently", [], 3):
    ...     print(check)
    track labels: 2 of 4 events labelled differently
    nesting: 3 problems in the traces
    """
    failed = []
    if label_problem:
        failed.append(f"track labels: {label_problem}")
    if gave_up:
        failed.append(f"Triton: {gave_up}")
    for label, report in reports:
        if report.errors:
            failed.append(f"run {label} at {report.threads} threads: {report.errors} events failed")
        elif report.events == 0:
            failed.append(f"run {label} at {report.threads} threads: no event completed")
    if nesting_problems:
        failed.append(f"nesting: {nesting_problems} problems in the traces")
    if study_problem:
        failed.append(f"study: {study_problem}")
    failed += [f"unexplained time: {line}" for line in unexplained]
    return failed


def _throughput_table(reports: list[tuple[str, RunReport]], threads: list[int]) -> str:
    lines = [
        f"{'service option':<38}"
        + "".join(f"{f'{t} thread' + ('s' if t > 1 else ''):>24}" for t in threads)
    ]
    rows: dict[str, dict[int, RunReport]] = {}
    for label, report in reports:
        rows.setdefault(label, {})[report.threads] = report
    for label, by_threads in rows.items():
        cells = "".join(
            f"{by_threads[t].throughput:9.1f} ev/s {by_threads[t].percentile_ms(50):6.1f} ms"
            if t in by_threads
            else f"{'-':>24}"
            for t in threads
        )
        lines.append(f"{label:<38}{cells}")
    return "\n".join(lines) + "\n(events per second, median latency per event)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo-output"))
    parser.add_argument("--seconds", type=float, default=5.0, help="per run")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--n-particles", type=int, default=40, help="event size (~10 hits each)")
    parser.add_argument("--no-twin", action="store_true", help="skip the FastAPI comparison")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray Serve comparison")
    parser.add_argument("--no-study", action="store_true", help="skip what caps throughput")
    parser.add_argument("--study-seconds", type=float, default=1.5, help="measured per point")
    parser.add_argument("--study-concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument(
        "--traces-per-s",
        type=float,
        default=20.0,
        help="at most this many events a second traced end to end (otelkit's rate-limiting "
        "sampler: tritonserver 2.51 crashes under heavy traced load)",
    )
    parser.add_argument(
        "--protocol",
        choices=["http", "grpc"],
        default="http",
        help="to Triton; gRPC with trace context crashes the bundled tritonserver 2.51 (README)",
    )
    args = parser.parse_args(argv)
    out: Path = args.out
    keep_response_heads()  # an HTTP response that fails to parse says whose fault it was
    torch.set_num_threads(1)  # the client's event threads are its parallelism, as in the seeds
    shutil.rmtree(out / "traces", ignore_errors=True)
    (out / "metrics").mkdir(parents=True, exist_ok=True)

    say(f"embedded OTLP receiver -> {out / 'traces'}")
    # every server and the client export here at once: room for all of them, no 503s
    # the traces as span store segments, which the breakdown reads compiled (otelkit[store])
    formats = ("parquet",) if _store_installed() else ("jsonl",)
    receiver = Receiver(out / "traces", max_concurrent=32, formats=formats).start()
    client_metrics_port = free_port()
    otelkit.configure(
        service_name="gnn-tracking-client",
        traces_endpoint=receiver.traces_url,
        sampler="parentbased_ratelimiting",
        sampler_arg=args.traces_per_s,
        prometheus_port=client_metrics_port,
        prometheus_host="127.0.0.1",
        bsp_schedule_delay_ms=200,
        bsp_max_queue_size=65536,
    )
    events = event_pool(32, args.n_particles)
    hits = sum(int(e.shape[0]) for e in events) / len(events)
    say(f"{len(events)} events generated, {hits:.0f} hits each on average")
    models = load_models()
    server = triton_server(receiver.traces_url, log_path=out / "triton.log", trace_rate=UNTRACED)
    say("starting tritonserver (5 stage models + the ensemble, Python backend on the CPU)...")
    reports: list[tuple[str, RunReport]] = []
    crashed_runs: set[str] = set()
    with server:
        say(f"Triton ready: grpc {server.grpc_url}, http {server.http_url}, {server.metrics_url}")
        remote = Remote(url_of(server, args.protocol), args.protocol, timeout_s=10)
        label_problem = _check_labels(events[:4], models, remote)
        say(label_problem or "options 0 and 4 give identical track labels on 4 events")
        restarts: list[Restart] = []
        gave_up: str | None = None
        for option in OPTIONS:
            for threads in args.threads:
                attempt = len(reports) + len(crashed_runs)
                report = _run(option, events, threads, models, remote, "triton", args, attempt)
                # tritonserver 2.51's tracing crash (see UNTRACED)
                while (failed := server.failure()) is not None:
                    crashed_runs.add(str(attempt))
                    run = f"option {option.number} at {threads} threads"
                    gave_up = after_failure(server, failed, run, out, restarts)
                    if gave_up:
                        break
                    server.start()
                    remote.close()
                    remote = Remote(url_of(server, args.protocol), args.protocol, timeout_s=10)
                    attempt = len(reports) + len(crashed_runs)
                    report = _run(option, events, threads, models, remote, "triton", args, attempt)
                if gave_up:
                    break
                reports.append((f"{option.number} {option.title}", report))
            if gave_up:
                break
        study: StudyResults | None = None
        study_problem: str | None = None
        if not args.no_study and not gave_up:
            study, study_problem = _what_caps_throughput(server, events, args)
        if not args.no_twin and not gave_up:
            say("starting the FastAPI twin (KServe v2 over HTTP)...")
            twin_metrics_port, twin_grpc_port = free_port(), free_port()
            with twin_process(
                receiver.traces_url,
                out / "fastapi.log",
                metrics_port=twin_metrics_port,
                grpc_port=twin_grpc_port,
            ) as twin_url:
                twin = Remote(twin_url, "http")
                _runs(
                    twin,
                    "fastapi",
                    "4 one model, FastAPI twin (HTTP)",
                    events,
                    models,
                    args,
                    reports,
                    len(crashed_runs),
                )
                say("the same twin over KServe v2 gRPC (the protocol SONIC's clients speak)...")
                twin = Remote(f"127.0.0.1:{twin_grpc_port}", "grpc", timeout_s=10)
                label_problem = label_problem or _check_labels(events[:4], models, twin)
                _runs(
                    twin,
                    "fastapi",
                    "4 one model, the twin over gRPC",
                    events,
                    models,
                    args,
                    reports,
                    len(crashed_runs),
                )
                _snapshot(
                    f"http://127.0.0.1:{twin_metrics_port}/metrics",
                    out / "metrics" / "fastapi.prom",
                )
        if not args.no_ray and not gave_up:
            ray_problem = _ray_serve_runs(
                receiver, events, models, args, reports, len(crashed_runs)
            )
            label_problem = label_problem or ray_problem
        _snapshot(server.metrics_url, out / "metrics" / "triton.prom")
        for stage in STAGE_ORDER:
            if server.running:  # a server given up on has no stage models to scrape
                _snapshot(server.stage_metrics_url(stage), out / "metrics" / f"model-{stage}.prom")
        _snapshot(
            f"http://127.0.0.1:{client_metrics_port}/metrics", out / "metrics" / "client.prom"
        )
        remote.close()
        say("stopping Triton (its models flush their spans)...")
    otelkit.shutdown()
    _settle(receiver)
    receiver.stop()
    say(f"{receiver.spans_stored} spans collected; computing the breakdown from the traces")
    if crashed_runs:
        say(f"{len(crashed_runs)} run(s) cut short by a Triton crash: their traces are left out")
    return _report(
        out,
        reports,
        args.threads,
        crashed_runs,
        restarts,
        label_problem,
        gave_up,
        study,
        study_problem,
    )


def _what_caps_throughput(
    server: TrackingTriton, events: list[torch.Tensor], args: argparse.Namespace
) -> tuple[StudyResults | None, str | None]:
    """``otelkit study`` of the ensemble on the demo's Triton along the events in flight, into
    ``out/study.jsonl``; the results and what went wrong, if anything. Untraced: its requests
    stay out of the demo's traces, and the verdict comes from Triton's counters, the host's CPU
    and the client's (the capacity model), with no span to read."""
    say(
        f"what caps throughput: otelkit study of the ensemble at {args.study_concurrency} events "
        "in flight, untraced..."
    )
    pool = [event.numpy() for event in events]
    study = Study(
        model=ENSEMBLE,
        inputs=lambda index, batch_size: {FEATURES: pool[index % len(pool)]},
        server=StudyRemote(server.http_url, metrics_url=server.metrics_url),
        sweep={"concurrency": sorted(set(args.study_concurrency))},
        load=Load(seconds=args.study_seconds, warmup_s=0.5),
        out=args.out / "study.jsonl",
        unit="event",
        tolerance=0.2,
        progress=False,
    )
    try:
        results = study.run()
    except StudyError as error:  # a failed point: the file holds the points measured
        return None, str(error)
    if results.status != "complete":
        return results, f"the study ended {results.status}: {results.message}"
    if not results.verdicts:
        return results, "no verdict on the ensemble's curve"
    return results, None


def _ray_serve_runs(
    receiver: Receiver,
    events: list[torch.Tensor],
    models: Models,
    args: argparse.Namespace,
    reports: list[tuple[str, RunReport]],
    crashed: int,
) -> str | None:
    """The whole pipeline as one model of Ray Serve (a local Ray on this machine's cores),
    through Serve's HTTP proxy and then its gRPC proxy (KServe v2 over gRPC, as SONIC's
    clients call); what differs from option 0's labels, if anything."""
    from gnn_tracking.serving.ray_app import ray_serve_app

    say("starting the pipeline on Ray Serve (a deployment per stage and one for the whole)...")
    grpc_port = free_port()
    problems: list[str] = []
    with ray_serve_app(receiver.traces_url, grpc_port=grpc_port) as url:
        proxies: list[tuple[Literal["http", "grpc"], str, str]] = [
            ("http", "HTTP", url),
            ("grpc", "gRPC", f"127.0.0.1:{grpc_port}"),
        ]
        for protocol, title, where in proxies:
            ray = Remote(where, protocol, timeout_s=30)
            problem = _check_labels(events[:4], models, ray)
            name = f"Ray Serve ({title})"
            say(f"{name}: {problem}" if problem else f"{name} gives option 0's labels on 4 events")
            problems += [f"{name}: {problem}"] if problem else []
            _runs(ray, "ray", f"4 one model, {name}", events, models, args, reports, crashed)
    return "; ".join(problems) or None


def _runs(
    remote: Remote,
    server: str,
    label: str,
    events: list[torch.Tensor],
    models: Models,
    args: argparse.Namespace,
    reports: list[tuple[str, RunReport]],
    crashed: int,
) -> None:
    """The whole pipeline as one model of ``remote``, at each client concurrency; then the
    client is closed. Each run is numbered after the runs so far (``crashed`` cut short)."""
    for threads in args.threads:
        attempt = len(reports) + crashed
        report = _run(OPTIONS[4], events, threads, models, remote, server, args, attempt)
        reports.append((label, report))
    remote.close()


def _run(
    option: ServiceOption,
    events: list[torch.Tensor],
    threads: int,
    models: Models,
    remote: Remote,
    server: str,
    args: argparse.Namespace,
    attempt: int,
) -> RunReport:
    protocol: str = remote.protocol
    if not option.served:
        server, protocol = "none", "-"
    attributes: dict[str, str | int] = {
        SERVER_ATTRIBUTE: server,
        PROTOCOL_ATTRIBUTE: protocol,
        RUN_ATTRIBUTE: attempt,
    }
    drive(
        option,
        events,
        threads=threads,
        models=models,
        remote=remote,
        count=2,
        attributes={SERVER_ATTRIBUTE: "warmup"},
    )
    report = drive(
        option,
        events,
        threads=threads,
        models=models,
        remote=remote,
        seconds=args.seconds,
        attributes=attributes,
    )
    where = "in process" if not option.served else f"{server} {protocol}"
    say(f"{where:<13} {report.line()}")
    if report.http_parse_error:
        say(f"an HTTP response failed to parse: {report.http_parse_error}")
    return report


def _store_installed() -> bool:
    """Whether the span store's compiled engine is here (``otelkit[store]``: pyarrow, numba)."""
    return all(importlib.util.find_spec(name) is not None for name in ("pyarrow", "numba"))


def _breakdown(
    folder: Path, keys: tuple[str, ...], crashed_runs: set[str]
) -> dict[tuple[str, ...], Breakdown]:
    """The breakdown of the traces in ``folder`` by ``keys``, the runs cut short by a crash
    left out: in compiled code over the segments, each run its own group first, then the
    runs kept merged (a trace's components in the order the groups list them); by Python from JSON
    lines where the store is not installed."""
    if not _store_installed():
        traces = [
            trace
            for trace in build_traces(load_spans(folder)).values()
            if not any(str(r.attributes.get(RUN_ATTRIBUTE)) in crashed_runs for r in trace.roots)
        ]
        return breakdown(traces, group_by=keys, root_name=ROOT_SPAN)
    from otelkit.analysis._columns import breakdown_columns

    segments = sorted(folder.glob("spans-*.parquet"))
    by_run = breakdown_columns(segments, (*keys, RUN_ATTRIBUTE), ROOT_SPAN).groups
    merged: dict[tuple[str, ...], Breakdown] = {}
    for key, group in sorted(by_run.items()):
        if key[-1] in crashed_runs:
            continue
        into = merged.setdefault(key[:-1], Breakdown(key[:-1]))
        seen, adding = into.traces, group.traces
        for name in [*into.components, *(n for n in group.components if n not in into.components)]:
            values = into.components.setdefault(name, [0.0] * seen)
            values.extend(group.components.get(name, [0.0] * adding))
        into.problems += group.problems
        into.incomplete += group.incomplete
        into.parts |= group.parts
    return merged


def _report(
    out: Path,
    reports: list[tuple[str, RunReport]],
    threads: list[int],
    crashed_runs: set[str],
    restarts: list[Restart],
    label_problem: str | None,
    gave_up: str | None,
    study: StudyResults | None,
    study_problem: str | None,
) -> int:
    keys = (SERVER_ATTRIBUTE, PROTOCOL_ATTRIBUTE, OPTION_ATTRIBUTE, THREADS_ATTRIBUTE)
    groups = _breakdown(out / "traces", keys, crashed_runs)
    groups = {k: g for k, g in groups.items() if k[0] in ("none", "triton", "fastapi", "ray")}
    print("\n=== where the time goes, per event (mean ms), from the traces ===")
    print(format_breakdowns(groups, labels=("server", "protocol", "option", "threads")))
    print("\n=== throughput per service option ===")
    print(_throughput_table(reports, threads))
    if study is not None:
        print("\n=== what caps throughput: otelkit study of the ensemble on Triton, untraced ===")
        print(study.summary())
    problems = sum(len(g.problems) for g in groups.values())
    incomplete = sum(g.incomplete for g in groups.values())
    print(
        f"\nnesting check: {'every call consistent' if not problems else f'{problems} problems'}"
        " (stages and queue within their server span, which starts after its client span)"
    )
    if incomplete:
        print(
            f"{incomplete} events left out of the breakdown: a call's server spans are missing "
            "(over gRPC, tritonserver 2.51 loses some trace contexts: see README)"
        )
    print(f"\n=== Triton restarts: {len(restarts) or 'none'} ===")
    for number, restart in enumerate(restarts, start=1):
        print(f"{number}. {restart.line()}\n   (whole log: {restart.log})")
    summary = {
        "runs": [
            {
                "label": label,
                "option": r.option,
                "threads": r.threads,
                "events": r.events,
                "errors": r.errors,
                "events_per_s": round(r.throughput, 2),
                "p50_ms": round(r.percentile_ms(50), 3),
                "p99_ms": round(r.percentile_ms(99), 3),
                "error_kinds": dict(r.error_kinds),
                "http_parse_error": r.http_parse_error or None,
            }
            for label, r in reports
        ],
        "breakdown_ms": {
            "/".join(k): {name: round(g.mean(name) * 1e3, 4) for name in g.components}
            for k, g in groups.items()
        },
        "restarts": [asdict(restart) for restart in restarts],
        "triton_failure": gave_up,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    # the same traces as one HTML page: breakdown bars, waterfalls, facts (otelkit report)
    studies = [out / "study.jsonl"] if study is not None else []
    study_line = "".join(f"study:   {s.resolve()} (`otelkit study show`)\n" for s in studies)
    page = Report.build([out / "traces"], studies, group_by=keys, root_name=ROOT_SPAN)
    page.title = "make demo: the reference deployment"
    report_path = page.write_html(out / "report.html").resolve()
    held = "span store segments" if _store_installed() else "OTLP JSON lines"
    print(
        f"\ntraces:  {(out / 'traces').resolve()}/ ({held}; "
        f"`otelkit breakdown {out / 'traces'} --group-by {OPTION_ATTRIBUTE}` reads them)\n"
        f"metrics: {(out / 'metrics').resolve()}/ (Triton's nv_inference_*, the stage models' "
        "otelkit_stage_*, the client's otelkit_client_*, the twin's http_server_*, as scraped "
        "at the end)\n"
        f"summary: {(out / 'summary.json').resolve()}; Triton's log: {out / 'triton.log'}\n"
        f"{study_line}report:  {report_path} (open it in a browser; it needs nothing else)"
    )
    unexplained = [
        f"{', '.join(key)}: {line}" for key, g in groups.items() for line in g.unexplained()
    ]
    failed = failed_checks(label_problem, reports, problems, gave_up, study_problem, unexplained)
    if failed:
        print("\nFAILED checks:\n" + "\n".join(f"- {check}" for check in failed))
        return 1
    print(f"\nall checks passed ({len(reports)} runs, {len(restarts)} cut short by a crash)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
