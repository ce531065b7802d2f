"""Server side: pipeline stages, and the request context in Triton, PyTriton, FastAPI and
Python gRPC servers.

``otelkit.stage`` is the public entry point; the integrations live in their own modules
(``otelkit.server.triton_backend``, ``otelkit.server.pytriton``, ``otelkit.server.fastapi``,
``otelkit.server.grpc``) so that none of their dependencies is imported unless used.
"""

from __future__ import annotations

from otelkit.server._stage import Stage, StageRun, stage

__all__ = ["Stage", "StageRun", "stage"]
