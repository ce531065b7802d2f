"""``otelkit study``: run a sweep, show a results file, compare two, merge client parts.

    otelkit study run --triton tests/models --model sleep_fp32 \\
        --sweep instances=1,2 --sweep concurrency=1,2,4 --seconds 5 --out study.jsonl
    otelkit study run --url gpu-node:8000 --metrics-url http://gpu-node:8002/metrics \\
        --model exatrkx --rate 50 --sweep batch_size=1,4,16 --out batch.jsonl
    otelkit study show study.jsonl
    otelkit study compare before.jsonl after.jsonl
    otelkit study merge part-0.jsonl part-1.jsonl --out merged.jsonl
    otelkit study slurm --parts 4 --dir parts -- --url gpu-node:8000 --model m --concurrency 250
    otelkit study ray --parts 2 --dir parts -- --url gpu-node:8000 --model m --no-traces

Exit status: 0 when every point was measured; 1 when a point failed (the message names it, the
points done are in the file); 2 for a sweep or option that makes no sense; 130 after Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from otelkit.errors import StudyError
from otelkit.study.compare import compare, format_comparison
from otelkit.study.load import Load
from otelkit.study.parts import merge_files
from otelkit.study.ray_tasks import run_on_ray
from otelkit.study.results import read_results
from otelkit.study.runner import Study, Tracing
from otelkit.study.servers import Remote, Server, Triton
from otelkit.study.slurm import write_slurm_files

__all__ = ["add_arguments", "parse_sweep", "run"]


def parse_value(text: str) -> Any:
    """``4`` → 4, ``0.5`` → 0.5, anything else stays text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_sweep(items: list[str]) -> dict[str, list[Any]]:
    """``["instances=1,2", "concurrency=1,4"]`` → ``{"instances": [1, 2], ...}``.

    >>> parse_sweep(["instances=1,2", "option=ensemble"])
    {'instances': [1, 2], 'option': ['ensemble']}
    """
    sweep: dict[str, list[Any]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or not name or not values:
            raise StudyError(f"--sweep takes NAME=V1,V2,...: not {item!r}")
        sweep[name.strip()] = [parse_value(v.strip()) for v in values.split(",")]
    return sweep


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="study_command", required=True, metavar="COMMAND")
    _run_arguments(commands.add_parser("run", help="measure a sweep into a results file"))
    show = commands.add_parser("show", help="print a results file's table and verdicts")
    show.add_argument("results", help="a results file (JSON Lines)")
    show.add_argument("--derive", action="store_true", help="compute figures and verdicts again")
    both = commands.add_parser("compare", help="two results files: each change with an interval")
    both.add_argument("before")
    both.add_argument("after")
    both.add_argument("--confidence", type=float, default=0.95)
    merge = commands.add_parser("merge", help="merge client processes' parts into one file")
    merge.add_argument("parts", nargs="+", help="results files of the same sweep, run side by side")
    merge.add_argument("--out", required=True)
    for name, help_text in (("slurm", "write a Slurm job array whose tasks drive the points"),
                            ("ray", "drive the points with Ray tasks, then merge")):  # fmt: skip
        parts = commands.add_parser(name, help=help_text)
        parts.add_argument("--parts", type=int, required=True, help="client processes a point")
        parts.add_argument("--dir", required=True, help="where the parts' files go")
        parts.add_argument("--slot", type=float, default=30.0, help="seconds a point, at most")
        parts.add_argument("--lead", type=float, default=None, help="seconds before the first")
        parts.add_argument("run_args", nargs=argparse.REMAINDER, help="-- then `study run` args")
    slurm = commands.choices["slurm"]
    slurm.add_argument("--command", default="otelkit", help="how the nodes start otelkit")
    slurm.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                       help="an extra #SBATCH option: --sbatch=--partition=cpu")  # fmt: skip


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--triton", metavar="REPOSITORY", help="launch tritonserver on it")
    where.add_argument("--url", help="host:port of a running KServe v2 server")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="the model to call, inputs made from its metadata")
    what.add_argument("--request", metavar="MODULE:FACTORY",
                      help="factory(params, endpoint) returning request(index)")  # fmt: skip
    parser.add_argument("--metrics-url", help="the server's Prometheus page (Triton: :8002)")
    parser.add_argument("--gpu-metrics-url", help="otelkit gpu-exporter's page: GPU per instance")
    parser.add_argument("--reconfigure", help="command run between points, {instances} replaced")
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight")
    parser.add_argument("--rate", type=float, help="open loop: Poisson arrivals a second")
    parser.add_argument("--asyncio", action="store_true", help="closed loop on asyncio tasks")
    parser.add_argument("--seconds", type=float, help="measured seconds a point (default 5)")
    parser.add_argument("--requests", type=int, help="or measured requests a point")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds left out first")
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
    else:
        server = Remote(args.url, metrics_url=args.metrics_url, reconfigure=args.reconfigure)
    load = Load(concurrency=args.concurrency, rate=args.rate, seconds=args.seconds,
                requests=args.requests, warmup_s=args.warmup, asyncio=args.asyncio)  # fmt: skip
    tracing = None if args.no_traces else Tracing(args.traces_per_s, port=args.receiver_port)
    request = None
    if args.request:
        module, _, name = args.request.partition(":")
        request = getattr(importlib.import_module(module), name)
    return Study(
        model=args.model, request=request, server=server, protocol=args.protocol,
        batch_size=args.batch_size, load=load, sweep=parse_sweep(args.sweep), tracing=tracing,
        out=args.out, unit=args.unit, tolerance=args.tolerance, progress=not args.quiet,
        timeout_s=args.timeout, start_at=args.start_at, slot_s=args.slot,
        gpu_metrics_url=args.gpu_metrics_url,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    command = args.study_command
    try:
        if command == "run":
            return _run(args)
        if command == "show":
            results = read_results(args.results)
            if args.derive:
                results.derive()
            print(results.summary())
            return 0
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


def _run(args: argparse.Namespace) -> int:
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
    return 0


def _parts(args: argparse.Namespace) -> int:
    run_args = [a for a in args.run_args if a != "--"]
    if args.study_command == "slurm":
        written = write_slurm_files(
            run_args, parts=args.parts, directory=args.dir, slot_s=args.slot,
            lead_s=120.0 if args.lead is None else args.lead, command=args.command,
            sbatch_options=args.sbatch,
        )  # fmt: skip
        print("\n".join(map(str, written)) + f"\nsubmit: {written[-1]}")
        return 0
    merged = run_on_ray(run_args, parts=args.parts, directory=args.dir, slot_s=args.slot,
                        lead_s=15.0 if args.lead is None else args.lead)  # fmt: skip
    print(merged.summary())
    return 0 if merged.status == "complete" else 1
