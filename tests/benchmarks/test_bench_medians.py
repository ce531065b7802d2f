"""The benchmarks' verdict on an overhead (``benchmarks/medians.py``): the interval of a
difference of medians covers the true difference as often as it claims, and the verdict
follows the interval, not the point estimate."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import numpy as np
import pytest

from tests.paths import BENCHMARKS


def _load() -> ModuleType:
    path = BENCHMARKS / "medians.py"
    spec = importlib.util.spec_from_file_location("bench_medians", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


medians = _load()


def latencies(rng: np.random.Generator, count: int, shift: float) -> tuple[np.ndarray, np.ndarray]:
    """Call pairs as a loaded host gives them: a skewed spread around 400 us, a drift both
    clients share, and ``shift`` more for the traced one."""
    drift = np.cumsum(rng.normal(0, 0.5, count))
    bare = 400 + drift + rng.gamma(2.0, 15.0, count)
    traced = 400 + drift + rng.gamma(2.0, 15.0, count) + shift
    return bare, traced


def test_the_interval_covers_the_true_difference_about_as_often_as_it_claims() -> None:
    rng = np.random.default_rng(7)
    covered = 0
    runs = 120
    for run in range(runs):
        bare, traced = latencies(rng, 1500, shift=6.0)
        (low, high), _ = medians.difference_interval(bare, traced, replicates=300, seed=run)
        covered += low <= 6.0 <= high
    assert covered / runs >= 0.85  # nominal 95 %; a bootstrap of medians runs a little short


def test_more_pairs_narrow_the_interval_and_percentages_follow_the_bare_median() -> None:
    rng = np.random.default_rng(3)
    widths = []
    for count in (1000, 16000):
        bare, traced = latencies(rng, count, shift=20.0)
        (low, high), (low_pct, high_pct) = medians.difference_interval(bare, traced)
        assert low < 20.0 < high
        bare_median = float(np.median(bare))
        assert low_pct == pytest.approx(100 * low / bare_median, rel=0.1)
        assert high_pct == pytest.approx(100 * high / bare_median, rel=0.1)
        widths.append(high - low)
    assert widths[1] < widths[0] / 2  # 16 times the pairs: about a quarter of the width


def test_no_difference_gives_an_interval_around_zero() -> None:
    bare, traced = latencies(np.random.default_rng(11), 4000, shift=0.0)
    (low, high), _ = medians.difference_interval(bare, traced)
    assert low < 0 < high


def test_the_ratio_interval_covers_the_true_ratio_of_medians_about_as_often_as_it_claims() -> None:
    rng = np.random.default_rng(5)
    covered = 0
    runs = 120
    for run in range(runs):
        # import times of a few dozen processes: skewed, the second path at 0.4 of the first
        before = 150 + rng.gamma(2.0, 20.0, 30)
        after = 0.4 * (150 + rng.gamma(2.0, 20.0, 30))
        true = 0.4  # the two distributions differ by the factor alone
        low, high = medians.ratio_interval(before, after, replicates=500, seed=run)
        covered += low <= true <= high
    assert covered / runs >= 0.85


@pytest.mark.parametrize(
    ("interval", "expected"),
    [((3.0, 4.9), "met"), ((3.0, 5.0), "met"), ((4.0, 6.0), "undecided"), ((5.1, 7.0), "missed")],
)
def test_the_verdict_follows_the_whole_interval(
    interval: tuple[float, float], expected: str
) -> None:
    found = medians.verdict(sum(interval) / 2, interval, 5.0)
    assert found["verdict"] == expected
    assert found["bound"] == 5.0 and found["interval95"] == list(interval)


def test_unpaired_values_are_refused() -> None:
    with pytest.raises(ValueError, match="as many"):
        medians.difference_interval([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        medians.difference_interval([], [])
    with pytest.raises(ValueError, match="as many"):
        medians.ratio_interval([1.0, 2.0], [1.0])


def test_the_median_interval_covers_the_true_median_as_often_as_it_claims() -> None:
    # rounds' ratios as a loaded host spreads them: skewed, a few far out
    rng = np.random.default_rng(11)
    true_median = float(np.exp(0.0))  # of a lognormal(0, 0.4)
    covered = widths = 0.0
    runs = 2000
    for _ in range(runs):
        low, high = medians.median_interval(rng.lognormal(0.0, 0.4, 15).tolist())
        covered += low <= true_median <= high
        widths += high - low
    # 15 rounds: the 4th and 12th values, which cover 96.5 % by the binomial law
    assert 0.95 <= covered / runs <= 0.98
    assert widths / runs < 0.6


def test_the_median_interval_is_the_order_statistics_the_binomial_law_allows() -> None:
    values = [float(v) for v in range(1, 31)]
    assert medians.median_interval(values[:15]) == (4.0, 12.0)
    assert medians.median_interval(values) == (10.0, 21.0)
    assert medians.median_interval(values[:6]) == (1.0, 6.0)  # fewer: the whole range
    with pytest.raises(ValueError):
        medians.median_interval([])
