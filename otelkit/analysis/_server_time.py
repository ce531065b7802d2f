"""The server's time that no stage or queue holds, cut at the timestamps the server records.

A server span's time beyond its stages and queue used to be one remainder, ``server other``.
Triton records much more than it: the frontend's receive and send events, each model span's
``REQUEST_START``/``REQUEST_END``, each ``compute`` span's ``COMPUTE_START``,
``COMPUTE_INPUT_END``, ``COMPUTE_OUTPUT_START`` and ``COMPUTE_END``; PyTriton and Ray Serve add
spans of their own between Triton's and the model's stages. Each of those intervals becomes a
component (``Part``), and every instant of the server's time goes to the innermost interval that
holds it, so the parts never count an instant twice, and an instant no interval holds stays in
``server other``:

- ``server receive`` / ``server send``: Triton's ``HTTP_RECV_*`` (``GRPC_WAITREAD_*``) and
  ``HTTP_SEND_*`` (``GRPC_SEND_*``) events, where they happened: before the server span starts
  (taken out of the network), inside it, or after it ends;
- ``server handler``: on an HTTP server span of otelkit's ASGI middleware (FastAPI), from the
  request's body received whole to the response started, outside the app's stages: decoding
  the request, encoding the answer, the app's code between its stages; ``server receive`` is
  then the span's start to the body received, ``server send`` the response's start to its
  body sent;
- ``server frontend``: the rest of Triton's own request span (``InferRequest``) around its
  model, and from the end of the receive to the span's start: parsing the request, building
  and handing over the response;
- ``server ensemble``: an ensemble's span less its steps (the ensemble scheduler's own time,
  the union of the steps' intervals taken out, as steps overlap);
- ``server scheduler``: a model's span less its queue and ``compute`` (``REQUEST_START`` to
  ``QUEUE_START``, ``COMPUTE_END`` to ``REQUEST_END``);
- ``server compute input`` / ``server compute output``: ``COMPUTE_START`` to
  ``COMPUTE_INPUT_END`` and ``COMPUTE_OUTPUT_START`` to ``COMPUTE_END``, the backend's copies of
  the tensors (Triton's own names);
- ``server <model> hand-off``: ``COMPUTE_INPUT_END`` to ``COMPUTE_OUTPUT_START`` outside the
  model's stages, where the model has stages: for the Python backend, the hand-off to its stub
  process and back, the stub's wait for a core, and the model's code around its stages;
- ``server <model> compute``: the same for a model without stages (an ONNX or TensorRT model,
  a Python model not instrumented): its whole execution as Triton times it;
- PyTriton's spans, by their own time: ``server proxy hand-off`` (``python_backend_execute``:
  its proxy model sending the request to the callable's process and waiting for the answer),
  ``server callable overhead`` (``proxy_inference_callable``: the callable's process reading
  the request and writing the answer around the callable), ``server batch decorator``
  (``@batch`` grouping requests and splitting outputs);
- Ray Serve's own spans, where its tracing is on (``otelkit.server.ray_serve.runtime_env(...,
  serve_tracing=True)``): ``server Serve proxy`` (its HTTP or gRPC proxy), ``server Serve
  router`` (choosing a replica, waiting for one under ``max_ongoing_requests``, handing the
  request over until the replica starts it), and ``server <deployment> replica`` (the
  replica's own time around the request, Serve's span and otelkit's);
- ``server <span>``: the own time of any other span in the server (``server <span> (span)``
  where a stage has that name).

None of these is a stage: ``Breakdown.slowest_stage`` never names them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from typing import NamedTuple

from otelkit import semconv
from otelkit.analysis._loader import Span, SpanKind, Trace

__all__ = [
    "SERVE_PROXY",
    "SERVE_ROUTER",
    "Part",
    "around",
    "event",
    "parts",
    "replica_queue",
    "routed",
    "uncovered",
]

RECEIVE = "server receive"
SEND = "server send"
FRONTEND = "server frontend"
ENSEMBLE = "server ensemble"
SCHEDULER = "server scheduler"
COMPUTE_INPUT = "server compute input"
COMPUTE_OUTPUT = "server compute output"
CALLS_OUT = "server calls out"
HANDLER = "server handler"
#: spans of PyTriton 0.7 (its Python-backend proxy model and the callable's process), whose own
#: time is named for what it holds
_KNOWN_SPANS = {
    # the proxy model sending the request to the callable's process and waiting for its answer
    "python_backend_execute": "server proxy hand-off",
    # the callable's process: reading the request, calling the callable, writing its answer
    "proxy_inference_callable": "server callable overhead",
    # @batch: grouping requests into a batch and splitting its outputs
    "pytriton-batch-decorator-span": "server batch decorator",
}
SERVE_PROXY = "server Serve proxy"
SERVE_ROUTER = "server Serve router"
#: Ray Serve's own tracing (2.60): the first word of its spans' names, and what each holds
_SERVE_SPANS = {
    # the HTTP or gRPC proxy: parsing the request, handing it to the router, relaying the answer
    "proxy_http_request": SERVE_PROXY,
    "proxy_grpc_request": SERVE_PROXY,
    # the router: choosing a replica, waiting for one under max_ongoing_requests, handing the
    # request over until the replica starts it
    "route_to_replica": SERVE_ROUTER,
}
_SERVE_REPLICA = "replica_handle_request"  # the replica running the request, by Serve
_SERVE_DEPLOYMENT = "deployment"  # Serve's attribute naming the deployment
_RECEIVE_EVENTS = (
    ("HTTP_RECV_START", "HTTP_RECV_END"),
    ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END"),
)
_SEND_EVENTS = (("HTTP_SEND_START", "HTTP_SEND_END"), ("GRPC_SEND_START", "GRPC_SEND_END"))
_NS = 1e-9


class Part(NamedTuple):
    """An interval of the server's time, its name, and its rank: where intervals overlap, the
    instant goes to the highest rank (the innermost: a stub's span before Triton's compute,
    compute before its model span, a step before its ensemble)."""

    start_ns: int
    end_ns: int
    name: str
    rank: tuple[int, ...]


def event(span: Span, name: str) -> int | None:
    """The time of ``span``'s first event named ``name`` (None: it has none)."""
    return next((found.time_ns for found in span.events if found.name == name), None)


def _pair(span: Span, pairs: Iterable[tuple[str, str]]) -> tuple[int, int] | None:
    for first, last in pairs:
        start, end = event(span, first), event(span, last)
        if start is not None and end is not None and end >= start:
            return start, end
    return None


def _model(span: Span) -> str | None:
    name = span.attributes.get(semconv.TRITON_SPAN_MODEL_NAME)
    return str(name) if name else None


def _http_marks(span: Span) -> tuple[int, int, int] | None:
    """An HTTP server span's cuts (otelkit's ASGI middleware): its request's body received,
    its response started and sent; None unless all three are there, in that order."""
    received = event(span, semconv.HTTP_REQUEST_RECEIVED)
    started = event(span, semconv.HTTP_RESPONSE_STARTED)
    sent = event(span, semconv.HTTP_RESPONSE_SENT)
    if received is None or started is None or sent is None:
        return None
    return (received, started, sent) if received <= started <= sent else None


def _has_stages(trace: Trace, span: Span) -> bool:
    """Whether a model's span holds stage spans (its Python model's, under it or its compute)."""
    pending = list(trace.children(span))
    while pending:
        child = pending.pop()
        if semconv.STAGE_NAME in child.attributes:
            return True
        if child.kind != SpanKind.CLIENT and _model(child) is None:
            pending.extend(trace.children(child))
    return False


def _compute(span: Span, model: str, staged: bool, rank: tuple[int, ...]) -> list[Part]:
    """A ``compute`` span cut at Triton's four compute events (all four, or the span whole)."""
    infer = f"server {model} hand-off" if staged else f"server {model} compute"
    start, inputs = event(span, "COMPUTE_START"), event(span, "COMPUTE_INPUT_END")
    outputs, end = event(span, "COMPUTE_OUTPUT_START"), event(span, "COMPUTE_END")
    if None in (start, inputs, outputs, end):
        return [Part(span.start_ns, span.end_ns, infer, rank)]
    assert start is not None and inputs is not None and outputs is not None and end is not None
    return [
        Part(start, inputs, COMPUTE_INPUT, rank),
        Part(inputs, outputs, infer, rank),
        Part(outputs, end, COMPUTE_OUTPUT, rank),
    ]


def _serve(trace: Trace, span: Span, rank: tuple[int, ...]) -> Part | None:
    """A span of Ray Serve's own tracing as a part (None: not one). Serve ends a replica's span
    after the caller has its answer: where otelkit's span of the request is under it, the
    replica's part ends with that, and what follows is its caller's."""
    head = span.name.split(" ", 1)[0]
    if head in _SERVE_SPANS:
        return Part(span.start_ns, span.end_ns, _SERVE_SPANS[head], rank)
    if head != _SERVE_REPLICA or not span.attributes.get(_SERVE_DEPLOYMENT):
        return None
    ours = _ours(trace, span)
    name = f"server {span.attributes[_SERVE_DEPLOYMENT]} replica"
    return Part(span.start_ns, max(ours)[1] if ours else span.end_ns, name, rank)


def _ours(trace: Trace, span: Span) -> list[tuple[int, int]]:
    """The intervals of otelkit's spans of the request directly under a span of Serve's."""
    children = trace.children(span)
    return [
        (c.start_ns, c.end_ns) for c in children if semconv.RAY_SERVE_DEPLOYMENT in c.attributes
    ]


def replica_queue(trace: Trace, span: Span) -> tuple[int, int] | None:
    """A Ray Serve replica's queue, where Serve's tracing records it: from Serve's span of
    the request in the replica (the replica took it) to otelkit's span of it (the user's code
    starts on the replica's thread for it, once the requests before it let it); None for
    other spans."""
    if span.name.split(" ", 1)[0] != _SERVE_REPLICA or not (ours := _ours(trace, span)):
        return None
    return span.start_ns, max(span.start_ns, min(ours)[0])


def routed(span: Span) -> bool:
    """Whether ``span`` is Ray Serve's router's (its choice of a replica for one request)."""
    return _SERVE_SPANS.get(span.name.split(" ", 1)[0]) == SERVE_ROUTER


def uncovered(interval: tuple[int, int], holes: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The pieces of ``interval`` that no hole covers, in time order.

    >>> uncovered((0, 10), [(2, 4), (3, 6), (8, 12)])
    [(0, 2), (6, 8)]
    """
    start, end = interval
    pieces = []
    for hole_start, hole_end in sorted(holes):
        if hole_end <= start or hole_start >= end:
            continue
        if hole_start > start:
            pieces.append((start, hole_start))
        start = max(start, hole_end)
    if end > start:
        pieces.append((start, end))
    return pieces


def _labelled(
    trace: Trace, span: Span, depth: int, model: str | None, taken: Collection[str]
) -> Iterator[Part]:
    """The parts of ``span`` (at ``depth`` below the server span) and of those under it;
    ``model``: the Triton model whose span holds it; ``taken``: the stages' component names,
    which a span's own time never joins."""
    if semconv.STAGE_NAME in span.attributes or span.name == semconv.RAY_SERVE_QUEUE_SPAN:
        return  # a stage is a component of its own, a Ray Serve wait the queue's, apart
    if span.kind == SpanKind.CLIENT:
        yield Part(span.start_ns, span.end_ns, CALLS_OUT, (3, depth))
        return  # the server's own calls: their servers' time is theirs
    own = _model(span)
    deployment = span.attributes.get(semconv.RAY_SERVE_DEPLOYMENT)
    # Triton's request span: the one carrying its frontend's receive or send events
    frontend = (
        [(_pair(span, _RECEIVE_EVENTS), RECEIVE), (_pair(span, _SEND_EVENTS), SEND)]
        if depth == 0
        else []
    )
    if any(found for found, _ in frontend):
        yield Part(span.start_ns, span.end_ns, FRONTEND, (0, 0))
        for found, name in frontend:
            if found is not None:  # the frontend says what it did, even inside a model span
                yield Part(found[0], found[1], name, (4, 0))
    elif depth == 0 and (marks := _http_marks(span)) is not None:
        received, started, sent = marks
        yield Part(span.start_ns, received, RECEIVE, (0, 1))
        yield Part(received, started, HANDLER, (0, 1))
        yield Part(started, sent, SEND, (0, 1))
    elif own is not None:
        steps = any(_model(child) is not None for child in trace.children(span))
        yield Part(span.start_ns, span.end_ns, ENSEMBLE if steps else SCHEDULER, (1, depth))
        model = own
    elif event(span, "COMPUTE_START") is not None and model is not None:
        parent = trace.spans.get(span.parent_span_id or "")
        staged = parent is not None and _has_stages(trace, parent)
        yield from _compute(span, model, staged, (2, depth))
    elif (serve := _serve(trace, span, (3, depth))) is not None:
        yield serve
    elif deployment:
        yield Part(span.start_ns, span.end_ns, f"server {deployment} replica", (3, depth))
    elif depth > 0:
        name = _KNOWN_SPANS.get(span.name, f"server {span.name}")
        name = f"{name} (span)" if name in taken else name
        yield Part(span.start_ns, span.end_ns, name, (3, depth))
    for child in trace.children(span):
        yield from _labelled(trace, child, depth + 1, model, taken)


def parts(
    trace: Trace,
    server: Span,
    accounted: Iterable[tuple[int, int]],
    stages: Collection[str] = (),
    end_ns: int | None = None,
) -> dict[str, float]:
    """Seconds of each part of ``server``'s span, in the span and outside ``accounted`` (its
    stages' and queue's intervals); the instants no part holds are left out (the caller's
    ``server other``). ``stages``: the stages' component names (``server <stage>``): a span
    named as one of them is told apart as ``server <name> (span)``. ``end_ns``: where the
    server's time stops counting (its caller's end, where the span outlasts it)."""
    lo = server.start_ns
    hi = server.end_ns if end_ns is None else min(end_ns, server.end_ns)
    # one sweep over the intervals' edges, in time order: at each edge the intervals that
    # start there join the open ones and those that end there leave (ends before starts)
    edges: list[tuple[int, int, int]] = []  # (time, 0 end / 1 start, index; -1: accounted)
    labels = list(_labelled(trace, server, 0, None, stages))
    for index, part in enumerate(labels):
        if part.end_ns > part.start_ns:
            edges += [(part.start_ns, 1, index), (part.end_ns, 0, index)]
    for start, end in accounted:
        if end > start:
            edges += [(start, 1, -1), (end, 0, -1)]
    edges.sort()
    out: dict[str, float] = {}
    ranks = [part.rank for part in labels]
    open_parts: list[int] = []
    held = 0
    at = lo
    for time_ns, starts, index in edges:
        now = hi if time_ns > hi else time_ns
        if now > at:
            if not held and open_parts:
                top = (
                    open_parts[0]
                    if len(open_parts) == 1
                    else max(open_parts, key=ranks.__getitem__)
                )
                name = labels[top].name
                out[name] = out.get(name, 0.0) + (now - at) * _NS
            at = now
        if index < 0:
            held += 1 if starts else -1
        elif starts:
            open_parts.append(index)
        else:
            open_parts.remove(index)
    return out


def around(server: Span, call: Span, serialized_ns: int) -> dict[str, float]:
    """Seconds the server recorded working on the call outside its own span: its receive
    (from ``serialized_ns`` into the call: the client's serialising, and its connecting) and
    its frontend up to the span's start, its send past the span's end; the network's share of
    the call loses them."""
    out: dict[str, float] = {}
    sent = call.start_ns + serialized_ns
    received = _pair(server, _RECEIVE_EVENTS)
    if received is not None and received[0] < server.start_ns:
        start, end = max(received[0], sent), min(received[1], server.start_ns)
        if end > start:
            out[RECEIVE] = (end - start) * _NS
        frontend = server.start_ns - max(end, sent)
        if frontend > 0:
            out[FRONTEND] = frontend * _NS
    answered = _pair(server, _SEND_EVENTS)
    if answered is not None and answered[1] > server.end_ns:
        start, end = max(answered[0], server.end_ns), min(answered[1], call.end_ns)
        if end > start:
            out[SEND] = (end - start) * _NS
    return out
