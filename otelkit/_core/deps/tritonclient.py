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

from typing import Any

from otelkit._core.deps import degraded

__all__ = ["channel", "http_post", "server_url", "session", "stub"]

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


def server_url(client: Any, name: str) -> Any | None:
    """The server address an HTTP client keeps (``name``: ``_parsed_url`` for the sync client,
    ``_url`` for the asyncio one), or ``None``: the spans then say ``unknown``."""
    return _attribute(client, name, "names the server 'unknown' in its spans")


def session(client: Any) -> Any | None:
    """An asyncio HTTP client's ``aiohttp.ClientSession`` (``_stub``), or ``None``."""
    return _attribute(
        client, "_stub", "assumes the client's aiohttp session is not traced by OpenTelemetry"
    )
