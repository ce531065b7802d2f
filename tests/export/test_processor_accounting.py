"""Every span the batch processor takes is exported, counted as dropped by reason, or still
queued: also when a span ends while shutdown empties the queue, and with a backend that takes
part of each batch."""

from __future__ import annotations

import collections
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otelkit import semconv
from otelkit.export._processor import BatchExportProcessor, LossCounter


class Half(SpanExporter):
    """A backend that takes the first half of each batch and refuses the rest, and says so
    (``deliver``, as otelkit's OTLP/HTTP exporter does for a batch refused in part)."""

    def __init__(self) -> None:
        self.taken = 0

    def deliver(self, batch: Sequence[ReadableSpan]) -> int:
        half = len(batch) // 2
        self.taken += half
        return half

    def export(self, batch: Sequence[ReadableSpan]) -> SpanExportResult:
        raise AssertionError("deliver is what otelkit calls")


def spans(count: int) -> list[ReadableSpan]:
    tracer = TracerProvider().get_tracer("accounting")
    ended = []
    for n in range(count):
        span = tracer.start_span(f"s{n}")
        span.end()
        ended.append(span)  # type: ignore[arg-type]
    return ended  # type: ignore[return-value]


def processor(exporter: SpanExporter, delay_s: float = 60.0) -> BatchExportProcessor:
    loss = LossCounter(3600.0, "spans", semconv.TELEMETRY_SPANS_DROPPED)
    return BatchExportProcessor(
        lambda: exporter, max_queue_size=100, max_batch_size=8, schedule_delay_s=delay_s, loss=loss
    )


def test_a_span_that_ends_while_shutdown_empties_the_queue_is_counted() -> None:
    batches = processor(Half())
    first, late = spans(5), spans(1)[0]

    class Racing(collections.deque):  # type: ignore[type-arg]
        """The late span passed on_end's shutdown check; shutdown runs before it is queued."""

        def append(self, span: ReadableSpan) -> None:
            if span is late:
                batches.shutdown(timeout_millis=1000)
            super().append(span)

    batches._queue = Racing()  # type: ignore[assignment]
    for span in first:
        batches.on_end(span)
    batches.on_end(late)
    counts, lost = batches.counts(), batches.loss.totals
    # the five went out with shutdown's last export (half taken), the late one was counted
    assert lost[semconv.DROP_REASON_SHUTDOWN] == 1
    assert counts["exported"] + sum(lost.values()) + counts["queued"] == 6


def test_a_backend_that_takes_part_of_each_batch_leaves_nothing_uncounted() -> None:
    exporter = Half()
    batches = processor(exporter, delay_s=0.01)
    for span in spans(37):
        batches.on_end(span)
    assert batches.force_flush(5000)
    batches.shutdown(timeout_millis=2000)
    counts, lost = batches.counts(), batches.loss.totals
    assert counts["exported"] == exporter.taken > 0
    assert lost[semconv.DROP_REASON_EXPORT_FAILED] > 0
    assert counts["exported"] + sum(lost.values()) + counts["queued"] == 37
