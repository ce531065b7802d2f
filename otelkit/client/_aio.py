"""Wrappers for the asyncio clients, ``tritonclient.http.aio`` and ``tritonclient.grpc.aio``.

``infer`` is a coroutine there; the call's span lives in the task's own context, so concurrent
tasks keep their own parents. The HTTP client's transport coroutine (``_post``) is wrapped per
client (by ``stamp_async``) to stamp when a sampled call's request left and its response came
back; the gRPC client stamps in its (de)serialiser (``_sync.attach_model_infer``), which runs in
the call's own task.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from otelkit.client._call import CURRENT_CALL, ClientTarget, end_quietly
from otelkit.client._sync import Transport, _begin, _enter, _headers_index

__all__ = ["stamp_async", "traced_aio_infer"]


def traced_aio_infer(target_of: Callable[[Any], ClientTarget], original: Callable[..., Any]) -> Any:
    """asyncio ``infer``: one CLIENT span from the call to its result, in the task's context;
    a call known not to be sampled takes ``_sync.traced_infer``'s short path."""
    index = _headers_index(original)
    clock = time.perf_counter_ns

    @functools.wraps(original)
    async def infer(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = _begin(target_of, self, args, kwargs, "asyncio_infer")
        if call is None:
            return await original(self, *args, **kwargs)
        if isinstance(call, tuple):  # not sampled: metrics only
            call[0].calls.in_flight.begin()
            start = clock()
            try:
                result = await original(self, *args, **kwargs)
            except BaseException as error:
                end_quietly(call, start, None, error)
                raise
            end_quietly(call, start, result)
            return result
        token = None
        if call.sampled:
            args, kwargs, token = _enter(call, index, args, kwargs)
        try:
            result = await original(self, *args, **kwargs)
        except BaseException as error:
            call.finish(error)
            raise
        finally:
            if token is not None:
                CURRENT_CALL.reset(token)
        call.finish(None, result)
        return result

    return infer


def stamp_async(original: Any) -> Transport:
    """``_sync.stamp`` for an awaited transport call, stamping the call of this task."""
    current = CURRENT_CALL.get

    async def stamped(*args: Any, **kwargs: Any) -> Any:
        call = current()
        if call is None:
            return await original(*args, **kwargs)
        call.sent()
        result = await original(*args, **kwargs)
        call.received()
        return result

    return stamped
