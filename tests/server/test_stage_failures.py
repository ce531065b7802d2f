"""A stage whose telemetry fails to start never breaks the user's code: ``with stage() as run``
still gives a run whose ``set`` works, and the stage around it ends as usual."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import otelkit
from otelkit import _errors as errors
from otelkit.analysis import build_traces, load_spans
from otelkit.server import _stage


@pytest.fixture
def telemetry(tmp_path: Path) -> Iterator[otelkit.Telemetry]:
    yield otelkit.configure(service_name="stage-failures", traces_dir=str(tmp_path))
    otelkit.shutdown()


def test_a_stage_that_cannot_start_leaves_the_user_and_the_outer_stage_alone(
    telemetry: otelkit.Telemetry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(errors, "RAISE_INTERNAL_ERRORS", False)  # as in production
    real = _stage.StageRun

    def broken(stage: _stage.Stage) -> _stage.StageRun:
        if stage.name == "inner":
            raise RuntimeError("otelkit's own failure")
        return real(stage)

    monkeypatch.setattr(_stage, "StageRun", broken)
    with otelkit.stage("outer") as outer:
        outer.set(edges=3)
        with otelkit.stage("inner") as inner:
            inner.set(hits=7)  # the user's code goes on
            inner.set_attribute("k", "v")
        outer.set(after=True)  # the outer run is still the current one
    otelkit.flush()
    (trace,) = build_traces(load_spans(tmp_path)).values()
    assert [(depth, span.name) for depth, span in trace.walk()] == [(0, "outer")]
    (span,) = trace.roots
    assert (span.attributes["edges"], span.attributes["after"]) == (3, True)
    assert _stage._RUN.get() is None


def test_a_stage_in_an_async_generator_dropped_mid_iteration_ends_without_raising(
    telemetry: otelkit.Telemetry, tmp_path: Path
) -> None:
    """asyncio closes an async generator left half-consumed from its own finalizer, in another
    context than the one the stage was entered in: the stage ends there (its span exported, its
    in-flight gauge back down) and nothing reaches the user's code or asyncio's handler."""
    import asyncio
    import gc

    from otelkit import semconv
    from otelkit._core.hotmetrics import HOT

    async def events():  # type: ignore[no-untyped-def]
        with otelkit.stage("stream"):
            yield 1
            yield 2

    raised: list[object] = []

    async def consume() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, context: raised.append(context))
        stream = events()
        assert await stream.__anext__() == 1  # then dropped, as a consumer that breaks off
        task = asyncio.create_task(asyncio.sleep(0))  # the stream lives on in another task's view
        await task
        del stream
        gc.collect()
        for _ in range(5):
            await asyncio.sleep(0)

    asyncio.run(consume())
    otelkit.flush()
    assert raised == []
    assert [s.name for s in load_spans(tmp_path)] == ["stream"]
    in_flight = {
        tuple(p.attributes.values()): p.value
        for m in HOT.collect()
        if m.name == semconv.STAGE_IN_FLIGHT.name
        for p in m.data.data_points  # type: ignore[union-attr]
    }
    assert all(value == 0 for value in in_flight.values()), in_flight
