"""One point driven by several client processes: their shared schedule and the merge of parts.

Client processes that drive the same sweep side by side (threads of one node, the tasks of a
Slurm job array, Ray tasks) each run ``otelkit study run`` with the same arguments, the same
schedule (point ``k`` starts at ``start_at + k × slot`` epoch seconds) and their own results
file, a *part*. ``merge_files`` makes one results file of the parts: each point's throughputs
add up and its percentiles come from every request (the merged histograms).

>>> part_arguments(["--url", "gpu:8000", "--model", "m"], 1, 4, start_at=1e9, slot_s=30,
...                directory="parts")[-6:]
['--start-at', '1000000000.0', '--slot', '30', '--out', 'parts/part-1-of-4.jsonl']

**A Slurm job array** drives the points, and a dependent job merges them: ``otelkit study slurm
--parts 4 --dir study-parts -- --url gpu-node:8000 --model m ...`` writes three files into
``--dir``:

- ``study-array.sbatch``: a job array of ``parts`` tasks; task ``i`` runs ``otelkit study run``
  with the given arguments, the shared schedule (``--start-at $OTELKIT_STUDY_START``, one
  ``--slot`` per point) and its own results file ``part-i-of-n.jsonl``;
- ``study-merge.sbatch``: ``otelkit study merge`` of the parts into ``study.jsonl``;
- ``submit.sh``: sets the schedule's start ``--lead`` seconds ahead (time for the array's tasks
  to be scheduled), submits the array, then the merge with ``--dependency=afterany`` on it
  (a failed part's points still merge, and the merged file says it failed).

Tasks that start after the first point's slot began exit naming it: give a longer ``--lead``
when the queue is slow. The 1,000-thread client of the NERSC study is ``--parts 4`` with
``--concurrency 250``, or one part with ``--concurrency 1000``.

>>> files = slurm_files(["--url", "gpu:8000", "--model", "m"], parts=2, directory="out")
>>> print(files["study-array.sbatch"].splitlines()[2])
#SBATCH --array=0-1
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from otelkit._errors import StudyError
from otelkit.study._point import merge_parts
from otelkit.study._results import ResultsWriter, StudyResults, read_results

__all__ = [
    "merge_files",
    "part_arguments",
    "part_path",
    "schedule_start",
    "slurm_files",
    "write_slurm_files",
]


#: The options of ``otelkit study run`` that the parts machinery sets itself.
OWN_OPTIONS = ("--start-at", "--slot", "--out")


def part_path(directory: str | Path, index: int, parts: int) -> str:
    """Where part ``index`` of ``parts`` writes its results."""
    return f"{Path(directory)}/part-{index}-of-{parts}.jsonl"


def part_arguments(
    run_args: Sequence[str],
    index: int,
    parts: int,
    *,
    start_at: float | str,
    slot_s: float,
    directory: str | Path,
) -> list[str]:
    """The ``otelkit study run`` arguments of part ``index``: the user's, then the schedule and
    the part's own results file. ``start_at`` may be text (``"$OTELKIT_STUDY_START"`` in a
    script, expanded where the part runs)."""
    taken = [a for a in run_args if a.split("=")[0] in OWN_OPTIONS]
    if taken:
        raise StudyError(f"the parts set {', '.join(OWN_OPTIONS)} themselves: drop {taken[0]}")
    if not 0 <= index < parts:
        raise StudyError(f"part {index} of {parts}: a part is 0 to {parts - 1}")
    if slot_s <= 0:
        raise StudyError(f"the slot is the seconds from one point to the next, not {slot_s}")
    start = start_at if isinstance(start_at, str) else repr(float(start_at))
    return [
        *run_args,
        "--start-at",
        start,
        "--slot",
        f"{slot_s:g}",
        "--out",
        part_path(directory, index, parts),
    ]


def schedule_start(now: float, lead_s: float) -> float:
    """The first point's start: ``lead_s`` from ``now``, on a whole second (readable in logs)."""
    return float(int(now + lead_s) + 1)


def merge_files(paths: Sequence[str | Path], out: str | Path) -> StudyResults:
    """One results file at ``out`` from the parts at ``paths``: point by point, throughputs
    summed and histograms merged; Triton's figures (its windows' too) and the traces are the
    first part's.

    A part that failed or was interrupted makes the merged file say so (with its message).
    """
    if not paths:
        raise StudyError("no parts to merge")
    parts = [read_results(p) for p in paths]
    first = parts[0]
    counts = {len(p.points) for p in parts}
    if len(counts) != 1:
        raise StudyError(f"the parts hold different numbers of points: {sorted(counts)}")
    merged = StudyResults({**first.header, "parts": [str(Path(p)) for p in paths]}, [])
    max_error_share = float(first.header.get("load", {}).get("max_error_share", 0.01))
    for index, point in enumerate(first.points):
        same = [p.points[index] for p in parts]
        if any(p.params != point.params for p in same):
            raise StudyError("the parts' points differ: not the same sweep", point=point.label)
        combined = merge_parts(same, max_error_share=max_error_share)
        combined.triton, combined.gpus, combined.traces = point.triton, point.gpus, point.traces
        combined.gpu_instances = point.gpu_instances
        if len(combined.windows) == len(point.windows):  # the server's parts, as its point's
            combined.windows = [
                replace(w, triton=p.triton)
                for w, p in zip(combined.windows, point.windows, strict=True)
            ]
        merged.points.append(combined)
    bad = [p for p in parts if p.status != "complete"]
    if bad:
        merged.status, merged.message = bad[0].status, bad[0].message
    merged.derive()
    with ResultsWriter(out, merged.header) as writer:
        for point in merged.points:
            writer.point(point)
        writer.finish(merged)
    return merged


ARRAY, MERGE, SUBMIT = "study-array.sbatch", "study-merge.sbatch", "submit.sh"
START_VARIABLE = "OTELKIT_STUDY_START"


def slurm_files(
    run_args: Sequence[str],
    *,
    parts: int,
    directory: str | Path,
    slot_s: float = 30.0,
    lead_s: float = 120.0,
    command: str = "otelkit",
    sbatch_options: Sequence[str] = (),
) -> dict[str, str]:
    """The array script, the merge script and the submit script, by file name.

    ``command`` starts otelkit on the nodes (``python -m otelkit.cli`` in a virtual
    environment, say); ``sbatch_options`` are extra ``#SBATCH`` lines' options
    (``--partition=cpu``, ``--time=00:30:00``).
    """
    if parts < 1:
        raise StudyError(f"--parts is the number of client processes, 1 or more, not {parts}")
    if lead_s < 0:
        raise StudyError(f"--lead is seconds ahead of submission, not {lead_s}")
    directory = Path(directory)
    start = f"${START_VARIABLE}"  # expanded on the node, from submit.sh's export
    task = part_arguments(run_args, 0, parts, start_at=start, slot_s=slot_s, directory=directory)
    out = task[-1].replace("part-0-of", "part-${SLURM_ARRAY_TASK_ID}-of")
    quoted = " ".join(f'"{a}"' if a == start else shlex.quote(a) for a in task[:-2])
    extra = "".join(f"#SBATCH {option}\n" for option in sbatch_options)
    array = (
        "#!/bin/bash\n"
        f"#SBATCH --job-name=otelkit-study\n#SBATCH --array=0-{parts - 1}\n"
        f"#SBATCH --ntasks=1\n#SBATCH --output={directory}/part-%a.log\n{extra}"
        "# one client process of the study: its part of every point, on the shared schedule\n"
        f': "${{{START_VARIABLE}:?submit.sh sets the schedule start}}"\n'
        f'exec {command} study run {quoted} --out "{out}"\n'
    )
    paths = " ".join(shlex.quote(part_path(directory, i, parts)) for i in range(parts))
    merge = (
        "#!/bin/bash\n"
        f"#SBATCH --job-name=otelkit-study-merge\n#SBATCH --ntasks=1\n"
        f"#SBATCH --output={directory}/merge.log\n{extra}"
        "# one point from the parts: throughputs summed, percentiles from every request\n"
        f"exec {command} study merge {paths} --out {shlex.quote(str(directory / 'study.jsonl'))}\n"
    )
    submit = (
        "#!/bin/bash\nset -euo pipefail\n"
        f'cd "$(dirname "$0")/{_up(directory)}"\n'
        "# every task starts the first point at the same moment, ahead of the queue's delay\n"
        f"export {START_VARIABLE}=$(( $(date +%s) + {int(lead_s)} ))\n"
        f'job=$(sbatch --parsable --export=ALL "{directory / ARRAY}")\n'
        f'sbatch --parsable --dependency=afterany:"${{job%%;*}}" "{directory / MERGE}"\n'
        f'echo "array job $job; the first point starts at ${START_VARIABLE}"\n'
    )
    return {ARRAY: array, MERGE: merge, SUBMIT: submit}


def _up(directory: Path) -> str:
    """From ``directory`` back to where the paths in the scripts are relative to."""
    if directory.is_absolute():
        return "."
    return "/".join(".." for _ in directory.parts) or "."


def write_slurm_files(files: Mapping[str, str], directory: str | Path) -> list[Path]:
    """``slurm_files``' files written into ``directory`` (created), the submit script
    executable; their paths, the submit script last."""
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        path = target / name
        path.write_text(text)
        if name == SUBMIT:
            path.chmod(0o755)
        written.append(path)
    return written
