"""How a point loads the server: a closed loop at a concurrency (threads, or asyncio tasks), or
an open loop at a rate.

A closed loop keeps ``concurrency`` requests in flight, one thread each, as CMS and ATLAS
clients do with a thread per event (up to 1,000 threads, as NERSC's client had). An open loop
sends requests at Poisson arrival times, ``rate`` a second on average, whether or not earlier
ones are answered; a request's latency then runs from its *scheduled* arrival, so a client that
falls behind shows as latency instead of hiding it (coordinated omission). Either runs for
``seconds`` or until ``requests`` requests are measured, after ``warmup_s`` seconds whose
requests are left out. With ``requests``, the window ends where the last measured request
starts, and the load goes on (unmeasured) until the window closes: the throughput is the full
loop's, as with ``seconds``.

A request counts in the point's throughput when it *completes* within the measured window,
and in its latencies when it *starts* within it. The window's equal parts (``Load.windows``)
each hold the requests that complete within them, whatever their start: a part's throughput
and latencies come from the same requests, and none ends after the window's close.

>>> Load(concurrency=8, seconds=10).mode
'closed'
>>> Load(rate=200.0, requests=5_000).problems()
[]
>>> Load(concurrency=0).problems()
['concurrency is the number of requests in flight, 1 to 1000, not 0']

**Asyncio.** A thread per request in flight stops paying somewhere in the thousands (memory,
switches); an asyncio task costs a few kilobytes. ``drive_tasks`` keeps ``load.concurrency``
tasks each awaiting one request at a time, on an event loop of its own in the calling thread,
with the same measured window and hooks as the threaded loop (the hooks, a blocking scrape, run
on a helper thread so the requests in flight go on meanwhile).

>>> import asyncio
>>> async def request(index: int, measured: bool) -> None:
...     await asyncio.sleep(0.001)
>>> run = drive_tasks(request, Load(concurrency=50, requests=200, warmup_s=0.0, asyncio=True))
>>> len(run.latencies_s)
200
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import random
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from otelkit.study._counters import CpuSample, host_sample

__all__ = [
    "MAX_CONCURRENCY",
    "MAX_TASKS",
    "AsyncCall",
    "EdgeRead",
    "Load",
    "LoadRun",
    "drive",
    "drive_tasks",
    "error_kind",
    "refusal",
    "scheduled_at",
]


_log = logging.getLogger("otelkit.study")

MAX_CONCURRENCY = 1000  # threads
MAX_TASKS = 100_000  # asyncio tasks
_PROGRESS_EVERY_S = 0.5

_DUE = threading.local()


def scheduled_at() -> float | None:
    """Within an open loop's request, when it was due (``time.perf_counter()``): the wait from
    then until a thread took it is the client's backlog. ``None`` in a closed loop."""
    due: float | None = getattr(_DUE, "at", None)
    return due


#: What the driver calls for each request: ``call(index, measured)``; it raises on failure.
Call = Callable[[int, bool], None]


@dataclass(frozen=True)
class Load:
    """One point's load: closed loop at ``concurrency`` or, with ``rate``, an open loop.

    With ``asyncio``, the closed loop's requests are asyncio tasks on one thread (many requests
    in flight from few threads; the request needs an asyncio form: ``otelkit.study._drive``).
    ``seconds`` or ``requests`` sets how much is measured after ``warmup_s``; an open loop
    runs each request on a pool of at most ``max_in_flight`` threads. A point stops early
    after ``max_errors`` failed requests (a dead server), and is marked ``errors`` (left out of
    the figures across points) when more than ``max_error_share`` of its measured requests
    failed. Requests the server refused (``refusal``) are outcomes, not failures: neither
    rule counts them. The measured window is cut into ``windows`` equal parts, whose spread
    gives the intervals of ``otelkit study compare``. ``repeats``: a study measures each point
    this many times, one pass over the sweep after another, and the spread between the repeats
    gives the intervals instead (``otelkit.study._repeats``; 3 or more).
    """

    concurrency: int = 1
    rate: float | None = None
    seconds: float | None = None  # 5 s when neither seconds nor requests is given
    requests: int | None = None
    warmup_s: float = 1.0
    max_in_flight: int = MAX_CONCURRENCY
    max_errors: int = 1000
    windows: int = 10
    seed: int = 0
    asyncio: bool = False
    max_error_share: float = 0.01
    repeats: int = 1

    def __post_init__(self) -> None:
        if self.seconds is None and self.requests is None:
            object.__setattr__(self, "seconds", 5.0)

    @property
    def mode(self) -> Literal["closed", "open"]:
        """``open`` with a rate, ``closed`` otherwise."""
        return "open" if self.rate is not None else "closed"

    def problems(self) -> list[str]:
        """What makes no sense in this load, one sentence each (empty when it is sound)."""
        found: list[str] = []
        most = MAX_TASKS if self.asyncio else MAX_CONCURRENCY
        if self.rate is None and not _whole_in(self.concurrency, 1, most):
            found.append(
                f"concurrency is the number of requests in flight, 1 to {most}, "
                f"not {self.concurrency!r}"
            )
        if self.asyncio and self.rate is not None:
            found.append("an open loop (rate) runs on threads: asyncio goes with a concurrency")
        if self.rate is not None and not (_number(self.rate) and 0 < self.rate < math.inf):
            found.append(f"rate is requests per second, above 0, not {self.rate!r}")
        if self.seconds is not None and self.requests is not None:
            found.append("give seconds or requests, not both")
        if self.seconds is not None and not (_number(self.seconds) and self.seconds > 0):
            found.append(f"seconds is the measured duration, above 0, not {self.seconds!r}")
        if self.requests is not None and not _whole_in(self.requests, 1, 10**12):
            found.append(
                f"requests is a count of measured requests, 1 or more, not {self.requests!r}"
            )
        if not (_number(self.warmup_s) and self.warmup_s >= 0):
            found.append(f"warmup_s is seconds, 0 or more, not {self.warmup_s!r}")
        if not _whole_in(self.max_in_flight, 1, MAX_CONCURRENCY):
            found.append(
                f"max_in_flight is 1 to {MAX_CONCURRENCY} threads, not {self.max_in_flight!r}"
            )
        if not _whole_in(self.windows, 2, 1000):
            found.append(f"windows is 2 to 1000 parts of the measured time, not {self.windows!r}")
        if not _whole_in(self.repeats, 1, 100):
            found.append(
                f"repeats is how often each point is measured, 1 to 100, not {self.repeats!r}"
            )
        if not (_number(self.max_error_share) and 0 <= self.max_error_share <= 1):
            found.append(
                f"max_error_share is a share of the measured requests, 0 to 1, "
                f"not {self.max_error_share!r}"
            )
        return found

    def at(self, params: dict[str, Any]) -> Load:
        """This load at a point's ``concurrency`` (a closed loop) or ``rate`` (an open loop)."""
        changes: dict[str, Any] = {}
        if "concurrency" in params:
            changes.update(concurrency=params["concurrency"], rate=None)
        if "rate" in params:
            changes["rate"] = params["rate"]
        return replace(self, **changes) if changes else self


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _whole_in(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


@dataclass
class LoadRun:
    """What the driver saw in the measured window; times in seconds from the window's start."""

    window_s: float = 0.0
    completed: int = 0  # successful requests that completed within the window
    latencies_s: list[float] = field(default_factory=list)  # successful requests started in it
    # the successful requests that completed within the window, whatever their start: when
    # (seconds from its opening) and their latencies
    ends_s: list[float] = field(default_factory=list)
    end_latencies_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # failed requests started in it, by kind
    failed_latencies_s: list[float] = field(default_factory=list)  # and their latencies
    error_samples: dict[str, str] = field(default_factory=dict)  # one message per kind
    # requests started in it that the server declined to serve, by reason (``refusal``)
    refused: dict[str, int] = field(default_factory=dict)
    refusal_samples: dict[str, str] = field(default_factory=dict)  # one message per reason
    cpu_s: float = 0.0  # this process's CPU time over the window, less other_cpu_s's
    warmup_failed: int = 0  # failed requests of the warm-up (a server down from the start)
    opened_epoch: float = 0.0  # when the window opened, in seconds since the epoch
    stopped: Literal["interrupted", "errors"] | None = None
    # the host's busy time when the window opened and when it closed (read beside the
    # process's CPU time, outside the hooks whose middle marks the server's counters)
    host: tuple[CpuSample, CpuSample] | None = None
    # the reads at each edge of the window's parts (``Load.windows`` + 1 of them when every
    # part was read: fewer with ``requests``, whose end is known only when it comes, or when
    # the load stopped early)
    edges: list[EdgeRead] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(self.errors.values())


def error_kind(error: BaseException) -> str:
    """A failed request's kind: the exception's class, with tritonclient's status when it has one.

    >>> error_kind(TimeoutError("no answer"))
    'TimeoutError'
    """
    name = type(error).__name__
    status = getattr(error, "status", None)
    try:
        code = status() if callable(status) else status
    except Exception:
        code = None
    return f"{name} {code}" if code not in (None, "") else name


#: What a server says when it sheds load, lowercase, and the reason a refusal is counted under,
#: whatever the status: Triton's queue policy (HTTP 503 or gRPC UNAVAILABLE), a gRPC server's
#: ``maximum_concurrent_rpcs`` (RESOURCE_EXHAUSTED).
_SHED = (
    ("exceeds maximum queue size", "queue full"),
    ("request timeout expired", "queue timeout"),
    ("concurrent rpc limit exceeded", "rpc limit"),
)
#: Envoy's 503s: its circuit breaker, and an upstream that refused the connection behind it.
_PROXY = (("overflow", "proxy overflow"), ("upstream connect", "proxy upstream"))
#: HTTP statuses that say "not now" whatever the message (gRPC's UNAVAILABLE and
#: RESOURCE_EXHAUSTED also mean a failed connection or a message too large: by message only).
_REFUSING = {"429": "429 too many requests", "503": "503 unavailable"}


def refusal(error: BaseException) -> str | None:
    """Why the server declined ``error``'s request (a refusal, an outcome of overload), or
    ``None`` for a failure. Decided by the status and message a server sends when it sheds
    load; a gRPC UNAVAILABLE is a refusal only with such a message (without, it is most often
    a connection that failed).

    >>> class Triton(Exception):
    ...     def status(self) -> str:
    ...         return "StatusCode.UNAVAILABLE"
    >>> refusal(Triton("[StatusCode.UNAVAILABLE] Exceeds maximum queue size"))
    'queue full'
    >>> refusal(Triton("[StatusCode.UNAVAILABLE] failed to connect to all addresses")) is None
    True
    >>> refusal(ConnectionRefusedError("[Errno 111] Connection refused")) is None
    True
    """
    message = str(error).lower()
    for words, reason in _SHED:
        if words in message:
            return reason
    status = _status(error) or ""
    if status == "503":
        return next((reason for words, reason in _PROXY if words in message), _REFUSING[status])
    return _REFUSING.get(status)


def _status(error: BaseException) -> str | None:
    """The status a client's exception carries: tritonclient's ``status()``, ``status_code``,
    ``code`` or ``status`` (httpx, requests, aiohttp, urllib), or its response's."""
    for owner in (error, getattr(error, "response", None)):
        for name in ("status", "status_code", "code"):
            value = getattr(owner, name, None)
            try:
                value = value() if callable(value) else value
            except Exception:
                continue
            if isinstance(value, (int, str)) and not isinstance(value, bool) and value != "":
                return str(value)
    return None


class RequestLog:
    """One thread's requests; only that thread writes it, so no lock is taken per request.

    Each request keeps whether its ticket said it is measured: with ``requests``, the count
    decides, and two threads may take their tickets in another order than their start times.
    """

    __slots__ = ("begins", "ends", "failures", "measured", "refusals")

    def __init__(self) -> None:
        self.begins: list[float] = []
        self.ends: list[float] = []
        self.measured: list[bool] = []
        self.failures: list[tuple[float, float, bool, str, str]] = []
        self.refusals: list[tuple[bool, str, str]] = []  # (measured, reason, message)

    def done(self, begin: float, measured: bool) -> None:
        self.begins.append(begin)
        self.ends.append(time.perf_counter())
        self.measured.append(measured)

    def fail(self, begin: float, measured: bool, error: BaseException) -> bool:
        """Log a request that raised; ``False`` when the server refused it (not a failure)."""
        end = time.perf_counter()
        reason = refusal(error)
        if reason is not None:
            self.refusals.append((measured, reason, str(error)[:300]))
            return False
        self.failures.append((begin, end, measured, error_kind(error), str(error)[:300]))
        return True


@dataclass(frozen=True)
class EdgeRead:
    """What the client read at one edge of the window's parts: when its hook ran (the middle
    of it; ``time.perf_counter()``, or seconds from the window's opening in a ``LoadRun``), its
    own CPU seconds so far, less the study's hooks' and the threads left out (``None`` where
    those were unreadable), and the host's busy time."""

    at: float
    cpu_s: float | None
    host: CpuSample


class WindowClock:
    """The measured window and its hooks, run on the driving thread."""

    def __init__(
        self,
        load: Load,
        on_start: Callable[[], None],
        on_end: Callable[[], None],
        progress: Callable[[float, int], None] | None,
        other_cpu_s: Callable[[], float | None] | None = None,
        on_part: Callable[[int], None] = lambda part: None,
    ) -> None:
        self.load = load
        self._on_start, self._on_end, self._progress = on_start, on_end, progress
        self._on_part = on_part
        self._other_cpu_s = other_cpu_s
        self.opened = self.closed = False
        self.cpu0 = self.cpu1 = 0.0
        self.host0: CpuSample | None = None
        self.host1: CpuSample | None = None
        self._other0: float | None = None
        self.cpu_s = 0.0  # the client's CPU over the window, once closed
        # the reads at each edge of the window's parts, the window's own two edges too
        self.edges: list[EdgeRead] = []
        self._hooks_cpu_s = 0.0  # the hooks' own CPU so far: the study's, not the client's
        self.begin()
        self.opened_epoch = 0.0
        self._last_progress = 0.0

    def begin(self) -> None:
        """The load begins now: the warm-up, then the measured window, count from here."""
        self.started_at = time.perf_counter()
        self.start = self.started_at + self.load.warmup_s
        self.end = self.start + self.load.seconds if self.load.seconds is not None else math.inf
        self.opened_at, self.closed_at = self.start, math.inf

    def _open(self) -> None:
        self.opened = True
        self.cpu0 = time.process_time()
        self.host0 = host_sample()
        self._other0 = self._other_cpu_s() if self._other_cpu_s is not None else None
        self.opened_at = self._edge(self._on_start, self.cpu0, self.host0, self._other0)
        self.opened_epoch = time.time() - (time.perf_counter() - self.opened_at)

    def _edge(
        self, hook: Callable[[], None], cpu: float, host: CpuSample, other: float | None
    ) -> float:
        """Run an edge's hook and keep what the client read just before it: its CPU so far,
        less the hooks' (the study's scrapes) and the other threads' (None where those were
        unreadable), and the host's busy time."""
        client: float | None = cpu - self._hooks_cpu_s
        if self._other0 is not None:  # else the process's, as the window's total then is
            client = None if other is None else cpu - self._hooks_cpu_s - (other - self._other0)
        spent = time.thread_time()
        at = self._hook(hook)
        self._hooks_cpu_s += time.thread_time() - spent
        self.edges.append(EdgeRead(at, client, host))
        return at

    def _part_edge(self) -> None:
        """The reads at the next edge between two parts of the window."""
        other = self._other_cpu_s() if self._other_cpu_s is not None else None
        part = len(self.edges)
        self._edge(lambda: self._on_part(part), time.process_time(), host_sample(), other)

    def _next_part(self) -> float:
        """When the next edge between two parts is due; inf when none is (with ``requests``
        the window's end, and so its parts, are known only once it has come)."""
        parts = self.load.windows
        if self.closed or self.load.seconds is None or not 0 < len(self.edges) < parts:
            return math.inf
        return self.start + len(self.edges) * (self.end - self.start) / parts

    @staticmethod
    def _hook(hook: Callable[[], None]) -> float:
        """Run a hook (a scrape of the server's counters); the middle of it is when the server
        read its counters, so the client counts its completions from or up to that moment."""
        before = time.perf_counter()
        hook()
        return (before + time.perf_counter()) / 2

    def tick(self, done: Callable[[], int]) -> None:
        now = time.perf_counter()
        if not self.opened and now >= self.start:
            self._open()
        while not self.closed and now >= self._next_part() and self._next_part() < self.end:
            self._part_edge()
        if self.opened and not self.closed and now >= self.end:
            self.close()
        if self._progress is not None and now - self._last_progress >= _PROGRESS_EVERY_S:
            self._last_progress = now
            self._progress(now - self.started_at, done())

    def close(self) -> None:
        if not self.opened:  # stopped before the warm-up was over
            self._open()
        self.closed = True
        self.cpu1 = time.process_time()
        self.host1 = host_sample()
        other1 = self._other_cpu_s() if self._other_cpu_s is not None else None
        self.cpu_s = self.cpu1 - self.cpu0 - self._hooks_cpu_s
        if self._other0 is not None and other1 is not None:
            self.cpu_s -= other1 - self._other0
        elif self._other_cpu_s is not None:
            _log.debug("the CPU time of the threads to leave out is unreadable: the process's")
        self.closed_at = self._edge(self._on_end, self.cpu1, self.host1, other1)

    def next_event(self) -> float:
        """Seconds until the window opens or closes, or until the next progress report."""
        now = time.perf_counter()
        marks = [self.start if not self.opened else min(self.end, self._next_part())]
        if self._progress is not None:
            marks.append(self._last_progress + _PROGRESS_EVERY_S)
        return max(0.0, min(marks) - now)


def drive(
    call: Call,
    load: Load,
    *,
    on_window_start: Callable[[], None] = lambda: None,
    on_window_end: Callable[[], None] = lambda: None,
    progress: Callable[[float, int], None] | None = None,
    other_cpu_s: Callable[[], float | None] | None = None,
    on_part: Callable[[int], None] = lambda part: None,
) -> LoadRun:
    """Run ``load`` with ``call(index, measured)`` per request; returns the measured window.

    ``on_window_start`` and ``on_window_end`` run on the calling thread when the window opens
    and closes (a scrape of the server's counters, say), ``on_part(k)`` at the edge between
    parts ``k - 1`` and ``k`` of the window (``Load.windows`` parts, with ``seconds``);
    ``progress(elapsed_s, done)`` runs twice a second. ``other_cpu_s()``: the CPU seconds so
    far of this process's threads that are not the client's (an embedded receiver's), left out
    of the client's CPU figure; the whole process's figure where it returns ``None``. Ctrl-C
    stops every thread once its request returns, then re-raises.
    """
    problems = load.problems()
    if problems:
        raise ValueError("; ".join(problems))
    stop = threading.Event()
    window = WindowClock(load, on_window_start, on_window_end, progress, other_cpu_s, on_part)
    records: list[RequestLog] = []
    try:
        if load.mode == "closed":
            _closed(call, load, window, stop, records)
        else:
            _open(call, load, window, stop, records)
    except KeyboardInterrupt:
        stop.set()
        raise
    run = collect_run(records, window)
    if stop.is_set() and run.stopped is None:
        run.stopped = "errors"
    return run


def _count_failures(records: list[RequestLog]) -> int:
    return sum(len(r.failures) for r in records)


class Tickets:
    """Whether a closed loop's worker may send another request, and its index: one rule for
    threads and asyncio tasks. None once the window has ended (``seconds``) or closed.

    With ``requests``, the window ends where the last measured request starts, and the loop
    runs on, unmeasured, until the driving thread closes it at its next tick: a moment that
    does not depend on when requests complete. Closing just after a completion (the last
    measured request starts right after one) would count a whole batch of completions at that
    edge and none at the other, and counting only those measured requests and the warm-up's
    stragglers up to the last one's end left the window short or long by what was in flight.
    """

    def __init__(self, window: WindowClock, requests: int | None) -> None:
        self._window = window
        self._requests = requests
        self._measured = itertools.count()
        self._all = itertools.count()

    def take(self, begin: float) -> tuple[int, bool] | None:
        """(index, measured) of a request starting at ``begin`` (perf_counter), or None."""
        window = self._window
        if window.closed or (self._requests is None and begin >= window.end):
            return None
        measured = window.start <= begin < window.end
        if measured and self._requests is not None:
            count = next(self._measured)
            measured = count < self._requests
            if count == self._requests - 1:
                window.end = begin
        return next(self._all), measured


def _closed(
    call: Call, load: Load, window: WindowClock, stop: threading.Event, records: list[RequestLog]
) -> None:
    tickets = Tickets(window, load.requests)
    go = threading.Event()

    def worker(record: RequestLog) -> None:
        go.wait()
        while not stop.is_set():
            begin = time.perf_counter()
            ticket = tickets.take(begin)
            if ticket is None:
                return
            try:
                call(*ticket)
            except Exception as error:
                record.fail(begin, ticket[1], error)
                if len(record.failures) * load.concurrency >= load.max_errors and (
                    _count_failures(records) >= load.max_errors
                ):
                    stop.set()
                continue
            record.done(begin, ticket[1])

    records.extend(RequestLog() for _ in range(load.concurrency))
    threads = [
        threading.Thread(target=worker, args=(r,), name=f"otelkit-study-{n}", daemon=True)
        for n, r in enumerate(records)
    ]
    try:
        for thread in threads:
            thread.start()
        # the threads start together, the warm-up from then: a thread started among hundreds
        # of busy ones waits long for the interpreter, and the window would open before they ran
        window.begin()
    finally:
        go.set()  # after Ctrl-C too: no thread waits for ever
    _wait(threads, window, stop, records)


def _done(records: list[RequestLog]) -> Callable[[], int]:
    return lambda: sum(len(r.ends) for r in records)


def _wait(
    threads: list[threading.Thread],
    window: WindowClock,
    stop: threading.Event,
    records: list[RequestLog],
) -> None:
    done = _done(records)
    try:
        while any(t.is_alive() for t in threads):
            window.tick(done)
            if stop.wait(min(window.next_event(), 0.1)):
                break
        for thread in threads:  # each returns once its request does
            while thread.is_alive():
                thread.join(0.1)
    except KeyboardInterrupt:
        stop.set()
        for thread in threads:
            thread.join()
        raise
    if not window.closed:
        window.close()  # every thread is done: a count was reached, or errors stopped it


def _open(
    call: Call, load: Load, window: WindowClock, stop: threading.Event, records: list[RequestLog]
) -> None:
    assert load.rate is not None
    rng = random.Random(load.seed)
    local = threading.local()
    lock = threading.Lock()

    def run_one(index: int, scheduled: float, measured: bool) -> None:
        record = getattr(local, "record", None)
        if record is None:
            record = local.record = RequestLog()
            with lock:
                records.append(record)
        if stop.is_set():
            return
        _DUE.at = scheduled
        try:
            call(index, measured)
        except Exception as error:
            record.fail(scheduled, measured, error)
            if _count_failures(records) >= load.max_errors:
                stop.set()
            return
        finally:
            _DUE.at = None
        record.done(scheduled, measured)

    pool = ThreadPoolExecutor(load.max_in_flight, thread_name_prefix="otelkit-study")
    done = _done(records)
    arrival = time.perf_counter()
    measured_count = 0
    try:
        for index in itertools.count():
            arrival += rng.expovariate(load.rate)
            if arrival >= window.end or stop.is_set():
                break
            measured = arrival >= window.start
            if measured and load.requests is not None:
                measured_count += 1
                if measured_count == load.requests:  # the window ends at the last measured one
                    window.end = arrival
            while (delay := arrival - time.perf_counter()) > 0:
                window.tick(done)
                if stop.wait(min(delay, window.next_event(), 0.05)):
                    break
            window.tick(done)
            pool.submit(run_one, index, arrival, measured)
        while not window.closed and not stop.is_set():
            window.tick(done)
            stop.wait(min(window.next_event(), 0.05))
    except KeyboardInterrupt:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    if not window.closed:
        window.close()


def collect_run(records: list[RequestLog], window: WindowClock) -> LoadRun:
    # Requests whose ticket said so are measured (their latencies, the trace phase); the
    # completions of every request are counted between the two scrapes of the server's counters.
    start, opened, ends_at = window.start, window.opened_at, window.closed_at
    run = LoadRun(
        window_s=max(ends_at - opened, 1e-9), cpu_s=window.cpu_s, opened_epoch=window.opened_epoch
    )
    if window.host0 is not None and window.host1 is not None:
        run.host = (window.host0, window.host1)
    run.edges = [replace(e, at=e.at - opened) for e in window.edges]
    for record in records:
        for begin, end, measured in zip(record.begins, record.ends, record.measured, strict=True):
            if opened <= end <= ends_at:
                run.completed += 1
                run.ends_s.append(end - opened)
                run.end_latencies_s.append(end - begin)
            if measured:
                run.latencies_s.append(end - begin)
        for begin, end, measured, kind, message in record.failures:
            run.error_samples.setdefault(kind, message)
            if measured:
                run.errors[kind] = run.errors.get(kind, 0) + 1
                run.failed_latencies_s.append(end - begin)
            elif begin < start:
                run.warmup_failed += 1
        for measured, reason, message in record.refusals:
            run.refusal_samples.setdefault(reason, message)
            if measured:
                run.refused[reason] = run.refused.get(reason, 0) + 1
    return run


#: What the driver awaits for each request: ``call(index, measured)``; it raises on failure.
AsyncCall = Callable[[int, bool], Awaitable[None]]


def drive_tasks(
    call: AsyncCall,
    load: Load,
    *,
    on_window_start: Callable[[], None] = lambda: None,
    on_window_end: Callable[[], None] = lambda: None,
    progress: Callable[[float, int], None] | None = None,
    finish: Callable[[], Awaitable[None]] | None = None,
    other_cpu_s: Callable[[], float | None] | None = None,
    on_part: Callable[[int], None] = lambda part: None,
) -> LoadRun:
    """Run ``load``'s closed loop as asyncio tasks; ``finish`` is awaited on the loop at the
    end (closing asyncio clients bound to it); ``other_cpu_s`` and ``on_part`` as ``drive``
    takes them. Ctrl-C cancels the tasks and re-raises."""
    problems = load.problems()
    if problems:
        raise ValueError("; ".join(problems))
    window = WindowClock(load, on_window_start, on_window_end, progress, other_cpu_s, on_part)
    records = [RequestLog() for _ in range(load.concurrency)]
    stopped = asyncio.run(_run(call, load, window, records, finish))
    run = collect_run(records, window)
    if stopped and run.stopped is None:
        run.stopped = "errors"
    return run


async def _run(
    call: AsyncCall,
    load: Load,
    window: WindowClock,
    records: list[RequestLog],
    finish: Callable[[], Awaitable[None]] | None,
) -> bool:
    tickets = Tickets(window, load.requests)
    failures = [0]
    stop = asyncio.Event()

    async def worker(record: RequestLog) -> None:
        while not stop.is_set():
            begin = time.perf_counter()
            ticket = tickets.take(begin)
            if ticket is None:
                return
            try:
                await call(*ticket)
            except Exception as error:
                failures[0] += record.fail(begin, ticket[1], error)
                if failures[0] >= load.max_errors:
                    stop.set()
                continue
            record.done(begin, ticket[1])

    loop = asyncio.get_running_loop()
    tasks = [asyncio.create_task(worker(r)) for r in records]

    def done() -> int:
        return sum(len(r.ends) for r in records)

    try:
        pending = set(tasks)
        while pending:
            await loop.run_in_executor(None, window.tick, done)
            _, pending = await asyncio.wait(pending, timeout=min(window.next_event(), 0.1))
        if not window.closed:
            await loop.run_in_executor(None, window.close)
    finally:
        for task in tasks:
            task.cancel()
        if finish is not None:
            await finish()
    return stop.is_set()
