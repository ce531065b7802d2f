"""The private attributes of ``tritonclient``'s clients that otelkit's client instrumentation
reads (``otelkit.client``).

Where a sampled call records when its request left and its response came back, otelkit hooks
the client's transport: the gRPC clients' stub (``_client_stub``) and channel (``_channel``),
the HTTP clients' ``_post``. A client whose release lacks one keeps its own transport: its
calls are answered and still traced and counted, without the phases of the call
(``triton.client.serialize_s``, ``wire_s``, ``deserialize_s``) and, over gRPC, with the
request's facts read from the caller's inputs. The server address falls back to what the
client was given. Each missing name is logged once.
"""

from __future__ import annotations

import importlib
from typing import Any

from otelkit._core.deps import degraded

__all__ = [
    "channel",
    "check_input_bytes",
    "connection_pool",
    "http_post",
    "missing_response_buffer",
    "server_url",
    "session",
    "stub",
]

_DISTRIBUTION = "tritonclient"
_UNHOOKED = "leaves the client's transport as it is: calls traced without their phases"


def _attribute(client: Any, name: str, instead: str) -> Any | None:
    found = getattr(client, name, None)
    if found is None:
        degraded(
            _DISTRIBUTION, f"{type(client).__module__}.{type(client).__name__}.{name}", instead
        )
    return found


def stub(client: Any) -> Any | None:
    """A gRPC client's ``GRPCInferenceServiceStub``, or ``None``."""
    return _attribute(client, "_client_stub", _UNHOOKED)


def channel(client: Any) -> Any | None:
    """A gRPC client's ``grpc.Channel``, or ``None``."""
    return _attribute(client, "_channel", _UNHOOKED)


def http_post(client: Any) -> Any | None:
    """An HTTP client's transport method (``_post``), or ``None``."""
    return _attribute(client, "_post", _UNHOOKED)


def connection_pool(client: Any) -> Any | None:
    """A sync HTTP client's connection pool (geventhttpclient's, ``_client_stub`` then
    ``_connection_pool``), whose ``_create_socket`` resolves and connects a new connection; or
    ``None``: a call that opens one then counts the set-up as network."""
    stub = getattr(client, "_client_stub", None)
    pool = getattr(stub, "_connection_pool", None)
    if pool is None or not callable(getattr(pool, "_create_socket", None)):
        degraded(
            "geventhttpclient",
            "HTTPClient._connection_pool._create_socket",
            "counts a new connection's set-up as network time",
        )
        return None
    return pool


def server_url(client: Any, name: str) -> Any | None:
    """The server address an HTTP client keeps (``name``: ``_parsed_url`` for the sync client,
    ``_url`` for the asyncio one), or ``None``: the spans then say ``unknown``."""
    return _attribute(client, name, "names the server 'unknown' in its spans")


def session(client: Any) -> Any | None:
    """An asyncio HTTP client's ``aiohttp.ClientSession`` (``_stub``), or ``None``."""
    return _attribute(
        client, "_stub", "assumes the client's aiohttp session is not traced by OpenTelemetry"
    )


_UNCOUNTED = "counts its request tensors' bytes as 0"
_checked_inputs: set[tuple[str, str]] = set()


def check_input_bytes(module_name: str, attribute: str) -> None:
    """Say once per tritonclient module when its ``InferInput`` no longer keeps the tensor's
    binary data in ``attribute`` (``_raw_content`` over gRPC, ``_raw_data`` over HTTP), where
    otelkit counts a request's bytes; a probe tensor of one float is filled to find out."""
    if (module_name, attribute) in _checked_inputs:
        return
    _checked_inputs.add((module_name, attribute))
    try:
        import numpy

        probe = importlib.import_module(module_name).InferInput("otelkit_probe", [1], "FP32")
        probe.set_data_from_numpy(numpy.zeros(1, dtype=numpy.float32))
    except Exception:  # a release whose InferInput otelkit cannot fill: nothing to conclude
        return
    if not getattr(probe, attribute, None):
        degraded(_DISTRIBUTION, f"{module_name}.InferInput.{attribute}", _UNCOUNTED)


def missing_response_buffer(result: Any) -> None:
    """An HTTP ``InferResult`` without ``_buffer`` (its binary outputs), where otelkit counts a
    response's bytes: said once, the bytes counted as 0."""
    kind = type(result)
    name = f"{kind.__module__}.{kind.__qualname__}._buffer"
    degraded(_DISTRIBUTION, name, "counts its responses' bytes as 0")
