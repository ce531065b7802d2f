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
"""

from __future__ import annotations

import argparse
import sys

from otelkit.errors import StudyError
from otelkit.study.arguments import (
    parse_sweep,
    predict_arguments,
    predict_study,
    run_arguments,
    run_study,
)
from otelkit.study.compare import compare, format_comparison
from otelkit.study.parts import merge_files
from otelkit.study.ray_parts import run_on_ray
from otelkit.study.results import read_results
from otelkit.study.slurm import slurm_files, write_slurm_files

__all__ = ["add_arguments", "parse_sweep", "run"]


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
            run_args, parts=args.parts, directory=args.dir, slot_s=args.slot,
            lead_s=120.0 if args.lead is None else args.lead, command=args.command,
            sbatch_options=args.sbatch,
        )  # fmt: skip
        written = write_slurm_files(files, args.dir)
        print("\n".join(map(str, written)) + f"\nsubmit: {written[-1]}")
        return 0
    merged = run_on_ray(run_args, parts=args.parts, directory=args.dir, slot_s=args.slot,
                        lead_s=15.0 if args.lead is None else args.lead)  # fmt: skip
    print(merged.summary())
    return 0 if merged.status == "complete" else 1
