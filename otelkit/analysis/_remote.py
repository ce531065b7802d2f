"""What the readers of a remote trace store (Jaeger, Tempo) share: the time windows a search walks,
and what an import brought, and left out, into the span store.

A trace store's search answers at most its limit of traces for one query, and says nothing when it
cut the answer there. A reader therefore walks the time range in windows, and a window whose
search came back holding exactly the limit is split in two and searched again, down to a
smallest window, where the cap is counted (``Imported.capped``) and warned of, not hidden.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

from otelkit.analysis._spans import Span, SpanKind

__all__ = ["Imported", "SpanKind", "orphaned", "windows"]


class Imported(NamedTuple):
    """What one import brought into the span store."""

    spans: int  # spans written into segments
    segments: int  # segments written
    traces: int  # traces fetched whole
    left_out: int = 0  # traces found but not brought: fetch failed, not found, or partial
    capped: int = 0  # windows whose search still returned exactly its limit at the smallest
    partial: int = 0  # traces written with a span whose parent is not among them


def orphaned(spans: Iterable[Span]) -> bool:
    """Whether a span of one trace names a parent that is not among ``spans`` (a hop exported
    elsewhere, a service that does not export, spans still on their way): such a trace is
    written as it is, counted in ``Imported.partial``; the breakdown joins or leaves out its
    orphans as it does from files.

    >>> root = Span("ab" * 16, "cd" * 8, None, "e", SpanKind.SERVER, 0, 1)
    >>> child = Span("ab" * 16, "ef" * 8, "01" * 8, "c", SpanKind.CLIENT, 0, 1)
    >>> orphaned([root]), orphaned([child])
    (False, True)
    """
    spans = list(spans)
    ids = {span.span_id for span in spans}
    return any(span.parent_span_id is not None and span.parent_span_id not in ids for span in spans)


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
