"""``otelkit.instrument`` and ``otelkit.uninstrument``: one entry point for every integration."""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from opentelemetry import trace

from otelkit import telemetry

__all__ = ["instrument", "uninstrument"]

logger = logging.getLogger("otelkit")
T = TypeVar("T")


def _ensure_configured() -> None:
    """Configure otelkit from the environment unless some tracing set-up already exists."""
    if telemetry.current() is None and isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider
    ):
        logger.info("otelkit: instrument() before configure(): configuring from the environment")
        telemetry.configure()


def instrument(target: T | None = None) -> T | list[str]:
    """Instrument ``target`` in place and return it; with no argument, every supported class.

    Supported: ``tritonclient.http`` and ``tritonclient.grpc`` ``InferenceServerClient``.
    A second call changes nothing. If neither otelkit nor an OpenTelemetry SDK is set up yet,
    otelkit configures itself from the environment (embedded default: JSON-lines files).

    >>> client = otelkit.instrument(tritonclient.grpc.InferenceServerClient("gpu-node:8001"))
    """
    from otelkit import client

    client.require_tritonclient()
    _ensure_configured()
    if target is None:
        return client.instrument_classes()
    if client.is_triton_client(target):
        instrumented: T = client.instrument_client(target)
        return instrumented
    raise TypeError(
        f"otelkit.instrument: cannot instrument {type(target).__qualname__}; supported are "
        "tritonclient InferenceServerClient objects"
    )


def uninstrument(target: Any = None) -> Any:
    """Undo ``instrument``: for ``target``, or for every class when called without one."""
    from otelkit import client

    if target is None:
        client.uninstrument_classes()
        return None
    return client.uninstrument_client(target)
