"""otelkit._core.switch: the global providers otelkit installs, as other libraries use them.

Ray Serve's tracing sets its own tracer provider and then adds its exporter's span processor
to whatever provider is global; where otelkit's switch is the global one, the processor must
see the spans of every configuration from then on (a replica crashed on the missing method).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from otelkit._core.switch import SWITCH
from otelkit.testing import MemoryCapture


class Names(SpanProcessor):
    def __init__(self) -> None:
        self.names: list[str] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.names.append(span.name)


@pytest.fixture
def added() -> Iterator[Names]:
    """A processor added to the global provider, taken off the switch after the test."""
    before = list(SWITCH._processors)
    names = Names()
    yield names
    SWITCH._processors[:] = before


def test_a_processor_added_to_the_global_provider_sees_every_later_configurations_spans(
    added: Names,
) -> None:
    tracer = trace.get_tracer("tests.switch")
    with MemoryCapture(service_name="first") as first:
        assert trace.get_tracer_provider() is SWITCH.tracers
        trace.get_tracer_provider().add_span_processor(added)  # type: ignore[attr-defined]
        with tracer.start_as_current_span("one"):
            pass
        assert [s.name for s in first.spans()] == ["one"]  # otelkit's own export unchanged
    with MemoryCapture(service_name="second") as second:
        with tracer.start_as_current_span("two"):
            pass
        assert [s.name for s in second.spans()] == ["two"]
    assert added.names == ["one", "two"]
