"""The closed loop on asyncio tasks: many requests in flight from one thread.

A thread per request in flight stops paying somewhere in the thousands (memory, switches); an
asyncio task costs a few kilobytes. ``drive_tasks`` keeps ``load.concurrency`` tasks each
awaiting one request at a time, on an event loop of its own in the calling thread, with the
same measured window and hooks as the threaded loop (the hooks, a blocking scrape, run on a
helper thread so the requests in flight go on meanwhile).

>>> import asyncio
>>> async def request(index: int, measured: bool) -> None:
...     await asyncio.sleep(0.001)
>>> run = drive_tasks(request, Load(concurrency=50, requests=200, warmup_s=0.0, asyncio=True))
>>> len(run.latencies_s)
200
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from otelkit.study.load import Load, LoadRun, RequestLog, Tickets, WindowClock, collect_run

__all__ = ["AsyncCall", "drive_tasks"]

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
) -> LoadRun:
    """Run ``load``'s closed loop as asyncio tasks; ``finish`` is awaited on the loop at the
    end (closing asyncio clients bound to it); ``other_cpu_s`` as ``drive`` takes it. Ctrl-C
    cancels the tasks and re-raises."""
    problems = load.problems()
    if problems:
        raise ValueError("; ".join(problems))
    window = WindowClock(load, on_window_start, on_window_end, progress, other_cpu_s)
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
                record.fail(begin, ticket[1], error)
                failures[0] += 1
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
