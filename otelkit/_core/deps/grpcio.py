"""The private attributes of ``grpcio``'s channels that otelkit's client instrumentation reads
(``otelkit.client``). Each missing name is logged once; the calls are answered and traced.

- The channel under each wrapper (``_channel``) and the target it connects to, the server
  address of a gRPC client's spans. grpcio's asyncio channel tells its target only from 1.82
  on (``AioChannel.target``); with an earlier grpcio, or a release that renames either name,
  the spans of that client name the server ``unknown``.
- Whether a channel's calls pass interceptors (``grpc.intercept_channel``'s wrapper keeps its
  ``_interceptor``, an asyncio channel its ``_unary_unary_interceptors`` and the like), where
  OpenTelemetry's own instrumentation would trace them again (``otelkit.client._interceptors``).
  A channel that does not tell is taken as intercepted: otelkit's calls on it run with that
  instrumentation suppressed, which a channel without interceptors does not notice.
- The serialiser and parser a multicallable was made with (``_request_serializer``,
  ``_response_deserializer``), which otelkit's rebuilt ``ModelInfer`` reuses: else the stub's
  messages' own (``None`` here).
- ``_registered_method`` (a method the channel registers once, not per call), an argument of a
  channel's ``unary_unary``: else otelkit's ``ModelInfer`` is rebuilt unregistered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from otelkit._core.deps import degraded

__all__ = ["channel_target", "intercepted", "multicallable_codec", "unary_unary"]

_DISTRIBUTION = "grpcio"
_WRAPPER_INTERCEPTOR = "_interceptor"  # of grpc.intercept_channel's wrapper
_INTERCEPTOR_LISTS = (
    "_unary_unary_interceptors",
    "_unary_stream_interceptors",
    "_stream_unary_interceptors",
    "_stream_stream_interceptors",
)

_WRAPPERS = 16  # interceptors wrap a channel in one object each


def channel_target(channel: Any) -> str | None:
    """The target ``channel`` connects to (``dns:///host:port`` and the like), found under the
    wrappers interceptors put around it, or ``None`` when grpcio does not tell it."""
    for _ in range(_WRAPPERS):
        inner = getattr(channel, "_channel", None)
        if inner is None:
            break
        channel = inner
        target = getattr(channel, "target", None)
        if target is not None:
            target = target() if callable(target) else target
            return target.decode() if isinstance(target, bytes) else str(target)
    degraded(_DISTRIBUTION, f"{_name_of(type(channel))}.target", "names the server 'unknown'")
    return None


def _name_of(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def intercepted(channel: Any) -> bool:
    """Whether calls on ``channel`` (a sync or an asyncio gRPC channel) pass interceptors;
    ``True``, with one log line, when a channel of grpcio's does not tell."""
    if hasattr(channel, _WRAPPER_INTERCEPTOR):
        return True
    lists = [getattr(channel, name, None) for name in _INTERCEPTOR_LISTS]  # grpc.aio's channel
    if any(lists):
        return True
    kind = type(channel)
    if all(isinstance(found, list) for found in lists) or kind.__module__ == "grpc._channel":
        return False  # an asyncio channel without interceptors, or a sync one unwrapped
    degraded(
        _DISTRIBUTION,
        f"{_name_of(kind)}.{_WRAPPER_INTERCEPTOR} and .{_INTERCEPTOR_LISTS[0]}",
        "runs its calls on the channel with OpenTelemetry's instrumentation suppressed",
    )
    return True


def multicallable_codec(
    multicallable: Any,
) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]] | None:
    """The functions that ``multicallable`` serialises its requests and parses its responses
    with, or ``None``: an interceptor's multicallable hides them (quietly), and one of
    grpcio's own that does not tell is logged once."""
    serialize = getattr(multicallable, "_request_serializer", None)
    parse = getattr(multicallable, "_response_deserializer", None)
    if serialize is not None and parse is not None:
        return serialize, parse
    kind = type(multicallable)
    if kind.__module__ in ("grpc._channel", "grpc.aio._channel"):
        degraded(
            _DISTRIBUTION,
            f"{_name_of(kind)}._request_serializer and _response_deserializer",
            "serialises ModelInfer with the stub's message classes",
        )
    return None


def unary_unary(
    channel: Any,
    method: str,
    serialize: Callable[[Any], bytes],
    parse: Callable[[bytes], Any],
) -> Any:
    """``channel.unary_unary(method, serialize, parse)``, registered with the channel where
    grpcio takes ``_registered_method`` (its own stubs' way: the method is looked up once)."""
    try:
        return channel.unary_unary(method, serialize, parse, _registered_method=True)
    except TypeError:
        degraded(
            _DISTRIBUTION,
            f"{_name_of(type(channel))}.unary_unary(_registered_method=)",
            "makes its multicallables unregistered (a lookup per call)",
        )
    return channel.unary_unary(method, serialize, parse)
