"""The intervals of batch means: each point's window is cut into parts, whose figures are
batch means (Law and Kelton, *Simulation Modeling and Analysis*, ch. 9): nearly independent of
one another and nearly normal when a part is long beside the time successive requests stay
correlated, so Student's t gives intervals from them.

``interval`` is the difference of two points' means (Welch's t: ``otelkit study compare``);
``mean_interval`` the mean of one set of parts, or of paired differences taken part by part
(two resources read over the same parts: ``capacity.spread``).

>>> low, high = mean_interval([1.0, 2.0, 3.0, 2.0])
>>> round(low, 2), round(high, 2)
(0.7, 3.3)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["interval", "mean_interval"]


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
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):
        tail = front * _beta_fraction(a, b, x) / a
    else:
        tail = 1.0 - front * _beta_fraction(b, a, 1 - x) / b
    return 1.0 - tail / 2 if t >= 0 else tail / 2


def t_quantile(p: float, df: float) -> float:
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
    half = t_quantile(0.5 + confidence / 2, df) * se
    return (diff - half, diff + half)


def mean_interval(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """The interval of the mean of ``samples`` (Student's t with n - 1 degrees of freedom);
    unbounded with fewer than two."""
    if len(samples) < 2:
        return (-math.inf, math.inf)
    mean = statistics.fmean(samples)
    se = statistics.stdev(samples) / math.sqrt(len(samples))
    half = t_quantile(0.5 + confidence / 2, len(samples) - 1) * se if se else 0.0
    return (mean - half, mean + half)
