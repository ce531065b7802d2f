"""Import cost: ``import otelkit`` in a fresh interpreter, this tree against an earlier commit's.

The earlier commit's ``otelkit/`` (d811eec by default, the commit issue 39 measured) is
extracted with ``git archive`` into a temporary directory. Each round starts two fresh
processes of this interpreter, one with ``PYTHONPATH`` on each tree (who goes first alternates),
and each times its own ``import otelkit`` with ``time.perf_counter``: the interpreter's start
and ``site`` are the same for both and left out. One uncounted round first writes both trees'
bytecode caches, so every counted import reads ``.pyc`` files, as an installed package does.

Medians of each path and the ratio (this tree over the earlier one) with its 95 % interval (a
bootstrap over the rounds, ``medians``); the last line is JSON, with a verdict on the target:
at most 0.40 of the earlier commit's time. ``--configure`` times ``import otelkit`` and then
``configure()`` with the embedded default (OTLP-JSON lines to a temporary directory), what a
Triton Python-backend instance does in ``initialize``; it has no target.

    python benchmarks/bench_import.py [--rounds 30] [--before d811eec] [--configure]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from medians import ratio_interval, verdict  # benchmarks/, this script's directory

ROOT = Path(__file__).resolve().parents[1]  # the repository: this tree's otelkit/ is in it
RATIO = 0.40  # the target
# The child prints the seconds its import took and where otelkit came from, to check the path.
CHILD = (
    "import tempfile, time; start = time.perf_counter(); import otelkit; {configure}"
    "took = time.perf_counter() - start; print(took, otelkit.__file__)"
)
CONFIGURE = (
    "otelkit.configure(service_name='bench-import', traces_dir=tempfile.mkdtemp()); "
    "otelkit.shutdown(); "
)


def extract(commit: str, into: Path) -> Path:
    """``commit``'s ``otelkit/`` under ``into``; returns the directory for ``PYTHONPATH``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "otelkit"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def import_seconds(tree: Path, configure: bool = False) -> float:
    """Seconds ``import otelkit`` (and ``configure()``) took in a fresh interpreter that finds
    it in ``tree``."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("OTEL_", "OTELKIT_")) and name != "PYTHONDONTWRITEBYTECODE"
    }
    environment["PYTHONPATH"] = str(tree)
    code = CHILD.format(configure=CONFIGURE if configure else "")
    found = subprocess.run(  # in ``tree``: ``-c`` puts the working directory first on sys.path
        [sys.executable, "-c", code],
        cwd=tree,
        env=environment,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    took, path = float(found[0]), Path(found[1])
    if not path.is_relative_to(tree):
        raise RuntimeError(f"otelkit came from {path}, not from {tree}: check sys.path")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="imports of each tree")
    parser.add_argument("--before", default="d811eec", help="the commit to compare with")
    parser.add_argument("--configure", action="store_true", help="time configure() too (no target)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-import-") as scratch:
        trees = {"before": extract(args.before, Path(scratch)), "after": ROOT}
        for tree in trees.values():
            import_seconds(tree, args.configure)  # writes the bytecode caches; not counted
        times: dict[str, list[float]] = {"before": [], "after": []}
        for index in range(args.rounds):
            order = list(trees) if index % 2 == 0 else list(reversed(trees))
            for which in order:
                times[which].append(1e3 * import_seconds(trees[which], args.configure))
    before, after = (statistics.median(times[which]) for which in ("before", "after"))
    ratio = after / before
    interval = ratio_interval(times["before"], times["after"])
    found = verdict(ratio, interval, RATIO)
    timed = "import otelkit and configure()" if args.configure else "import otelkit"
    print(
        f"{timed}: {args.before} median {before:.1f} ms, this tree {after:.1f} ms; "
        f"ratio {ratio:.3f} (95 % {interval[0]:.3f} to {interval[1]:.3f})"
        + ("" if args.configure else f", at most {RATIO:g}: {found['verdict']}")
        + f" ({args.rounds} fresh processes each, interleaved)"
    )
    print(
        json.dumps(
            {
                "timed": timed,
                "rounds": args.rounds,
                "before": args.before,
                "python": sys.version.split()[0],
                "before_median_ms": round(before, 1),
                "after_median_ms": round(after, 1),
                "ratio": round(ratio, 3),
                "ratio_interval95": [round(bound, 3) for bound in interval],
                "targets": {} if args.configure else {"ratio_to_before": found},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
