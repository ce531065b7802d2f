"""How well one benchmark run resolves an overhead: the difference of two medians, with a
95 % interval from a moving-block bootstrap over interleaved call pairs, and a verdict
against a target bound.

The interval says how well *this run* resolves the overhead: drift within the run widens it
(neighbouring pairs share the host's state of the moment, so they are resampled together),
but it does not say how the next run, in another state of the host, will come out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

BLOCK = 50  # call pairs resampled together


def difference_interval(
    bare: Sequence[float], traced: Sequence[float], replicates: int = 1000, seed: int = 0
) -> tuple[tuple[float, float], tuple[float, float]]:
    """95 % intervals of ``median(traced) - median(bare)`` (pairs at the same index were
    measured side by side) and of it as a percentage of ``median(bare)``."""
    bare_values, traced_values = np.asarray(bare, float), np.asarray(traced, float)
    count = len(bare_values)
    if count != len(traced_values) or count == 0:
        raise ValueError(f"need as many traced as bare values, and some: {count}, {len(traced)}")
    block = min(BLOCK, count)
    blocks = -(-count // block)
    starts = np.random.default_rng(seed).integers(0, count - block + 1, (replicates, blocks))
    index = (starts[:, :, None] + np.arange(block)).reshape(replicates, -1)[:, :count]
    bare_medians = np.median(bare_values[index], axis=1)
    difference = np.median(traced_values[index], axis=1) - bare_medians
    low, high = np.percentile(difference, [2.5, 97.5])
    low_pct, high_pct = np.percentile(100 * difference / bare_medians, [2.5, 97.5])
    return (float(low), float(high)), (float(low_pct), float(high_pct))


def ratio_interval(
    before: Sequence[float], after: Sequence[float], replicates: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """95 % interval of ``median(after) / median(before)`` from a bootstrap over rounds (pairs
    at the same index were measured side by side), for runs of a few dozen rounds, each a
    process of its own: independent, so resampled one by one."""
    before_values, after_values = np.asarray(before, float), np.asarray(after, float)
    count = len(before_values)
    if count != len(after_values) or count == 0:
        raise ValueError(f"need as many rounds after as before, and some: {count}, {len(after)}")
    index = np.random.default_rng(seed).integers(0, count, (replicates, count))
    ratios = np.median(after_values[index], axis=1) / np.median(before_values[index], axis=1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


def median_interval(values: Sequence[float]) -> tuple[float, float]:
    """A distribution-free interval of at least 95 % for the median of ``values`` (independent
    rounds, each a paired ratio, say): the ``k``-th smallest and largest values, for the
    largest ``k`` with P(B < k) <= 2.5 %, B binomial (n, 1/2): fewer than ``k`` values fall
    below the median that rarely. It needs 6 values or more; with fewer, it is the whole range,
    which covers less than 95 %."""
    ordered = sorted(values)
    count = len(ordered)
    if count == 0:
        raise ValueError("the median of no values has no interval")
    k = 1
    while k < count and 40 * sum(math.comb(count, i) for i in range(k + 1)) <= 2**count:
        k += 1
    return ordered[k - 1], ordered[count - k]


def verdict(measured: float, interval: tuple[float, float], bound: float) -> dict[str, Any]:
    """``met`` when the whole 95 % interval is within ``bound``, ``missed`` when none of it is,
    else ``undecided`` (this run cannot tell: run it again, or longer)."""
    low, high = interval
    outcome = "met" if high <= bound else "missed" if low > bound else "undecided"
    return {
        "bound": bound,
        "measured": round(measured, 2),
        "interval95": [round(low, 2), round(high, 2)],
        "verdict": outcome,
    }


def latency_summary(durations_ns: dict[str, Sequence[int]]) -> dict[str, float]:
    """``<name>_p50_us`` and ``<name>_p99_us`` of each named series of request durations."""
    summary: dict[str, float] = {}
    for name, values in durations_ns.items():
        summary[f"{name}_p50_us"] = round(statistics.median(values) / 1e3, 1)
        summary[f"{name}_p99_us"] = round(statistics.quantiles(values, n=100)[98] / 1e3, 1)
    return summary
