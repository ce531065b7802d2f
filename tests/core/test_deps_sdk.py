"""The private names of OpenTelemetry's SDK and API that otelkit's spans, propagation and hot
metrics read (``otelkit._core.deps.otel``), each taken away as a newer release could: the
spans are sampled as the sampler says, the tracestate goes on, the metrics are collected, and
one log line says what is missing and what otelkit does instead."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import baggage, trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import (
    Decision,
    ParentBased,
    StaticSampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import TraceState

import otelkit
from otelkit._core import deps, hotmetrics
from otelkit._core.deps import otel
from otelkit._core.switch import SWITCH
from otelkit._propagation import extract, inject
from otelkit.analysis import load_spans
from tests.support import otelkit_lines

ROOTS = 400
SDK = f"otelkit: opentelemetry-sdk {deps.version_of('opentelemetry-sdk')} has no "
API = f"otelkit: opentelemetry-api {deps.version_of('opentelemetry-api')} has no "
ASKS = "; otelkit asks the sampler's should_sample for each root span (slower)"


class _Newer:
    """A sampler as a newer SDK could make it: the private attribute ``gone`` kept under
    another name (here: in a sampler of the current SDK that it asks)."""

    def __init__(self, inner: Any, gone: str) -> None:
        self._inner = inner
        self.__dict__.pop(gone, None)

    def should_sample(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.should_sample(*args, **kwargs)

    def get_description(self) -> str:
        description: str = self._inner.get_description()
        return description


class NewerParentBased(_Newer, ParentBased):
    def __init__(self, root: Any) -> None:
        ParentBased.__init__(self, root)
        _Newer.__init__(self, ParentBased(root), "_root")


class NewerStatic(_Newer, StaticSampler):
    def __init__(self, decision: Decision) -> None:
        StaticSampler.__init__(self, decision)
        _Newer.__init__(self, StaticSampler(decision), "_decision")


def recorded_roots(out: Path, sampler: Any) -> set[int]:
    """The trace ids of the root spans of ``ROOTS`` stages with a child, recorded with
    ``sampler``; each child of a recorded stage recorded with it. (A child of a stage not
    sampled is a root of its own.)"""
    otelkit.configure(service_name="deps", traces_dir=out, metrics_exporter="none")
    try:
        provider: Any = SWITCH.configured_tracer_provider()
        provider.sampler = sampler  # before its first span, which reads it
        for _ in range(ROOTS):
            with otelkit.stage("root"), otelkit.stage("child"):
                pass
        otelkit.flush()
    finally:
        otelkit.shutdown()
    spans = load_spans(out)
    stages = {s.trace_id for s in spans if s.name == "root"}
    children = {s.trace_id for s in spans if s.name == "child" and s.parent_span_id is not None}
    assert children == stages
    return {int(s.trace_id, 16) for s in spans if s.parent_span_id is None}


def test_a_parent_based_sampler_without_its_root_decides_each_root_itself(
    fresh_warnings: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="otelkit"):
        roots = recorded_roots(tmp_path, NewerParentBased(TraceIdRatioBased(0.5)))
    bound = TraceIdRatioBased(0.5).bound  # what the ratio keeps: each root recorded kept it
    assert all(trace_id & TraceIdRatioBased.TRACE_ID_LIMIT < bound for trace_id in roots)
    assert ROOTS * 0.4 < len(roots) < ROOTS * 1.1  # half the stages, a half of their children
    assert otelkit_lines(caplog) == [f"{SDK}ParentBased._root{ASKS}"]


@pytest.mark.parametrize(
    ("sampler", "expected"),
    [
        (NewerStatic(Decision.RECORD_AND_SAMPLE), ROOTS),  # the stages' (children have parents)
        (ParentBased(NewerStatic(Decision.DROP)), 0),
    ],
    ids=["always_on", "parentbased_always_off"],
)
def test_a_static_sampler_without_its_decision_is_asked(
    sampler: Any,
    expected: int,
    fresh_warnings: None,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="otelkit"):
        roots = recorded_roots(tmp_path, sampler)
    assert len(roots) == expected
    assert otelkit_lines(caplog) == [f"{SDK}StaticSampler._decision{ASKS}"]


def newer_trace_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """``TraceState`` as a release that keeps its entries in ``_entries`` would make it."""
    own_init = TraceState.__init__

    def __init__(self: Any, entries: Any = None) -> None:
        own_init(self, entries)
        self._entries = self.__dict__.pop("_dict")

    newer: dict[str, Any] = {
        "__init__": __init__,
        "__contains__": lambda self, key: key in self._entries,
        "__getitem__": lambda self, key: self._entries[key],
        "__iter__": lambda self: iter(self._entries),
        "__len__": lambda self: len(self._entries),
        "keys": lambda self: self._entries.keys(),
        "items": lambda self: self._entries.items(),
        "values": lambda self: self._entries.values(),
        "to_header": lambda self: ",".join(f"{k}={v}" for k, v in self._entries.items()),
    }
    for name, method in newer.items():
        monkeypatch.setattr(TraceState, name, method)


def test_a_trace_state_kept_elsewhere_is_built_through_its_constructor(
    fresh_warnings: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from otelkit import _propagation

    newer_trace_state(monkeypatch)
    fill = otel._trace_state_filler()
    assert fill is otel._fill_through_constructor
    monkeypatch.setattr(_propagation, "fill_trace_state", fill)
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with caplog.at_level(logging.WARNING, logger="otelkit"):
        context = extract({"traceparent": traceparent, "tracestate": "rojo=1,congo=2"})
        state = trace.get_current_span(context).get_span_context().trace_state
        assert inject({}, context) == {"traceparent": traceparent, "tracestate": "rojo=1,congo=2"}
        assert state.update("congo", "3").delete("rojo").to_header() == "congo=3"
    (line,) = otelkit_lines(caplog)
    assert line.startswith(f"{API}TraceState._dict; otelkit builds tracestates through")


def test_the_baggage_key_found_through_the_public_api_is_the_apis_own(
    fresh_warnings: None, caplog: pytest.LogCaptureFixture
) -> None:
    from opentelemetry.baggage import _BAGGAGE_KEY

    with caplog.at_level(logging.WARNING, logger="otelkit"):
        assert otel._baggage_key(object()) == _BAGGAGE_KEY == otel.BAGGAGE_KEY
    assert baggage.get_all(baggage.set_baggage("k", "v", Context())) == {"k": "v"}
    assert otelkit_lines(caplog) == [
        f"{API}opentelemetry.baggage._BAGGAGE_KEY; otelkit finds the baggage key through "
        "baggage.set_baggage"
    ]


def test_without_the_sdks_exemplar_hot_histograms_are_collected_without_exemplars(
    fresh_warnings: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import opentelemetry.sdk.metrics
    import opentelemetry.sdk.metrics._internal.exemplar as private

    series = hotmetrics.HistogramSeries((1.0, 2.0), lambda: 5)
    series.observe(1.5, 0xAB, 0xCD)
    (exemplar,) = series._point({}, 0, 1).exemplars
    assert (exemplar.value, exemplar.trace_id, exemplar.span_id) == (1.5, 0xAB, 0xCD)
    monkeypatch.delattr(opentelemetry.sdk.metrics, "Exemplar")
    otel.exemplar_class.cache_clear()
    assert otel.exemplar_class() is private.Exemplar  # where older releases keep it
    monkeypatch.delattr(private, "Exemplar")
    otel.exemplar_class.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="otelkit"):
            point = series._point({"k": "v"}, 0, 1)
            series._point({}, 0, 1)
    finally:
        otel.exemplar_class.cache_clear()
    assert (point.count, point.sum, list(point.bucket_counts), point.exemplars) == (
        1,
        1.5,
        [0, 1, 0],
        [],
    )
    assert otelkit_lines(caplog) == [
        f"{SDK}opentelemetry.sdk.metrics.Exemplar; otelkit collects its hot histograms' points "
        "without exemplars"
    ]
