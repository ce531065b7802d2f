"""Where the time of a request goes, computed from its trace.

A trace root (the client's work for one event, say) is split into components that add up to
its duration:

- ``client <stage>``: ``otelkit.stage`` spans run in the client process;
- ``client serialize`` / ``client deserialize``: tritonclient building the request and reading
  the response (attributes of otelkit's CLIENT span);
- ``network + client wait``: the CLIENT span minus what the server recorded (its span, its
  receive and send outside it), the client's (de)serialising and its connection set-up: the
  wire both ways, and the client library's sending and waiting that nothing else times
  (``network + offload`` until 0.1.0: results files that say so are read with this name);
- ``load balancer``: through a proxy (Envoy, whose spans say ``component=proxy``), its
  ``ingress`` span minus the span of the server that answered: Envoy's own work, the wire from
  it to the server, and any attempt it retried elsewhere (the client-to-proxy wire stays in
  ``network + client wait``);
- ``server queue``: Triton's ``QUEUE_START`` (on a model span) to ``COMPUTE_START`` (on its
  ``compute`` child), summed over model spans (each step of an ensemble queues on its own);
- ``server <stage>``: ``otelkit.stage`` spans inside the server (outermost ones only);
- ``server other``: the server span minus its queue and stages (Triton, the Python backend's
  stub round trip, unpacking tensors);
- ``client other``: the root minus its calls and client stages (application glue).

Grouping by ``semconv.ANSWERED_BY`` groups requests by the server that answered their first
call: through a proxy, the address it forwarded to; else the address the client called.

Each call is checked on the way: its stages and queue must fit in its server span, which must
start after its client span; a broken nesting is reported, never silently averaged. (A server
span may end after its client span: Triton and ASGI servers end theirs after sending the
response. Only the part of it within the call counts, so the components add up to the root
and ``network + client wait`` is never negative for that.)

>>> traces = build_traces(load_spans("demo-output/traces"))  # doctest: +SKIP
>>> by_option = breakdown(traces.values(), group_by=("gnn_tracking.option",))  # doctest: +SKIP
>>> print(format_breakdowns(by_option))  # doctest: +SKIP
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, MutableSequence, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from otelkit import semconv
from otelkit.analysis._loader import Span, SpanKind, Trace
from otelkit.analysis._server_time import (
    CALLS_OUT,
    COMPUTE_INPUT,
    COMPUTE_OUTPUT,
    ENSEMBLE,
    FRONTEND,
    HANDLER,
    RECEIVE,
    SCHEDULER,
    SEND,
    SERVE_PROXY,
    SERVE_ROUTER,
    around,
    event,
    parts,
    replica_queue,
    routed,
    uncovered,
)

__all__ = [
    "RENAMED",
    "Breakdown",
    "SlowestStage",
    "answered_by",
    "breakdown",
    "format_breakdowns",
    "group_key",
    "trace_components",
]

TOTAL = "total"
CLIENT_OTHER = "client other"
SERVER_OTHER = "server other"
SERVER_QUEUE = "server queue"
NETWORK = "network + client wait"
#: components named otherwise by earlier releases (results files keep them): their names now
RENAMED = {"network + offload": NETWORK}
CONNECTION = "connection set-up"  # a call that opened its connection: resolve and connect
LOAD_BALANCER = "load balancer"
NO_SERVER_SPAN = "call, server span missing"
_MODEL_PARTS = (" hand-off", " compute")
#: the share of a request's time that ``server other`` and ``client other`` may each hold
#: before the breakdown says what would explain it (issue 47)
UNEXPLAINED_BUDGET = 0.05
_SERVE_SCOPE = "ray.serve"  # the instrumentation scope of Ray Serve's own tracing
_NS = 1e-9


@dataclass
class Breakdown:
    """The components of every trace of one group, in seconds, one entry per trace (a list,
    or an ``array('d')`` from the compiled engine: eight bytes a value)."""

    group: tuple[str, ...]
    components: dict[str, MutableSequence[float]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    incomplete: int = 0  # traces left out: a call's server spans are missing
    parts: set[str] = field(default_factory=set)  # the server's parts: not stages

    @property
    def traces(self) -> int:
        return len(self.components.get(TOTAL, ()))

    def mean(self, component: str) -> float:
        """Mean seconds per trace (a trace without the component counts zero)."""
        values = self.components.get(component, ())
        return sum(values) / self.traces if self.traces else 0.0

    def median_total(self) -> float:
        return statistics.median(self.components[TOTAL]) if self.traces else 0.0

    def add(self, trace: Trace, root: Span) -> dict[str, float] | None:
        """Split ``root``'s time into components and add them (``None``: left out, incomplete).

        >>> from otelkit.analysis import build_traces
        >>> root = Span("ab" * 16, "cd" * 8, None, "event", SpanKind.INTERNAL, 0, 500_000_000)
        >>> Breakdown(("all",)).add(build_traces([root])["ab" * 16], root)
        {'client other': 0.5, 'total': 0.5}
        """
        components, problems, named = _components(trace, root)
        if NO_SERVER_SPAN in components:
            self.incomplete += 1
            return None
        seen = self.traces
        for name, seconds in components.items():
            self.components.setdefault(name, [0.0] * seen).append(seconds)
        for values in self.components.values():
            values.extend([0.0] * (seen + 1 - len(values)))
        self.problems.extend(problems)
        self.parts.update(named)
        return components

    def slowest_stage(self) -> SlowestStage | None:
        """The server stage with the most time per trace, and its share of the trace's time.

        Its mean time at load holds the waits of the requests sharing it, so it says where the
        time goes, not what the stage can serve: ``otelkit study`` measures that.
        """
        stages = [c for c in self.components if c.startswith("server ") and c != SERVER_QUEUE]
        stages = [c for c in stages if c != SERVER_OTHER and c not in self.parts]
        if not stages:
            return None
        worst = max(stages, key=self.mean)
        total = self.mean(TOTAL)
        mean = self.mean(worst)
        return SlowestStage(worst, mean, mean / total if total else 0.0)

    def unexplained(self, budget: float = UNEXPLAINED_BUDGET) -> list[str]:
        """``server other`` and ``client other`` where each is above ``budget`` of the time,
        in words, with what would explain it; empty when both are within it."""
        total = self.mean(TOTAL)
        found = []
        for name, why in ((SERVER_OTHER, self._server_lacks()), (CLIENT_OTHER, _CLIENT_LACKS)):
            share = self.mean(name) / total if total > 0 else 0.0
            if share > budget:
                found.append(
                    f"{name} is {100 * share:.1f} % of the time (over {100 * budget:g} %): {why}"
                )
        return found

    def _server_lacks(self) -> str:
        if not self.parts:
            return (
                "its server records no spans or events beyond its stages (no frontend's or "
                "scheduler's timestamps): instrument the server with otelkit, or put its work "
                "in stages"
            )
        return "the server's time between spans and events it records: a span is missing there"


_CLIENT_LACKS = (
    "the client's code outside its calls and stages: put its work between calls (packing "
    "inputs, unpacking outputs) in otelkit.stage"
)


class SlowestStage(NamedTuple):
    """A group's server stage with the most time per trace: its mean seconds per trace and
    their share of the trace's mean total (0 to 1)."""

    name: str
    seconds: float
    share: float


def _outermost_stages(trace: Trace, span: Span) -> Iterable[Span]:
    for child in trace.children(span):
        if semconv.STAGE_NAME in child.attributes:
            yield child
        elif child.kind != SpanKind.CLIENT:
            yield from _outermost_stages(trace, child)


def _subtree(trace: Trace, span: Span) -> Iterable[Span]:
    yield span
    for child in trace.children(span):
        yield from _subtree(trace, child)


def _queue_interval(trace: Trace, span: Span) -> tuple[int, int] | None:
    """Triton's queue of a model span: its ``QUEUE_START`` to ``COMPUTE_START``, an event of
    its ``compute`` child (None for spans without them, an ensemble's own span among them);
    a Ray Serve request's wait for a replica: its ``queued`` span, and, with Serve's own
    tracing, the replica's queue (``replica_queue``)."""
    if span.name == semconv.RAY_SERVE_QUEUE_SPAN:
        return span.start_ns, span.end_ns
    if (waited := replica_queue(trace, span)) is not None:
        return waited
    queued = event(span, "QUEUE_START")
    if queued is None:
        return None
    for child in trace.children(span):
        started = event(child, "COMPUTE_START")
        if started is not None:
            return queued, max(queued, started)
    return None


def _union(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The intervals merged where they overlap or touch.

    >>> _union([(5, 8), (0, 2), (1, 3), (7, 9)])
    [(0, 3), (5, 9)]
    """
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _add(components: dict[str, float], name: str, seconds: float) -> None:
    components[name] = components.get(name, 0.0) + seconds


def _add_parts(components: dict[str, float], named: set[str], found: dict[str, float]) -> None:
    """Add the server's parts (``_server_time``), noting their names: they are not stages."""
    named.update(found)
    for name, seconds in found.items():
        _add(components, name, seconds)


def _is_proxy(span: Span) -> bool:
    return (
        span.kind == SpanKind.SERVER
        and span.attributes.get(semconv.PROXY_COMPONENT) == semconv.PROXY
    )


def _answered(trace: Trace, proxy: Span) -> tuple[Span, Span] | None:
    """The proxy's last attempt that reached a server (its ``egress`` span), and that server's
    span; ``None`` when no server span joined (a lost context, an attempt that failed)."""
    found = None
    for attempt in trace.children(proxy):
        if attempt.kind == SpanKind.CLIENT and (servers := trace.children(attempt)):
            found = attempt, servers[0]
    return found


def answered_by(trace: Trace, root: Span) -> str:
    """The server that answered ``root``'s first call: the address a proxy forwarded it to, or
    the one the client called; "" without a call."""
    pending = list(trace.children(root))
    while pending:
        span = pending.pop(0)
        if span.kind != SpanKind.CLIENT:
            pending[:0] = trace.children(span)
            continue
        first = trace.children(span)
        if first and _is_proxy(first[0]) and (answered := _answered(trace, first[0])):
            return str(answered[0].attributes.get(semconv.PROXY_UPSTREAM_ADDRESS, ""))
        host = span.attributes.get(semconv.SERVER_ADDRESS)
        port = span.attributes.get(semconv.SERVER_PORT)
        return f"{host}:{port}" if host and port else str(host or "")
    return ""


def _adopted(trace: Trace, call: Span, problems: list[str]) -> list[Span]:
    """The server's span of a call whose first hop's spans went elsewhere: Ray Serve's proxy
    exports where the job's environment says, its replicas where their deployment's does (a
    study's own receiver). The earliest span of Serve's own tracing in the trace whose parent
    is missing and that started within the call, said as a problem; the missing hop's time
    stays in the network's share. Empty when there is none: any other call without its
    server's span is left out, as before (a proxy's lost span says nothing of who answered)."""
    found = [
        span
        for span in trace.roots
        if trace.is_orphan(span)
        and span.kind == SpanKind.SERVER
        and span.scope.startswith(_SERVE_SCOPE)
        and call.start_ns <= span.start_ns < call.end_ns
    ]
    if not found:
        return []
    first = min(found, key=lambda span: span.start_ns)
    problems.append(
        f"{first.name}: its parent span is missing (a hop exported elsewhere); joined to the "
        f"call {call.name} it started in ({trace.trace_id})"
    )
    return [first]


def _call(
    trace: Trace, call: Span, out: dict[str, float], problems: list[str], named: set[str]
) -> None:
    serialize = float(call.attributes.get(semconv.SERIALIZE_S, 0.0))
    deserialize = float(call.attributes.get(semconv.DESERIALIZE_S, 0.0))
    _add(out, "client serialize", serialize)
    _add(out, "client deserialize", deserialize)
    servers = trace.children(call) or _adopted(trace, call, problems)
    if not servers:
        _add(out, NO_SERVER_SPAN, call.duration_ns * _NS)
        return
    server = servers[0]
    connect = float(call.attributes.get(semconv.CONNECT_S, 0.0))
    if connect:
        _add(out, CONNECTION, connect)
    # the server's receive and send, where they fell outside its span, are the server's time;
    # its receive counts once the client had serialised and connected (a server may mark it
    # as it accepts the connection)
    outside = around(server, call, round((serialize + connect) / _NS))
    _add_parts(out, named, outside)
    # a server that ends its span after the client has its answer (Triton and ASGI servers
    # end theirs after sending) spends that overhang outside the call: only the call's share
    # of the span counts, so the network's share is never negative
    end_ns = min(server.end_ns, call.end_ns)
    wire = (call.duration_ns - (end_ns - server.start_ns)) * _NS - serialize - deserialize
    _add(out, NETWORK, wire - connect - sum(outside.values()))
    if _is_proxy(server):
        proxy, answered = server, _answered(trace, server)
        if answered is None:
            _add(out, NO_SERVER_SPAN, call.duration_ns * _NS)
            return
        attempt, server = answered
        # the server's receive and send outside its span fall within the proxy's attempt
        behind = around(server, attempt, 0)
        _add_parts(out, named, behind)
        answered_ns = min(server.end_ns, end_ns) - server.start_ns
        balanced = (end_ns - proxy.start_ns - answered_ns) * _NS - sum(behind.values())
        _add(out, LOAD_BALANCER, balanced)
        if server.start_ns < proxy.start_ns:
            problems.append(
                f"{server.name}: server span starts before the proxy's ({trace.trace_id})"
            )
    spans = list(_subtree(trace, server))
    waits = [(span, q) for span in spans if (q := _queue_interval(trace, span))]
    # Serve's router (its own tracing) says which part of a handle call's wait (otelkit's
    # ``queued`` span, from the caller) was its choice of a replica and the hand-off: the
    # queue is the rest, and the replica's own queue, which the router's span overlaps while
    # it waits for the replica's reply
    routers = [(s.start_ns, s.end_ns) for s in spans if routed(s)]
    queued = [
        piece
        for span, interval in waits
        for piece in (
            uncovered(interval, routers)
            if routers and span.name == semconv.RAY_SERVE_QUEUE_SPAN
            else [interval]
        )
    ]
    # each instant once: a handle call's wait and its replica's queue meet, parallel steps'
    # queues overlap
    queue = sum(end - start for start, end in _union(queued)) * _NS
    _add(out, SERVER_QUEUE, queue)
    staged = 0.0
    held = list(queued)
    stages = set()
    for stage in _outermost_stages(trace, server):
        staged += stage.duration_ns * _NS
        held.append((stage.start_ns, stage.end_ns))
        stages.add(f"server {stage.attributes[semconv.STAGE_NAME]}")
        _add(out, f"server {stage.attributes[semconv.STAGE_NAME]}", stage.duration_ns * _NS)
    end_ns = min(server.end_ns, end_ns)
    found = parts(trace, server, held, stages, end_ns)
    _add_parts(out, named, found)
    served = (end_ns - server.start_ns) * _NS
    _add(out, SERVER_OTHER, served - queue - staged - sum(found.values()))
    model = call.attributes.get(semconv.MODEL_NAME, call.name)
    # A server may end its span after sending the response, when the client already has it:
    # an end past the client's is no error (its overhang is left out above). A start before
    # the client's is (or clock skew).
    if server.start_ns < call.start_ns:
        problems.append(f"{model}: server span starts before its client span ({trace.trace_id})")
    if staged + queue > server.duration_ns * _NS * (1 + 1e-6):
        problems.append(f"{model}: stages + queue exceed the server span ({trace.trace_id})")


def trace_components(trace: Trace, root: Span) -> tuple[dict[str, float], list[str]]:
    """The components of ``root``'s time in seconds, and the nesting problems found."""
    out, problems, _ = _components(trace, root)
    return out, problems


def _components(trace: Trace, root: Span) -> tuple[dict[str, float], list[str], set[str]]:
    """``trace_components``, and which of the components are the server's parts (cut at its
    timestamps: ``_server_time``), not stages."""
    out: dict[str, float] = {}
    problems: list[str] = []
    named: set[str] = set()
    accounted = 0.0
    pending = list(trace.children(root))
    while pending:
        span = pending.pop(0)
        if span.kind == SpanKind.CLIENT:
            accounted += span.duration_ns * _NS
            _call(trace, span, out, problems, named)
        elif semconv.STAGE_NAME in span.attributes:
            accounted += span.duration_ns * _NS
            _add(out, f"client {span.attributes[semconv.STAGE_NAME]}", span.duration_ns * _NS)
            # a call made from inside a client stage is accounted within that stage
        else:
            pending[:0] = trace.children(span)
    out[CLIENT_OTHER] = root.duration_ns * _NS - accounted
    out[TOTAL] = root.duration_ns * _NS
    return out, problems, named


def group_key(trace: Trace, root: Span, group_by: Sequence[str]) -> tuple[str, ...]:
    """The values of ``root``'s attributes ``group_by``; ``semconv.ANSWERED_BY`` is the server
    that answered (``answered_by``)."""
    return tuple(
        answered_by(trace, root)
        if key == semconv.ANSWERED_BY
        else str(root.attributes.get(key, ""))
        for key in group_by
    )


def breakdown(
    traces: Iterable[Trace], group_by: Sequence[str] = (), root_name: str | None = None
) -> dict[tuple[str, ...], Breakdown]:
    """Components of every root span (named ``root_name`` if given, not an orphan), grouped by
    the values of the root's attributes ``group_by``."""
    groups: dict[tuple[str, ...], Breakdown] = {}
    for trace in traces:
        for root in trace.roots:
            if trace.is_orphan(root) or (root_name is not None and root.name != root_name):
                continue
            key = group_key(trace, root, group_by)
            groups.setdefault(key, Breakdown(key)).add(trace, root)
    return groups


def _order(names: Iterable[str]) -> list[str]:
    """Components in the order a request meets them (stages in the order they ran)."""
    first = ["client", "client serialize", CONNECTION, NETWORK, LOAD_BALANCER, SERVE_PROXY]
    first += [SERVE_ROUTER, RECEIVE, FRONTEND]
    first += [SERVER_QUEUE, ENSEMBLE, SCHEDULER, HANDLER, COMPUTE_INPUT, "server"]
    last = [COMPUTE_OUTPUT, CALLS_OUT, SEND, SERVER_OTHER, "client deserialize", CLIENT_OTHER]
    rank = {name: index for index, name in enumerate(first + last)}

    def key(name: str) -> int:
        return rank.get(name, rank.get(name.split(" ")[0], len(rank)))

    ordered = sorted((n for n in names if n != TOTAL), key=key)
    # a model's hand-off (or its compute) just before its stage of the same name
    out: list[str] = []
    for name in ordered:
        if name.endswith(_MODEL_PARTS) and name in out:
            continue
        out += [f"{name}{suffix}" for suffix in _MODEL_PARTS if f"{name}{suffix}" in ordered]
        if name not in out:
            out.append(name)
    return out


def format_breakdowns(groups: dict[tuple[str, ...], Breakdown], labels: Sequence[str] = ()) -> str:
    """A table per group: each component's mean ms per trace and its share of the total."""
    lines: list[str] = []
    width = max([24, *(len(name) for g in groups.values() for name in g.components)])
    for key, group in sorted(groups.items()):
        title = ", ".join(f"{k}={v}" for k, v in zip(labels, key, strict=False)) or "all traces"
        total = group.mean(TOTAL)
        left_out = (
            f" ({group.incomplete} left out: server spans missing)" if group.incomplete else ""
        )
        lines.append(
            f"{title}: {group.traces} traces{left_out}, mean {total * 1e3:.2f} ms, "
            f"median {group.median_total() * 1e3:.2f} ms"
        )
        names = _order(group.components)
        for name in names:
            mean = group.mean(name)
            mean = 0.0 if abs(mean) < 5e-7 else mean  # a remainder of 0 less rounding
            share = 100 * mean / total if total else 0.0
            lines.append(f"  {name:<{width}} {mean * 1e3:9.3f} ms  {share:5.1f} %")
        slowest = group.slowest_stage()
        if slowest:
            lines.append(
                f"  slowest stage: {slowest.name}, {slowest.seconds * 1e3:.2f} ms per trace, "
                f"{100 * slowest.share:.0f} % of the time"
            )
        for line in group.unexplained():
            lines.append(f"  unexplained: {line}")
        for problem in group.problems[:5]:
            lines.append(f"  nesting problem: {problem}")
    return "\n".join(lines)
