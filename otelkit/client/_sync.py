"""Wrappers for the synchronous tritonclient clients: HTTP and gRPC, ``infer`` and ``async_infer``.

The wrappers take the user's arguments as they are and add only the trace headers, to a copy
of the caller's headers (tritonclient itself writes into the dict it is given). The transport
call (HTTP ``_post``, gRPC ``ModelInfer``) is wrapped per client to stamp when the request
left and the response came back, and how many tensor bytes each carried.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from otelkit.client._call import CURRENT_CALL, Call, ClientTarget, internal_error

__all__ = [
    "attach_grpc_transport",
    "attach_http_transport",
    "traced_grpc_async_infer",
    "traced_http_async_infer",
    "traced_infer",
]


def _headers_index(method: Callable[..., Any]) -> int:
    """Position of ``headers`` among the positional arguments after ``self``."""
    names = list(inspect.signature(method).parameters)
    return names.index("headers") - 1


def _call_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any, str, Any, str]:
    """model_name, inputs, model_version, outputs, request_id from infer's arguments."""
    model = args[0] if args else kwargs["model_name"]
    inputs = args[1] if len(args) > 1 else kwargs.get("inputs", ())
    version = args[2] if len(args) > 2 else kwargs.get("model_version", "")
    outputs = args[3] if len(args) > 3 else kwargs.get("outputs")
    request_id = args[4] if len(args) > 4 else kwargs.get("request_id", "")
    return model, inputs, version or "", outputs, request_id or ""


def _begin(
    target_of: Callable[[Any], ClientTarget],
    client: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    style: str,
) -> Call | None:
    try:
        model, inputs, version, outputs, request_id = _call_args(args, kwargs)
        return target_of(client).begin(model, version, request_id, inputs, outputs, style)
    except Exception:
        internal_error(f"reading {style} arguments")
        return None


def _with_headers(
    call: Call | None, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if call is None:
        return args, kwargs
    if len(args) > index:
        return (*args[:index], call.headers(args[index]), *args[index + 1 :]), kwargs
    kwargs["headers"] = call.headers(kwargs.get("headers"))
    return args, kwargs


def _outputs(result: Any) -> int:
    response = result.get_response()
    outputs = response.get("outputs") if isinstance(response, dict) else response.outputs
    return len(outputs) if outputs is not None else -1


def traced_infer(target_of: Callable[[Any], ClientTarget], original: Callable[..., Any]) -> Any:
    """``infer``: one CLIENT span from the call to its result."""
    index = _headers_index(original)

    @functools.wraps(original)
    def infer(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = _begin(target_of, self, args, kwargs, "infer")
        if call is None:
            return original(self, *args, **kwargs)
        args, kwargs = _with_headers(call, index, args, kwargs)
        token = CURRENT_CALL.set(call)
        try:
            result = original(self, *args, **kwargs)
        except BaseException as error:
            call.finish(error)
            raise
        finally:
            CURRENT_CALL.reset(token)
        call.finish(None, _outputs(result))
        return result

    return infer


Measure = Callable[[Call, tuple[Any, ...], dict[str, Any]], None]


def _stamped(
    original: Callable[..., Any], request: Measure, response: Callable[[Call, Any], None]
) -> Any:
    """A transport call that stamps send and receive times and tensor bytes on the ``Call``."""

    @functools.wraps(original)
    def transport(*args: Any, **kwargs: Any) -> Any:
        call = CURRENT_CALL.get()
        if call is None:
            return original(*args, **kwargs)
        call.sent()
        result = original(*args, **kwargs)
        call.received()
        try:
            request(call, args, kwargs)
            response(call, result)
        except Exception:
            internal_error("measuring tensor bytes")
        return result

    return transport


def _grpc_request_bytes(call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    request = kwargs["request"] if "request" in kwargs else args[0]
    call.request_bytes = sum(map(len, request.raw_input_contents))


def _grpc_response_bytes(call: Call, response: Any) -> None:
    call.response_bytes = sum(map(len, response.raw_output_contents))


def _http_request_bytes(call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    body = kwargs.get("request_body", args[1] if len(args) > 1 else b"")
    headers = kwargs.get("headers", args[2] if len(args) > 2 else None) or {}
    json_size = headers.get("Inference-Header-Content-Length")
    call.request_bytes = len(body) - int(json_size) if json_size is not None else 0


def _http_response_bytes(call: Call, response: Any) -> None:
    json_size = response.get("Inference-Header-Content-Length")
    length = response.get("Content-Length")
    if json_size is not None and length is not None:
        call.response_bytes = int(length) - int(json_size)


def attach_grpc_transport(client: Any) -> None:
    stub = client._client_stub
    stub.ModelInfer = _StampedUnary(stub.ModelInfer)


def attach_http_transport(client: Any) -> None:
    client._post = _stamped(client._post, _http_request_bytes, _http_response_bytes)


class _StampedUnary:
    """gRPC's ``ModelInfer`` multi-callable, stamped; ``future`` passes through for async_infer."""

    def __init__(self, callable_: Any) -> None:
        self.original = callable_
        self._call = _stamped(callable_, _grpc_request_bytes, _grpc_response_bytes)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    def future(self, *args: Any, **kwargs: Any) -> Any:
        call = CURRENT_CALL.get()
        if call is not None:
            call.sent()
            try:
                _grpc_request_bytes(call, args, kwargs)
            except Exception:
                internal_error("measuring tensor bytes")
        return self.original.future(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)


def traced_grpc_async_infer(
    target_of: Callable[[Any], ClientTarget], original: Callable[..., Any]
) -> Any:
    """gRPC ``async_infer``: the span ends when the callback gets the result or the error."""
    index = _headers_index(original)

    @functools.wraps(original)
    def async_infer(
        self: Any, model_name: str, inputs: Any, callback: Any, *args: Any, **kwargs: Any
    ) -> Any:
        call = _begin(target_of, self, (model_name, inputs, *args), kwargs, "async_infer")
        if call is None:
            return original(self, model_name, inputs, callback, *args, **kwargs)
        args, kwargs = _with_headers(call, index - 3, args, kwargs)
        traced_call = call

        def done(result: Any, error: Any) -> None:
            traced_call.received()
            try:
                if result is not None:
                    outputs = result.get_response().raw_output_contents
                    traced_call.response_bytes = sum(map(len, outputs))
            except Exception:
                internal_error("measuring tensor bytes")
            traced_call.finish(error, _outputs(result) if result is not None else -1)
            callback(result=result, error=error)

        token = CURRENT_CALL.set(call)
        try:
            return original(self, model_name, inputs, done, *args, **kwargs)
        except BaseException as error:
            call.finish(error)
            raise
        finally:
            CURRENT_CALL.reset(token)

    return async_infer


class TracedAsyncRequest:
    """HTTP ``async_infer``'s handle: the span ends when ``get_result`` returns or raises."""

    def __init__(self, inner: Any, call: Call) -> None:
        self._inner = inner
        self._call: Call | None = call

    def get_result(self, block: bool = True, timeout: float | None = None) -> Any:
        call = self._call
        try:
            result = self._inner.get_result(block=block, timeout=timeout)
        except BaseException as error:
            if call is not None:
                self._call = None
                call.finish(error)
            raise
        if call is not None:
            self._call = None
            call.finish(None, _outputs(result))
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def traced_http_async_infer(
    target_of: Callable[[Any], ClientTarget], original: Callable[..., Any]
) -> Any:
    index = _headers_index(original)

    @functools.wraps(original)
    def async_infer(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = _begin(target_of, self, args, kwargs, "async_infer")
        if call is None:
            return original(self, *args, **kwargs)
        args, kwargs = _with_headers(call, index, args, kwargs)
        try:
            handle = original(self, *args, **kwargs)
        except BaseException as error:
            call.finish(error)
            raise
        return TracedAsyncRequest(handle, call)

    return async_infer
