"""How a wrapped call begins, shared by the sync, asyncio and stream wrappers.

A wrapper asks ``begin`` for its call and gets one of three: ``None`` (the caller suppressed
instrumentation, or otelkit's own code failed: the client's own call runs bare), a
``MeteredCall`` (a call known not to be sampled before any span is asked for: its metrics and
nothing else), or a ``Call`` (one with its span). The wrapper then runs the client's own call
and hands it the result or the error (``finish``). A sampled ``Call`` also puts its trace
context in the request's headers and is the current call while the client's own call runs
(``enter``), for its transport's hooks.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable, Mapping
from random import getrandbits
from typing import Any, Protocol, cast

from otelkit._core.context import SUPPRESSED_KEYS, current_context, is_suppressed
from otelkit._core.deps.otel import SPAN_KEY as _SPAN_KEY
from otelkit._core.guard import internal_error
from otelkit._core.spans import NOT_SAMPLED, UNDECIDED, RootDecision
from otelkit._core.switch import SWITCH
from otelkit.client._call import CURRENT_CALL, RECORDER, Call, MeteredCall
from otelkit.client._target import TARGET, ClientTarget

__all__ = ["TargetOf", "Traced", "begin", "enter", "headers_index", "with_headers"]

_SUPPRESSED, _SUPPRESSED_PLAIN = SUPPRESSED_KEYS
TargetOf = Callable[[Any], ClientTarget]  # a client's target, made on first use


def begin(
    target_of: TargetOf,
    client: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    style: str,
) -> MeteredCall | Call | None:
    """The call that one request of ``client`` starts (``args`` and ``kwargs``: ``infer``'s):
    a ``MeteredCall`` when its root is found not sampled (``RootDecision``), else a ``Call``,
    which keeps the decision (``root``) for its span.

    ``None`` when the caller suppressed OpenTelemetry instrumentation
    (``opentelemetry.instrumentation.utils.suppress_instrumentation()``): the client's own
    call then runs with no span, no metrics and no context sent, as every contrib
    instrumentation does there; ``None`` too when otelkit's own code failed (counted).
    """
    try:
        context = current_context()
        if (  # the usual context is empty, or holds a span: membership first, no method call
            context
            and (_SUPPRESSED in context or _SUPPRESSED_PLAIN in context)
            and is_suppressed(context)
        ):
            return None
        target = client.__dict__.get(TARGET) or target_of(client)
        # Its root's sampling decision, by the recorder's rule (``SpanRecorder.roots``), taken
        # here, in no function of its own: every call comes this way, and a frame more was
        # measurably slower for a call not sampled.
        rule = RECORDER.roots
        if rule.generation != SWITCH.generation or context.get(_SPAN_KEY) is not None:
            root = UNDECIDED  # a span is current (it decides), or the configuration is new
        elif rule.every_root is not None:
            root = rule.every_root
        else:  # a trace id ratio: the bits it decides on first, where getrandbits(128) puts them
            low = getrandbits(64)
            if low < rule.bound:
                root = RootDecision.drawn(getrandbits(64) << 64 | low)
            else:
                root = NOT_SAMPLED
        if root is NOT_SAMPLED:
            return MeteredCall(target, args, kwargs)
        # a gRPC call goes through the rebuilt ModelInfer, which hands it its request
        return Call(target, args, kwargs, style, root, handed_request=target.handed_request)
    except Exception:
        internal_error(f"starting a client span for {style}")
        return None


def headers_index(method: Callable[..., Any]) -> int:
    """Position of ``headers`` among the positional arguments after ``self``."""
    names = list(inspect.signature(method).parameters)
    return names.index("headers") - 1


class Traced(Protocol):
    """What sends a trace context: a sampled ``Call``, or a stream's calls."""

    def headers(self, caller: Mapping[str, str] | None) -> dict[str, str]: ...


def with_headers(
    traced: Traced, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments with ``headers`` (at ``index`` or by keyword) replaced by ``traced``'s:
    a copy of the caller's, with the trace context added unless its client sends none
    (tritonclient writes into the dict it is given; the caller's stays untouched)."""
    if len(args) > index:
        return (*args[:index], traced.headers(args[index]), *args[index + 1 :]), kwargs
    kwargs["headers"] = traced.headers(kwargs.get("headers"))
    return args, kwargs


def enter(
    call: MeteredCall, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], contextvars.Token[Call | None]]:
    """A sampled call about to run (only a ``Call`` is sampled): its headers in the arguments
    (``with_headers``), and it becomes the current call, for its transport's hooks. Returns the
    arguments and the token that resets the current call."""
    sampled = cast(Call, call)
    args, kwargs = with_headers(sampled, index, args, kwargs)
    return args, kwargs, CURRENT_CALL.set(sampled)
