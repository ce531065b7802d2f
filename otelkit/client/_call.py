"""One inference call as the client sees it: its metrics, and, when sampled, its CLIENT span.

Shared by every tritonclient flavour. A call starts before the request is built and ends when
the result is in the caller's hands (``finish``); a sampled call's transport hooks record when
its request left (``sent``) and when its response came back (``received``), which splits the
call into client serialisation, the wire and the server, and client deserialisation.

What is left of a call once its result is in hand does not change what the caller gets, so it
is handed to ``LATER``'s worker, off the caller's path: the response's bytes, the metrics, the
span's attributes and its end.

Telemetry never breaks inference: every step here is guarded, the user's call runs outside the
guard and its exceptions pass through untouched.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext, SpanKind

from otelkit import semconv
from otelkit._core.carriers import write
from otelkit._core.guard import internal_error
from otelkit._core.hotmetrics import HOT
from otelkit._core.spans import (
    NOT_SAMPLED,
    READY_IDS,
    UNDECIDED,
    LeanSpan,
    RecordingSpan,
    RootDecision,
    SpanRecorder,
    error_type,
)
from otelkit._core.worker import LATER
from otelkit._propagation import has_baggage, headers_for
from otelkit.client._target import ERROR_LABELS, ClientTarget, PerModel, output_count
from otelkit.client._wire import KEEP_WIRE_BYTES, counted_on_wire

__all__ = ["CURRENT_CALL", "RECORDER", "Call", "MeteredCall", "with_trace_context"]

CURRENT_CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar(
    "otelkit_current_call", default=None
)
RECORDER = SpanRecorder("otelkit.client")
_CLIENT = SpanKind.CLIENT  # a module global: an enum's member is a slower read
_clock = time.perf_counter_ns
_WAITING, _LIMIT = LATER.waiting, LATER.limit


def with_trace_context(
    caller: Mapping[str, str] | None, span: SpanContext, traceparent: str | None = None
) -> dict[str, str]:
    """A copy of the caller's headers, untouched, with the trace context of ``span`` added.

    Only sampled spans come here: Triton traces every request that carries a context,
    whatever its own sampling rate (triton-inference-server/server#8474), so an unsampled
    call sends none. A header the caller set under the same name (any case) is replaced.
    ``traceparent``: the span's header, when it came ready-made (``spans.ReadyRoots``); it is
    all there is to send when the caller has no headers and the context no baggage.
    """
    try:
        if traceparent is not None and not caller and not has_baggage():
            return {"traceparent": traceparent}
        merged = dict(caller) if caller else {}
        fields = headers_for(span)
        if not merged:
            return dict(fields)
        return write(merged, fields, frozenset(name for name, _ in fields))
    except Exception:
        internal_error("injecting trace context")
        return dict(caller) if caller else {}


def _count_error(per: PerModel, error: BaseException) -> None:
    labels = (*per.labels, error_type(error))
    HOT.counter(semconv.CLIENT_ERRORS, ERROR_LABELS).series(labels).add(1)


class MeteredCall:
    """One inference request in flight, as its metrics see it: its duration, its request's
    and its response's tensor bytes, its failure. All that a call records when it is known
    not to be sampled before a span is asked for (``begin``): no span, no context sent, and it
    is not the current call (``CURRENT_CALL``), so the transport hooks find none and do
    nothing. The response is counted from the call's result, which is kept until then.
    """

    __slots__ = ("end", "per", "request_bytes", "result", "start")
    sampled = False
    ends_later = True
    root = NOT_SAMPLED  # the decision that makes a call a MeteredCall (``_begin.begin``)

    def __init__(self, target: ClientTarget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """``args`` and ``kwargs``: ``infer``'s (model_name, inputs, model_version, ...).

        Its model's record is looked up, and its request's tensor bytes counted from the inputs
        the caller holds as the call starts (the caller may refill them once it returns: the
        binary part only, tensors sent as JSON or through shared memory count zero)."""
        count = len(args)
        model = args[0] if count else kwargs["model_name"]
        version = (args[2] if count > 2 else kwargs.get("model_version")) or ""
        self.per = per = target.by_model.get(
            (model, version) if version else model
        ) or target.per_model(model, version)
        name = per.tensors.input_attribute
        request_bytes = 0
        for tensor in args[1] if count > 1 else kwargs.get("inputs", ()):
            raw = getattr(tensor, name, None)
            if raw:
                request_bytes += len(raw)
        self.request_bytes = request_bytes
        per.calls.in_flight.begin()
        self.start = _clock()

    def finish(self, error: BaseException | None = None, result: Any = None) -> None:
        """The call is over: it returned ``result``, or failed with ``error``. What is left of
        its telemetry runs off the caller's path (``LATER``), but for a failure's, and a span's
        of another SDK's tracer, which ends on the thread that made it. Never raises."""
        self.end = _clock()
        self.result = result
        if error is None and self.ends_later:
            if len(_WAITING) < _LIMIT:  # LATER.add without its frame: every call comes here
                _WAITING.append(self._end)
            else:
                LATER.add(self._end)
            return
        try:
            self._end(error)
        except Exception:
            internal_error("ending a client span")

    def _end(self, error: BaseException | None = None) -> None:
        try:
            per = self.per
            if error is None:
                response_bytes = per.tensors.response(self.result)[0]
            else:
                _count_error(per, error)
                response_bytes = 0
            per.calls.end((self.end - self.start) / 1e9, self.request_bytes, response_bytes)
        except Exception:
            internal_error("ending a client call's metrics")


# What a sampled call's span says of its request: number of inputs, number of outputs asked
# for, request id, first dimension of the first input (batch size). Taken from the caller's
# inputs as the call starts (the caller may reuse them for the next call before the span is
# ended), or, off the caller's path, from the request message the transport built from them.
_Facts = tuple[int, int, "str | None", "int | None"]


def _caller_facts(args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Facts:
    """The facts from ``infer``'s arguments: model_name, inputs, model_version, outputs,
    request_id."""
    count = len(args)
    inputs = args[1] if count > 1 else kwargs.get("inputs", ())
    outputs = args[3] if count > 3 else kwargs.get("outputs")
    request_id = args[4] if count > 4 else kwargs.get("request_id")
    shape = inputs[0].shape() if inputs else None
    return len(inputs), len(outputs) if outputs else 0, request_id, shape[0] if shape else None


def _request_facts(request: Any) -> _Facts:
    """The facts from a gRPC ``ModelInferRequest``, as tritonclient builds it from the same
    arguments (a fresh message per call, which the caller never sees)."""
    inputs = request.inputs
    shape = inputs[0].shape if inputs else None
    return len(inputs), len(request.outputs), request.id or None, shape[0] if shape else None


def _describe(attributes: dict[str, Any], per: PerModel, style: str, facts: _Facts | None) -> None:
    """The sampled span's attributes known before the call (``facts``: ``None`` when unknown:
    a gRPC call that failed before its request was built)."""
    attributes.update(per.attributes)
    attributes[semconv.CALL_STYLE] = style
    if facts is None:
        return
    inputs, outputs, request_id, batch = facts
    attributes[semconv.INPUT_COUNT] = inputs
    if request_id:
        attributes[semconv.REQUEST_ID] = request_id
    if outputs:
        attributes[semconv.OUTPUT_COUNT] = outputs
    if batch is not None:
        attributes[semconv.BATCH_SIZE] = int(batch)


class Call(MeteredCall):
    """One inference request in flight with its span, unless its span turns out not sampled
    (``sampled``: then it records its metrics only, as a ``MeteredCall``).

    A sampled call fills its span and sends its context to the server (unless its client sends
    none), and is the current call (``CURRENT_CALL``) while its transport runs: the transport
    hooks record when its request left (``sent``) and its response came back (``received``).
    The gRPC hooks also hand it its request message when it reads its facts from it (``facts``
    is then ``None``: read off the caller's path), and the response's bytes (kept while small,
    else counted as they arrive: ``counted``). Otherwise the response is counted from the
    result. A sampled root that took ready ids (``ready``) has no span until ``_end`` makes
    it, started when the call started.
    """

    __slots__ = (
        "connect_ns",
        "counted",
        "ends_later",
        "facts",
        "ready",
        "received_ns",
        "request",
        "root",
        "sampled",
        "sent_ns",
        "span",
        "style",
        "wire",
    )

    def __init__(
        self,
        target: ClientTarget,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        style: str,
        root: RootDecision = UNDECIDED,
        context: Context | None = None,
        links: Sequence[Link] = (),
        handed_request: bool = False,
    ) -> None:
        """``args`` and ``kwargs`` are ``infer``'s: model_name, inputs, model_version,
        outputs, request_id. ``root``: its span's sampling decision, taken before it
        (``_begin.begin``; for a call with no ``context`` of its own). ``handed_request``: the
        transport hands a sampled call its request message (gRPC's rebuilt ``ModelInfer``);
        the call then keeps a small one (up to ``KEEP_WIRE_BYTES`` of tensors) until its
        telemetry ends and reads its facts from it, instead of from the caller's inputs now."""
        MeteredCall.__init__(self, target, args, kwargs)  # in flight from here
        self.root = root
        try:
            ready = RECORDER.take_root() if root is READY_IDS else None
            if ready is None:
                self.span: RecordingSpan | None = RECORDER.start(
                    self.per.span_name, _CLIENT, context, links, root
                )
                self.sampled = sampled = self.span.sampled
                self.ends_later = not sampled or self.span.__class__ is LeanSpan
            else:  # its span is made as the call ends (``_end``)
                self.ready = ready
                self.span = None
                self.sampled = sampled = self.ends_later = True
            if sampled:
                self.style = style
                self.sent_ns = self.received_ns = self.connect_ns = 0
                self.counted: tuple[int, int | None] | None = None
                self.wire: bytes | None = None
                self.request: Any = None
                self.facts: _Facts | None = (
                    None
                    if handed_request and self.request_bytes <= KEEP_WIRE_BYTES
                    else _caller_facts(args, kwargs)
                )
        except BaseException:
            self.per.calls.in_flight.add(-1)  # it never began: the client's call runs bare
            raise
        self.start = _clock()  # once its span is made
        if self.span.__class__ is LeanSpan:
            # a lean span ends at start_ns + the call's time on the monotonic clock: its wall
            # start is read now, after the call's, so that its end is never placed before the
            # call's end (work done or a preemption since the span was made would move it there)
            self.span.start_ns = time.time_ns()

    def headers(self, caller: Mapping[str, str] | None) -> dict[str, str]:
        """The caller's headers plus this call's trace context (see ``with_trace_context``);
        a copy of the caller's alone when its client sends none (``otelkit.instrument(client,
        send_context=False)``)."""
        if not self.per.target.send_context:
            return dict(caller) if caller else {}
        span = self.span
        if span is None:  # its ids, taken ready-made
            context, traceparent = self.ready[1]
            return with_trace_context(caller, context, traceparent)
        return with_trace_context(caller, span.context, span.traceparent)

    def sent(self, request: Any = None) -> None:
        """The request left (over gRPC: ``request``, the message serialised for it, which the
        call keeps when it reads its facts from it)."""
        self.sent_ns = _clock()
        if request is not None and self.facts is None:
            self.request = request

    def connected(self, took_ns: int) -> None:
        """The call opened a connection (resolved the server's name, connected): ``took_ns``."""
        self.connect_ns += took_ns

    def received(self, raw: bytes | None = None) -> None:
        """The response came back (over gRPC, before it is parsed: ``raw``, its bytes on the
        wire, kept when small and counted off the caller's path, else counted now, so that
        calls waiting for the worker hold little; ``_wire``)."""
        self.received_ns = _clock()
        if raw is not None:
            if len(raw) <= KEEP_WIRE_BYTES:
                self.wire = raw
            else:
                self.counted = counted_on_wire(raw)  # None: the result's shapes will tell

    def _end(self, error: BaseException | None = None) -> None:
        """Record the metrics, and end the span of a sampled call."""
        if not self.sampled:
            MeteredCall._end(self, error)
            return
        per = self.per
        if error is not None:
            _count_error(per, error)
        counted = (0, 0) if error is not None else self.counted
        if counted is None:  # the response's bytes, kept by the transport, else the result
            wire = self.wire
            if wire is None:
                counted = per.tensors.response(self.result)
            else:
                counted = counted_on_wire(wire) or (0, 0)
        response_bytes, outputs = counted
        span = self.span
        if span is None:  # its ids were taken as it started: its span starts then, on this clock
            started = time.time_ns() - (_clock() - self.start)
            span = self.span = RECORDER.root_span(self.ready, per.span_name, _CLIENT, started)
        context = span.context
        per.calls.end(
            (self.end - self.start) / 1e9,
            self.request_bytes,
            response_bytes,
            context.trace_id,
            context.span_id,
        )
        if error is not None:
            span.record_error(error)
        self._describe(span.attributes, error, response_bytes, outputs)
        if span.__class__ is LeanSpan:  # ended on the worker, at the call's end on its own clock
            span.end(span.start_ns + self.end - self.start)
        else:
            span.end()

    def _describe(
        self,
        attributes: dict[str, Any],
        error: BaseException | None,
        response_bytes: int,
        outputs: int | None,
    ) -> None:
        """The span's attributes: the request's facts, the call's phases, its bytes."""
        facts = self.facts
        if facts is None:  # read from the request message
            request, self.request = self.request, None
            if request is not None:
                facts = _request_facts(request)
            elif error is None:  # a call that did not fail before its request was built, whose
                try:  # transport did not hand it over: otelkit's own failure
                    raise LookupError("no request message was handed to this gRPC call")
                except LookupError:
                    internal_error("reading a gRPC call's request message")
        _describe(attributes, self.per, self.style, facts)
        if self.sent_ns:
            attributes[semconv.SERIALIZE_S] = (self.sent_ns - self.start) / 1e9
            if self.connect_ns:
                attributes[semconv.CONNECT_S] = self.connect_ns / 1e9
            if self.received_ns:
                attributes[semconv.WIRE_S] = (self.received_ns - self.sent_ns) / 1e9
                attributes[semconv.DESERIALIZE_S] = (self.end - self.received_ns) / 1e9
        attributes[semconv.REQUEST_BYTES] = self.request_bytes
        if error is None:
            attributes[semconv.RESPONSE_BYTES] = response_bytes
            if facts is None or not facts[1]:  # no outputs named: as many as came back
                attributes[semconv.OUTPUT_COUNT] = (
                    output_count(self.result) if outputs is None else outputs
                )
        else:
            attributes[semconv.ERROR_TYPE] = error_type(error)
