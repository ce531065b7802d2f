"""The private parts of Ray that otelkit reaches: Serve's replica and batching classes, whose
methods ``otelkit.server.ray_serve`` wraps, and Ray's actor table, which ``otelkit study``
reads for the replicas' processes.

A Ray that moved one of them costs the hook or the figure that needs it, with one log line;
``import otelkit`` and the deployment's requests go on.
"""

from __future__ import annotations

import importlib
from typing import Any

from otelkit._core.deps import degraded

__all__ = ["actor_table", "serve_class"]

_DISTRIBUTION = "ray"


def serve_class(module: str, name: str) -> type | None:
    """``module.name`` (e.g. ``ray.serve._private.replica``, ``UserCallableWrapper``), or
    ``None`` with one log line: the hooks on it are skipped, its calls untraced."""
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError:
        found = None
    if not isinstance(found, type):
        degraded(_DISTRIBUTION, f"{module}.{name}", "leaves the calls it runs untraced")
        return None
    return found


def actor_table() -> dict[str, Any]:
    """Ray's actor table (``ray._private.state.actors()``), or ``{}`` with one log line: a
    study's figures then go without the replicas' CPU."""
    try:
        from ray._private import state

        actors: dict[str, Any] = state.actors()
    except (ImportError, AttributeError):
        degraded(
            _DISTRIBUTION,
            "ray._private.state.actors",
            "reads a deployment's demand from its stages alone (no replica CPU)",
        )
        return {}
    return actors
