"""A study's points driven by several client processes as Ray tasks, then merged.

``run_on_ray(run_args, parts=4)`` submits ``parts`` Ray tasks; each runs ``otelkit study run``
with the given arguments, the shared schedule and its own results file, in a Ray worker
process (on whichever node of the cluster Ray places it); the driver then merges the parts
into one results file. Ray is whatever ``ray.init`` finds: a running local Ray, the cluster of
``RAY_ADDRESS``, or a new local one.

>>> merged = run_on_ray(["--url", "gpu-node:8000", "--model", "m", "--concurrency", "250",
...                      "--no-traces"], parts=4, directory="ray-parts")  # doctest: +SKIP

The parts' files are written where each task runs: on one node, or a shared file system
across nodes (as for Slurm). Each task asks Ray for ``cpus_per_part`` CPUs, so Ray spreads the
parts over the cluster's cores; a part that raises fails ``run_on_ray`` naming it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from otelkit._core.extras import require
from otelkit.errors import StudyError
from otelkit.study.arguments import run_command
from otelkit.study.parts import merge_files, part_arguments, part_path, schedule_start
from otelkit.study.results import StudyResults

__all__ = ["run_on_ray", "run_part"]


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
    arguments = [part_arguments(run_args, i, parts, start_at=start, slot_s=slot_s,
                                directory=directory) for i in range(parts)]  # fmt: skip
    statuses = ray.get([task.remote(args) for args in arguments])
    failed = [i for i, status in enumerate(statuses) if status not in (0, 1)]
    if failed:  # 1: a point failed, and the part's file says which; merge still tells it
        raise StudyError(
            f"Ray task of part {failed[0]} of {parts} exited with {statuses[failed[0]]}: "
            f"see {part_path(directory, failed[0], parts)}"
        )
    return merge_files([part_path(directory, i, parts) for i in range(parts)],
                       out if out is not None else Path(directory) / "study.jsonl")  # fmt: skip
