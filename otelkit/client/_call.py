"""One inference call as the client sees it: its CLIENT span, its phases, its metrics.

Shared by every tritonclient flavour. A call starts before the request is built and ends when
the result is in the caller's hands; the transport wrappers stamp when the request left
(``sent``) and when the response came back (``received``), which splits the call into client
serialisation, the wire and the server, and client deserialisation.

Telemetry never breaks inference: every step here is guarded, the user's call runs outside the
guard and its exceptions pass through untouched.
"""

from __future__ import annotations

import contextvars
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from random import getrandbits
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext, SpanKind
from opentelemetry.trace.propagation import _SPAN_KEY

from otelkit import semconv
from otelkit._core.carriers import write
from otelkit._core.context import SUPPRESSED_KEYS, current_context, is_suppressed
from otelkit._core.guard import internal_error
from otelkit._core.hotmetrics import HOT, CallSpecs
from otelkit._core.spans import READY_ROOT, LeanSpan, RecordingSpan, SpanRecorder, error_type
from otelkit._core.switch import SWITCH
from otelkit._core.worker import LATER
from otelkit.client._wire import KEEP_WIRE_BYTES, counted_on_wire
from otelkit.propagation import has_baggage, headers_for

__all__ = ["CURRENT_CALL", "GRPC_TENSORS", "HTTP_TENSORS", "RECORDER", "TARGET", "Call",
           "ClientTarget", "InstrumentationSuppressed", "Tensors", "end_quietly", "end_unsampled",
           "open_call", "output_count", "with_trace_context"]  # fmt: skip

_WAITING, _LIMIT = LATER.waiting, LATER.limit
CURRENT_CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar(
    "otelkit_current_call", default=None
)
RECORDER = SpanRecorder("otelkit.client")
_CLIENT = SpanKind.CLIENT  # a module global: reading an enum's member costs more
TARGET = "_otelkit_target"  # the instance attribute that holds a client's ClientTarget
_SUPPRESSED, _SUPPRESSED_PLAIN = SUPPRESSED_KEYS


class InstrumentationSuppressed(Exception):  # a signal, not an error
    """Raised by ``open_call`` when the caller suppressed OpenTelemetry instrumentation
    (``opentelemetry.instrumentation.utils.suppress_instrumentation()``): the wrapper then
    runs the client's own call, with no span, no metrics and no context sent, as every
    contrib instrumentation does there. Never reaches the user."""


class Tensors:
    """How one protocol's tritonclient objects hold tensor bytes.

    Requests are counted from the inputs the caller holds, as the call starts (the attribute
    ``input_attribute`` of each: the binary part only; tensors sent as JSON or through shared
    memory count zero; ``Call`` sums them inline); responses from the result (``response``),
    off the caller's path.
    """

    __slots__ = ("_output_bytes", "input_attribute")

    def __init__(
        self, input_attribute: str, output_bytes: Callable[[Any], tuple[int, int | None]]
    ) -> None:
        self.input_attribute = input_attribute
        self._output_bytes = output_bytes

    def response(self, result: Any) -> tuple[int, int | None]:
        """The response's tensor bytes, and its number of outputs when counting them was free
        (``None``: ``output_count`` tells, for sampled calls only); zero bytes, counted as
        otelkit's own failure, when the result cannot tell."""
        try:
            return self._output_bytes(result)
        except Exception:
            internal_error("counting a response's tensor bytes")
            return 0, 0


_ITEM_BYTES = {"BOOL": 1, "INT8": 1, "UINT8": 1, "INT16": 2, "UINT16": 2, "FP16": 2, "BF16": 2,
               "INT32": 4, "UINT32": 4, "FP32": 4, "INT64": 8, "UINT64": 8, "FP64": 8}  # fmt: skip


def _grpc_output_bytes(result: Any) -> tuple[int, int | None]:
    """As ``_wire.wire_tensors`` would count them: the sizes of the outputs that came as raw
    bytes. From the outputs' shapes and types when every output came so (reading
    ``raw_output_contents`` copies each tensor out of the protobuf, about 50 us for 600 kB);
    from those contents when one has no fixed item size (BYTES) or came another way (shared
    memory)."""
    response = result.get_response()
    outputs = response.outputs
    contents = response.raw_output_contents
    if len(contents) == len(outputs):
        total = 0
        for output in outputs:
            size = _ITEM_BYTES.get(output.datatype)
            if size is None:
                break
            for dim in output.shape:
                size *= dim
            total += size
        else:
            return total, len(outputs)
    return sum(len(raw) for raw in contents), len(outputs)


def _http_output_bytes(result: Any) -> tuple[int, int | None]:
    return len(getattr(result, "_buffer", None) or b""), None


GRPC_TENSORS = Tensors("_raw_content", _grpc_output_bytes)
HTTP_TENSORS = Tensors("_raw_data", _http_output_bytes)


def output_count(result: Any) -> int:
    """How many outputs a tritonclient result holds (HTTP: a JSON dict; gRPC: a protobuf)."""
    response = result.get_response()
    outputs = response.get("outputs") if isinstance(response, dict) else response.outputs
    return len(outputs) if outputs is not None else 0


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


class ClientTarget:
    """Everything per instrumented client: where it calls, and its metric series per model."""

    def __init__(self, protocol: str, url: str, system: str, method: str, tensors: Tensors) -> None:
        host, _, port = (
            url.rpartition(":") if "://" not in url else url.split("://", 1)[1].rpartition(":")
        )
        self.server_address = host or url
        self.server_port = int(port) if port.isdigit() else None
        self.server = f"{self.server_address}:{port}" if port else self.server_address
        self.protocol = protocol
        self.system = system
        self.method = method
        self.tensors = tensors
        # (model, version), or the model's name alone for its default version: no tuple to
        # build and hash on every call to the usual kind of model
        self.by_model: dict[tuple[str, str] | str, _PerModel] = {}
        self._other_methods: dict[str, ClientTarget] = {}

    def with_method(self, method: str) -> ClientTarget:
        """The same server and protocol under another RPC method (a stream's requests)."""
        found = self._other_methods.get(method)
        if found is None:
            found = ClientTarget(self.protocol, self.server, self.system, method, self.tensors)
            self._other_methods[method] = found
        return found

    def per_model(self, model: str, version: str) -> _PerModel:
        """What every call to one model shares: its metric series, span name and attributes."""
        key = (model, version) if version else model
        found = self.by_model.get(key)
        if found is None:
            found = self.by_model[key] = _PerModel(self, model, version)
        return found


_LABELS = (semconv.M_MODEL, semconv.M_MODEL_VERSION, semconv.M_SERVER, semconv.M_PROTOCOL)
_ERROR_LABELS = (*_LABELS, semconv.M_ERROR_TYPE)
_CALL_METRICS = CallSpecs(
    semconv.CLIENT_DURATION, semconv.CLIENT_IN_FLIGHT, semconv.CLIENT_REQUEST_BYTES,
    semconv.CLIENT_RESPONSE_BYTES,
)  # fmt: skip


class _PerModel:
    """Built once per (client, model, version), so that a call only looks it up."""

    __slots__ = ("attributes", "calls", "labels", "span_name", "tensors")

    def __init__(self, target: ClientTarget, model: str, version: str) -> None:
        self.labels = (model, version, target.server, target.protocol)
        self.calls = HOT.calls(_CALL_METRICS, _LABELS, self.labels)
        self.tensors = target.tensors
        self.span_name = f"{target.method} {model}"
        self.attributes: dict[str, Any] = {
            semconv.RPC_SYSTEM_NAME: target.system,
            semconv.RPC_METHOD: target.method,
            semconv.SERVER_ADDRESS: target.server_address,
            semconv.MODEL_NAME: model,
            semconv.PROTOCOL: target.protocol,
        }
        if target.server_port is not None:
            self.attributes[semconv.SERVER_PORT] = target.server_port
        if version:
            self.attributes[semconv.MODEL_VERSION] = version


Opened = tuple[_PerModel, int, int | None]  # what open_call finds


def open_call(
    target: ClientTarget, args: tuple[Any, ...], kwargs: dict[str, Any], streamed: bool = False
) -> Opened:
    """What any call to ``target`` starts with (``args`` and ``kwargs``: ``infer``'s): its
    model's ``_PerModel``, the request's tensor bytes, and its root span's sampling decision
    when it can be drawn before a span is asked for (``SpanRecorder``: no span is current and
    the sampler is ``always_off``, ``always_on`` or a trace id ratio): the trace id of a
    sampled root, 0 for one not sampled, ``READY_ROOT`` for a sampled one whose ids are drawn
    ahead, else ``None``. A call known not to be sampled needs no ``Call``: ``end_unsampled``
    records it.

    Raises ``InstrumentationSuppressed`` when the caller suppressed instrumentation, but for
    a request on a stream (``streamed``): a traced stream's server traces all its requests,
    and each must wait for its response so that responses find their requests.

    Requests are counted from the inputs the caller holds, as the call starts (the binary part
    only: tensors sent as JSON or through shared memory count zero), inline: no Python frame.
    """
    context = current_context()
    if (  # the usual context is empty, or holds a span: membership first, no method call
        context
        and (_SUPPRESSED in context or _SUPPRESSED_PLAIN in context)
        and is_suppressed(context)
        and not streamed
    ):
        raise InstrumentationSuppressed
    count = len(args)
    model = args[0] if count else kwargs["model_name"]
    version = (args[2] if count > 2 else kwargs.get("model_version")) or ""
    per = target.by_model.get((model, version) if version else model) or target.per_model(
        model, version
    )
    name = per.tensors.input_attribute
    request_bytes = 0
    for tensor in args[1] if count > 1 else kwargs.get("inputs", ()):
        raw = getattr(tensor, name, None)
        if raw:
            request_bytes += len(raw)
    # the root's decision, inline: no Python frame
    if RECORDER.roots_generation != SWITCH.generation or context.get(_SPAN_KEY) is not None:
        return per, request_bytes, None
    bound = RECORDER.root_bound
    if bound <= 0:  # every root dropped (0), or every one sampled (READY_ROOT)
        return per, request_bytes, bound
    low = getrandbits(64)  # the bits the ratio decides on, drawn first:
    if low >= bound:  # the very bits getrandbits(128) would have put there
        return per, request_bytes, 0
    return per, request_bytes, getrandbits(64) << 64 | low


def _count_error(per: _PerModel, error: BaseException) -> None:
    labels = (*per.labels, error_type(error))
    HOT.counter(semconv.CLIENT_ERRORS, _ERROR_LABELS).series(labels).add(1)


def end_unsampled(
    per: _PerModel,
    start_ns: int,
    end_ns: int,
    request_bytes: int,
    result: Any,
    error: BaseException | None = None,
) -> None:
    """Record the metrics of a call not sampled, from ``start_ns`` to ``end_ns``: its duration,
    bytes and failure. The response is counted from ``result`` (off the caller's path: its
    caller hands this to ``LATER`` unless the call failed). Never raises."""
    try:
        if error is None:
            response_bytes = per.tensors.response(result)[0]
        else:
            _count_error(per, error)
            response_bytes = 0
        per.calls.end((end_ns - start_ns) / 1e9, request_bytes, response_bytes)
    except Exception:
        internal_error("ending a client call's metrics")


def end_quietly(
    opened: Opened, start_ns: int, result: Any, error: BaseException | None = None
) -> None:
    """A call not sampled (``opened``: what ``open_call`` found; ``start_ns``: when it began)
    is over: its metrics are recorded by ``LATER`` when it returned ``result``, here when it
    failed with ``error``. Never raises."""
    end_ns = time.perf_counter_ns()
    if error is not None:
        end_unsampled(opened[0], start_ns, end_ns, opened[1], None, error)
        return
    ended = functools.partial(end_unsampled, opened[0], start_ns, end_ns, opened[1], result)
    if len(_WAITING) < _LIMIT:  # LATER.add, inline
        _WAITING.append(ended)
    else:
        LATER.add(ended)


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


def _describe(attributes: dict[str, Any], per: _PerModel, style: str, facts: _Facts | None) -> None:
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


class Call:
    """One inference request in flight (but one that ``open_call`` finds not sampled, which
    needs none, whatever its style: ``end_quietly`` ends it).

    An unsampled call records its metrics and nothing else: no attributes, no headers, no
    phases (its ``sent_ns``, ``received_ns``, ``counted`` and ``wire`` start unset). A
    sampled one also fills its span and sends its context to the server, and is the current
    call (``CURRENT_CALL``) while its transport runs: the rebuilt gRPC ``ModelInfer``
    (``_sync.attach_model_infer``) stamps its ``sent_ns`` and ``received_ns``, hands it its
    request message when the call waits for it (``request``: the call's ``facts`` are then read
    from it, off the caller's path), and either keeps the response's bytes (``wire``, a small
    response) or sets ``counted`` (the response's tensor bytes and outputs, counted as it
    arrived). Otherwise the response is counted from the call's ``result``, which is kept until
    then: off the caller's path, within about 10 ms (``LATER``). A sampled root that took ready
    ids (``root``: ``open_call`` found ``READY_ROOT``) has no span until then: ``_end`` makes it,
    started when the call started.
    """

    __slots__ = ("counted", "end", "facts", "per", "received_ns", "request", "request_bytes",
                 "result", "root", "sampled", "sent_ns", "span", "start", "style",
                 "wire")  # fmt: skip

    def __init__(
        self,
        opened: Opened,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        style: str,
        context: Context | None = None,
        links: Sequence[Link] = (),
        handed_request: bool = False,
    ) -> None:
        """``opened``: what ``open_call`` found (its root decision holds unless ``context`` is
        given); ``args`` and ``kwargs`` are ``infer``'s: model_name, inputs, model_version,
        outputs, request_id. ``handed_request``: the transport hands a sampled call its request
        message (gRPC's rebuilt ``ModelInfer``); the call then keeps a small one (up to
        ``KEEP_WIRE_BYTES`` of tensors) until its telemetry ends and reads its facts from it,
        instead of from the caller's inputs now. The unsampled path reads only what its metrics
        need, for speed."""
        self.per = per = opened[0]
        self.request_bytes = opened[1]
        root = opened[2] if context is None else None
        taken = RECORDER.take_root() if root == READY_ROOT else None
        if taken is None:
            self.span: RecordingSpan | None = RECORDER.start(
                per.span_name, _CLIENT, context, links, root
            )
            self.sampled = sampled = self.span.sampled
        else:  # a root with ready ids (``root``): its span is made as the call ends (``_end``)
            self.root = taken
            self.span = None
            self.sampled = sampled = True
        if sampled:
            self.style = style
            self.sent_ns = self.received_ns = 0
            self.counted: tuple[int, int | None] | None = None
            self.wire: bytes | None = None
            self.request: Any = None
            self.facts: _Facts | None = (
                None
                if handed_request and opened[1] <= KEEP_WIRE_BYTES
                else _caller_facts(args, kwargs)
            )
        per.calls.in_flight.begin()
        self.start = time.perf_counter_ns()

    def headers(self, caller: Mapping[str, str] | None) -> dict[str, str]:
        """The caller's headers plus this call's trace context (see ``with_trace_context``)."""
        span = self.span
        if span is None:  # its ids, taken ready-made
            context, traceparent = self.root[1]
            return with_trace_context(caller, context, traceparent)
        return with_trace_context(caller, span.context, span.traceparent)

    def sent(self) -> None:
        self.sent_ns = time.perf_counter_ns()

    def received(self) -> None:
        self.received_ns = time.perf_counter_ns()

    def finish(self, error: BaseException | None = None, result: Any = None) -> None:
        """The call is over: its telemetry ends off the caller's path (``LATER``), or here for
        a failure or a span of another SDK's tracer. Never raises."""
        try:
            self.end = time.perf_counter_ns()
            self.result = result
            span = self.span
            if error is None and (span is None or not self.sampled or span.__class__ is LeanSpan):
                if len(_WAITING) < _LIMIT:  # LATER.add, inline
                    _WAITING.append(self._end)
                else:
                    LATER.add(self._end)
                return
            self._end(error)
        except Exception:
            internal_error("ending a client span")

    def _end(self, error: BaseException | None = None) -> None:
        """Record the metrics, and end the span of a sampled call."""
        per = self.per
        if not self.sampled:
            end_unsampled(per, self.start, self.end, self.request_bytes, self.result, error)
            return
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
        seconds = (self.end - self.start) / 1e9
        span = self.span
        if span is None:  # its ids were taken as it started: its span starts then, on this clock
            started = time.time_ns() - (time.perf_counter_ns() - self.start)
            span = self.span = RECORDER.root_span(self.root, per.span_name, _CLIENT, started)
        context = span.context
        per.calls.end(
            seconds, self.request_bytes, response_bytes, context.trace_id, context.span_id
        )
        attributes = span.attributes
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
        _describe(attributes, per, self.style, facts)
        if self.sent_ns:
            attributes[semconv.SERIALIZE_S] = (self.sent_ns - self.start) / 1e9
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
            span.record_error(error)
            attributes[semconv.ERROR_TYPE] = error_type(error)
        if span.__class__ is LeanSpan:  # ended on the worker, at the call's end on its own clock
            span.end(span.start_ns + self.end - self.start)
        else:
            span.end()
