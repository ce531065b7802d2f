"""Where a test reads spans from: this process, in memory, or other processes, through a receiver.

Both give ``otelkit.analysis.Span`` records, decoded from the OTLP JSON that otelkit's exporters
and receiver write, so a test reads what a trace file would hold. Absence is asserted only after
a marker: a span that must arrive through the same exporters after the absent ones would have
(``Capture.assert_absent``), never after a sleep, which a slow exporter outlasts.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from otelkit import telemetry
from otelkit._core.hotmetrics import HOT
from otelkit._core.worker import LATER
from otelkit.analysis import Span
from otelkit.analysis._decode import spans_of_line
from otelkit.export._otlp_json_encode import spans_to_bytes
from otelkit.receiver import Receiver
from otelkit.testing._wait import wait_until

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import DataPointT

__all__ = ["Capture", "MemoryCapture", "ReceiverCapture"]

Where = Callable[[Span], bool]


class Capture(ABC):
    """Spans that have arrived so far, and ways to wait for more."""

    @abstractmethod
    def spans(self) -> list[Span]:
        """Every span that has arrived since the capture began or was last cleared."""

    @abstractmethod
    def clear(self) -> None:
        """Forget the spans that have arrived so far."""

    def trace(self, trace_id: str) -> list[Span]:
        """The spans of one trace that have arrived."""
        return [s for s in self.spans() if s.trace_id == trace_id]

    def wait_for_spans(
        self, where: Where | None = None, count: int = 1, timeout: float = 15.0, what: str = ""
    ) -> list[Span]:
        """The spans ``where`` accepts (all, without it) once ``count`` of them have arrived;
        ``AssertionError`` naming ``what`` and listing those seen after ``timeout`` seconds."""
        if count < 1:
            raise ValueError(f"count must be at least 1, not {count}")
        seen: list[Span] = []

        def enough() -> list[Span] | None:
            nonlocal seen
            seen = [s for s in self.spans() if where is None or where(s)]
            return seen if len(seen) >= count else None

        return wait_until(
            enough,
            timeout,
            what or f"{count} span(s)",
            explain=lambda: f"{len(seen)} of {count} arrived: {_rows(seen)}",
        )

    def wait_for_trace(self, trace_id: str, count: int = 1, timeout: float = 15.0) -> list[Span]:
        """The spans of trace ``trace_id`` once ``count`` of them have arrived."""
        return self.wait_for_spans(
            lambda s: s.trace_id == trace_id, count, timeout, f"trace {trace_id}: {count} span(s)"
        )

    def assert_absent(
        self, where: Where, *, after: str | Where, count: int = 1, timeout: float = 15.0
    ) -> list[Span]:
        """Assert that no span ``where`` accepts has arrived, once the marker has: ``count``
        spans that ``after`` accepts (a predicate, or a trace id: that trace's spans).

        The marker must end after anything that must be absent, and leave through the same
        processes and exporters: a later call's spans, say. Exporters send in the order spans
        end, so once the marker is in, what came before it is in too. Returns the marker's spans.
        """
        marker = (lambda s: s.trace_id == after) if isinstance(after, str) else after
        found = self.wait_for_spans(marker, count, timeout, "the marker's span(s)")
        present = [s for s in self.spans() if where(s)]
        assert not present, f"{len(present)} span(s) that must be absent arrived: {_rows(present)}"
        return found


def _rows(spans: list[Span]) -> list[tuple[str, str, str | None]]:
    return sorted((str(s.resource.get("service.name")), s.name, s.parent_span_id) for s in spans)


class MemoryCapture(Capture):
    """This process's spans and otelkit's metrics, in memory: ``start()`` configures otelkit with
    ``options`` (``otelkit.configure``'s; the service name of the configuration in force when
    none is given) to export nowhere else, ``stop()`` shuts it down. A context manager.

    Spans come as they end; ``spans()`` first ends the calls whose spans otelkit finishes off the
    caller's thread. Code under test must not configure otelkit again while it runs (that
    replaces the configuration it captures from).

    >>> import otelkit
    >>> with MemoryCapture(service_name="shop") as capture:
    ...     with otelkit.stage("scale"):
    ...         pass
    ...     [(s.name, s.resource["service.name"]) for s in capture.spans()]
    [('scale', 'shop')]
    """

    def __init__(self, **options: Any) -> None:
        self.options = options
        self._processor: _Keep | None = None

    def start(self) -> MemoryCapture:
        """Configure otelkit to keep spans here, and count its metrics from now."""
        options = dict(self.options)
        current = telemetry.current()
        if current is not None:
            options.setdefault("service_name", current.settings.service_name)
        options.update(traces_exporter="none", metrics_exporter="none")
        state = telemetry.configure(**options)
        self._processor = _Keep()
        state.tracer_provider.add_span_processor(self._processor)
        LATER.drain()
        HOT.reset()  # client and stage metrics count from here
        return self

    def stop(self) -> None:
        """Stop keeping spans, and shut otelkit's configuration down."""
        if self._processor is not None:
            self._processor.keeping = False
            self._processor = None
            telemetry.shutdown()

    def __enter__(self) -> MemoryCapture:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def spans(self) -> list[Span]:
        if self._processor is None:
            raise RuntimeError("the capture is not started: call start() first")
        telemetry.flush()
        ended = self._processor.ended()
        return spans_of_line(spans_to_bytes(ended).decode(), "memory") if ended else []

    def clear(self) -> None:
        if self._processor is not None:
            telemetry.flush()
            self._processor.clear()

    def metrics(self) -> dict[str, list[DataPointT]]:
        """otelkit's client and stage metrics (``otelkit.semconv`` names) by name, each series a
        data point, cumulative since ``start()``."""
        return {m.name: list(m.data.data_points) for m in HOT.collect()}


class _Keep(SpanProcessor):
    """Keeps every span that ends, while ``keeping``."""

    def __init__(self) -> None:
        self.keeping = True
        self._ended: list[ReadableSpan] = []
        self._lock = threading.Lock()

    def on_end(self, span: ReadableSpan) -> None:
        if self.keeping:
            with self._lock:
                self._ended.append(span)

    def ended(self) -> list[ReadableSpan]:
        with self._lock:
            return list(self._ended)

    def clear(self) -> None:
        with self._lock:
            self._ended.clear()


class ReceiverCapture(Capture):
    """The spans that other processes export to a running ``Receiver`` (``otelkit.receiver``):
    point a server's ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` at ``traces_url``.

    It reads the receiver's ``traces.jsonl`` from where it stood when the capture began or was
    last cleared, so a receiver shared by many tests is read only as far as each test's part.

    >>> import tempfile
    >>> with Receiver(tempfile.mkdtemp()) as receiver:
    ...     capture = ReceiverCapture(receiver)
    ...     capture.traces_url == receiver.traces_url, capture.spans()
    (True, [])
    """

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver
        self._path: Path = receiver.out_path
        self._lock = threading.Lock()
        self._spans: list[Span] = []
        self._offset = 0
        self._in_line = False
        self.clear()

    @property
    def traces_url(self) -> str:
        """Where to send spans: the receiver's ``/v1/traces`` URL."""
        return self.receiver.traces_url

    @property
    def endpoint(self) -> str:
        """The receiver's base URL, for ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
        return self.receiver.endpoint

    def clear(self) -> None:
        with self._lock:
            self._spans = []
            self._offset = self._path.stat().st_size if self._path.exists() else 0
            # a line being written now is before: what is left of it is skipped once it ends
            self._in_line = bool(self._offset) and self._read_byte(self._offset - 1) != b"\n"

    def spans(self) -> list[Span]:
        with self._lock:
            if self._path.exists():
                with self._path.open("rb") as file:
                    file.seek(self._offset)
                    data = file.read()
                start = 0
                if self._in_line:
                    start = data.find(b"\n") + 1
                    self._in_line = start == 0
                complete = data.rfind(b"\n") + 1  # a line still being written waits
                for number, line in enumerate(data[start:complete].splitlines(), 1):
                    self._spans += spans_of_line(line.decode(), f"{self._path}:+{number}")
                self._offset += max(start, complete)
            return list(self._spans)

    def _read_byte(self, at: int) -> bytes:
        with self._path.open("rb") as file:
            file.seek(at)
            return file.read(1)
