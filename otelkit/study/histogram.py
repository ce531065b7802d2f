"""Latencies kept as a log histogram: percentiles within half a percent, mergeable across processes.

A point may be driven by several client processes, on several nodes: each keeps its latencies
in buckets 1 % wide (a bucket's upper edge is 1.01 times its lower one, from 1 µs up), and the
point's percentiles come from the sum of their buckets, that is from all requests. A bucket is
read as its geometric middle, so a percentile is off by at most 0.5 %; the maximum, minimum and
mean are kept exactly.

>>> histogram = LatencyHistogram()
>>> histogram.add_many([0.010, 0.011, 0.012, 0.013, 0.100])
>>> abs(histogram.quantile(0.5) - 0.012) < 0.005 * 0.012, histogram.max_s
(True, 0.1)
>>> both = histogram.merged(LatencyHistogram.from_dict(histogram.to_dict()))
>>> both.count, round(both.quantile(0.99) * 1e3, 1)
(10, 100.0)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["LatencyHistogram"]

_BASE_S = 1e-6
_RATIO = 1.01
_LOG_RATIO = math.log(_RATIO)


class LatencyHistogram:
    """Request latencies in seconds, in log buckets 1 % wide."""

    __slots__ = ("count", "counts", "max_s", "min_s", "sum_s")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.count = 0
        self.sum_s = 0.0
        self.max_s = 0.0
        self.min_s = math.inf

    @staticmethod
    def _index(seconds: float) -> int:
        if seconds <= _BASE_S:
            return 0
        return int(math.log(seconds / _BASE_S) / _LOG_RATIO)

    def add(self, seconds: float) -> None:
        """Count one latency."""
        index = self._index(seconds)
        self.counts[index] = self.counts.get(index, 0) + 1
        self.count += 1
        self.sum_s += seconds
        self.max_s = max(self.max_s, seconds)
        self.min_s = min(self.min_s, seconds)

    def add_many(self, latencies: Iterable[float]) -> None:
        """Count every latency of ``latencies``."""
        for seconds in latencies:
            self.add(seconds)

    @property
    def mean_s(self) -> float:
        """The exact mean, 0 when empty."""
        return self.sum_s / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        """The latency below which a share ``q`` of the requests fall (nearest rank); 0 if empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q is a share from 0 to 1, not {q!r}")
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for index in sorted(self.counts):
            seen += self.counts[index]
            if seen >= rank:
                middle: float = _BASE_S * _RATIO ** (index + 0.5)
                return min(self.max_s, max(self.min_s, middle))
        return self.max_s

    def merged(self, other: LatencyHistogram) -> LatencyHistogram:
        """A new histogram holding the requests of both."""
        out = LatencyHistogram()
        for part in (self, other):
            for index, n in part.counts.items():
                out.counts[index] = out.counts.get(index, 0) + n
        out.count = self.count + other.count
        out.sum_s = self.sum_s + other.sum_s
        out.max_s = max(self.max_s, other.max_s)
        out.min_s = min(self.min_s, other.min_s)
        return out

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (bucket indices as strings, as JSON object keys must be)."""
        return {
            "base_s": _BASE_S,
            "ratio": _RATIO,
            "count": self.count,
            "sum_s": self.sum_s,
            "max_s": self.max_s,
            "min_s": self.min_s if self.count else 0.0,
            "buckets": {str(index): n for index, n in sorted(self.counts.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencyHistogram:
        """The histogram ``to_dict`` wrote; refuses buckets of another layout."""
        if data.get("base_s") != _BASE_S or data.get("ratio") != _RATIO:
            raise ValueError(
                f"a histogram with other buckets: {data.get('base_s')}, {data.get('ratio')}"
            )
        out = cls()
        out.counts = {int(index): int(n) for index, n in data.get("buckets", {}).items()}
        out.count = int(data.get("count", sum(out.counts.values())))
        out.sum_s = float(data.get("sum_s", 0.0))
        out.max_s = float(data.get("max_s", 0.0))
        out.min_s = float(data["min_s"]) if out.count else math.inf
        return out
