"""Sending spans in parts a backend takes: a batch refused as too large goes again in halves."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan

__all__ = ["Send", "in_halves"]

logger = logging.getLogger("otelkit")

Send = Callable[[Sequence[ReadableSpan]], "int | None"]


def in_halves(spans: Sequence[ReadableSpan], send: Send, backend: str) -> int:
    """Send ``spans`` with ``send``; how many of them ``backend`` took.

    ``send`` answers ``None`` when they were taken, 0 when they were lost (it logged why), and
    the size of what it sent when the backend refused it as too large. A batch refused so is
    sent again in halves, down to single spans, so that only a span too large on its own is
    lost; otelkit's batch processor counts what this returns, not the whole batch, as
    dropped."""
    refused = send(spans)
    if refused is None:
        return len(spans)
    if refused and len(spans) > 1:
        half = len(spans) // 2
        return in_halves(spans[:half], send, backend) + in_halves(spans[half:], send, backend)
    if refused and backend not in _TOLD_TOO_LARGE:  # the drop itself is counted, each time
        _TOLD_TOO_LARGE.add(backend)
        logger.warning(
            "otelkit: %s refused a span of %d bytes as too large; dropped (logged once; "
            "such spans are counted in otelkit_telemetry_spans_dropped_total, "
            "reason export_failed)",
            backend,
            refused,
        )
    return 0


_TOLD_TOO_LARGE: set[str] = set()  # the backends for which a span too large was logged
