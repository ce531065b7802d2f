"""The private names of ``opentelemetry-api`` and ``opentelemetry-sdk`` that otelkit reads.

Each is read once, at import or where it is used; a name gone from a newer release degrades
to the public API with one log line (``degraded``), never an exception:

- ``opentelemetry.context._RUNTIME_CONTEXT`` (attach, detach and read the current context
  without the API's wrappers): else the API's ``attach``, ``detach``, ``get_current``;
- its ``_current_context`` ``ContextVar`` (the current context in one read): else the
  runtime's ``get_current``;
- ``opentelemetry.trace.propagation._SPAN_KEY`` and
  ``opentelemetry.context._SUPPRESS_INSTRUMENTATION_KEY`` (looked up in a ``Context``
  directly): else the same keys, found by asking the public API to set them;
- ``TracerProvider._active_span_processor`` (otelkit's lean spans end into it): else spans
  start through the SDK's tracer, slower, with the same content;
- ``TracerProvider._update_resource`` or ``_resource`` (a forked child's ``process.pid``):
  else the child's spans keep the parent's resource;
- ``ParentBased._root`` and ``StaticSampler._decision`` (a root's decision known without
  asking the sampler): else the sampler's ``should_sample`` decides each root;
- ``TraceState._dict`` (a tracestate built from entries already checked, and kept in the
  order and with the keys of the W3C Level-2 grammar): else ``TraceState``'s constructor,
  which checks them again by OpenTelemetry's grammar (and may drop Level-2-only keys);
- ``ReadableSpan._attributes``, ``_events``, ``_links`` and ``BoundedAttributes._dict`` (a
  span's parts read without the copies its properties make): else those properties;
- ``opentelemetry.baggage._BAGGAGE_KEY`` (baggage read from a ``Context`` directly): else the
  key found by asking ``baggage.set_baggage``;
- ``Exemplar`` (``opentelemetry.sdk.metrics``' public name, else its ``_internal``'s): else
  the points of otelkit's hot histograms go without exemplars.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, Sampler, StaticSampler
from opentelemetry.trace import TraceState

from otelkit._core.deps import degraded

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import Event
    from opentelemetry.trace import Link

__all__ = [
    "BAGGAGE_KEY",
    "RUNTIME_CONTEXT",
    "SPAN_KEY",
    "SUPPRESS_INSTRUMENTATION_KEY",
    "RuntimeContext",
    "active_span_processor",
    "attribute_items",
    "context_reader",
    "exemplar_class",
    "fill_trace_state",
    "merge_resource",
    "root_sampler",
    "span_contents",
    "static_decision",
]

_API = "opentelemetry-api"
_SDK = "opentelemetry-sdk"


class RuntimeContext(Protocol):
    """What otelkit calls on OpenTelemetry's runtime context."""

    def attach(self, context: Context) -> object: ...

    def detach(self, token: Any) -> None: ...

    def get_current(self) -> Context: ...


class _PublicRuntime:
    """The API's functions in place of the runtime's methods: a call or two more each."""

    def attach(self, context: Context) -> object:
        return otel_context.attach(context)

    def detach(self, token: Any) -> None:
        otel_context.detach(token)

    def get_current(self) -> Context:
        return otel_context.get_current()


def _runtime_context(module: Any = otel_context) -> RuntimeContext:
    runtime: RuntimeContext | None = getattr(module, "_RUNTIME_CONTEXT", None)
    if runtime is None or not all(
        callable(getattr(runtime, name, None)) for name in ("attach", "detach", "get_current")
    ):
        degraded(
            _API,
            "opentelemetry.context._RUNTIME_CONTEXT",
            "attaches and reads contexts through opentelemetry.context's functions (slower)",
        )
        return _PublicRuntime()
    return runtime


#: Attach, detach and read the current context (the runtime's own methods where it has them).
RUNTIME_CONTEXT: RuntimeContext = _runtime_context()


def context_reader(runtime: object = RUNTIME_CONTEXT) -> Callable[[], Context]:
    """The fastest reader of the current ``Context``: the default runtime's ``ContextVar``,
    else the runtime's ``get_current``. Any other runtime (``OTEL_PYTHON_CONTEXT``) goes its
    own way, quietly."""
    variable = getattr(runtime, "_current_context", None)
    if isinstance(variable, contextvars.ContextVar):
        read: Callable[[], Context] = variable.get
        return read
    if type(runtime).__name__ == "ContextVarsRuntimeContext":
        degraded(
            _API,
            "ContextVarsRuntimeContext._current_context",
            "reads the current context through the runtime's get_current (slower)",
        )
    get_current: Callable[[], Context] = getattr(runtime, "get_current", otel_context.get_current)
    return get_current


def _key_set_by(context: Context) -> str:
    """The one key the public API added to an empty context."""
    return next(iter(context))


def _span_key(module: Any = None) -> str:
    if module is None:
        from opentelemetry.trace import propagation as module
    key = getattr(module, "_SPAN_KEY", None)
    if isinstance(key, str):
        return key
    degraded(
        _API,
        "opentelemetry.trace.propagation._SPAN_KEY",
        "finds the span key through trace.set_span_in_context",
    )
    return _key_set_by(trace.set_span_in_context(trace.INVALID_SPAN, Context()))


def _suppress_key(module: Any = otel_context) -> str:
    key = getattr(module, "_SUPPRESS_INSTRUMENTATION_KEY", None)
    if isinstance(key, str):
        return key
    try:
        from opentelemetry.instrumentation.utils import suppress_instrumentation
    except ImportError:
        instead = "sees instrumentation suppressed by the plain 'suppress_instrumentation' key only"
        degraded(_API, "opentelemetry.context._SUPPRESS_INSTRUMENTATION_KEY", instead)
        return "suppress_instrumentation"
    degraded(
        _API,
        "opentelemetry.context._SUPPRESS_INSTRUMENTATION_KEY",
        "finds the key through opentelemetry.instrumentation.utils.suppress_instrumentation",
    )
    before = set(otel_context.get_current())
    with suppress_instrumentation():
        added = [k for k in otel_context.get_current() if k not in before]
    return added[0] if added else "suppress_instrumentation"


#: The key of the current span in a ``Context``.
SPAN_KEY: str = _span_key()
#: The key that ``suppress_instrumentation()`` sets in a ``Context``.
SUPPRESS_INSTRUMENTATION_KEY: str = _suppress_key()


def _baggage_key(module: Any = None) -> str:
    if module is None:
        from opentelemetry import baggage as module
    key = getattr(module, "_BAGGAGE_KEY", None)
    if isinstance(key, str):
        return key
    degraded(
        _API,
        "opentelemetry.baggage._BAGGAGE_KEY",
        "finds the baggage key through baggage.set_baggage",
    )
    from opentelemetry import baggage

    return _key_set_by(baggage.set_baggage("k", "v", Context()))


#: The key of the baggage in a ``Context``.
BAGGAGE_KEY: str = _baggage_key()


def active_span_processor(provider: object) -> Any | None:
    """The SDK ``TracerProvider``'s span processor (all of its processors in one), or ``None``:
    spans then start through the SDK's tracer."""
    processor = getattr(provider, "_active_span_processor", None)
    if processor is None or not callable(getattr(processor, "on_end", None)):
        degraded(
            _SDK,
            "TracerProvider._active_span_processor",
            "starts its spans through the SDK's tracer (slower; the same spans)",
        )
        return None
    return processor


def merge_resource(provider: Any, addition: Any) -> bool:
    """Merge ``addition`` into an SDK ``TracerProvider``'s resource (a forked child's
    ``process.pid``): the SDK's own ``_update_resource`` (which its tracers follow), else its
    ``_resource``. ``False`` when it has neither: the spans keep the resource they had."""
    update = getattr(provider, "_update_resource", None)
    if callable(update):
        update(addition)
        return True
    if hasattr(provider, "_resource"):
        provider._resource = provider.resource.merge(addition)
        return True
    degraded(
        _SDK,
        "TracerProvider._update_resource and _resource",
        "leaves a forked child's spans with its parent's resource (process.pid)",
    )
    return False


def root_sampler(sampler: Sampler) -> Sampler | None:
    """The sampler that decides root spans: a ``ParentBased``'s delegate for them (its
    ``_root``), or ``sampler`` itself; ``None`` when a ``ParentBased`` keeps it elsewhere: its
    ``should_sample`` then decides each root."""
    if not isinstance(sampler, ParentBased):
        return sampler
    root = getattr(sampler, "_root", None)
    if isinstance(root, Sampler):
        return root
    degraded(_SDK, "ParentBased._root", _ASKS_THE_SAMPLER)
    return None


def static_decision(sampler: Sampler | None) -> bool | None:
    """Whether ``sampler`` samples every span (``ALWAYS_ON``: ``True``) or none
    (``ALWAYS_OFF``: ``False``), read from a ``StaticSampler``'s ``_decision``; ``None`` for
    any other sampler, or a ``StaticSampler`` that keeps its decision elsewhere."""
    if not isinstance(sampler, StaticSampler):
        return None
    decision = getattr(sampler, "_decision", None)
    if isinstance(decision, Decision):
        return decision is Decision.RECORD_AND_SAMPLE
    degraded(_SDK, "StaticSampler._decision", _ASKS_THE_SAMPLER)
    return None


_ASKS_THE_SAMPLER = "asks the sampler's should_sample for each root span (slower)"


def _stores_entries_in_dict() -> bool:
    """Whether ``TraceState`` reads its entries from its ``_dict``."""
    probe = TraceState.__new__(TraceState)
    probe._dict = {"k": "v"}
    try:
        return len(probe) == 1 and probe.get("k") == "v" and probe.to_header() == "k=v"
    except Exception:
        return False


def _fill_dict(state: TraceState, entries: dict[str, str]) -> None:
    state._dict = entries


def _fill_through_constructor(state: TraceState, entries: dict[str, str]) -> None:
    degraded(
        _API,
        "TraceState._dict",
        "builds tracestates through TraceState's constructor (each entry checked again, by "
        "OpenTelemetry's grammar: keys only W3C Level 2 allows are dropped)",
    )
    TraceState.__init__(state, list(entries.items()))


def _trace_state_filler() -> Callable[[TraceState, dict[str, str]], None]:
    return _fill_dict if _stores_entries_in_dict() else _fill_through_constructor


#: Store entries already checked in a new ``TraceState`` (made with ``__new__``), in order.
fill_trace_state = _trace_state_filler()


def span_contents(
    span: ReadableSpan,
) -> tuple[Mapping[str, Any] | None, Sequence[Event], Sequence[Link]]:
    """A span's attributes, events and links. A ``ReadableSpan``'s properties wrap the first in
    a proxy and copy the others into tuples, on every read; its own fields read at once."""
    if type(span) is ReadableSpan:
        try:
            return span._attributes, span._events, span._links
        except AttributeError:
            degraded(
                _SDK,
                "ReadableSpan._attributes, _events and _links",
                "reads spans through their properties (copies: slower)",
            )
    return span.attributes, span.events, span.links


def attribute_items(attributes: Mapping[Any, Any] | None) -> Iterable[tuple[Any, Any]]:
    """The pairs of a span's ``attributes``, in order: a ``BoundedAttributes``' own dict
    (``_dict``: iterating the mapping costs a generator step and a lookup a pair)."""
    if type(attributes) is BoundedAttributes:
        pairs = getattr(attributes, "_dict", None)
        if type(pairs) is dict:  # spans are immutable once ended: nothing changes it
            return pairs.items()
        degraded(_API, "BoundedAttributes._dict", "reads attributes through the mapping (slower)")
    return attributes.items() if attributes else ()


@functools.cache
def exemplar_class() -> type | None:
    """The SDK's ``Exemplar`` (its public name, else where older releases keep it), or
    ``None``: otelkit's hot histograms then collect points without exemplars."""
    from opentelemetry.sdk import metrics

    found = getattr(metrics, "Exemplar", None)
    if isinstance(found, type):
        return found
    try:
        from opentelemetry.sdk.metrics._internal.exemplar import Exemplar
    except ImportError:
        degraded(
            _SDK,
            "opentelemetry.sdk.metrics.Exemplar",
            "collects its hot histograms' points without exemplars",
        )
        return None
    private: type = Exemplar
    return private
