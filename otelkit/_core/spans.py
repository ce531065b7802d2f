"""Lean spans for otelkit's hot paths: the SDK's own ``ReadableSpan``, at a fraction of the cost.

The SDK's ``Tracer.start_span`` takes locks, builds bounded containers and validates every
attribute, which costs more than an inference call can spare on telemetry. So otelkit builds
the span it exports directly: the same ids, sampler decision, trace flags, resource and scope
as the SDK would give, handed to the same span processors. Attributes come from otelkit's own
code and are valid by construction.

When otelkit is not configured (a user's own SDK, or ``opentelemetry-instrument``), spans go
through the global tracer instead: slower, but into whatever pipeline the process has.
"""

from __future__ import annotations

import os
import random
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from otelkit import semconv
from otelkit._core.context import current_context as _current_context
from otelkit._core.deps.otel import SPAN_KEY as _SPAN_KEY
from otelkit._core.deps.otel import active_span_processor, root_sampler, static_decision
from otelkit._core.switch import SWITCH
from otelkit._core.worker import LATER
from otelkit._propagation import format_traceparent

__all__ = [
    "NOT_SAMPLED",
    "READY_IDS",
    "READY_ROOTS",
    "UNDECIDED",
    "LeanSpan",
    "ReadyRoots",
    "RecordingSpan",
    "RootDecision",
    "RootRule",
    "SdkSpan",
    "SpanRecorder",
    "error_type",
    "with_own_parent_id",
    "with_span",
]

_SAMPLED = TraceFlags.SAMPLED
_RANDOM = TraceFlags.RANDOM_TRACE_ID
_INVALID = trace.INVALID_SPAN_CONTEXT
_SAMPLED_FLAGS = {flags: TraceFlags(flags | _SAMPLED) for flags in (0, _RANDOM)}
_UNSET = Status(StatusCode.UNSET)  # immutable: one for every span that has not failed


class RootDecision:
    """A root span's sampling decision, taken before the span is asked for, by the rule of
    ``SpanRecorder.roots``: ``UNDECIDED`` (the span decides as it starts), ``NOT_SAMPLED``,
    ``READY_IDS`` (sampled, its ids and header taken ready-made: ``SpanRecorder.take_root``),
    or sampled with the trace id drawn to decide it (``RootDecision.drawn``: a new one per
    sampled root; the others are the only ones of their kind, compared with ``is``)."""

    __slots__ = ("name", "sampled", "trace_id")

    def __init__(self, name: str, sampled: bool | None, trace_id: int = 0) -> None:
        self.name = name
        self.sampled = sampled  # None: undecided
        self.trace_id = trace_id

    @classmethod
    def drawn(cls, trace_id: int) -> RootDecision:
        """A root sampled by its trace id, drawn as the SDK draws one."""
        return cls("sampled", True, trace_id)

    def __repr__(self) -> str:
        return f"<RootDecision {self.name}>"


UNDECIDED = RootDecision("undecided", None)
NOT_SAMPLED = RootDecision("not sampled", False)
READY_IDS = RootDecision("ready ids", True)


class RootRule(NamedTuple):
    """How a root span (one with no span current) is decided before it is asked for, under
    the configuration of ``generation`` (``SWITCH.generation``): ``every_root``, the decision
    every root gets when it is fixed (``NOT_SAMPLED``; ``READY_IDS``; ``UNDECIDED`` where only
    the span can decide), else ``None``: a trace id ratio decides, and a root is sampled when
    the low 64 bits of its trace id, drawn first as the SDK draws them (128 random bits), fall
    under ``bound`` (``TraceIdRatioBased``'s rule)."""

    generation: int
    every_root: RootDecision | None
    bound: int


def with_span(span_context: SpanContext, base: Context | None = None) -> Context:
    """``base`` (default: the current context) with ``span_context`` as its span.

    otelkit's lean spans are not API spans: code that reads the current span (nested stages,
    user code, other instrumentations) sees a non-recording span with the same ids.
    """
    context = _current_context() if base is None else base
    return Context({**context, _SPAN_KEY: trace.NonRecordingSpan(span_context)})


def with_own_parent_id(parent: Context) -> Context:
    """``parent`` for a service that does not sample its request: the same trace, flags and
    tracestate, under a span id of its own. Trace Context Level 2 asks every participant to
    replace the parent-id it passes on, sampled or not, so that a service downstream is never
    told its parent is the caller's span.

    >>> incoming = with_span(SpanContext(0xAB, 0xCD, True, TraceFlags(0)), Context())
    >>> own = trace.get_current_span(with_own_parent_id(incoming)).get_span_context()
    >>> (own.trace_id, own.span_id != 0xCD, own.is_remote, own.trace_flags)
    (171, True, False, 0)
    """
    incoming = trace.get_current_span(parent).get_span_context()
    if not incoming.is_valid:
        return parent
    own = SpanContext(
        incoming.trace_id,
        random.getrandbits(64) or 1,
        False,
        incoming.trace_flags,
        incoming.trace_state,
    )
    return with_span(own, parent)


class ReadyRoots:
    """The ids and ``traceparent`` of sampled root spans, drawn ahead by ``LATER``'s worker.

    Drawing two random ids, building their ``SpanContext`` and formatting the header all
    happen before the request can leave, right after a network wait, when little of it is in
    the caches; a call that starts a trace takes them ready-made instead, and draws its own when
    none are ready. Only for the SDK's ``RandomIdGenerator``, whose ids hold nothing but
    randomness (a generator that encodes the time, such as X-Ray's, is asked at the call). A
    forked child forgets them: its parent holds the same ones.
    """

    def __init__(self, size: int = 512) -> None:
        self._size = size
        self._ready: deque[tuple[SpanContext, str]] = deque()
        self._ids = RandomIdGenerator()
        self._wanted = False  # nothing is drawn before a call asked once

    def take(self) -> tuple[SpanContext, str] | None:
        try:
            return self._ready.popleft()  # atomic: no lock between callers and the worker
        except IndexError:
            self._wanted = True
            return None

    def refill(self) -> None:
        if not self._wanted:
            return
        ready, ids, flags = self._ready, self._ids, _SAMPLED_FLAGS[_RANDOM]
        for _ in range(self._size - len(ready)):
            context = SpanContext(
                ids.generate_trace_id(), ids.generate_span_id(), False, flags, _INVALID.trace_state
            )
            ready.append((context, format_traceparent(context)))

    def _after_fork_in_child(self) -> None:
        self._ready.clear()


READY_ROOTS = ReadyRoots()
LATER.each_cycle(READY_ROOTS.refill)
os.register_at_fork(after_in_child=READY_ROOTS._after_fork_in_child)


class _Pipeline(NamedTuple):
    processor: SpanProcessor
    resource: Resource
    ids: IdGenerator
    sampler: Sampler
    root: Sampler | None  # what decides a span without a parent (None: the sampler's own way)
    root_sampled: bool | None  # the decision for a span without a parent, when it is fixed
    ready_roots: bool  # sampled root spans may take READY_ROOTS' ids
    gpu: Callable[[], dict[str, Any]] | None  # attributes of this process's GPU, when enriching


def _root_rule(pipeline: _Pipeline | None, generation: int) -> RootRule:
    """The ``RootRule`` of ``pipeline`` (``None``: otelkit is not configured): a fixed
    decision for the fixed samplers, a bound for a trace id ratio with the SDK's random ids,
    and ``UNDECIDED`` for any other sampler or id generator."""
    if pipeline is None:
        return RootRule(generation, UNDECIDED, 0)
    if pipeline.root_sampled is not None:  # fixed: every root dropped, or every one sampled
        if not pipeline.root_sampled:
            return RootRule(generation, NOT_SAMPLED, 0)
        return RootRule(generation, READY_IDS if pipeline.ready_roots else UNDECIDED, 0)
    root = pipeline.root
    if type(root) is TraceIdRatioBased and pipeline.ready_roots:  # the SDK's random ids
        return RootRule(generation, None, root.bound)
    return RootRule(generation, UNDECIDED, 0)


def _is_sampled(
    sampler: Sampler, parent: Context | None, trace_id: int, name: str, kind: SpanKind
) -> bool:
    decision = sampler.should_sample(parent, trace_id, name, kind).decision
    return decision is Decision.RECORD_AND_SAMPLE


def _sampled(
    pipeline: _Pipeline, parent: SpanContext, trace_id: int, name: str, kind: SpanKind
) -> bool:
    """The decision the SDK's sampler would take, without its allocations for the usual ones."""
    sampler = pipeline.sampler
    if parent.is_valid:
        if isinstance(sampler, ParentBased):  # with its default delegates: follows the parent
            return bool(parent.trace_flags & _SAMPLED)
        if pipeline.root is sampler and pipeline.root_sampled is not None:  # ALWAYS_ON, _OFF
            return pipeline.root_sampled
        context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
        return _is_sampled(sampler, context, trace_id, name, kind)
    if pipeline.root_sampled is not None:
        return pipeline.root_sampled
    root = pipeline.root
    if type(root) is TraceIdRatioBased:
        return trace_id & TraceIdRatioBased.TRACE_ID_LIMIT < root.bound
    return _is_sampled(sampler if root is None else root, None, trace_id, name, kind)


class LeanSpan:
    """A span being recorded; ``end()`` hands it to the span processors as a ``ReadableSpan``."""

    __slots__ = (
        "_pipeline",
        "_scope",
        "attributes",
        "context",
        "events",
        "kind",
        "links",
        "name",
        "parent",
        "start_ns",
        "status",
        "traceparent",
    )
    ids: SpanContext | None = None  # a recorded span's ids are its context

    def __init__(
        self,
        pipeline: _Pipeline,
        scope: InstrumentationScope,
        name: str,
        kind: SpanKind,
        context: SpanContext,
        parent: SpanContext | None,
        attributes: dict[str, Any],
        links: Sequence[Link] = (),
        traceparent: str | None = None,
        start_ns: int = 0,
    ) -> None:
        """``traceparent``: the header of ``context``, when it came ready-made; ``start_ns``:
        when the span started (default: now)."""
        self._pipeline = pipeline
        self._scope = scope
        self.name = name
        self.kind = kind
        self.context = context
        self.parent = parent
        self.attributes = attributes
        self.links = links
        self.traceparent = traceparent
        self.events: list[Event] = []
        self.status = _UNSET
        self.start_ns = start_ns or time.time_ns()

    sampled = True

    def add_event(
        self, name: str, attributes: dict[str, Any] | None = None, at_ns: int = 0
    ) -> None:
        self.events.append(Event(name, attributes, at_ns or time.time_ns()))

    def record_error(self, error: BaseException) -> None:
        """Mark the span failed by ``error``: status, ``error.type`` and an exception event."""
        kind = type(error).__qualname__
        self.attributes[semconv.ERROR_TYPE] = kind
        self.status = Status(StatusCode.ERROR, f"{kind}: {error}")
        self.add_event(
            "exception",
            {
                "exception.type": kind,
                "exception.message": str(error),
                "exception.stacktrace": "".join(traceback.format_exception(error)),
            },
        )

    def end(self, end_ns: int = 0) -> None:
        self._pipeline.processor.on_end(
            ReadableSpan(
                name=self.name,
                context=self.context,
                parent=self.parent,
                resource=self._pipeline.resource,
                attributes=self.attributes,
                events=self.events,
                links=self.links,
                kind=self.kind,
                status=self.status,
                start_time=self.start_ns,
                end_time=end_ns or time.time_ns(),
                instrumentation_scope=self._scope,
            )
        )


class SdkSpan:
    """The same interface over a span of the global tracer, when otelkit is not configured."""

    __slots__ = ("_span", "attributes", "context", "sampled")
    ids: SpanContext | None = None
    traceparent = None

    def __init__(self, span: trace.Span, attributes: dict[str, Any]) -> None:
        self._span = span
        self.context = span.get_span_context()
        self.sampled = span.is_recording() and bool(self.context.trace_flags & _SAMPLED)
        self.attributes = attributes  # set on the span at end, like LeanSpan

    def add_event(
        self, name: str, attributes: dict[str, Any] | None = None, at_ns: int = 0
    ) -> None:
        self._span.add_event(name, attributes, at_ns or None)

    def record_error(self, error: BaseException) -> None:
        kind = type(error).__qualname__
        self.attributes[semconv.ERROR_TYPE] = kind
        self._span.record_exception(error)
        self._span.set_status(Status(StatusCode.ERROR, f"{kind}: {error}"))

    def end(self, end_ns: int = 0) -> None:
        self._span.set_attributes(self.attributes)
        self._span.end(end_ns or None)


class _Unsampled:
    """What a call gets when its span is not sampled: nothing is recorded or propagated."""

    __slots__ = ()
    sampled = False
    ids: SpanContext | None = None  # an unsampled root's, for what starts beneath it
    traceparent = None
    context = trace.INVALID_SPAN_CONTEXT
    attributes: dict[str, Any] = {}

    def add_event(
        self, name: str, attributes: dict[str, Any] | None = None, at_ns: int = 0
    ) -> None:
        return None

    def record_error(self, error: BaseException) -> None:
        return None

    def end(self, end_ns: int = 0) -> None:
        return None


UNSAMPLED = _Unsampled()


class _UnsampledRoot(_Unsampled):
    """A root its sampler turned down after drawing its trace id (``traceidratio`` and the
    like): nothing is recorded, but a stage makes its ids current (``ids``), so that the
    stages and calls beneath it are not sampled as roots of their own by the same sampler."""

    __slots__ = ("ids",)

    def __init__(self, ids: SpanContext) -> None:
        self.ids = ids


RecordingSpan = LeanSpan | SdkSpan | _Unsampled


class SpanRecorder:
    """Starts lean spans for one instrumentation scope, following ``configure()``.

    A root span's sampling decision can be taken before ``start`` (``roots``: the rule) where
    the sampler decides a root by its trace id alone, or not at all: ``always_off``,
    ``always_on``, ``traceidratio`` and their ``parentbased_`` forms, with the SDK's random
    ids. A caller that finds its span would not be sampled may then skip ``start`` altogether
    (the client's calls not sampled); one whose root is sampled with ready ids (``READY_IDS``)
    may take them (``take_root``) and have ``root_span`` make its span later, off the
    caller's path.
    """

    __slots__ = ("_generation", "_scope", "_server", "_tracer", "pipeline", "roots")

    def __init__(self, scope_name: str, version: str = "", *, server: bool = False) -> None:
        self._scope = InstrumentationScope(scope_name, version)
        self._server = server  # server spans carry GPU attributes when configured to
        self._generation = -1
        self.pipeline: _Pipeline | None = None  # as of ``_generation``
        self._tracer = SWITCH.tracers.get_tracer(scope_name, version)
        # read with the configuration: until a span starts under a new one, a reader that
        # compares its generation with SWITCH's leaves the decision to the span
        self.roots = RootRule(-1, UNDECIDED, 0)

    def _current(self) -> _Pipeline | None:
        generation = SWITCH.generation
        if self._generation != generation:
            provider = SWITCH.configured_tracer_provider()
            sdk = isinstance(provider, TracerProvider)
            processor = active_span_processor(provider) if sdk else None
            if processor is None or not isinstance(provider, TracerProvider):
                self.pipeline = None  # not the SDK's provider, or its processor out of reach
            else:
                root = root_sampler(provider.sampler)
                self.pipeline = _Pipeline(
                    processor,
                    provider.resource,
                    provider.id_generator,
                    provider.sampler,
                    root,
                    static_decision(root),
                    type(provider.id_generator) is RandomIdGenerator,
                    SWITCH.span_attributes,
                )
            self._generation = generation
            self.roots = _root_rule(self.pipeline, generation)
        return self.pipeline

    def take_root(self) -> tuple[_Pipeline, tuple[SpanContext, str]] | None:
        """For a root decided ``READY_IDS`` (``roots``): the pipeline and the ready ids
        and header of its sampled span, whose ``LeanSpan`` ``root_span`` makes later; ``None``
        when no ids are ready (``start`` then draws them)."""
        pipeline, ready = self.pipeline, READY_ROOTS.take()
        return None if pipeline is None or ready is None else (pipeline, ready)

    def root_span(
        self,
        taken: tuple[_Pipeline, tuple[SpanContext, str]],
        name: str,
        kind: SpanKind,
        start_ns: int,
    ) -> LeanSpan:
        """The span of a root that ``take_root`` gave ids to, started at ``start_ns``."""
        pipeline, (context, traceparent) = taken
        return LeanSpan(
            pipeline,
            self._scope,
            name,
            kind,
            context,
            None,
            self._attributes(pipeline),
            (),
            traceparent,
            start_ns,
        )

    def _attributes(self, pipeline: _Pipeline) -> dict[str, Any]:
        """A new span's first attributes: a server span's GPU ones, when enriching."""
        gpu = pipeline.gpu
        return dict(gpu()) if gpu is not None and self._server else {}

    def start(
        self,
        name: str,
        kind: SpanKind,
        context: Context | None = None,
        links: Sequence[Link] = (),
        root: RootDecision = UNDECIDED,
    ) -> RecordingSpan:
        """A span, child of the current span (or of ``context``), or ``UNSAMPLED``.

        Its ``attributes`` dict starts empty (but for a server recorder's GPU attributes):
        fill it only when ``sampled``. ``root``: its decision by the rule of ``roots``, when no
        ``context`` is given (``READY_IDS`` whose ids were not taken: they are drawn here).
        """
        if root is NOT_SAMPLED:
            return UNSAMPLED
        # the span starts as it is asked for: the sampler's decision and the span's making
        # (about 13 µs on the 2-core VM) are then inside it, not in the gap before it that
        # the breakdown reads as the caller's own code (``client other``)
        now = time.time_ns()
        pipeline = self.pipeline if self._generation == SWITCH.generation else self._current()
        current = (_current_context() if context is None else context).get(_SPAN_KEY)
        if current is None:  # no span: skip the isinstance check against an ABC
            if pipeline is not None and pipeline.root_sampled is False:
                return UNSAMPLED  # the usual unsampled call: no parent, no ids to draw
            parent = _INVALID
        else:
            parent = current.get_span_context() if isinstance(current, trace.Span) else _INVALID
        if pipeline is None:
            span = self._tracer.start_span(name, context, kind, links=links)
            recorded = SdkSpan(span, {})
            return recorded if recorded.sampled else UNSAMPLED
        ready: tuple[SpanContext, str] | None = None
        if parent is not _INVALID and parent.is_valid:
            trace_id = parent.trace_id
            flags = int(parent.trace_flags) & _RANDOM
            if not _sampled(pipeline, parent, trace_id, name, kind):
                return UNSAMPLED
            parent_context: SpanContext | None = parent
        else:
            fixed = pipeline.root_sampled
            if fixed is False:  # ALWAYS_OFF at the root: no ids to draw
                return UNSAMPLED
            parent_context = None
            if root.trace_id:  # drawn to decide it, and sampled
                trace_id, flags = root.trace_id, _RANDOM
            else:
                if fixed and pipeline.ready_roots:
                    ready = READY_ROOTS.take()
                if ready is None:
                    trace_id = pipeline.ids.generate_trace_id()
                    flags = _RANDOM if pipeline.ids.is_trace_id_random() else 0
                    if fixed is None and not _sampled(pipeline, _INVALID, trace_id, name, kind):
                        # its ids go on: what starts beneath it is not sampled either
                        ids = SpanContext(
                            trace_id, pipeline.ids.generate_span_id(), False, TraceFlags(flags)
                        )
                        return _UnsampledRoot(ids)
        if ready is None:
            span_context = SpanContext(
                trace_id,
                pipeline.ids.generate_span_id(),
                False,
                _SAMPLED_FLAGS[flags],
                parent.trace_state,
            )
            traceparent = None
        else:
            span_context, traceparent = ready
        return LeanSpan(
            pipeline,
            self._scope,
            name,
            kind,
            span_context,
            parent_context,
            self._attributes(pipeline),
            links,
            traceparent,
            now,
        )


def error_type(error: BaseException) -> str:
    """A low-cardinality name for a failure: the gRPC status or HTTP code, else the class."""
    status = getattr(error, "status", None)
    code = status() if callable(status) else None
    if code:
        return str(code).removeprefix("StatusCode.")
    return type(error).__qualname__
