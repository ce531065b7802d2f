"""Work taken off the caller's path (``otelkit._core.worker``): run soon by a worker thread, at once
by whoever drains, in the caller when too much waits, and never twice across a fork."""

from __future__ import annotations

import logging
import multiprocessing
import threading
from multiprocessing.connection import Connection

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otelkit import semconv
from otelkit._core import guard
from otelkit._core.guard import InternalErrors
from otelkit._core.hotmetrics import HotRegistry
from otelkit._core.worker import LATER, DrainFirst, Later

IDLE = 3600.0  # a worker that never wakes during a test: only drains run the work


def test_work_runs_soon_on_the_worker_thread() -> None:
    later = Later(interval_s=0.001)
    ran = threading.Event()
    where: list[str] = []
    later.add(lambda: (where.append(threading.current_thread().name), ran.set()))
    assert ran.wait(5)
    assert where == ["otelkit-later"]
    later.close()


def test_drain_runs_what_waits_in_order_and_waits_for_the_item_running() -> None:
    later = Later(interval_s=IDLE)
    done: list[int] = []
    for index in range(100):
        later.add(lambda index=index: done.append(index))
    assert done == [] and later.pending() == 100
    later.drain()
    assert done == list(range(100)) and later.pending() == 0
    later.close()

    busy = Later(interval_s=0.001)
    started, release = threading.Event(), threading.Event()
    busy.add(lambda: (started.set(), release.wait(10)))
    assert started.wait(5)  # the worker runs it now
    drainer = threading.Thread(target=busy.drain)
    drainer.start()
    drainer.join(0.3)
    assert drainer.is_alive(), "drain returned while the worker's item was still running"
    release.set()
    drainer.join(5)
    assert not drainer.is_alive()
    busy.close()


def test_a_full_queue_runs_the_work_in_the_callers_thread() -> None:
    later = Later(interval_s=IDLE, limit=3)
    where: list[str] = []
    for _ in range(4):
        later.add(lambda: where.append(threading.current_thread().name))
    assert where == [threading.current_thread().name]  # the fourth, at once
    assert later.pending() == 3
    later.close()
    assert len(where) == 4


def test_failing_work_is_counted_logged_once_and_the_rest_still_runs(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("otelkit._errors.RAISE_INTERNAL_ERRORS", False)  # as for a user
    monkeypatch.setattr("otelkit._core.guard.INTERNAL_ERRORS", InternalErrors())
    later = Later(interval_s=IDLE)
    done: list[str] = []
    for _ in range(2):
        later.add(lambda: 1 / 0)
        later.add(lambda: done.append("after"))
    with caplog.at_level(logging.ERROR, logger="otelkit"):
        later.drain()
    assert done == ["after", "after"] and later.failed == 2
    assert guard.INTERNAL_ERRORS.total == 2  # exported as a health metric
    [record] = caplog.records
    assert "failed while ending a call's span and metrics" in record.getMessage()
    later.close()


def test_tests_see_a_failure_at_the_next_drain() -> None:
    later = Later(interval_s=0.001)
    ran = threading.Event()
    later.add(lambda: (ran.set(), 1 / 0))
    assert ran.wait(5)
    with pytest.raises(ZeroDivisionError):
        later.drain()  # OTELKIT_RAISE_INTERNAL_ERRORS=1 (conftest): raised where it can be seen
    later.drain()  # once
    later.close()


def test_a_flush_of_the_tracer_provider_ends_the_spans_still_waiting() -> None:
    later = Later(interval_s=IDLE)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(DrainFirst(later))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for name in ("first", "second"):
        later.add(provider.get_tracer("t").start_span(name).end)
    assert exporter.get_finished_spans() == ()
    assert provider.force_flush()
    assert [span.name for span in exporter.get_finished_spans()] == ["first", "second"]
    later.add(provider.get_tracer("t").start_span("third").end)
    provider.shutdown()
    assert [span.name for span in exporter.get_finished_spans()][-1] == "third"
    later.close()


def test_a_metric_snapshot_counts_the_calls_still_waiting() -> None:
    later = Later(interval_s=IDLE)
    hot = HotRegistry(later=later)
    counter = hot.counter(semconv.CLIENT_REQUEST_BYTES, ()).series(())
    for _ in range(3):
        later.add(lambda: counter.add(10))
    (metric,) = hot.collect()
    assert metric.data.data_points[0].value == 30
    later.close()


def _in_child(conn: Connection) -> None:
    pending = LATER.pending()  # the parent's: dropped at the fork
    ran = threading.Event()
    LATER.add(lambda: ran.set())  # a worker of the child's own runs it
    conn.send((pending, ran.wait(10), threading.current_thread().name))


def test_a_forked_child_drops_its_parents_work_and_runs_its_own() -> None:
    done: list[str] = []
    context = multiprocessing.get_context("fork")
    parent_end, child_end = context.Pipe()
    LATER.start()  # as instrument() does: add() below would start it under the lock held here
    LATER.drain()
    with LATER._lock:  # the parent's worker is mid-item at the fork; the child must not hang
        LATER.add(lambda: done.append("parent"))
        child = context.Process(target=_in_child, args=(child_end,))
        child.start()
    assert parent_end.poll(20), "the child hung on a lock held at the fork"
    assert parent_end.recv() == (0, True, "MainThread")
    child.join(10)
    assert child.exitcode == 0
    LATER.drain()
    assert done == ["parent"]  # ended once, by the parent
