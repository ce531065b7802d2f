"""The trace breakdown of one point, from the sampled share of its requests.

Every request a study sends runs under a root span (``semconv.STUDY_SPAN``) that carries the
study's run id, the point's index and the phase (warm-up or measured). Once a point is over,
its measured roots are read back from the trace files and split into components by
``otelkit.analysis._breakdown``; each component gets its mean and p99 over the traces. Two more
figures come from the same traces: the calls per request (the steps of a service option, for
the offload overhead per step) and which model each server stage ran in (a Triton model, a Ray Serve
deployment: for the capacity of each stage, with that model's instances and batching).

Traces arrive after the point ends (Triton exports every 200 ms, the client at a flush):
``collect`` waits until every sampled root has arrived with its calls' server spans and the
stages of each model that shows stages in any of the point's traces, or until no span came for
a while; a trace still without them then is counted incomplete, not read as stages of 0 ms (a
model whose stages run for only some of its requests waits that while).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otelkit import semconv
from otelkit.analysis._breakdown import RENAMED, TOTAL, Breakdown, breakdown
from otelkit.analysis._loader import Span, SpanKind, Trace, build_traces, iter_spans
from otelkit.analysis._source import open_source
from otelkit.analysis._store import SUFFIX

__all__ = ["ComponentStat", "PointTraces", "collect", "summarize"]


@dataclass(frozen=True)
class ComponentStat:
    """One component of a request's time over the traces of a point, in milliseconds."""

    mean_ms: float
    p99_ms: float


@dataclass
class PointTraces:
    """A point's breakdown: ``components`` by name (``total`` included), ms per request."""

    traces: int = 0
    incomplete: int = 0  # sampled requests whose server spans never came
    components: dict[str, ComponentStat] = field(default_factory=dict)
    calls_per_request: float = 0.0
    stage_models: dict[str, str] = field(default_factory=dict)  # "server <stage>" -> model
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "traces": self.traces,
            "incomplete": self.incomplete,
            "components": {
                k: {"mean_ms": v.mean_ms, "p99_ms": v.p99_ms} for k, v in self.components.items()
            },
            "calls_per_request": self.calls_per_request,
            "stage_models": dict(self.stage_models),
            "problems": list(self.problems[:10]),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PointTraces:
        return cls(
            traces=int(data.get("traces", 0)),
            incomplete=int(data.get("incomplete", 0)),
            components={
                RENAMED.get(k, k): ComponentStat(float(v["mean_ms"]), float(v["p99_ms"]))
                for k, v in data.get("components", {}).items()
            },
            calls_per_request=float(data.get("calls_per_request", 0.0)),
            stage_models=dict(data.get("stage_models", {})),
            problems=list(data.get("problems", [])),
        )


def _p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)] if ordered else 0.0


def _is_root_of(span: Span, run_id: str, point: int) -> bool:
    attributes = span.attributes
    return (
        span.name == semconv.STUDY_SPAN
        and attributes.get(semconv.STUDY_RUN) == run_id
        and str(attributes.get(semconv.STUDY_POINT)) == str(point)
        and attributes.get(semconv.STUDY_PHASE) == semconv.STUDY_PHASE_MEASURE
    )


def _model_of(trace: Trace, span: Span) -> str | None:
    by_id = trace.spans
    current: Span | None = span
    while current is not None:
        model = _named_model(current)
        if model:
            return model
        current = by_id.get(current.parent_span_id or "")
    return None


def summarize(
    traces: Iterable[Trace], run_id: str, point: int, *, waiting: bool = False
) -> PointTraces:
    """The breakdown of the measured roots of ``point`` of run ``run_id`` among ``traces``.

    ``waiting``: spans may still be on their way, so a trace that lacks a stage the other
    traces of its model ran is incomplete too (their exporter may send a request's stages in
    two batches); once nothing more arrives, a stage that some requests skip is counted as
    the request ran it."""
    chosen = [t for t in traces if any(_is_root_of(r, run_id, point) for r in t.roots)]
    stages = [_stages(t) for t in chosen]
    staged = {model for found in stages for model, _ in found}
    every = set().union(*stages)
    # a model's stages come from its own process (a Python backend's stub, a replica), often
    # later than the server's spans: a trace that has the model but not yet its stages would
    # count their time as 0 and lower the stage's demand (under load, 19.2 ms for a 20 ms
    # hold); so would one that has some of them (CI, acf4674: 19.23 ms, two traces short)
    partial = []
    for trace, found in zip(chosen, stages, strict=True):
        models = _models(trace)
        ran = {model for model, _ in found}
        if (models & staged) - ran or (
            waiting and {pair for pair in every if pair[0] in models} - found
        ):
            partial.append(trace)
    chosen = [t for t in chosen if t not in partial]
    groups = breakdown(chosen, root_name=semconv.STUDY_SPAN)
    group = next(iter(groups.values()), Breakdown(()))
    out = PointTraces(
        traces=group.traces, incomplete=group.incomplete + len(partial), problems=group.problems
    )
    for name, values in group.components.items():
        out.components[name] = ComponentStat(group.mean(name) * 1e3, _p99(values) * 1e3)
    calls = 0
    for trace in chosen:
        for span in trace.spans.values():
            if span.kind == SpanKind.CLIENT:
                calls += 1
            stage = span.attributes.get(semconv.STAGE_NAME)
            if stage is not None and span.kind != SpanKind.CLIENT:
                model = _model_of(trace, span)
                if model is not None and _served(trace, span):
                    out.stage_models.setdefault(f"server {stage}", model)
    out.calls_per_request = calls / len(chosen) if chosen else 0.0
    if TOTAL not in out.components and out.traces:
        out.problems.append("no total component")
    return out


def _named_model(span: Span) -> str | None:
    attributes = span.attributes
    model = attributes.get(semconv.TRITON_SPAN_MODEL_NAME) or attributes.get(semconv.MODEL_NAME)
    model = model or attributes.get(semconv.RAY_SERVE_DEPLOYMENT)
    return str(model) if model else None


def _models(trace: Trace) -> set[str]:
    """The models (and deployments) a trace's spans name."""
    return {m for m in map(_named_model, trace.spans.values()) if m is not None}


def _stages(trace: Trace) -> set[tuple[str, str]]:
    """The (model, stage name) of each of a trace's server stages."""
    found = set()
    for span in trace.spans.values():
        stage = span.attributes.get(semconv.STAGE_NAME)
        if stage is not None and span.kind != SpanKind.CLIENT:
            model = _model_of(trace, span)
            if model is not None and _served(trace, span):
                found.add((model, str(stage)))
    return found


def _served(trace: Trace, span: Span) -> bool:
    """Whether ``span`` runs in a server (below a CLIENT span, or below a span whose parent
    is missing: a hop exported elsewhere, as Ray Serve's proxy may), not in the client
    process."""
    by_id = trace.spans
    current = span
    while (parent := by_id.get(current.parent_span_id or "")) is not None:
        if parent.kind == SpanKind.CLIENT:
            return True
        current = parent
    return trace.is_orphan(current)


def segment_names(directory: str | Path) -> frozenset[str]:
    """The span store segments in ``directory`` now (none: it is not there)."""
    folder = Path(directory)
    if not folder.is_dir():
        return frozenset()
    return frozenset(path.name for path in folder.glob(f"spans-*{SUFFIX}"))


def _arrived(directory: str | Path, old: Collection[str]) -> list[Span]:
    if not Path(directory).exists():
        return []
    files = [path for path in open_source([directory]).files if path.name not in old]
    return list(iter_spans(*files)) if files else []


def collect(
    directory: str | Path,
    run_id: str,
    point: int,
    *,
    sampled: int,
    timeout_s: float = 10.0,
    quiet_s: float = 1.5,
    flush: Callable[[], object] | None = None,
    old: Collection[str] = (),
) -> PointTraces:
    """Wait for the ``sampled`` measured roots of ``point`` and their server spans, then
    summarize them; gives up ``quiet_s`` after the last new span, or after ``timeout_s``.

    ``flush`` makes the spans received so far readable (the receiver's segment written: a
    segment has no footer until then); ``old``: the names of segments written before the
    point began, which hold none of its spans and are not read again (a segment does not
    change once written: a point reads what arrived during it, not the whole study's)."""
    deadline = time.monotonic() + timeout_s
    last_count, last_change = -1, time.monotonic()
    while True:
        if flush is not None:
            flush()
        spans = _arrived(directory, old)
        traces = build_traces(spans).values()
        result = summarize(traces, run_id, point, waiting=True)
        now = time.monotonic()
        if len(spans) != last_count:
            last_count, last_change = len(spans), now
        arrived = result.traces + result.incomplete
        if arrived >= sampled and result.incomplete == 0:
            return result
        if now >= deadline or (now - last_change >= quiet_s and arrived > 0):
            return summarize(traces, run_id, point)  # what arrived is all there is
        time.sleep(0.2)
