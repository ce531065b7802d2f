"""What the readers of a remote trace store (Jaeger, Tempo) share: the time windows a search walks,
and what an import brought, and left out, into the span store.

A trace store's search answers at most its limit of traces for one query, and says nothing when it
cut the answer there. A reader therefore walks the time range in windows, and a window whose
search came back holding exactly the limit is split in two and searched again, down to a
smallest window, where the cap is counted (``Imported.capped``) and warned of, not hidden.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

__all__ = ["Imported", "windows"]


class Imported(NamedTuple):
    """What one import brought into the span store."""

    spans: int  # spans written into segments
    segments: int  # segments written
    traces: int  # traces fetched whole
    left_out: int = 0  # traces found but not brought: fetch failed, not found, or partial
    capped: int = 0  # windows whose search still returned exactly its limit at the smallest


def windows(since_ns: int, until_ns: int, step_ns: int) -> Iterator[tuple[int, int]]:
    """``[since_ns, until_ns)`` cut into windows of ``step_ns`` at most, in time order.

    >>> list(windows(0, 25, 10))
    [(0, 10), (10, 20), (20, 25)]
    """
    if step_ns <= 0:
        raise ValueError(f"a window of {step_ns} ns")
    start = since_ns
    while start < until_ns:
        end = min(start + step_ns, until_ns)
        yield start, end
        start = end
