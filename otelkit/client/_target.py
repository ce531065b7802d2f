"""Where an instrumented client calls, and what every call to one of its models shares.

A ``ClientTarget`` is made once per instrumented client (its server, protocol and RPC method,
and whether its calls send their trace context); a ``PerModel`` once per model (and version)
it calls: the metric series, span name and attributes of those calls, so that a call only
looks it up. ``Tensors`` says how one protocol's tritonclient objects hold tensor bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from otelkit import semconv
from otelkit._core.deps import tritonclient as triton_private
from otelkit._core.guard import internal_error
from otelkit._core.hotmetrics import HOT, CallSpecs

__all__ = [
    "GRPC_TENSORS",
    "HTTP_TENSORS",
    "TARGET",
    "ClientTarget",
    "PerModel",
    "Tensors",
    "output_count",
]

TARGET = "_otelkit_target"  # the instance attribute that holds a client's ClientTarget


class Tensors:
    """How one protocol's tritonclient objects hold tensor bytes.

    Requests are counted from the inputs the caller holds, as the call starts (the attribute
    ``input_attribute`` of each: the binary part only; tensors sent as JSON or through shared
    memory count zero: ``_call.MeteredCall``); responses from the result (``response``), off
    the caller's path.
    """

    __slots__ = ("_output_bytes", "input_attribute")

    def __init__(
        self, input_attribute: str, output_bytes: Callable[[Any], tuple[int, int | None]]
    ) -> None:
        self.input_attribute = input_attribute
        self._output_bytes = output_bytes

    def response(self, result: Any) -> tuple[int, int | None]:
        """The response's tensor bytes, and its number of outputs when counting them was free
        (``None``: ``output_count`` tells, for sampled calls only); zero bytes, counted as
        otelkit's own failure, when the result cannot tell."""
        try:
            return self._output_bytes(result)
        except Exception:
            internal_error("counting a response's tensor bytes")
            return 0, 0


_ITEM_BYTES = {
    "BOOL": 1,
    "INT8": 1,
    "UINT8": 1,
    "INT16": 2,
    "UINT16": 2,
    "FP16": 2,
    "BF16": 2,
    "INT32": 4,
    "UINT32": 4,
    "FP32": 4,
    "INT64": 8,
    "UINT64": 8,
    "FP64": 8,
}


def _grpc_output_bytes(result: Any) -> tuple[int, int | None]:
    """As ``_wire.wire_tensors`` would count them: the sizes of the outputs that came as raw
    bytes. From the outputs' shapes and types when every output came so (reading
    ``raw_output_contents`` copies each tensor out of the protobuf); from those contents when
    one has no fixed item size (BYTES) or came another way (shared memory)."""
    response = result.get_response()
    outputs = response.outputs
    contents = response.raw_output_contents
    if len(contents) == len(outputs):
        total = 0
        for output in outputs:
            size = _ITEM_BYTES.get(output.datatype)
            if size is None:
                break
            for dim in output.shape:
                size *= dim
            total += size
        else:
            return total, len(outputs)
    return sum(len(raw) for raw in contents), len(outputs)


_MISSING: Any = object()


def _http_output_bytes(result: Any) -> tuple[int, int | None]:
    buffer = getattr(result, "_buffer", _MISSING)
    if buffer is _MISSING:
        triton_private.missing_response_buffer(result)
        return 0, None
    return len(buffer or b""), None


GRPC_TENSORS = Tensors("_raw_content", _grpc_output_bytes)
HTTP_TENSORS = Tensors("_raw_data", _http_output_bytes)


def output_count(result: Any) -> int:
    """How many outputs a tritonclient result holds (HTTP: a JSON dict; gRPC: a protobuf)."""
    response = result.get_response()
    outputs = response.get("outputs") if isinstance(response, dict) else response.outputs
    return len(outputs) if outputs is not None else 0


class ClientTarget:
    """Everything per instrumented client: where it calls, whether its calls send their trace
    context (``send_context``: see ``otelkit.instrument``), and its ``PerModel`` records."""

    def __init__(
        self,
        protocol: str,
        url: str,
        system: str,
        method: str,
        tensors: Tensors,
        send_context: bool = True,
    ) -> None:
        host, _, port = (
            url.rpartition(":") if "://" not in url else url.split("://", 1)[1].rpartition(":")
        )
        self.server_address = host or url
        self.server_port = int(port) if port.isdigit() else None
        self.server = f"{self.server_address}:{port}" if port else self.server_address
        self.protocol = protocol
        self.system = system
        self.method = method
        self.tensors = tensors
        self.send_context = send_context
        # whether the client's transport hands a sampled gRPC call its request message
        self.handed_request = tensors is GRPC_TENSORS
        # (model, version), or the model's name alone for its default version: no tuple to
        # build and hash on every call to the usual kind of model
        self.by_model: dict[tuple[str, str] | str, PerModel] = {}
        self._other_methods: dict[str, ClientTarget] = {}

    def with_method(self, method: str) -> ClientTarget:
        """The same server and protocol under another RPC method (a stream's requests)."""
        found = self._other_methods.get(method)
        if found is None:
            found = ClientTarget(self.protocol, self.server, self.system, method, self.tensors)
            found.handed_request = self.handed_request
            self._other_methods[method] = found
        return found

    def per_model(self, model: str, version: str) -> PerModel:
        """What every call to one model shares: its metric series, span name and attributes."""
        key = (model, version) if version else model
        found = self.by_model.get(key)
        if found is None:
            found = self.by_model[key] = PerModel(self, model, version)
        return found


_LABELS = (semconv.M_MODEL, semconv.M_MODEL_VERSION, semconv.M_SERVER, semconv.M_PROTOCOL)
ERROR_LABELS = (*_LABELS, semconv.M_ERROR_TYPE)
_CALL_METRICS = CallSpecs(
    semconv.CLIENT_DURATION,
    semconv.CLIENT_IN_FLIGHT,
    semconv.CLIENT_REQUEST_BYTES,
    semconv.CLIENT_RESPONSE_BYTES,
)


class PerModel:
    """Built once per (client, model, version), so that a call only looks it up."""

    __slots__ = ("attributes", "calls", "labels", "span_name", "target", "tensors")

    def __init__(self, target: ClientTarget, model: str, version: str) -> None:
        self.target = target
        self.labels = (model, version, target.server, target.protocol)
        self.calls = HOT.calls(_CALL_METRICS, _LABELS, self.labels)
        self.tensors = target.tensors
        self.span_name = f"{target.method} {model}"
        self.attributes: dict[str, Any] = {
            semconv.RPC_SYSTEM_NAME: target.system,
            semconv.RPC_METHOD: target.method,
            semconv.SERVER_ADDRESS: target.server_address,
            semconv.MODEL_NAME: model,
            semconv.PROTOCOL: target.protocol,
        }
        if target.server_port is not None:
            self.attributes[semconv.SERVER_PORT] = target.server_port
        if version:
            self.attributes[semconv.MODEL_VERSION] = version
