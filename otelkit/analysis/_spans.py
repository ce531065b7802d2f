"""The records a trace file holds: spans with their events and links, ids as lowercase hex.

>>> Span("ab" * 16, "cd" * 8, None, "infer", SpanKind.CLIENT, 1_000, 3_500).kind.name
'CLIENT'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

__all__ = ["Attributes", "Span", "SpanEvent", "SpanKind", "SpanLink", "StatusCode"]

Attributes = dict[str, Any]


class SpanKind(IntEnum):
    """OTLP's span kinds, with their wire values."""

    UNSPECIFIED = 0
    INTERNAL = 1
    SERVER = 2
    CLIENT = 3
    PRODUCER = 4
    CONSUMER = 5


class StatusCode(IntEnum):
    """OTLP's span status codes, with their wire values."""

    UNSET = 0
    OK = 1
    ERROR = 2


@dataclass(frozen=True, slots=True)
class SpanEvent:
    """A timestamped event on a span, e.g. Triton's ``QUEUE_START``."""

    name: str
    time_ns: int
    attributes: Attributes = field(default_factory=dict, hash=False)


@dataclass(frozen=True, slots=True)
class SpanLink:
    """A link from a span to a span of another (or the same) trace."""

    trace_id: str
    span_id: str
    attributes: Attributes = field(default_factory=dict, hash=False)


@dataclass(frozen=True, slots=True)
class Span:
    """One finished span, ids as lowercase hex; ``parent_span_id`` is None for a root.

    >>> Span("ab" * 16, "cd" * 8, None, "infer", SpanKind.CLIENT, 1_000, 3_500).duration_ns
    2500
    """

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: SpanKind
    start_ns: int
    end_ns: int
    attributes: Attributes = field(default_factory=dict, hash=False)
    resource: Attributes = field(default_factory=dict, hash=False)
    scope: str = ""
    events: tuple[SpanEvent, ...] = field(default=(), hash=False)
    links: tuple[SpanLink, ...] = field(default=(), hash=False)
    status_code: StatusCode = StatusCode.UNSET
    status_message: str = ""

    @property
    def duration_ns(self) -> int:
        """End minus start, in nanoseconds."""
        return self.end_ns - self.start_ns
