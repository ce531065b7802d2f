"""The private parts of other packages that otelkit reaches, one module per package.

otelkit reads a few names that its dependencies do not promise to keep (OpenTelemetry's
runtime context, tritonclient's stubs, Ray Serve's internals): each is reached here, guarded,
and nowhere else. When a release renames one, otelkit does the slower or plainer thing its
module names and says so once (``degraded``): a log line naming the package, its version,
the missing name and what otelkit does instead; ``import otelkit`` and the user's calls go
on. The versions these were tested at are bounded in ``pyproject.toml``
(docs/deployment.md, "Supported versions").
"""

from __future__ import annotations

import logging
import threading

__all__ = ["DEGRADED", "degraded", "version_of"]

logger = logging.getLogger("otelkit")

#: (distribution, missing name) -> what otelkit does instead, for each degradation seen.
DEGRADED: dict[tuple[str, str], str] = {}
_lock = threading.Lock()


def version_of(distribution: str) -> str:
    """The installed version of ``distribution``, or ``"(not installed)"``."""
    from importlib import metadata  # it imports email: not for every ``import otelkit``

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def degraded(distribution: str, name: str, instead: str) -> None:
    """Say once (per distribution and name) that ``distribution`` lacks ``name`` and that
    otelkit does ``instead``.

    >>> degraded("example-dist", "_gone", "reads the public API")
    >>> DEGRADED[("example-dist", "_gone")]
    'reads the public API'
    """
    with _lock:
        if (distribution, name) in DEGRADED:
            return
        DEGRADED[(distribution, name)] = instead
    logger.warning(
        "otelkit: %s %s has no %s; otelkit %s",
        distribution,
        version_of(distribution),
        name,
        instead,
    )
