"""Two results files side by side (before and after a change), each difference with an interval.

Points are matched by their parameters. For throughput and the p50 and p99 latency, the
difference (after − before) comes with a confidence interval from the spread of each point's
equal parts of its measured window (batch means, which tolerate the correlation between
successive requests) and Welch's t: a difference whose interval holds 0 is no change.

>>> low, high = interval([100.0, 102.0, 98.0, 101.0], [110.0, 112.0, 109.0, 111.0])
>>> round(low, 1), round(high, 1)
(7.6, 12.9)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from otelkit.study.point import Point
from otelkit.study.results import StudyResults

__all__ = ["Difference", "compare", "format_comparison", "interval"]


def _t_quantile(p: float, df: float) -> float:
    """Student's t quantile (Cornish-Fisher expansion from the normal's; within 0.3 % from 3
    degrees of freedom)."""
    z = statistics.NormalDist().inv_cdf(p)
    if math.isinf(df):
        return z
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def interval(
    before: Sequence[float], after: Sequence[float], confidence: float = 0.95
) -> tuple[float, float]:
    """The interval of mean(after) − mean(before), from each side's samples (Welch)."""
    if len(before) < 2 or len(after) < 2:
        return (-math.inf, math.inf)
    var_b, var_a = statistics.variance(before), statistics.variance(after)
    se2_b, se2_a = var_b / len(before), var_a / len(after)
    se = math.sqrt(se2_b + se2_a)
    diff = statistics.fmean(after) - statistics.fmean(before)
    if se == 0:
        return (diff, diff)
    df = (se2_b + se2_a) ** 2 / (
        (se2_b**2 / (len(before) - 1) if se2_b else 0.0)
        + (se2_a**2 / (len(after) - 1) if se2_a else 0.0)
    )
    half = _t_quantile(0.5 + confidence / 2, df) * se
    return (diff - half, diff + half)


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
