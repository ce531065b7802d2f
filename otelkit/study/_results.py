"""The results file (JSON Lines, one record per point, then the derived table and the verdicts),
and two of them compared.

The first line describes the study (``"record": "study"``: its sweep, load, server, the otelkit
version); each point is appended as soon as it is measured (``"record": "point"``), so a sweep
stopped by Ctrl-C or by a failed point keeps the points done; then one line per derived figure
(``"record": "derived"``) and per verdict (``"record": "verdict"``), and a last line saying how
the study ended (``"record": "end"``: complete, interrupted or failed, with the message).
Notebooks read it with ``read_results`` or line by line with ``json``.

>>> results = StudyResults({"unit": "request"}, [])
>>> results.derive()
>>> results.verdicts
[]

**Two results files side by side** (before and after a change), each difference with an
interval. Points are matched by their parameters. For throughput and the p50 and p99 latency,
the difference (after − before) comes with a confidence interval from the spread of each point's
equal parts of its measured window (batch means, which tolerate the correlation between
successive requests) and Welch's t: a difference whose interval holds 0 is no change.

>>> low, high = interval([100.0, 102.0, 98.0, 101.0], [110.0, 112.0, 109.0, 111.0])
>>> round(low, 1), round(high, 1)
(7.6, 12.9)
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from otelkit.analysis._breakdown import TOTAL
from otelkit.study import _derived as derived
from otelkit.study._counters import per_model
from otelkit.study._derived import Row
from otelkit.study._falsify import Contradiction, contradictions
from otelkit.study._point import Point
from otelkit.study._predict import Prediction, parse_changes, predict
from otelkit.study._stats import interval
from otelkit.study._verdicts import Verdict, verdicts

__all__ = [
    "Difference",
    "ResultsWriter",
    "StudyResults",
    "compare",
    "format_comparison",
    "interval",
    "read_results",
]


@dataclass
class StudyResults:
    """A study's points, the figures derived across them and one verdict per curve."""

    header: dict[str, Any]
    points: list[Point]
    derived: list[Row] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    status: str = "complete"  # complete, interrupted, failed
    message: str = ""
    path: Path | None = None

    @property
    def interrupted(self) -> bool:
        return self.status == "interrupted"

    def point(self, **params: Any) -> Point:
        """The point whose parameters include ``params``: ``results.point(concurrency=4)``."""
        found = [p for p in self.points if all(p.params.get(k) == v for k, v in params.items())]
        if len(found) != 1:
            raise KeyError(f"{len(found)} points with {params}")
        return found[0]

    def figure(self, name: str) -> list[Row]:
        """The derived rows of one figure: efficiency, strong_scaling, knee, ..."""
        return [row for row in self.derived if row.figure == name]

    def derive(self, tolerance: float | None = None, unit: str | None = None) -> None:
        """Compute the derived figures and verdicts from the points (again)."""
        tolerance = float(self.header.get("tolerance", 0.1) if tolerance is None else tolerance)
        unit = str(self.header.get("unit", "request") if unit is None else unit)
        ok = [p for p in self.points if p.status == "ok"]
        self.derived = [
            *derived.efficiency(ok),
            *derived.server_efficiency(ok),
            *derived.strong_scaling(ok),
            *derived.throughput_by_batch(ok),
            *derived.offload_overhead(ok),
            *derived.knees(ok, tolerance),
        ]
        self.verdicts = verdicts(self.points, unit=unit, tolerance=tolerance)

    def contradictions(self) -> list[Contradiction]:
        """Each claim of the verdicts that a measured point refutes beyond its noise: none for
        the verdicts ``derive`` makes; a file written by an older otelkit may hold some.

        >>> [str(c) for c in results.contradictions()]  # doctest: +SKIP
        """
        tolerance = float(self.header.get("tolerance", 0.1))
        return contradictions(self.verdicts, self.points, tolerance)

    def predict(
        self,
        changes: Mapping[str, Mapping[str, int]] | Sequence[str],
        *,
        loads: Sequence[float] | None = None,
    ) -> list[Prediction]:
        """Throughput and latency along each curve if ``changes`` were made, derived from the
        lowest point's demands by mean value analysis (``otelkit.study._predict``).

        >>> results.predict(["gnn.instances=2"])  # doctest: +SKIP
        >>> results.predict({"host": {"cores": 8}}, loads=[16, 32])  # doctest: +SKIP
        """
        if not isinstance(changes, Mapping):
            changes = parse_changes(list(changes))
        tolerance = float(self.header.get("tolerance", 0.1))
        return predict(self.points, changes, loads=loads, tolerance=tolerance)

    def summary(self) -> str:
        """The terminal table: one line per point, the derived figures, the verdicts."""
        unit = str(self.header.get("unit", "request"))
        width = max([len(p.label) for p in self.points] + [5])
        # a server that refused: what was offered, served (goodput) and refused, side by side
        shed = any(p.refused for p in self.points)
        rates = f"{'offered/s':>10} {'served/s':>10} {'refused/s':>10}" if shed else ""
        lines = [
            f"{'point':<{width}} {rates or f'{unit}s/s':>10} {'p50 ms':>8} {'p90 ms':>8} "
            f"{'p99 ms':>8} {'max ms':>8} {'errors':>6} {'cores':>5}  server and traces"
        ]
        for point in self.points:
            lines.append(_point_line(point, width, shed))
        if self.derived:
            lines.append("")
            lines += [_row_line(row) for row in self.derived]
        if self.verdicts:
            lines.append("")
            for v in self.verdicts:
                lines.append(f"verdict [{v.curve or 'all'}] {v.kind}: {v.sentence}")
                if v.change:
                    lines.append(f"  what to change: {v.change}")
        if self.status != "complete":
            lines += ["", f"study {self.status}: {self.message}"]
        return "\n".join(lines)


def _point_line(point: Point, width: int, shed: bool = False) -> str:
    if point.status not in ("ok", "errors"):
        return f"{point.label:<{width}} failed: {point.error}"
    extra = []
    if point.status == "errors":
        extra.append(f"too many errors, left out of the figures below: {point.error}")
    if point.refused:
        extra.append(
            "refused: " + ", ".join(f"{n} {reason}" for reason, n in sorted(point.refused.items()))
        )
    if point.failed:
        p50, p99 = point.all_requests_ms(0.5), point.all_requests_ms(0.99)
        extra.append(f"all requests, the failed too: p50 {p50:.2f}, p99 {p99:.2f} ms")
    for model, figures in point.triton.items():
        extra.append(
            f"{model}: queue {figures.queue_ms:.2f} ms, compute {figures.compute_ms:.2f} ms, "
            f"batch {figures.batch_size:.1f}, saturation {figures.saturation_ms:.2f} ms/exec"
        )
    traces = point.traces
    if traces is not None and traces.traces:
        parts = sorted(
            ((n, c.mean_ms) for n, c in traces.components.items() if n != TOTAL),
            key=lambda item: -item[1],
        )[:3]
        top = ", ".join(f"{n} {ms:.2f}" for n, ms in parts)
        extra.append(f"{traces.traces} traces: {top} ms")
    if point.restarts:
        extra.append(
            f"measured again after {len(point.restarts)} server failure(s): "
            f"{point.restarts[-1].splitlines()[0]}"
        )
    for model, gpu in per_model(point.gpu_instances).items():
        share = f" ({gpu['memory_share']:.0%} of a GPU)" if "memory_share" in gpu else ""
        extra.append(
            f"{model}: {gpu['instances']:.0f} on GPUs, "
            f"{gpu['memory_bytes'] / 2**30:.2f} GiB each{share}"
        )
    offered = f"{point.offered:>10.1f} " if shed else ""
    refused = f" {point.refused_per_s:>10.1f}" if shed else ""
    return (
        f"{point.label:<{width}} {offered}{point.throughput:>10.1f}{refused} "
        f"{point.latency_ms(0.5):>8.2f} "
        f"{point.latency_ms(0.9):>8.2f} {point.latency_ms(0.99):>8.2f} "
        f"{point.histogram.max_s * 1e3:>8.2f} {point.failed:>6} {point.cpu_cores:>5.2f}  "
        + "; ".join(extra)
    )


def _row_line(row: Row) -> str:
    curve = f" [{row.curve}]" if row.curve else ""
    at = f" at {row.axis}={row.at}" if row.axis else ""
    if row.figure == "knee":
        state = "plateau" if row.detail.get("plateau") else "still rising"
        return (
            f"knee{curve}{at}: {row.value:.1f}/s, within {row.detail['tolerance'] * 100:.0f} % "
            f"of the highest {row.detail['highest']:.1f}/s ({state})"
        )
    if row.figure == "throughput_n_over_l":
        return (
            f"T = N/ℓ (derived: batch over mean latency, as at 1 request in flight){curve}{at}: "
            f"{row.value:.1f} inferences/s; measured {row.detail['measured_items_per_s']:.1f}"
        )
    return f"{row.figure}{curve}{at}: {row.value:.3g}"


class ResultsWriter:
    """Appends a study's records to its results file as they come; a context manager."""

    def __init__(self, path: str | Path, header: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = self.path.open("w", encoding="utf-8")
        self._write({"record": "study", **header})

    def _write(self, record: Mapping[str, Any]) -> None:
        assert self._file is not None
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()

    def point(self, point: Point) -> None:
        self._write(point.to_dict())

    def finish(self, results: StudyResults) -> None:
        """Append the derived table, the verdicts and the end record, and close the file."""
        for row in results.derived:
            self._write(row.to_dict())
        for verdict in results.verdicts:
            self._write(verdict.to_dict())
        self._write({"record": "end", "status": results.status, "message": results.message})
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_results(path: str | Path) -> StudyResults:
    """A results file read back; a file cut short (a killed study) gives the points it holds.

    >>> read_results("study.jsonl").summary()  # doctest: +SKIP
    """
    header: dict[str, Any] = {}
    results = StudyResults(header, [], path=Path(path), status="incomplete")
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line of a killed writer
            kind = record.get("record")
            if kind == "study":
                header.update({k: v for k, v in record.items() if k != "record"})
            elif kind == "point":
                results.points.append(Point.from_dict(record))
            elif kind == "derived":
                known = {"record", "figure", "curve", "axis", "at", "value", "estimate"}
                detail = {k: v for k, v in record.items() if k not in known}
                results.derived.append(
                    Row(
                        record["figure"],
                        record["curve"],
                        record["axis"],
                        record["at"],
                        record["value"],
                        detail,
                    )
                )
            elif kind == "verdict":
                results.verdicts.append(Verdict.from_dict(record))
            elif kind == "end":
                results.status, results.message = record["status"], record.get("message", "")
    return results


@dataclass(frozen=True)
class Difference:
    """One figure of one point, before and after, and the interval of the change."""

    point: str
    figure: str  # throughput, p50_ms, p99_ms
    before: float
    after: float
    low: float
    high: float

    @property
    def change(self) -> float:
        return self.after - self.before

    @property
    def significant(self) -> bool:
        """Whether the interval leaves 0 out."""
        return self.low > 0 or self.high < 0


def _figures(point: Point) -> dict[str, tuple[float, list[float]]]:
    windows = point.windows
    return {
        "throughput": (point.throughput, [w.throughput for w in windows]),
        "p50_ms": (point.latency_ms(0.5), [w.p50_ms for w in windows]),
        "p99_ms": (point.latency_ms(0.99), [w.p99_ms for w in windows]),
    }


def compare(
    before: StudyResults, after: StudyResults, confidence: float = 0.95
) -> tuple[list[Difference], list[str]]:
    """The differences of the points both files measured, and the labels of the others."""
    old = {p.label: p for p in before.points if p.status == "ok"}
    new = {p.label: p for p in after.points if p.status == "ok"}
    differences = []
    for label in [p.label for p in after.points if p.label in old and p.label in new]:
        a, b = _figures(old[label]), _figures(new[label])
        for figure in a:
            value_a, windows_a = a[figure]
            value_b, windows_b = b[figure]
            low, high = interval(windows_a, windows_b, confidence)
            center = (low + high) / 2 if math.isfinite(low) else value_b - value_a
            shift = (value_b - value_a) - center  # center on the points' own figures
            differences.append(
                Difference(label, figure, value_a, value_b, low + shift, high + shift)
            )
    unmatched = sorted(set(old) ^ set(new))
    return differences, unmatched


def format_comparison(
    differences: Sequence[Difference], unmatched: Sequence[str] = (), confidence: float = 0.95
) -> str:
    """One line per point and figure: before → after (change, interval): verdict."""
    lines = []
    units = {"throughput": "/s", "p50_ms": " ms", "p99_ms": " ms"}
    for d in differences:
        unit = units.get(d.figure, "")
        if not d.significant:
            word = "no significant change"
        elif d.figure == "throughput":
            word = "higher" if d.change > 0 else "lower"
        else:
            word = "slower" if d.change > 0 else "faster"
        lines.append(
            f"{d.point}: {d.figure} {d.before:.2f} → {d.after:.2f}{unit} ({d.change:+.2f}, "
            f"{confidence * 100:.0f} % interval {d.low:+.2f} … {d.high:+.2f}): {word}"
        )
    for label in unmatched:
        lines.append(f"{label}: measured in one file only")
    return "\n".join(lines)
