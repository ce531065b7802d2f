"""W3C Trace Context (Level 1 and 2) and W3C Baggage propagation, spec-exact.

OpenTelemetry Python's ``TraceContextTextMapPropagator`` still checks tracestate keys with the
Level-1 ``tenant@system`` grammar and drops keys valid today (``1abc``, ``a@b@c``), so the whole
tracestate of such a request is lost. This module parses by the Level-2 grammar
(https://www.w3.org/TR/trace-context-2/) and reads every carrier an inference server meets:
header mappings (case-insensitive, duplicate headers combined with ``,`` as RFC 9110 says) and
gRPC or ASGI metadata as sequences of ``(key, value)`` pairs, ``str`` or ``bytes``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any, cast

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators import textmap
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from otelkit._core.baggage import format_baggage, parse_baggage
from otelkit._core.carriers import Carrier, CarrierT, read, write
from otelkit._core.context import current_context
from otelkit._core.deps.otel import BAGGAGE_KEY as _BAGGAGE_KEY
from otelkit._core.deps.otel import fill_trace_state

__all__ = [
    "Carrier",
    "W3CPropagator",
    "W3CTraceState",
    "extract",
    "format_traceparent",
    "format_tracestate",
    "has_baggage",
    "headers_for",
    "inject",
    "parse_traceparent",
    "parse_tracestate",
]

_logger = logging.getLogger(__name__)

_TRACEPARENT, _TRACESTATE, _BAGGAGE = "traceparent", "tracestate", "baggage"
_FIELDS = frozenset((_TRACEPARENT, _TRACESTATE, _BAGGAGE))
_TRACE_ONLY, _BAGGAGE_ONLY = frozenset((_TRACEPARENT, _TRACESTATE)), frozenset((_BAGGAGE,))
_FLAGS_HEX = ("00", "01", "02", "03")
_TRACEPARENT_RE = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_KEY_RE = re.compile(r"[a-z0-9][a-z0-9_\-*/@]{0,255}")  # Level 2, w3c/trace-context #386
_VALUE_RE = re.compile(r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
_MEMBER_RE = re.compile(rf"({_KEY_RE.pattern})=({_VALUE_RE.pattern})")
_MAX_MEMBERS = 32
_KNOWN_FLAGS = TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID  # unknown bits are zeroed
_ZERO_TRACE_ID, _ZERO_SPAN_ID = "0" * 32, "0" * 16
_FLAGS = {f"{i:02x}": TraceFlags(i & _KNOWN_FLAGS) for i in range(256)}  # hex -> kept bits


class W3CTraceState(TraceState):
    """A ``TraceState`` whose keys are checked by the Level-2 grammar, not OpenTelemetry's.

    It keeps OpenTelemetry's contract: an invalid or duplicate entry is dropped with a warning,
    more than 32 entries give an empty state, and ``add``/``update``/``delete`` return new
    states (with the changed key first, as the spec asks).

    >>> W3CTraceState([("1abc", "x"), ("a@b@c", "y")]).to_header()
    '1abc=x,a@b@c=y'
    """

    def __init__(self, entries: Sequence[tuple[str, str]] | None = None) -> None:
        kept: dict[str, str] = {}
        if entries is not None and len(entries) > _MAX_MEMBERS:
            _logger.warning("tracestate: more than %d entries, all dropped", _MAX_MEMBERS)
        elif entries is not None:
            for key, value in entries:
                if not _is_valid_entry(key, value) or key in kept:
                    _logger.warning(
                        "tracestate: invalid or duplicate entry %r=%r dropped", key, value
                    )
                    continue
                kept[key] = value
        fill_trace_state(self, kept)

    @classmethod
    def _trusted(cls, entries: Iterable[tuple[str, str]]) -> W3CTraceState:
        state = cls.__new__(cls)  # entries already validated: skip the per-entry checks
        fill_trace_state(state, dict(entries))
        return state

    @classmethod
    def from_header(cls, header_list: list[str]) -> W3CTraceState:
        """Parse ``tracestate`` header values; an invalid header gives an empty state."""
        return cls._trusted(parse_tracestate(",".join(header_list)) or ())

    def add(self, key: str, value: str) -> W3CTraceState:
        """A new state with ``key`` first; unchanged if the key exists, is invalid or full."""
        if key in self or len(self) >= _MAX_MEMBERS or not _is_valid_entry(key, value):
            _logger.warning("tracestate: cannot add %r=%r", key, value)
            return self
        return self._trusted([(key, value), *self.items()])

    def update(self, key: str, value: str) -> W3CTraceState:
        """A new state with ``key`` set and moved first (added if absent and there is room)."""
        if not _is_valid_entry(key, value) or (key not in self and len(self) >= _MAX_MEMBERS):
            _logger.warning("tracestate: cannot update %r=%r", key, value)
            return self
        rest = [(k, v) for k, v in self.items() if k != key]
        return self._trusted([(key, value), *rest])

    def delete(self, key: str) -> W3CTraceState:
        """A new state without ``key`` (unchanged if absent)."""
        if key not in self:
            return self
        return self._trusted((k, v) for k, v in self.items() if k != key)


def _is_valid_entry(key: object, value: object) -> bool:
    return (
        isinstance(key, str)
        and isinstance(value, str)
        and _KEY_RE.fullmatch(key) is not None
        and _VALUE_RE.fullmatch(value) is not None
    )


def _parse_traceparent(value: str) -> tuple[int, int, TraceFlags] | None:
    value = value.strip(" \t")
    match = _TRACEPARENT_RE.match(value)
    if match is None:
        return None
    version, trace_id, span_id, flags = match.groups()
    if version == "ff" or trace_id == _ZERO_TRACE_ID or span_id == _ZERO_SPAN_ID:
        return None
    # Version 00 is exactly 55 characters; a later version may append "-" and more fields.
    if len(value) != 55 and (version == "00" or value[55] != "-"):
        return None
    return int(trace_id, 16), int(span_id, 16), _FLAGS[flags]


def parse_traceparent(value: str) -> SpanContext | None:
    """The remote ``SpanContext`` of a ``traceparent`` value, or ``None`` when invalid.

    >>> ctx = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    >>> (hex(ctx.span_id), ctx.trace_flags.sampled, ctx.is_remote)
    ('0xf067aa0ba902b7', True, True)
    """
    ids = _parse_traceparent(value)
    if ids is None:
        return None
    return SpanContext(ids[0], ids[1], is_remote=True, trace_flags=ids[2])


def parse_tracestate(value: str) -> list[tuple[str, str]] | None:
    """The ``(key, value)`` entries of a ``tracestate`` value in order; ``None`` when invalid.

    An invalid value is discarded whole: a malformed member or more than 32 members. A key that
    comes again is not an error in Trace Context Level 2: the header is kept, and of the
    duplicates the first (the most recent vendor's) is, the later ones discarded. Empty members
    and whitespace around commas are allowed.

    >>> parse_tracestate("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE,")
    [('rojo', '00f067aa0ba902b7'), ('congo', 't61rcWkgMzE')]
    >>> parse_tracestate("rojo=1,congo=2,rojo=3")
    [('rojo', '1'), ('congo', '2')]
    """
    entries: dict[str, str] = {}
    members = 0
    for member in value.split(","):
        member = member.strip(" \t")
        if not member:
            continue
        match = _MEMBER_RE.fullmatch(member)
        members += 1
        if match is None or members > _MAX_MEMBERS:
            _logger.debug("tracestate discarded at member %r", member)
            return None
        entries.setdefault(match[1], match[2])
    return list(entries.items())


def format_traceparent(span_context: SpanContext) -> str:
    """The version-00 ``traceparent`` of a valid span context, unknown flag bits zeroed.

    >>> format_traceparent(SpanContext(0x1, 0x2, is_remote=False, trace_flags=TraceFlags(0x83)))
    '00-00000000000000000000000000000001-0000000000000002-03'
    """
    if not span_context.is_valid:
        raise ValueError(f"otelkit: cannot format an invalid span context: {span_context!r}")
    return _format_traceparent(
        span_context.trace_id, span_context.span_id, span_context.trace_flags
    )


def _format_traceparent(trace_id: int, span_id: int, flags: int) -> str:
    # %-formatting the 128-bit id is faster than an f-string, and this is the hot path.
    return "00-%032x-%016x-%s" % (trace_id, span_id, _FLAGS_HEX[flags & _KNOWN_FLAGS])  # noqa: UP031


def format_tracestate(trace_state: Mapping[str, str]) -> str:
    """The ``tracestate`` value of a ``TraceState`` (or mapping), in order, without spaces.

    >>> format_tracestate(W3CTraceState([("rojo", "1"), ("congo", "2")]))
    'rojo=1,congo=2'
    """
    if not isinstance(trace_state, TraceState):  # a TraceState was validated when built
        trace_state = W3CTraceState(list(trace_state.items()))
    return ",".join([f"{key}={value}" for key, value in trace_state.items()])


def _extract(fields: Mapping[str, str], context: Context | None) -> Context:
    context = Context() if context is None else context
    header = fields.get(_BAGGAGE)
    if header:
        context = parse_baggage(header, context)
    header = fields.get(_TRACEPARENT)
    ids = None if header is None else _parse_traceparent(header)
    if ids is None:
        return context
    header = fields.get(_TRACESTATE)
    entries = None if header is None else parse_tracestate(header)
    trace_state = W3CTraceState._trusted(entries) if entries else None
    span_context = SpanContext(ids[0], ids[1], True, ids[2], trace_state)
    return trace.set_span_in_context(NonRecordingSpan(span_context), context)


def _fields(context: Context | None) -> tuple[list[tuple[str, str]], frozenset[str]]:
    """The headers to write for ``context`` and the names they replace."""
    context = current_context() if context is None else context
    return _span_fields(trace.get_current_span(context).get_span_context(), context)


def _span_fields(
    span_context: SpanContext, context: Context
) -> tuple[list[tuple[str, str]], frozenset[str]]:
    # One unpacking instead of four property calls: this runs on every inference call.
    trace_id, span_id, _, flags, trace_state, is_valid = span_context
    entries = context.get(_BAGGAGE_KEY)  # what baggage.get_all reads, without its copy
    baggage_header = format_baggage(entries) if entries and isinstance(entries, dict) else ""
    if not is_valid:
        return ([(_BAGGAGE, baggage_header)], _BAGGAGE_ONLY) if baggage_header else ([], _FIELDS)
    fields = [(_TRACEPARENT, _format_traceparent(trace_id, span_id, flags))]
    if trace_state:
        fields.append((_TRACESTATE, format_tracestate(trace_state)))
    if baggage_header:
        fields.append((_BAGGAGE, baggage_header))
        return fields, _FIELDS
    # A tracestate left from another request would describe another trace: it goes too.
    return fields, _TRACE_ONLY


def has_baggage(context: Context | None = None) -> bool:
    """Whether ``context`` (default: the current one) holds baggage that ``inject`` would send."""
    return bool((current_context() if context is None else context).get(_BAGGAGE_KEY))


def headers_for(span_context: SpanContext, context: Context | None = None) -> list[tuple[str, str]]:
    """The headers that carry ``span_context`` (and the baggage of ``context``) to a server.

    For instrumentation whose span is not the current one, such as a client call span.

    >>> headers_for(SpanContext(0xAB, 0xCD, False, TraceFlags(1)))
    [('traceparent', '00-000000000000000000000000000000ab-00000000000000cd-01')]
    """
    return _span_fields(span_context, current_context() if context is None else context)[0]


def extract(carrier: Carrier, context: Context | None = None) -> Context:
    """A Context holding the remote span and the baggage that ``carrier`` propagates.

    ``context`` defaults to an empty one, so nothing of the current context leaks into a
    request's. An invalid or missing ``traceparent`` adds no span (and its tracestate is
    ignored), but baggage is still read.

    >>> ctx = extract({"Traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
    >>> f"{trace.get_current_span(ctx).get_span_context().trace_id:032x}"
    '4bf92f3577b34da6a3ce929d0e0e4736'
    """
    return _extract(read(carrier, _FIELDS), context)


def inject(carrier: CarrierT, context: Context | None = None) -> CarrierT:
    """Write ``traceparent``, ``tracestate`` and ``baggage`` for ``context`` into ``carrier``.

    ``context`` defaults to the current one. Trace headers are written only for a valid span
    context; baggage whenever there is some. A header of ours already there in any letter
    case is replaced, other headers are left as they are. A list is changed in place and a
    tuple (immutable gRPC metadata) gives a new tuple: use the return value.

    >>> span = NonRecordingSpan(SpanContext(0xAB, 0xCD, False, TraceFlags(1)))
    >>> inject({"X-Request-Id": "7"}, trace.set_span_in_context(span))
    {'X-Request-Id': '7', 'traceparent': '00-000000000000000000000000000000ab-00000000000000cd-01'}
    """
    fields, owned = _fields(context)
    return write(carrier, fields, owned) if fields else carrier


class W3CPropagator(textmap.TextMapPropagator):
    """``extract``/``inject`` behind OpenTelemetry's propagator interface.

    With the default getter and setter it reads and writes carriers as ``extract`` and
    ``inject`` do; custom ones (an instrumentation's ASGI getter) are used as given. Install
    it for every instrumentation with ``opentelemetry.propagate.set_global_textmap``.

    >>> sorted(W3CPropagator().fields)
    ['baggage', 'traceparent', 'tracestate']
    """

    def extract(
        self,
        carrier: textmap.CarrierT,
        context: Context | None = None,
        getter: textmap.Getter[textmap.CarrierT] = textmap.default_getter,
    ) -> Context:
        """See ``opentelemetry.propagators.textmap.TextMapPropagator.extract``."""
        if getter is textmap.default_getter:
            return _extract(read(cast("Carrier", carrier), _FIELDS), context)
        fields = {}
        for name in _FIELDS:
            values = getter.get(carrier, name)
            if values:
                fields[name] = ",".join(values)
        return _extract(fields, context)

    def inject(
        self,
        carrier: textmap.CarrierT,
        context: Context | None = None,
        setter: textmap.Setter[textmap.CarrierT] = textmap.default_setter,
    ) -> None:
        """See ``opentelemetry.propagators.textmap.TextMapPropagator.inject``."""
        fields, owned = _fields(context)
        if not fields:
            return
        if setter is textmap.default_setter:  # a tuple cannot come back through this API
            write(cast("MutableMapping[str, Any]", carrier), fields, owned)
            return
        for name, value in fields:
            setter.set(carrier, name, value)

    @property
    def fields(self) -> set[str]:
        """The headers ``inject`` writes."""
        return set(_FIELDS)
