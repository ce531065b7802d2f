"""The results file: JSON Lines, one record per point, then the derived table and the verdicts.

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
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from otelkit.analysis.breakdown import TOTAL
from otelkit.study import derived
from otelkit.study.derived import Row
from otelkit.study.gpu_instances import per_model
from otelkit.study.point import Point
from otelkit.study.predict import Prediction, parse_changes, predict
from otelkit.study.verdicts import Verdict, verdicts

__all__ = ["ResultsWriter", "StudyResults", "read_results"]


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
            *derived.strong_scaling(ok),
            *derived.throughput_by_batch(ok),
            *derived.offload_overhead(ok),
            *derived.knees(ok, tolerance),
        ]
        self.verdicts = verdicts(self.points, unit=unit, tolerance=tolerance)

    def predict(
        self,
        changes: Mapping[str, Mapping[str, int]] | Sequence[str],
        *,
        loads: Sequence[float] | None = None,
    ) -> list[Prediction]:
        """Throughput and latency along each curve if ``changes`` were made, derived from the
        lowest point's demands by mean value analysis (``otelkit.study.predict``).

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
        lines = [
            f"{'point':<{width}} {unit + 's/s':>10} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} "
            f"{'max ms':>8} {'errors':>6} {'cores':>5}  server and traces"
        ]
        for point in self.points:
            lines.append(_point_line(point, width))
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


def _point_line(point: Point, width: int) -> str:
    if point.status not in ("ok", "errors"):
        return f"{point.label:<{width}} failed: {point.error}"
    extra = []
    if point.status == "errors":
        extra.append(f"too many errors, left out of the figures below: {point.error}")
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
        extra.append(f"measured again after {len(point.restarts)} server failure(s): "
                     f"{point.restarts[-1].splitlines()[0]}")  # fmt: skip
    for model, gpu in per_model(point.gpu_instances).items():
        share = f" ({gpu['memory_share']:.0%} of a GPU)" if "memory_share" in gpu else ""
        extra.append(f"{model}: {gpu['instances']:.0f} on GPUs, "
                     f"{gpu['memory_bytes'] / 2**30:.2f} GiB each{share}")  # fmt: skip
    return (
        f"{point.label:<{width}} {point.throughput:>10.1f} {point.latency_ms(0.5):>8.2f} "
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
                results.derived.append(Row(record["figure"], record["curve"], record["axis"],
                                           record["at"], record["value"], detail))  # fmt: skip
            elif kind == "verdict":
                results.verdicts.append(Verdict.from_dict(record))
            elif kind == "end":
                results.status, results.message = record["status"], record.get("message", "")
    return results
