"""Wrappers for the asyncio clients, ``tritonclient.http.aio`` and ``tritonclient.grpc.aio``.

``infer`` is a coroutine there; the call's span lives in the task's own context, so concurrent
tasks keep their own parents. The HTTP client's transport coroutine (``_post``) is stamped per
client (``_transport.stamp_async``); the gRPC client's hooks run in its (de)serialiser
(``_transport.attach_model_infer``), in the call's own task. gRPC ``stream_infer`` is
``_stream``'s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from otelkit.client._begin import TargetOf, begin, enter, headers_index
from otelkit.client._call import CURRENT_CALL

__all__ = ["traced_aio_infer"]


def traced_aio_infer(target_of: TargetOf, original: Callable[..., Any]) -> Any:
    """asyncio ``infer``: one CLIENT span from the call to its result, in the task's context;
    a call not sampled records its metrics only, as ``_sync.traced_infer``'s."""
    index = headers_index(original)

    @functools.wraps(original)
    async def infer(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = begin(target_of, self, args, kwargs, "asyncio_infer")
        if call is None:
            return await original(self, *args, **kwargs)
        token = None
        if call.sampled:
            args, kwargs, token = enter(call, index, args, kwargs)
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
