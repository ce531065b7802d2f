"""``otelkit.stage``: one INTERNAL span and one duration observation per pipeline stage.

A stage is a decorator (sync functions, ``async`` functions, generators) or a context manager
(``with`` and ``async with``). Each run is a child of the current context, becomes the current
span while it runs (so nested stages nest), and records its wall time in the stage-duration
histogram (labels: model, stage) with the trace id as exemplar. Attributes can be set while it
runs through the object ``with`` gives. An exception is recorded and re-raised unchanged.

The model label comes from ``model=``, else from the request being served (set by the Triton
Python-backend and PyTriton helpers), else it is empty.

Costs a few microseconds per run: spans are otelkit's lean spans, the histogram is a hot one.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any, TypeVar, cast

from opentelemetry.trace import Link, SpanKind

from otelkit import semconv
from otelkit._core.deps.otel import RUNTIME_CONTEXT
from otelkit._core.guard import internal_error
from otelkit._core.hotmetrics import HOT, HistogramSeries, UpDownSeries
from otelkit._core.spans import SpanRecorder, error_type, with_span
from otelkit.gpu import _cuda_events as _gpu

__all__ = ["BATCH_LINKS", "CURRENT_MODEL", "Stage", "StageRun", "stage"]

F = TypeVar("F", bound=Callable[..., Any])

CURRENT_MODEL: contextvars.ContextVar[str] = contextvars.ContextVar("otelkit_model", default="")
# Links to every request of a dynamic batch, for the next stage that runs over the whole batch.
BATCH_LINKS: contextvars.ContextVar[Sequence[Link]] = contextvars.ContextVar(
    "otelkit_batch_links", default=()
)
_RUN: contextvars.ContextVar[StageRun | _NoRun | None] = contextvars.ContextVar(
    "otelkit_stage", default=None
)
_RECORDER = SpanRecorder("otelkit.server", server=True)
_LABELS = (semconv.M_MODEL, semconv.M_STAGE)
_ERROR_LABELS = (*_LABELS, semconv.M_ERROR_TYPE)
_INTERNAL = SpanKind.INTERNAL
_current_context = RUNTIME_CONTEXT


class _Series:
    """The metric series of one (model, stage)."""

    __slots__ = ("duration", "gpu_duration", "in_flight", "labels")

    def __init__(self, model: str, name: str) -> None:
        self.labels = (model, name)
        self.duration: HistogramSeries = HOT.histogram(semconv.STAGE_DURATION, _LABELS).series(
            self.labels
        )
        self.gpu_duration: HistogramSeries = HOT.histogram(
            semconv.STAGE_GPU_DURATION, _LABELS
        ).series(self.labels)
        self.in_flight: UpDownSeries = HOT.up_down_counter(semconv.STAGE_IN_FLIGHT, _LABELS).series(
            self.labels
        )


class StageRun:
    """One run of a stage; ``with otelkit.stage("frnn") as run: run.set(edges=n)``."""

    __slots__ = ("_gpu", "_links_token", "_series", "_start", "_token", "outer", "span")

    def __init__(self, stage: Stage) -> None:
        links = BATCH_LINKS.get()
        self.span = span = _RECORDER.start(stage.name, _INTERNAL, None, links)
        # only the outermost stage over a batch carries its links; stages inside it nest
        self._links_token = BATCH_LINKS.set(()) if links else None
        model = CURRENT_MODEL.get() if stage.model is None else stage.model
        self._series = series = stage.series(model)
        self._token: Any = None
        self.outer: contextvars.Token[StageRun | _NoRun | None] | None = None
        if span.sampled:
            attributes = span.attributes
            attributes[semconv.STAGE_NAME] = stage.name
            if series.labels[0]:
                attributes[semconv.MODEL_NAME] = series.labels[0]
            if links:
                attributes[semconv.STAGE_BATCH_REQUESTS] = len(links)
            if stage.attributes:
                attributes.update(stage.attributes)
            self._token = _current_context.attach(with_span(span.context))
        elif span.ids is not None:  # an unsampled root: nothing beneath it is sampled either
            self._token = _current_context.attach(with_span(span.ids))
        self._gpu = _gpu.start(stage.gpu)
        series.in_flight.begin()
        self._start = time.perf_counter_ns()

    def set(self, **attributes: Any) -> None:
        """Add attributes to the stage's span (ignored when it is not sampled)."""
        if self.span.sampled:
            self.span.attributes.update(attributes)

    def set_attribute(self, key: str, value: Any) -> None:
        if self.span.sampled:
            self.span.attributes[key] = value

    def close(self, error: BaseException | None) -> None:
        """End the run: metrics, then the span; never raises."""
        try:
            seconds = (time.perf_counter_ns() - self._start) / 1e9
            series = self._series
            series.in_flight.add(-1)
            span = self.span
            if error is not None:
                labels = (*series.labels, error_type(error))
                HOT.counter(semconv.STAGE_ERRORS, _ERROR_LABELS).series(labels).add(1)
                span.record_error(error)
            if self._token is not None:
                _forget(_current_context.detach, self._token)
            if self._links_token is not None:
                _forget(BATCH_LINKS.reset, self._links_token)
            if not span.sampled:
                series.duration.observe(seconds)
                if self._gpu is not None:
                    _gpu.finish(self._gpu, series.gpu_duration, None)
                return
            context = span.context
            series.duration.observe(seconds, context.trace_id, context.span_id)
            if self._gpu is not None:
                _gpu.finish(self._gpu, series.gpu_duration, span)  # ends the span later
            else:
                span.end()
        except Exception:
            internal_error("ending a stage span")


def _forget(reset: Callable[[Any], Any], token: Any) -> None:
    """Undo what a stage set in its context. A stage may end in another context than the one
    it began in (an async generator dropped half-consumed is closed by asyncio's finalizer, in
    a context of its own): there is nothing of the stage's to undo there, and the run still
    ends (its span, its in-flight count)."""
    with contextlib.suppress(ValueError):  # "<Token ...> was created in a different Context"
        reset(token)


class _NoRun:
    """What ``with stage(...) as run`` gives when otelkit failed to start the run: the user's
    ``run.set(...)`` still works (and does nothing), and the stage around it is left alone."""

    __slots__ = ("outer",)

    def __init__(self) -> None:
        self.outer: contextvars.Token[StageRun | _NoRun | None] | None = None

    def set(self, **attributes: Any) -> None:
        return None

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def close(self, error: BaseException | None) -> None:
        return None


class Stage:
    """What ``otelkit.stage(name, ...)`` returns: a decorator and a context manager."""

    __slots__ = ("_series", "attributes", "gpu", "model", "name")

    def __init__(
        self, name: str, model: str | None, gpu: bool | None, attributes: dict[str, Any]
    ) -> None:
        self.name = name
        self.model = model
        self.gpu = gpu
        self.attributes = attributes
        self._series: dict[str, _Series] = {}

    def series(self, model: str) -> _Series:
        found = self._series.get(model)
        if found is None:
            found = self._series[model] = _Series(model, self.name)
        return found

    def _open(self) -> StageRun | None:
        try:
            return StageRun(self)
        except Exception:
            internal_error(f"starting stage {self.name!r}")
            return None

    # -- context manager -----------------------------------------------------------------------
    def __enter__(self) -> StageRun | _NoRun:
        run: StageRun | _NoRun = self._open() or _NoRun()
        run.outer = _RUN.set(run)
        return run

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        run = _RUN.get()
        if run is None or run.outer is None:
            return
        _forget(_RUN.reset, run.outer)
        run.close(error)

    async def __aenter__(self) -> StageRun | _NoRun:
        return self.__enter__()

    async def __aexit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        self.__exit__(kind, error, traceback)

    # -- decorator -----------------------------------------------------------------------------
    def __call__(self, function: F) -> F:
        if inspect.isgeneratorfunction(function):
            return cast(F, self._generator(function))
        if inspect.iscoroutinefunction(function):
            return cast(F, self._coroutine(function))
        return cast(F, self._function(function))

    def _function(self, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def run_stage(*args: Any, **kwargs: Any) -> Any:
            run = self._open()
            if run is None:
                return function(*args, **kwargs)
            try:
                result = function(*args, **kwargs)
            except BaseException as error:
                run.close(error)
                raise
            run.close(None)
            return result

        return run_stage

    def _coroutine(self, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        async def run_stage(*args: Any, **kwargs: Any) -> Any:
            run = self._open()
            if run is None:
                return await function(*args, **kwargs)
            try:
                result = await function(*args, **kwargs)
            except BaseException as error:
                run.close(error)
                raise
            run.close(None)
            return result

        return run_stage

    def _generator(self, function: Callable[..., Generator[Any, Any, Any]]) -> Callable[..., Any]:
        """The stage spans the generator's life, first ``next`` to exhaustion or ``close``;
        its context is current only while the generator's own code runs."""

        @functools.wraps(function)
        def run_stage(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
            run = self._open()
            if run is None:
                return (yield from function(*args, **kwargs))
            generator = function(*args, **kwargs)
            error: BaseException | None = None
            try:
                return (yield from _in_context(generator, run))
            except BaseException as failure:
                error = failure
                raise
            finally:
                run.close(error if not isinstance(error, GeneratorExit) else None)

        return run_stage


def _in_context(generator: Generator[Any, Any, Any], run: StageRun) -> Generator[Any, Any, Any]:
    """``yield from generator``, but with the stage's context current only inside it."""
    stage_context = _current_context.get_current()
    if run._token is not None:  # the consumer runs in its own context between items
        _current_context.detach(run._token)
        run._token = None
    value: Any = None
    thrown: BaseException | None = None
    while True:
        token = _current_context.attach(stage_context)
        try:
            item = generator.throw(thrown) if thrown is not None else generator.send(value)
        except StopIteration as stop:
            return stop.value
        finally:
            _current_context.detach(token)
        thrown = None
        try:
            value = yield item
        except GeneratorExit:
            generator.close()
            raise
        except BaseException as failure:
            thrown = failure


def stage(
    name: str, *, model: str | None = None, gpu: bool | None = None, **attributes: Any
) -> Stage:
    """A pipeline stage: decorator or context manager; one span and one histogram sample per run.

    ``model`` labels the metrics (default: the model being served, from the Triton and PyTriton
    helpers). ``gpu``: ``True`` times the stage on the GPU with CUDA events, ``False`` never
    does, ``None`` (default) does when torch has initialised CUDA in this process. Extra keyword
    arguments become span attributes.

    >>> @otelkit.stage("frnn")
    ... def build_graph(points): ...
    >>> with otelkit.stage("filter") as run:
    ...     run.set(edges=int(edges.shape[1]))
    """
    return Stage(name, model, gpu, attributes)
