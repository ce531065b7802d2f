"""``otelkit.instrument`` and ``otelkit.uninstrument``: one entry point for every integration."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

from opentelemetry import trace

from otelkit import telemetry

if TYPE_CHECKING:
    from starlette.applications import Starlette

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


def _is_starlette_app(target: object) -> bool:
    """Whether ``target`` is a FastAPI or Starlette app, without importing either: an app
    exists only once its module has been imported."""
    applications = sys.modules.get("starlette.applications")
    return applications is not None and isinstance(target, applications.Starlette)


def _is_ray_deployment(target: object) -> bool:
    """Whether ``target`` is a Ray Serve deployment, without importing Ray."""
    deployment = sys.modules.get("ray.serve.deployment")
    return deployment is not None and isinstance(target, deployment.Deployment)


@overload
def instrument(target: None = None, *, send_context: bool = True) -> list[str]: ...
@overload
def instrument(target: T, *, send_context: bool = True) -> T: ...
def instrument(target: T | None = None, *, send_context: bool = True) -> T | list[str]:
    """Instrument ``target`` in place and return it; with no argument, every supported class.

    Supported: ``tritonclient.http`` and ``tritonclient.grpc`` ``InferenceServerClient`` (a
    CLIENT span per call, trace context sent to the server), and FastAPI or any Starlette app
    (a SERVER span per HTTP request, parented on its ``traceparent``, with ``otelkit.stage``
    spans of the handlers under it), and Ray Serve class deployments (a new deployment whose
    replicas set otelkit up and trace HTTP requests, handle calls and batches: see
    ``otelkit.server.ray_serve``; instrument each deployment of an application).
    Without an argument: every tritonclient client class.
    A second call changes nothing (but ``send_context``). If neither otelkit nor an
    OpenTelemetry SDK is set up yet, otelkit configures itself from the environment (embedded
    default: JSON-lines files).

    ``send_context=False`` (one tritonclient client): its calls keep their spans and metrics
    but send the server no trace context, only the caller's own headers: for a server whose
    spans must stay out of your traces (Triton traces every request that carries a context,
    and its 2.51 release may crash under that much tracing), or to see what the context costs
    on the wire. Calling ``instrument`` again with another value changes it from the client's
    next call.

    >>> client = otelkit.instrument(tritonclient.grpc.InferenceServerClient("gpu-node:8001"))
    >>> app = otelkit.instrument(fastapi.FastAPI())
    >>> ingress = otelkit.instrument(Ingress)  # a Ray Serve deployment: keep the returned one
    >>> quiet = otelkit.instrument(tritonclient.http.InferenceServerClient("cpu-node:8000"),
    ...                            send_context=False)
    """
    if not send_context and (
        target is None or _is_starlette_app(target) or _is_ray_deployment(target)
    ):
        raise TypeError(
            "otelkit.instrument: send_context=False applies to one tritonclient client: "
            "otelkit.instrument(client, send_context=False)"
        )
    if _is_starlette_app(target):
        from otelkit.server import fastapi

        _ensure_configured()
        fastapi.instrument_app(cast("Starlette", target))
        return cast(T, target)
    if _is_ray_deployment(target):
        from otelkit.server import ray_serve

        return cast(T, ray_serve.instrument_deployment(target))
    from otelkit import client

    client.require_tritonclient()
    _ensure_configured()
    if target is None:
        return client.instrument_classes()
    if client.is_triton_client(target):
        instrumented: T = client.instrument_client(target, send_context)
        return instrumented
    raise TypeError(
        f"otelkit.instrument: cannot instrument {type(target).__qualname__}; supported are "
        "tritonclient InferenceServerClient objects, FastAPI or Starlette apps and Ray Serve "
        "class deployments"
    )


def uninstrument(target: Any = None) -> Any:
    """Undo ``instrument``: for ``target``, or for every class when called without one."""
    if _is_starlette_app(target):
        from otelkit.server import fastapi

        return fastapi.uninstrument_app(cast("Starlette", target))
    if _is_ray_deployment(target):
        from otelkit.server import ray_serve

        return ray_serve.uninstrument_deployment(target)
    from otelkit import client

    if target is None:
        client.uninstrument_classes()
        return None
    return client.uninstrument_client(target)
