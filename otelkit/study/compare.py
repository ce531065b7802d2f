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


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= d * c
        if abs(d * c - 1.0) < 1e-12:
            break
    return result


def _t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (``df`` need not be whole)."""
    if t == 0:
        return 0.5
    x = df / (df + t * t)
    a, b = df / 2, 0.5
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))  # fmt: skip
    if x < (a + 1) / (a + b + 2):
        tail = front * _beta_fraction(a, b, x) / a
    else:
        tail = 1.0 - front * _beta_fraction(b, a, 1 - x) / b
    return 1.0 - tail / 2 if t >= 0 else tail / 2


def _t_quantile(p: float, df: float) -> float:
    """Student's t quantile, by bisection on its distribution function."""
    if math.isinf(df) or df > 1e6:
        return statistics.NormalDist().inv_cdf(p)
    low, high = -1e3, 1e3
    for _ in range(200):
        middle = (low + high) / 2
        if _t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
    return (low + high) / 2


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
