"""The private attributes of ``grpcio``'s channels that otelkit's client instrumentation reads
(``otelkit.client``): the channel under each wrapper (``_channel``) and the target it connects
to, the server address of a gRPC client's spans.

grpcio's asyncio channel tells its target only from 1.82 on (``AioChannel.target``); with an
earlier grpcio, or a release that renames either name, the spans of that client name the
server ``unknown`` and the missing name is logged once. Its calls are traced as before.
"""

from __future__ import annotations

from typing import Any

from otelkit._core.deps import degraded

__all__ = ["channel_target"]

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
    kind = type(channel)
    degraded(
        "grpcio", f"{kind.__module__}.{kind.__qualname__}.target", "names the server 'unknown'"
    )
    return None
