"""The private parts of ``opentelemetry-exporter-otlp-proto-grpc`` that otelkit's OTLP/gRPC
span exporter (``otelkit.export``) builds on.

otelkit's exporter subclasses the SDK's and overrides two of its private methods: the one that
makes the gRPC channel and stub (``_initialize_channel_and_stub``, at start and on each
reconnection), after which otelkit wraps the stub (``_client``) so that a server's refusal of a
message too large tells otelkit the server's limit; and the one that builds the request
(``_translate_data``), which otelkit's encoder replaces. A release that renames one goes on
exporting through the SDK's own: the stub unwrapped (otelkit still sends no message over gRPC's
default limit, but learns no smaller one) or the SDK's encoder (slower, the same request), and
says so in one log line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from otelkit._core.deps import degraded

__all__ = ["check_overrides", "endpoint", "wrap_stub"]

_DISTRIBUTION = "opentelemetry-exporter-otlp-proto-grpc"
_UNWRAPPED = "sends through the SDK's stub: a server's smaller size limit is not learned"


def check_overrides(base: type, stub_made: bool) -> None:
    """Say once what of otelkit's overrides a ``base`` exporter's ``__init__`` (just run) did
    not reach: ``stub_made``, whether it made its stub through ``_initialize_channel_and_stub``;
    and whether it builds its requests in ``_translate_data``."""
    name = f"{base.__module__}.{base.__qualname__}"
    if not stub_made:
        degraded(_DISTRIBUTION, f"{name}._initialize_channel_and_stub", _UNWRAPPED)
    if not callable(getattr(base, "_translate_data", None)):
        degraded(
            _DISTRIBUTION,
            f"{name}._translate_data",
            "encodes spans with the SDK's encoder (slower; the same request)",
        )


def wrap_stub(exporter: Any, wrap: Callable[[Any], Any]) -> None:
    """Replace the stub the SDK's exporter just made (``_client``) by ``wrap(stub)``; nothing,
    with one log line, where the exporter keeps it elsewhere."""
    stub = getattr(exporter, "_client", None)
    if stub is None:
        degraded(_DISTRIBUTION, "OTLPSpanExporter._client", _UNWRAPPED)
        return
    exporter._client = wrap(stub)


def endpoint(exporter: Any) -> str:
    """The address the exporter sends to (``_endpoint``), as its log lines name it."""
    found = getattr(exporter, "_endpoint", None)
    return str(found) if found is not None else "the OTLP gRPC endpoint"
