"""A head sampler that caps tracing load: at most N new traces per second in this process.

A ratio sampler's tracing cost grows with the request rate; a rate limit's does not. That
matters twice here: the export pipeline and the collectors behind it get a load that no burst
of requests can raise, and a Triton older than 2.57 — whose tracer crashes under heavy traced
load (upstream server issue 7795), and which traces every request that carries a context —
stays below the rate at which it crashes, since otelkit sends no context on a call it does not
sample. The model is the ``ratelimiting`` sampler of Jaeger's remote sampling: a token bucket
that earns ``traces_per_second`` credits a second, holds at most ``max(traces_per_second, 1)``
and spends one per new trace. It starts with one credit, so over any long run the traces
sampled stay within one of ``traces_per_second`` times its length.

>>> sampler = RateLimitingSampler(2.0, clock=iter([0.0, 0.0, 0.1, 1.0]).__next__)
>>> [sampler.should_sample(None, 1, "call").decision.is_sampled() for _ in range(3)]
[True, False, True]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, get_current_span
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

__all__ = ["RateLimitingSampler"]


class RateLimitingSampler(Sampler):
    """Samples at most ``traces_per_second`` root spans per second (a token bucket)."""

    def __init__(
        self, traces_per_second: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not traces_per_second > 0:
            raise ValueError(f"traces_per_second must be positive, not {traces_per_second!r}")
        self.traces_per_second = float(traces_per_second)
        self._max_balance = max(self.traces_per_second, 1.0)
        self._balance = 1.0
        self._clock = clock
        self._last = clock()
        self._lock = threading.Lock()

    def _take(self) -> bool:
        with self._lock:
            now = self._clock()
            self._balance = min(
                self._max_balance, self._balance + (now - self._last) * self.traces_per_second
            )
            self._last = now
            if self._balance < 1.0:
                return False
            self._balance -= 1.0
            return True

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        state = get_current_span(parent_context).get_span_context().trace_state
        if self._take():
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, state)
        return SamplingResult(Decision.DROP, None, state)

    def get_description(self) -> str:
        return f"RateLimitingSampler{{{self.traces_per_second:g}/s}}"
