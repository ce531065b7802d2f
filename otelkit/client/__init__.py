"""tritonclient instrumentation: one instance, or every client class at once.

``otelkit.instrument(client)`` and ``otelkit.uninstrument(client)`` land here for tritonclient
objects. A client kind is a row of ``_KINDS``: its module, how to find the server it calls,
which methods to wrap and how to stamp its transport.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from otelkit import semconv
from otelkit._core.deps import grpcio as grpc_private
from otelkit._core.deps import tritonclient as triton_private
from otelkit._core.extras import require
from otelkit._core.worker import LATER
from otelkit.client import _aio, _stream, _sync, _transport
from otelkit.client._interceptors import infer_suppressed, session_traced
from otelkit.client._target import GRPC_TENSORS, HTTP_TENSORS, TARGET, ClientTarget, Tensors

__all__ = [
    "instrument_classes",
    "instrument_client",
    "is_triton_client",
    "uninstrument_classes",
    "uninstrument_client",
]

logger = logging.getLogger("otelkit")
_WRAPPED = "_otelkit_wrapped"
_lock = threading.Lock()


def _strip_target(target: str) -> str:
    for prefix in ("dns:///", "dns:", "ipv4:", "ipv6:", "unix:", "http://", "https://"):
        target = target.removeprefix(prefix)
    return target


def _grpc_url(client: Any) -> str:
    channel = triton_private.channel(client)
    target = None if channel is None else grpc_private.channel_target(channel)
    return "unknown" if target is None else _strip_target(target)


def _http_url(client: Any) -> str:
    parsed = triton_private.server_url(client, "_parsed_url")
    return "unknown" if parsed is None else f"{parsed.host}:{parsed.port}"


def _aio_http_url(client: Any) -> str:
    url = triton_private.server_url(client, "_url")
    return "unknown" if url is None else _strip_target(str(url))


def _attach_grpc_transport(client: Any) -> bool:
    hooked = _transport.attach_model_infer(client)
    return _stream.attach_stream_transport(client) and hooked


def _detach_grpc_transport(client: Any) -> None:
    _transport.detach_model_infer(client)
    _stream.detach_stream_transport(client)


def _attach_aio_http_transport(client: Any) -> bool:
    stamp = _transport.stamp_async
    # traced by OpenTelemetry's aiohttp instrumentation, most likely
    if session_traced(triton_private.session(client)):
        return _transport.attach_http_transport(client, lambda post: infer_suppressed(stamp(post)))
    return _transport.attach_http_transport(client, stamp)


@dataclass(frozen=True)
class _Kind:
    module: str
    protocol: str
    system: str
    method: str
    url: Callable[[Any], str]
    tensors: Tensors
    wrappers: dict[str, Callable[[Callable[[Any], ClientTarget], Callable[..., Any]], Any]]
    attach_transport: Callable[[Any], bool]  # False: the client's transport is not hooked
    detach_transport: Callable[[Any], None]


_GRPC, _HTTP = semconv.RPC_SYSTEM_TRITON_GRPC, semconv.RPC_SYSTEM_TRITON_HTTP
_GRPC_INFER, _HTTP_INFER = semconv.RPC_METHOD_GRPC_INFER, semconv.RPC_METHOD_HTTP_INFER
_KINDS: dict[str, _Kind] = {
    "tritonclient.http": _Kind(
        "tritonclient.http",
        "http",
        _HTTP,
        _HTTP_INFER,
        _http_url,
        HTTP_TENSORS,
        {"infer": _sync.traced_infer, "async_infer": _sync.traced_http_async_infer},
        _transport.attach_http_transport,
        _transport.detach_http_transport,
    ),
    "tritonclient.grpc": _Kind(
        "tritonclient.grpc",
        "grpc",
        _GRPC,
        _GRPC_INFER,
        _grpc_url,
        GRPC_TENSORS,
        {
            "infer": _sync.traced_infer,
            "async_infer": _sync.traced_grpc_async_infer,
            "start_stream": _stream.traced_start_stream,
            "async_stream_infer": _stream.traced_async_stream_infer,
            "stop_stream": _stream.traced_stop_stream,
        },
        _attach_grpc_transport,
        _detach_grpc_transport,
    ),
    "tritonclient.http.aio": _Kind(
        "tritonclient.http.aio",
        "http",
        _HTTP,
        _HTTP_INFER,
        _aio_http_url,
        HTTP_TENSORS,
        {"infer": _aio.traced_aio_infer},
        _attach_aio_http_transport,
        _transport.detach_http_transport,
    ),
    "tritonclient.grpc.aio": _Kind(
        "tritonclient.grpc.aio",
        "grpc",
        _GRPC,
        _GRPC_INFER,
        _grpc_url,
        GRPC_TENSORS,
        {"infer": _aio.traced_aio_infer, "stream_infer": _stream.traced_aio_stream_infer},
        _attach_grpc_transport,
        _detach_grpc_transport,
    ),
}


def _kind_of(obj: Any) -> _Kind | None:
    for kind in _KINDS.values():
        module = importlib.import_module(kind.module) if _imported(kind.module) else None
        if module is not None and isinstance(obj, module.InferenceServerClient):
            return kind
    return None


def _imported(module: str) -> bool:
    import sys

    return module in sys.modules


def is_triton_client(obj: Any) -> bool:
    """Whether ``obj`` is a tritonclient client otelkit knows how to instrument."""
    return _kind_of(obj) is not None


def _target(kind: _Kind, client: Any) -> ClientTarget:
    """The client's target, created (and its transport stamped) on first use."""
    target: ClientTarget | None = client.__dict__.get(TARGET)
    if target is None:
        with _lock:
            target = client.__dict__.get(TARGET)
            if target is None:
                target = ClientTarget(
                    kind.protocol, kind.url(client), kind.system, kind.method, kind.tensors
                )
                # a gRPC call's request message comes from the hooked transport, else from
                # the caller's inputs
                target.handed_request = kind.attach_transport(client) and kind.protocol == "grpc"
                triton_private.check_input_bytes(kind.module, kind.tensors.input_attribute)
                client.__dict__[TARGET] = target
    return target


def instrument_client(client: Any, send_context: bool = True) -> Any:
    """Instrument one tritonclient client in place and return it; a second call changes
    nothing but ``send_context`` (whether its sampled calls send their trace context to the
    server), which holds from the client's next call."""
    kind = _kind_of(client)
    if kind is None:
        raise TypeError(f"otelkit: cannot instrument {type(client).__qualname__}")
    if client.__dict__.get(_WRAPPED):
        _target(kind, client).send_context = send_context
        return client
    LATER.start()  # calls end on the worker
    _target(kind, client).send_context = send_context
    cls = type(client)
    for name, wrap in kind.wrappers.items():
        method = getattr(cls, name)
        if getattr(method, _WRAPPED, False):
            continue  # the class is instrumented already: its methods trace every instance
        wrapped = wrap(functools.partial(_target, kind), method)
        client.__dict__[name] = wrapped.__get__(client, cls)
    client.__dict__[_WRAPPED] = True
    return client


def uninstrument_client(client: Any) -> Any:
    """Undo ``instrument_client``: the client calls its own methods again."""
    kind = _kind_of(client)
    if kind is None or not client.__dict__.pop(_WRAPPED, False):
        return client
    for name in kind.wrappers:
        client.__dict__.pop(name, None)
    with _lock:
        if client.__dict__.pop(TARGET, None) is not None:
            kind.detach_transport(client)
    return client


def instrument_classes() -> list[str]:
    """Instrument every tritonclient client class that is installed; returns their modules."""
    done = []
    LATER.start()
    for kind in _KINDS.values():
        try:
            module = importlib.import_module(kind.module)
        except ImportError:
            continue
        cls = module.InferenceServerClient
        for name, wrap in kind.wrappers.items():
            method = cls.__dict__[name]
            if getattr(method, _WRAPPED, False):
                continue
            wrapped = wrap(functools.partial(_target, kind), method)
            setattr(wrapped, _WRAPPED, method)
            setattr(cls, name, wrapped)
        done.append(kind.module)
    return done


def uninstrument_classes() -> None:
    """Restore every client class's own methods."""
    for kind in _KINDS.values():
        if not _imported(kind.module):
            continue
        cls = importlib.import_module(kind.module).InferenceServerClient
        for name in kind.wrappers:
            original = getattr(cls.__dict__.get(name), _WRAPPED, None)
            if original is not None:
                setattr(cls, name, original)


def require_tritonclient() -> None:
    require("tritonclient", extra="triton", feature="instrumenting tritonclient")
