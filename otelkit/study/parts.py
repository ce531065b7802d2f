"""One point driven by several client processes: their shared schedule and the merge of parts.

Client processes that drive the same sweep side by side (threads of one node, the tasks of a
Slurm job array, Ray tasks) each run ``otelkit study run`` with the same arguments, the same
schedule (point ``k`` starts at ``start_at + k × slot`` epoch seconds) and their own results
file, a *part*. ``merge_files`` makes one results file of the parts: each point's throughputs
add up and its percentiles come from every request (the merged histograms).

>>> part_arguments(["--url", "gpu:8000", "--model", "m"], 1, 4, start_at=1e9, slot_s=30,
...                directory="parts")[-6:]
['--start-at', '1000000000.0', '--slot', '30', '--out', 'parts/part-1-of-4.jsonl']
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from otelkit.errors import StudyError
from otelkit.study.point import merge_parts
from otelkit.study.results import ResultsWriter, StudyResults, read_results

__all__ = ["merge_files", "part_arguments", "part_path", "schedule_start"]

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
    return [*run_args, "--start-at", start, "--slot", f"{slot_s:g}",
            "--out", part_path(directory, index, parts)]  # fmt: skip


def schedule_start(now: float, lead_s: float) -> float:
    """The first point's start: ``lead_s`` from ``now``, on a whole second (readable in logs)."""
    return float(int(now + lead_s) + 1)


def merge_files(paths: Sequence[str | Path], out: str | Path) -> StudyResults:
    """One results file at ``out`` from the parts at ``paths``: point by point, throughputs
    summed and histograms merged; Triton's figures and the traces are the first part's.

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
