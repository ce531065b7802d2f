"""Wrappers for the synchronous tritonclient clients: HTTP and gRPC, ``infer`` and ``async_infer``.

Each wrapper begins its call (``_begin.begin``), runs the client's own method with the
caller's arguments (for a sampled call, with a copy of the caller's headers that carries the
trace context: tritonclient writes into the dict it is given) and hands the call its result or
its error, where the result reaches the caller: as ``infer`` returns, in gRPC
``async_infer``'s callback, or at HTTP ``async_infer``'s ``get_result``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, cast

from otelkit.client._begin import TargetOf, begin, enter, headers_index, with_headers
from otelkit.client._call import CURRENT_CALL, Call, MeteredCall

__all__ = [
    "TracedAsyncRequest",
    "traced_grpc_async_infer",
    "traced_http_async_infer",
    "traced_infer",
]


def traced_infer(target_of: TargetOf, original: Callable[..., Any]) -> Any:
    """``infer``: one CLIENT span from the call to its result; a call not sampled records its
    metrics only (``MeteredCall``). The hottest path otelkit has."""
    index = headers_index(original)

    @functools.wraps(original)
    def infer(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = begin(target_of, self, args, kwargs, "infer")
        if call is None:
            return original(self, *args, **kwargs)
        token = None
        if call.sampled:
            args, kwargs, token = enter(call, index, args, kwargs)
        try:
            result = original(self, *args, **kwargs)
        except BaseException as error:
            call.finish(error)
            raise
        finally:
            if token is not None:
                CURRENT_CALL.reset(token)
        call.finish(None, result)
        return result

    return infer


def traced_grpc_async_infer(target_of: TargetOf, original: Callable[..., Any]) -> Any:
    """gRPC ``async_infer``: the call ends when the callback gets the result or the error."""
    index = headers_index(original)

    @functools.wraps(original)
    def async_infer(
        self: Any, model_name: str, inputs: Any, callback: Any, *args: Any, **kwargs: Any
    ) -> Any:
        call = begin(target_of, self, (model_name, inputs, *args), kwargs, "async_infer")
        if call is None:
            return original(self, model_name, inputs, callback, *args, **kwargs)

        def done(result: Any, error: Any) -> None:
            if call.sampled:  # its response was parsed on gRPC's thread, with no current call
                cast(Call, call).received()
            call.finish(error, result)
            callback(result=result, error=error)

        token = None
        if call.sampled:
            args, kwargs, token = enter(call, index - 3, args, kwargs)
        try:
            return original(self, model_name, inputs, done, *args, **kwargs)
        except BaseException as error:
            call.finish(error)
            raise
        finally:
            if token is not None:
                CURRENT_CALL.reset(token)

    return async_infer


class TracedAsyncRequest:
    """HTTP ``async_infer``'s handle: the call ends when ``get_result`` returns or raises."""

    def __init__(self, inner: Any, call: MeteredCall) -> None:
        self._inner = inner
        self._call: MeteredCall | None = call

    def get_result(self, block: bool = True, timeout: float | None = None) -> Any:
        call, self._call = self._call, None
        try:
            result = self._inner.get_result(block=block, timeout=timeout)
        except BaseException as error:
            if call is not None:
                call.finish(error)
            raise
        if call is not None:
            call.finish(None, result)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def traced_http_async_infer(target_of: TargetOf, original: Callable[..., Any]) -> Any:
    """HTTP ``async_infer``: the call ends at the handle's ``get_result``. Its request is sent
    from tritonclient's pool of greenlets, where no call is current: its phases go unstamped."""
    index = headers_index(original)

    @functools.wraps(original)
    def async_infer(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = begin(target_of, self, args, kwargs, "async_infer")
        if call is None:
            return original(self, *args, **kwargs)
        if call.sampled:  # only a Call is
            args, kwargs = with_headers(cast(Call, call), index, args, kwargs)
        try:
            handle = original(self, *args, **kwargs)
        except BaseException as error:
            call.finish(error)
            raise
        return TracedAsyncRequest(handle, call)

    return async_infer
