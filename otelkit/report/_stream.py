"""Spans read one at a time and handed on as whole traces, in bounded memory.

The files a receiver or a Collector writes hold each trace's spans close together but not on
one line: every process exports its own spans, on its own schedule (Triton every 200 ms, a
client at its batch delay). ``complete_traces`` keeps the traces still open and hands one on
when the stream's clock (the latest span end seen) has moved ``grace_s`` past the trace's own
last span end: by then every exporter has flushed it. Only open traces are held, so memory
follows the spans in flight, not the file. If more than ``max_open_spans`` are held (a file
out of time order, a clock far off), the oldest traces are handed on early.

A span that arrives for a trace already handed on is counted in ``late_spans``, never merged:
the page's checks report it, as the breakdown reports broken nesting.

>>> from otelkit.analysis import Span, SpanKind
>>> spans = [Span(f"{t:032x}", f"{t:016x}", None, "event", SpanKind.INTERNAL, t * 10**9,
...               t * 10**9 + 5) for t in range(1, 50)]
>>> stream = TraceStream(grace_s=10)
>>> [trace.trace_id[-2:] for trace in stream.complete_traces(spans)][:3]
['01', '02', '03']
>>> stream.traces, stream.spans, stream.late_spans
(49, 49, 0)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from otelkit.analysis import Span, Trace, build_traces

__all__ = ["TraceStream"]

# Looking for complete traces after every span would make the reader quadratic in the traces
# held; every few thousand spans keeps the check's cost a small share of parsing.
_CHECK_EVERY = 4096
# Trace ids handed on, remembered to tell a late span from a new trace; bounded, oldest first.
_REMEMBERED = 200_000


@dataclass
class _Open:
    spans: list[Span] = field(default_factory=list)
    last_end_ns: int = 0


class TraceStream:
    """Groups a stream of spans into traces, each handed on once, when complete.

    ``grace_s``: how far (in span time) the stream must have moved past a trace's last span
    before the trace counts as complete. ``max_open_spans``: the most spans held at once.
    """

    def __init__(self, grace_s: float = 10.0, max_open_spans: int = 100_000) -> None:
        if grace_s < 0 or max_open_spans < 1:
            raise ValueError("grace_s must be >= 0 and max_open_spans >= 1")
        self.grace_ns = int(grace_s * 1e9)
        self.max_open_spans = max_open_spans
        self.spans = 0  # spans read
        self.traces = 0  # traces handed on
        self.late_spans = 0  # spans of traces already handed on
        self.closed_early = 0  # traces handed on before their grace, to bound memory
        self.first_ns: int | None = None
        self.last_ns = 0
        self._open: OrderedDict[str, _Open] = OrderedDict()
        self._held = 0
        self._done: OrderedDict[str, None] = OrderedDict()

    def complete_traces(self, spans: Iterable[Span]) -> Iterator[Trace]:
        """Every trace of ``spans``, each as soon as it is complete; the rest at the end."""
        for span in spans:
            self._add(span)
            if self.spans % _CHECK_EVERY == 0:
                yield from self._hand_on(self.last_ns - self.grace_ns)
            if self._held > self.max_open_spans:
                yield from self._hand_on_oldest()
        yield from self._hand_on(None)

    def _add(self, span: Span) -> None:
        self.spans += 1
        if self.first_ns is None or span.start_ns < self.first_ns:
            self.first_ns = span.start_ns
        self.last_ns = max(self.last_ns, span.end_ns)
        if span.trace_id in self._done:
            self.late_spans += 1
            return
        entry = self._open.get(span.trace_id)
        if entry is None:
            entry = self._open[span.trace_id] = _Open()
        entry.spans.append(span)
        entry.last_end_ns = max(entry.last_end_ns, span.end_ns)
        self._held += 1

    def _hand_on(self, before_ns: int | None) -> Iterator[Trace]:
        """The open traces whose last span ended before ``before_ns`` (all of them: None)."""
        ready = [
            trace_id
            for trace_id, entry in self._open.items()
            if before_ns is None or entry.last_end_ns < before_ns
        ]
        for trace_id in ready:
            yield self._close(trace_id)

    def _hand_on_oldest(self) -> Iterator[Trace]:
        while self._held > self.max_open_spans // 2 and self._open:
            self.closed_early += 1
            yield self._close(next(iter(self._open)))

    def _close(self, trace_id: str) -> Trace:
        entry = self._open.pop(trace_id)
        self._held -= len(entry.spans)
        self._done[trace_id] = None
        if len(self._done) > _REMEMBERED:
            self._done.popitem(last=False)
        self.traces += 1
        return build_traces(entry.spans)[trace_id]
