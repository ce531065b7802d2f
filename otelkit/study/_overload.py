"""Overload as data: a server that refuses work past its capacity, and whether it is gone.

A refused request (``_drive.refusal``: a full queue, a queue timeout, a proxy's limit) is an
outcome of its point, counted apart from failures: the point records what was offered, what
was served (goodput) and what was refused. Along a load axis with refusals, the verdict says the
capacity (the highest goodput measured), the offered load where refusals start, whether goodput
holds or collapses past it, with the figures, and what to change. On a shared host the client's
own CPU for the refused calls may be part of a collapse: its utilisation is said beside.

>>> from otelkit.study._point import Point
>>> points = [
...     Point(0, {"rate": 40}, requests=80, seconds=2.0),
...     Point(1, {"rate": 80}, requests=100, seconds=2.0, refused={"queue full": 60}),
...     Point(2, {"rate": 160}, requests=64, seconds=2.0, refused={"queue full": 256}),
...     Point(3, {"rate": 320}, requests=40, seconds=2.0, refused={"queue full": 600}),
... ]
>>> found = overload(points, "rate")
>>> found.onset, found.capacity_per_s, found.collapses
((40.0, 80.0), 50.0, True)
>>> print(found.sentence)  # doctest: +NORMALIZE_WHITESPACE
the server refuses requests past its capacity of 50 requests/s (served at 80/s offered);
refusals start between 40/s offered (none refused) and 80/s (30/s refused, queue full);
goodput collapses past it: served 50/s at 80/s offered, 32/s at 160/s, 20/s at 320/s
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from otelkit.study._point import Point

__all__ = ["Overload", "overload", "ready", "settle"]

#: the load axes along which refusals are judged: what was offered grows along them
_LOAD = ("rate", "concurrency")


@dataclass(frozen=True)
class Overload:
    """The facts of a curve along which the server refused requests, and their sentence."""

    model: str | None  # the model served, where the server's counters name it
    capacity_per_s: float  # the highest goodput measured
    onset: tuple[float | None, float]  # offered: the last load without refusals, the first with
    collapses: bool  # goodput at the most offered is below the capacity beyond noise
    sentence: str
    change: str


def overload(
    points: Sequence[Point], axis: str, *, unit: str = "request", tolerance: float = 0.1
) -> Overload | None:
    """The overload facts along ``axis`` (rate or concurrency), ``None`` where no point refused."""
    if axis not in _LOAD:
        return None
    ordered = sorted(points, key=lambda p: p.params[axis])
    first = next((i for i, p in enumerate(ordered) if p.refused), None)
    if first is None:
        return None
    onset, before = ordered[first], ordered[first - 1] if first else None
    peak = max(ordered, key=lambda p: p.throughput)
    model = _model(ordered)
    who = model or "the server"
    past = list(ordered[first:])
    last = ordered[-1]
    # beyond twice the tolerance: the windows' noise on a shared host is within it
    collapses = last.throughput < (1 - 2 * tolerance) * peak.throughput
    holds = all(p.throughput >= (1 - 2 * tolerance) * peak.throughput for p in past)
    figures = ", ".join(
        f"{p.throughput:.0f}/s at {_offered(p, axis, i == 0)}" for i, p in enumerate(past)
    )
    if collapses:
        shape = f"goodput collapses past it: served {figures}"
    elif holds:
        shape = f"goodput holds past it: served {figures}"
    else:
        shape = f"goodput dips past it: served {figures}"
    reasons = ", ".join(sorted(onset.refused, key=lambda r: -onset.refused[r]))
    start = (
        f"{_offered(onset, axis, before is None)} ({onset.refused_per_s:.0f}/s refused, {reasons})"
    )
    if before is None:
        starts = f"refusals start at or below {start}"
    else:
        starts = f"refusals start between {_offered(before, axis, True)} (none refused) and {start}"
    sentence = (
        f"{who} refuses requests past its capacity of {peak.throughput:.0f} {unit}s/s "
        f"(served at {_offered(peak, axis, True)}); {starts}; {shape}"
    )
    sentence += _client(last, axis, collapses, tolerance)
    capacity = f"{peak.throughput:.0f}/s"
    change = (
        f"to serve more than {capacity}: more instances of {who} or more servers; to keep "
        f"goodput past it: admission limits in front of it (at most {capacity} sent, the rest "
        "turned away before they cost the server); a larger max_queue_size queues bursts "
        "instead of refusing them, at the cost of their latency"
    )
    low = float(before.offered) if before is not None else None
    return Overload(model, peak.throughput, (low, onset.offered), collapses, sentence, change)


def _offered(point: Point, axis: str, named: bool) -> str:
    """``80/s offered``, or a closed loop's ``8 threads, sending 400/s``; ``named`` adds
    the word ``offered`` to an open loop's rate."""
    if axis == "rate":
        return f"{point.offered:.0f}/s offered" if named else f"{point.offered:.0f}/s"
    threads = point.params[axis]
    return f"{threads} thread{'s' if threads != 1 else ''}, sending {point.offered:.0f}/s"


def _model(points: Sequence[Point]) -> str | None:
    """The model the server's counters show serving most (a refusal reaches no counter:
    Triton 2.51 counts its full queue's refusals neither as requests nor as failures);
    ``None`` without counters. An ensemble spans its steps: a step is named."""
    served: dict[str, int] = {}
    for point in points:
        for name, figures in point.triton.items():
            if not figures.ensemble:
                served[name] = served.get(name, 0) + figures.requests
    return max(served, key=lambda name: served[name], default=None)


def _client(point: Point, axis: str, collapses: bool, tolerance: float) -> str:
    """The client's CPU at the most offered load. On a host whose cores are busy, the client's
    cost of the refused calls is part of a collapse where it holds a share of the cores beyond
    the tolerance; otherwise it is too little to explain it, and is said as such."""
    sent = point.offered * point.seconds
    if not point.cpu_s or not sent:
        return ""
    said = (
        f"; the client's CPU at {_offered(point, axis, True)}: U {point.cpu_cores:.2f} of a "
        f"core, {point.cpu_s / sent * 1e3:.2f} ms a call"
    )
    host = point.host
    if not collapses or host is None or host.busy_cores is None or not host.cores:
        return said
    busy = host.busy_cores / host.cores
    if busy < 1 - 2 * tolerance:
        return said
    if point.cpu_cores >= 2 * tolerance * host.cores:
        return (
            f"{said}, of a host whose {host.cores} cores were U {busy:.2f} busy: part of the "
            "collapse may be the client's own cost of the refused calls (drive it from another "
            "host to tell)"
        )
    return (
        f"{said}, of a host whose {host.cores} cores were U {busy:.2f} busy: too little to "
        "explain the collapse"
    )


def settle(point: Point, http_url: str | None) -> None:
    """Decide a failed point whose every failure is a refused connection: with the server
    ready (``ready``), its listener turned the connections away under load, and they are
    refusals of a point that stands; without, the server is gone, and the error says so.
    A point that failed otherwise is left as it is."""
    if point.status != "failed" or not _connections_refused(point):
        return
    if not ready(http_url):
        where = f"{http_url}/v2/health/ready" if http_url else "no readiness page to ask"
        point.error = (
            f"the server is gone: connections refused, and {where} not ready; {point.error}"
        )
        return
    for kind, count in point.errors.items():
        point.refused["connection refused"] = point.refused.get("connection refused", 0) + count
        point.refusal_samples.setdefault("connection refused", point.error_samples.get(kind, ""))
    point.errors, point.error_samples = {}, {}
    point.status, point.error = "ok", ""


#: How clients say a connection was refused, or closed under a request in flight (a server
#: killed while it answered): tritonclient's HTTP and gRPC, Python's own.
_CONNECTION = (
    "connection refused",
    "failed to connect",
    "connectionclosed",
    "connection closed",
    "connection reset",
    "connection aborted",
    "remote end closed",
    "broken pipe",
)


def _connections_refused(point: Point) -> bool:
    # a point stopped in its warm-up has its failures' kinds, and no measured ones
    kinds = point.errors or point.error_samples
    said = [f"{kind} {point.error_samples.get(kind, '')}".lower() for kind in kinds]
    return bool(said) and all(any(words in s for words in _CONNECTION) for s in said)


def ready(http_url: str | None, timeout_s: float = 2.0) -> bool:
    """Whether a KServe v2 server at ``http_url`` (``host:port``) says it is ready to serve
    (``/v2/health/ready``: Triton's, and any KServe v2 server's)."""
    if http_url is None:
        return False
    base = http_url if "://" in http_url else f"http://{http_url}"
    try:
        with urllib.request.urlopen(f"{base}/v2/health/ready", timeout=timeout_s) as answer:
            status: int = answer.status
            body = answer.read()
    except Exception:  # refused, reset, timed out: not ready
        return False
    if status != 200:
        return False
    try:  # a server may answer with a body; one that says it is not ready is not
        return bool(json.loads(body).get("ready", True)) if body.strip() else True
    except (ValueError, AttributeError):
        return True
