"""``otelkit study``: run a sweep, show a results file, predict a change, compare two, merge
client parts.

    otelkit study run --triton tests/models --model sleep_fp32 \\
        --sweep instances=1,2 --sweep concurrency=1,2,4 --seconds 5 --out study.jsonl
    otelkit study run --url gpu-node:8000 --metrics-url http://gpu-node:8002/metrics \\
        --model exatrkx --rate 50 --sweep batch_size=1,4,16 --out batch.jsonl
    otelkit study show study.jsonl
    otelkit study predict study.jsonl --set sleep_fp32.instances=2 --confirm
    otelkit study compare before.jsonl after.jsonl
    otelkit study merge part-0.jsonl part-1.jsonl --out merged.jsonl
    otelkit study slurm --parts 4 --dir parts -- --url gpu-node:8000 --model m --concurrency 250
    otelkit study ray --parts 2 --dir parts -- --url gpu-node:8000 --model m --no-traces

Exit status: 0 when every point was measured; 1 when a point failed (the message names it, the
points done are in the file); 2 for a sweep or option that makes no sense; 130 after Ctrl-C.

``otelkit study run``'s arguments describe a study (``run_arguments``, ``run_study``). The
command line is also each part's interface when several client processes drive a point
(a Slurm job array's tasks run it as a command, Ray tasks call ``run_command``).

>>> parse_sweep(["instances=1,2", "option=ensemble"])
{'instances': [1, 2], 'option': ['ensemble']}

**On Ray tasks**: ``run_on_ray(run_args, parts=4)`` submits ``parts`` Ray tasks; each runs
``otelkit study run`` with the given arguments, the shared schedule and its own results file, in
a Ray worker process (on whichever node of the cluster Ray places it); the driver then merges
the parts into one results file. Ray is whatever ``ray.init`` finds: a running local Ray, the
cluster of ``RAY_ADDRESS``, or a new local one.

>>> merged = run_on_ray(["--url", "gpu-node:8000", "--model", "m", "--concurrency", "250",
...                      "--no-traces"], parts=4, directory="ray-parts")  # doctest: +SKIP

The parts' files are written where each task runs: on one node, or a shared file system
across nodes (as for Slurm). Each task asks Ray for ``cpus_per_part`` CPUs, so Ray spreads the
parts over the cluster's cores; a part that raises fails ``run_on_ray`` naming it.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from otelkit._core.extras import require
from otelkit._errors import StudyError
from otelkit.study._drive import Load
from otelkit.study._parts import (
    merge_files,
    part_arguments,
    part_path,
    schedule_start,
    slurm_files,
    write_slurm_files,
)
from otelkit.study._predict import Prediction
from otelkit.study._results import StudyResults, compare, format_comparison, read_results
from otelkit.study._runner import Study, Tracing
from otelkit.study._servers import Remote, Server, Triton

__all__ = [
    "add_arguments",
    "parse_sweep",
    "run",
    "run_arguments",
    "run_command",
    "run_on_ray",
    "run_part",
    "run_study",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="study_command", required=True, metavar="COMMAND")
    run_arguments(commands.add_parser("run", help="measure a sweep into a results file"))
    show = commands.add_parser("show", help="print a results file's table and verdicts")
    show.add_argument("results", help="a results file (JSON Lines)")
    show.add_argument("--derive", action="store_true", help="compute figures and verdicts again")
    predict_arguments(
        commands.add_parser(
            "predict", help="what a change would give, from the measured demands (derived)"
        )
    )
    both = commands.add_parser("compare", help="two results files: each change with an interval")
    both.add_argument("before")
    both.add_argument("after")
    both.add_argument("--confidence", type=float, default=0.95)
    merge = commands.add_parser("merge", help="merge client processes' parts into one file")
    merge.add_argument("parts", nargs="+", help="results files of the same sweep, run side by side")
    merge.add_argument("--out", required=True)
    for name, help_text in (
        ("slurm", "write a Slurm job array whose tasks drive the points"),
        ("ray", "drive the points with Ray tasks, then merge"),
    ):
        parts = commands.add_parser(name, help=help_text)
        parts.add_argument("--parts", type=int, required=True, help="client processes a point")
        parts.add_argument("--dir", required=True, help="where the parts' files go")
        parts.add_argument("--slot", type=float, default=30.0, help="seconds a point, at most")
        parts.add_argument("--lead", type=float, default=None, help="seconds before the first")
        parts.add_argument("run_args", nargs=argparse.REMAINDER, help="-- then `study run` args")
    slurm = commands.choices["slurm"]
    slurm.add_argument("--command", default="otelkit", help="how the nodes start otelkit")
    slurm.add_argument(
        "--sbatch",
        action="append",
        default=[],
        metavar="OPTION",
        help="an extra #SBATCH option: --sbatch=--partition=cpu",
    )


def run(args: argparse.Namespace) -> int:
    command = args.study_command
    try:
        if command == "run":
            return run_study(args)
        if command == "show":
            results = read_results(args.results)
            if args.derive:
                results.derive()
            print(results.summary())
            return 0
        if command == "predict":
            return predict_study(args)
        if command == "compare":
            differences, unmatched = compare(
                read_results(args.before), read_results(args.after), args.confidence
            )
            print(format_comparison(differences, unmatched, args.confidence))
            return 0
        if command == "merge":
            print(merge_files(args.parts, args.out).summary())
            return 0
        return _parts(args)
    except StudyError as error:
        print(error, file=sys.stderr)
        return 2
    except OSError as error:
        print(f"otelkit study: {error}", file=sys.stderr)
        return 2


def _parts(args: argparse.Namespace) -> int:
    run_args = [a for a in args.run_args if a != "--"]
    if args.study_command == "slurm":
        files = slurm_files(
            run_args,
            parts=args.parts,
            directory=args.dir,
            slot_s=args.slot,
            lead_s=120.0 if args.lead is None else args.lead,
            command=args.command,
            sbatch_options=args.sbatch,
        )
        written = write_slurm_files(files, args.dir)
        print("\n".join(map(str, written)) + f"\nsubmit: {written[-1]}")
        return 0
    merged = run_on_ray(
        run_args,
        parts=args.parts,
        directory=args.dir,
        slot_s=args.slot,
        lead_s=15.0 if args.lead is None else args.lead,
    )
    print(merged.summary())
    return 0 if merged.status == "complete" else 1


def parse_value(text: str) -> Any:
    """``4`` → 4, ``0.5`` → 0.5, anything else stays text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_sweep(items: list[str]) -> dict[str, list[Any]]:
    """``["instances=1,2", "concurrency=1,4"]`` → ``{"instances": [1, 2], ...}``."""
    sweep: dict[str, list[Any]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or not name or not values:
            raise StudyError(f"--sweep takes NAME=V1,V2,...: not {item!r}")
        sweep[name.strip()] = [parse_value(v.strip()) for v in values.split(",")]
    return sweep


def run_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``otelkit study run``."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--triton", metavar="REPOSITORY", help="launch tritonserver on it")
    where.add_argument("--url", help="host:port of a running KServe v2 server")
    where.add_argument(
        "--fleet",
        metavar="REPOSITORY",
        help="launch tritonservers on it behind Envoy, as many as the point's servers",
    )
    where.add_argument(
        "--ray-serve",
        metavar="MODULE:BUILDER",
        help="deploy builder(params, env_vars) on a local Ray Serve",
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="the model to call, inputs made from its metadata")
    what.add_argument(
        "--request",
        metavar="MODULE:FACTORY",
        help="factory(params, endpoint) returning request(index)",
    )
    parser.add_argument("--metrics-url", help="the server's Prometheus page (Triton: :8002)")
    parser.add_argument("--gpu-metrics-url", help="otelkit gpu-exporter's page: GPU per instance")
    parser.add_argument("--reconfigure", help="command run between points, {instances} replaced")
    parser.add_argument(
        "--restarts",
        type=int,
        default=0,
        help="times a point is measured again after the "
        "server it launched failed (tritonserver 2.51's tracing crash)",
    )
    parser.add_argument(
        "--link-gbps",
        type=float,
        default=None,
        help="the network's rate between clients and servers, Gb/s one way: weighs each "
        "request's tensor bytes against it",
    )
    parser.add_argument(
        "--etcd",
        metavar="URL",
        help="--fleet: register the servers in this etcd (default: a directory of the study's own)",
    )
    parser.add_argument(
        "--balancer-workers", type=int, default=1, help="--fleet: Envoy's worker threads"
    )
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight")
    parser.add_argument("--rate", type=float, help="open loop: Poisson arrivals a second")
    parser.add_argument("--asyncio", action="store_true", help="closed loop on asyncio tasks")
    parser.add_argument("--seconds", type=float, help="measured seconds a point (default 5)")
    parser.add_argument("--requests", type=int, help="or measured requests a point")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds left out first")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="measure each point this often, one pass over the sweep after another (3 or more)",
    )
    parser.add_argument("--sweep", action="append", default=[], metavar="NAME=V1,V2")
    parser.add_argument(
        "--traces-per-s", type=float, default=20.0, help="sampled requests a second"
    )
    parser.add_argument("--no-traces", action="store_true", help="send no trace context")
    parser.add_argument("--receiver-port", type=int, default=0, help="the embedded receiver's")
    parser.add_argument("--out", default="study.jsonl")
    parser.add_argument("--unit", default="request", help="what a request is called: event")
    parser.add_argument("--tolerance", type=float, default=0.1, help="knee and flatness, 0.1")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a request may take")
    parser.add_argument("--start-at", type=float, help="epoch seconds the first point starts at")
    parser.add_argument("--slot", type=float, help="seconds from one point's start to the next")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def _study(args: argparse.Namespace) -> Study:
    server: Server
    if args.triton:
        server = Triton(args.triton)
    elif args.fleet:
        from otelkit.fleet._registry import EtcdRegistry
        from otelkit.study._fleet import Fleet

        registry = EtcdRegistry(args.etcd) if args.etcd else None
        server = Fleet(args.fleet, registry=registry, balancer_workers=args.balancer_workers)
    elif args.ray_serve:
        from otelkit.study._servers import RayServe  # Ray only when asked for

        server = RayServe(args.ray_serve)
    else:
        server = Remote(args.url, metrics_url=args.metrics_url, reconfigure=args.reconfigure)
    load = Load(
        concurrency=args.concurrency,
        rate=args.rate,
        seconds=args.seconds,
        requests=args.requests,
        warmup_s=args.warmup,
        asyncio=args.asyncio,
        repeats=args.repeats,
    )
    tracing = None if args.no_traces else Tracing(args.traces_per_s, port=args.receiver_port)
    request = None
    if args.request:
        module, _, name = args.request.partition(":")
        request = getattr(importlib.import_module(module), name)
    return Study(
        model=args.model,
        request=request,
        server=server,
        protocol=args.protocol,
        batch_size=args.batch_size,
        load=load,
        sweep=parse_sweep(args.sweep),
        tracing=tracing,
        out=args.out,
        unit=args.unit,
        tolerance=args.tolerance,
        progress=not args.quiet,
        timeout_s=args.timeout,
        start_at=args.start_at,
        slot_s=args.slot,
        gpu_metrics_url=args.gpu_metrics_url,
        restarts=args.restarts,
        link_gbps=args.link_gbps,
    )


def run_study(args: argparse.Namespace) -> int:
    """Run the study ``args`` describe; the exit status (0, 1 a point failed, 130 Ctrl-C)."""
    study = _study(args)  # a StudyError here is a usage error: exit 2
    try:
        results = study.run()
    except StudyError as error:
        if error.results is None:
            raise
        print(error.results.summary())
        print(f"\n{error}\n(the points done are in {study.out})", file=sys.stderr)
        return 1
    print(results.summary())
    if results.interrupted:
        print(f"interrupted: the points done are in {study.out}", file=sys.stderr)
        return 130
    print(f"\nthe report, with the study's traces: {report_command(results)}")
    return 0


def report_command(results: StudyResults) -> str:
    """The command that makes the page of a study's results and the traces it wrote.

    >>> from pathlib import Path
    >>> report_command(StudyResults({"traces": "study-files/traces"}, [], path=Path("study.jsonl")))
    'otelkit report --study study.jsonl --out study.html'
    """
    out = results.path if results.path is not None else Path("study.jsonl")
    page = out.with_suffix(".html")
    return f"otelkit report --study {shlex.quote(str(out))} --out {shlex.quote(str(page))}"


def run_command(args: list[str]) -> int:
    """``otelkit study run ARGS`` in this process; its exit status (2: a usage error)."""
    parser = argparse.ArgumentParser(prog="otelkit study run")
    run_arguments(parser)
    try:
        return run_study(parser.parse_args(args))
    except StudyError as error:
        print(error, file=sys.stderr)
        return 2


def predict_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", help="a results file (JSON Lines)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        dest="changes",
        required=True,
        metavar="RESOURCE.SETTING=N",
        help="gnn.instances=2, gnn.replicas=2, host.cores=4, client.processes=2",
    )
    parser.add_argument("--at", default=None, help="loads to predict at (1,8,32): the curve's")
    parser.add_argument(
        "--confirm",
        action="store_true",
        help="measure the changed deployment beside the prediction (a Triton the study launched)",
    )
    parser.add_argument("--out", default=None, help="the confirming study's results file")
    parser.add_argument("--seconds", type=float, default=None, help="measured seconds a point")


def predict_study(args: argparse.Namespace) -> int:
    """``otelkit study predict``: the prediction, and with ``--confirm`` the measurement."""
    results = read_results(args.results)
    loads = [float(v) for v in parse_sweep([f"at={args.at}"])["at"]] if args.at else None
    unit = str(results.header.get("unit", "request"))
    predictions = results.predict(args.changes, loads=loads)
    if not predictions:
        raise StudyError("no curve along concurrency or rate in the results to predict")
    for prediction in predictions:
        print(prediction.summary(unit))
    if not args.confirm:
        return 0
    out = Path(args.out or Path(args.results).with_suffix(".confirm.jsonl"))
    for prediction in predictions:
        measured = confirm(results, prediction, out=out, seconds=args.seconds)
        print(compare_prediction(prediction, measured, unit))
    return 0


def confirm(
    results: StudyResults, prediction: Prediction, *, out: Path, seconds: float | None = None
) -> StudyResults:
    """The changed deployment measured at the prediction's loads: a model's instances or the
    request's batch size changed, on a Triton the study launched, the rest as it was."""
    header = results.header
    server = header.get("server") or {}
    if server.get("kind") != "triton":
        raise StudyError(
            "--confirm changes and restarts a Triton the study launched (study run --triton); "
            "for another server, make the change and run the study again"
        )
    if header.get("model") is None:
        raise StudyError("--confirm calls the study's model: this study called a function")
    models = {r: c for r, c in prediction.changes.items() if r != "request"}
    counts = {c.get("instances", c.get("replicas")) for c in models.values()}
    if any(set(c) - {"instances", "replicas"} for c in models.values()) or len(counts) > 1:
        raise StudyError(
            "--confirm measures one instance count set on models and the request's batch "
            "size: the host's cores and the client's processes are not the study's to change"
        )
    sweep: dict[str, list[Any]] = {}
    if models:
        sweep["instances"] = [counts.pop()]
    fixed = _params(prediction.curve) if prediction.curve else {}
    sweep.update({k: [v] for k, v in fixed.items() if k not in sweep})
    batch = prediction.changes.get("request", {}).get("batch_size")
    if batch is not None:
        sweep["batch_size"] = [batch]
    sweep[prediction.axis] = [
        p.load if prediction.axis == "rate" else int(p.load) for p in prediction.points
    ]
    load = Load(**{k: v for k, v in header["load"].items() if k in Load.__dataclass_fields__})
    if seconds is not None:
        load = replace(load, seconds=seconds, requests=None)
    study = Study(
        model=str(header["model"]),
        server=Triton(server["repository"], models=sorted(models) or server.get("models", [])),
        protocol="grpc" if header.get("protocol") == "grpc" else "http",
        load=load,
        sweep=sweep,
        tracing=None,
        out=out,
        unit=str(header.get("unit", "request")),
        progress=False,
    )
    return study.run()


def _params(label: str) -> dict[str, Any]:
    return {k: parse_value(v) for k, _, v in (w.partition("=") for w in label.split())}


def compare_prediction(prediction: Prediction, measured: StudyResults, unit: str) -> str:
    """Predicted against measured, load by load."""
    lines = [f"confirmed [{prediction.curve or 'all'}]: predicted (derived) against measured"]
    for predicted in prediction.points:
        load = predicted.load if prediction.axis == "rate" else int(predicted.load)
        point = measured.point(**{prediction.axis: load})
        ratio = point.throughput / predicted.throughput if predicted.throughput else 0.0
        lines.append(
            f"  {prediction.axis}={predicted.load:g}: predicted "
            f"{predicted.throughput:.0f}, measured {point.throughput:.0f} {unit}s/s "
            f"(measured / predicted {ratio:.2f})"
        )
    return "\n".join(lines)


def run_part(args: Sequence[str]) -> int:
    """One part: ``otelkit study run`` with ``args`` in this process; its exit status."""
    return run_command([*args, "--quiet"])


def run_on_ray(
    run_args: Sequence[str],
    *,
    parts: int,
    directory: str | Path,
    slot_s: float = 20.0,
    lead_s: float = 15.0,
    cpus_per_part: float = 1.0,
    out: str | Path | None = None,
) -> StudyResults:
    """Drive each point with ``parts`` Ray tasks side by side; the merged results (also in
    ``out``, default ``directory/study.jsonl``).

    ``lead_s`` is the time the tasks have to be placed and started before the first point;
    ``slot_s`` the seconds from one point's start to the next (warm-up, measuring, reading).
    """
    if parts < 1:
        raise StudyError(f"parts is the number of client processes, 1 or more, not {parts}")
    ray: Any = require("ray", extra="ray", feature="otelkit study on Ray tasks")
    if not ray.is_initialized():
        ray.init(log_to_driver=False)
    Path(directory).mkdir(parents=True, exist_ok=True)
    start = schedule_start(time.time(), lead_s)
    task = ray.remote(num_cpus=cpus_per_part, max_retries=0)(run_part)
    arguments = [
        part_arguments(run_args, i, parts, start_at=start, slot_s=slot_s, directory=directory)
        for i in range(parts)
    ]
    statuses = ray.get([task.remote(args) for args in arguments])
    failed = [i for i, status in enumerate(statuses) if status not in (0, 1)]
    if failed:  # 1: a point failed, and the part's file says which; merge still tells it
        raise StudyError(
            f"Ray task of part {failed[0]} of {parts} exited with {statuses[failed[0]]}: "
            f"see {part_path(directory, failed[0], parts)}"
        )
    return merge_files(
        [part_path(directory, i, parts) for i in range(parts)],
        out if out is not None else Path(directory) / "study.jsonl",
    )
