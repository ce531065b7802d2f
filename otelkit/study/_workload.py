"""What one request of a study does: call a model with tritonclient, or run a user's function.

``ModelCalls`` calls one model of a KServe v2 server over HTTP or gRPC with a pool of inputs
made before the load starts (from the model's metadata, or from the user's ``inputs(index,
batch_size)``), so the load measures inference, not input making. tritonclient's HTTP client
is not thread-safe: each thread gets its own; gRPC threads share one channel. With tracing on,
the clients are instrumented by otelkit (a CLIENT span and a ``traceparent`` per sampled call).

``FunctionCalls`` wraps a user's request factory, ``factory(params, endpoint)`` returning
``request(index)``: the reference deployment's ``reconstruct`` of one event under a service
option, say. Whatever it calls, its spans join the request's root span.

>>> calls = ModelCalls("identity_fp32", protocol="http", batch_size=4)
>>> calls.axes
('batch_size',)

**What a model call sends**: tensors from a user's function, or made from the model's metadata.
Made tensors follow the model's metadata: each input's datatype and shape, with the batch
dimension (when the model's ``max_batch_size`` is above 0) set to the point's batch size and
every other variable dimension (``-1``) to ``free_dim``. Values are seeded random numbers: a
model that branches on its input sees the same inputs from one run to the next.

>>> metadata = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}]}
>>> arrays = inputs_from_metadata(metadata, max_batch_size=8, batch_size=4, free_dim=16)
>>> arrays["INPUT0"].shape, arrays["INPUT0"].dtype
((4, 16), dtype('float32'))
>>> batch_problem(max_batch_size=8, batch_size=64)
'the model takes batches of at most 8 (its max_batch_size), not 64'
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from otelkit._core.extras import require
from otelkit._errors import StudyError
from otelkit.client import instrument_client
from otelkit.study._servers import Endpoint, WireProtocol

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = [
    "FunctionCalls",
    "ModelCalls",
    "Workload",
    "batch_problem",
    "inputs_from_metadata",
    "to_infer_inputs",
]


Inputs = Callable[[int, int], Mapping[str, Any]]
RequestFactory = Callable[[Mapping[str, Any], Endpoint], Callable[[int], Any]]


class Workload:
    """One request of a study: ``open`` before a point's load, ``__call__`` per request,
    ``close`` after. ``axes`` are the sweep parameters it takes (``None``: any)."""

    axes: tuple[str, ...] | None = ()
    model: str | None = None
    protocol: WireProtocol | None = None  # what the results file records: http, grpc, or None
    batch_size: int = 1  # inferences a request, unless the point's batch_size says otherwise

    def in_flight(self, concurrency: int) -> None:
        """The point's asyncio requests in flight, before its load (a client sizes its pool)."""

    def payload_bytes(self) -> tuple[int, int] | None:
        """(request, response) bytes of tensor data per request, once known; ``None`` where
        the workload cannot tell (the capacity model's network demand)."""
        return None

    def open(
        self, params: Mapping[str, Any], endpoint: Endpoint, *, traced: bool, ready_s: float
    ) -> None:
        raise NotImplementedError

    def __call__(self, index: int) -> None:
        raise NotImplementedError

    async def acall(self, index: int) -> None:
        """Request ``index`` as an asyncio coroutine, for ``Load(asyncio=True)``."""
        raise StudyError(f"{type(self).__name__} has no asyncio form: use threads")

    async def aclose(self) -> None:
        """Release what ``acall`` made on the event loop (closed before the loop is)."""

    def close(self) -> None:
        """Release what ``open`` made."""


class ModelCalls(Workload):
    """Calls ``model`` with ``pool`` distinct inputs, ``batch_size`` a request (or the point's).

    ``timeout_s`` bounds each call; ``free_dim`` sets the variable dimensions of made inputs.
    """

    axes = ("batch_size",)

    def __init__(
        self,
        model: str,
        *,
        protocol: WireProtocol = "http",
        inputs: Inputs | None = None,
        batch_size: int = 1,
        pool: int = 16,
        free_dim: int = 16,
        timeout_s: float = 60.0,
    ) -> None:
        if protocol not in ("http", "grpc"):
            raise StudyError(f"protocol is http or grpc, not {protocol!r}")
        self.model, self.protocol, self._inputs = model, protocol, inputs
        self.batch_size, self.pool, self.free_dim = batch_size, pool, free_dim
        self.timeout_s = timeout_s
        self._module: Any = None
        self._url = ""
        self._traced = False
        self._local = threading.local()
        self._clients: list[Any] = []
        self._hubs: list[tuple[threading.Thread, Any]] = []  # gevent's, of the request threads
        self._lock = threading.Lock()
        self._requests: Sequence[Sequence[Any]] = ()
        self._request_bytes = 0
        self._response_bytes: int | None = None
        self._call_options: dict[str, Any] = {}
        self._aclient: Any = None
        self.connections = 100  # the asyncio HTTP client's; the study sets the point's

    def open(
        self, params: Mapping[str, Any], endpoint: Endpoint, *, traced: bool, ready_s: float
    ) -> None:
        self.close()
        name = "tritonclient.http" if self.protocol == "http" else "tritonclient.grpc"
        self._module = require(name, extra="triton", feature="otelkit study")
        self._url, self._traced = endpoint.url(self.protocol or "http"), traced
        self._call_options = {"client_timeout": self.timeout_s} if self.protocol == "grpc" else {}
        client = self._client()
        self._wait_ready(client, ready_s)
        batch_size = int(params.get("batch_size", self.batch_size))
        max_batch_size = self._max_batch_size(client)
        problem = batch_problem(max_batch_size, batch_size)
        if problem:
            raise StudyError(f"model {self.model!r}: {problem}")
        if self._inputs is not None:
            arrays = [self._inputs(index, batch_size) for index in range(self.pool)]
        else:
            metadata = self._json(client.get_model_metadata(self.model, **self._as_json()))
            try:
                arrays = [
                    inputs_from_metadata(
                        metadata,
                        max_batch_size=max_batch_size,
                        batch_size=batch_size,
                        free_dim=self.free_dim,
                        seed=index,
                    )
                    for index in range(self.pool)
                ]
            except ValueError as error:
                raise StudyError(f"model {self.model!r}: {error}") from error
        self._requests = [to_infer_inputs(self._module, a) for a in arrays]
        sizes = [sum(int(v.nbytes) for v in a.values()) for a in arrays]
        self._request_bytes = sum(sizes) // max(1, len(sizes))
        self._response_bytes = None

    def in_flight(self, concurrency: int) -> None:
        self.connections = concurrency

    def _max_batch_size(self, client: Any) -> int | None:
        """Triton's ``max_batch_size``; ``None`` from a server without the configuration API."""
        try:
            config = self._json(client.get_model_config(self.model, **self._as_json()))
        except Exception:
            return None
        config = config.get("config", config)
        return int(config.get("max_batch_size", 0))

    def _as_json(self) -> dict[str, bool]:
        return {"as_json": True} if self.protocol == "grpc" else {}

    @staticmethod
    def _json(value: Any) -> dict[str, Any]:
        return value if isinstance(value, dict) else {}

    def _wait_ready(self, client: Any, ready_s: float) -> None:
        deadline = time.monotonic() + ready_s
        while True:
            try:
                live = bool(client.is_server_live())
                problem = None if live else "says it is not live"
            except Exception as error:
                problem = f"does not answer ({type(error).__name__}: {error})"
            if problem is None:
                try:
                    if client.is_model_ready(self.model):
                        return
                except Exception:
                    pass
                problem = f"has no model {self.model!r} ready{self._models_known(client)}"
            if time.monotonic() >= deadline:
                raise StudyError(f"the server at {self._url} ({self.protocol}) {problem}")
            time.sleep(0.2)

    def _models_known(self, client: Any) -> str:
        try:
            index = client.get_model_repository_index(**self._as_json())
        except Exception:
            return ""
        models = index.get("models", []) if isinstance(index, dict) else index
        names = sorted({str(m.get("name")) for m in models if isinstance(m, dict)})
        return f" (its models: {', '.join(names)})" if names else ""

    def _client(self) -> Any:
        client = getattr(self._local, "client", None)
        if client is not None:
            return client
        if self.protocol == "grpc" and self._clients:
            client = self._clients[0]  # gRPC threads share one channel
        else:
            if self.protocol == "http":
                client = self._module.InferenceServerClient(
                    self._url, connection_timeout=self.timeout_s, network_timeout=self.timeout_s
                )
            else:
                client = self._module.InferenceServerClient(self._url)
            if self._traced:
                client = instrument_client(client)
            hub = self._hub() if self.protocol == "http" else None
            with self._lock:
                self._clients.append(client)
                if hub is not None:
                    self._hubs.append((threading.current_thread(), hub))
        self._local.client = client
        return client

    @staticmethod
    def _hub() -> Any:
        """This thread's gevent hub, which tritonclient.http's calls run on: its event loop
        holds two file descriptors until the hub is destroyed, which no thread's end does (at
        1,000 threads, 2,000 a point, until the study ran out of them)."""
        gevent: Any = require("gevent", extra="triton", feature="otelkit study")
        return gevent.get_hub()

    def __call__(self, index: int) -> None:
        inputs = self._requests[index % len(self._requests)]
        result = self._client().infer(self.model, inputs, **self._call_options)
        if self._response_bytes is None:
            self._response_bytes = response_bytes(result)

    def payload_bytes(self) -> tuple[int, int] | None:
        if self._response_bytes is None:
            return None
        return self._request_bytes, self._response_bytes

    async def acall(self, index: int) -> None:
        """Request ``index`` through tritonclient's asyncio client, one per event loop."""
        client = self._aclient
        if client is None:
            name = "tritonclient.http.aio" if self.protocol == "http" else "tritonclient.grpc.aio"
            module: Any = require(name, extra="triton", feature="otelkit study on asyncio")
            if self.protocol == "http":  # one connection per request in flight, at most
                client = module.InferenceServerClient(self._url, conn_limit=self.connections)
            else:
                client = module.InferenceServerClient(self._url)
            client = instrument_client(client) if self._traced else client
            self._aclient = client
        inputs = self._requests[index % len(self._requests)]
        await client.infer(self.model, inputs, **self._call_options)

    async def aclose(self) -> None:
        client, self._aclient = self._aclient, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()

    def close(self) -> None:
        with self._lock:
            clients, self._clients = self._clients, []
            hubs, self._hubs = self._hubs, []
        for client in clients:
            with contextlib.suppress(Exception):  # a client of a server that died
                client.close()
        for thread, hub in hubs:
            # a hub is destroyed once its thread has ended (gevent allows it from another
            # thread then); the driving thread's own, which read the model's metadata, is kept
            if thread is not threading.current_thread() and not thread.is_alive():
                hub.destroy(destroy_loop=True)
        self._local = threading.local()


class FunctionCalls(Workload):
    """A user's requests: ``factory(params, endpoint)`` returns ``request(index)`` for a point.

    ``axes`` are the sweep parameters the factory takes (default: any). A returned callable
    with a ``close()`` method is closed after the point.

    >>> calls = FunctionCalls(lambda params, endpoint: lambda index: None)
    """

    axes: tuple[str, ...] | None = None

    def __init__(
        self,
        factory: RequestFactory,
        *,
        axes: Sequence[str] | None = None,
        model: str | None = None,
    ) -> None:
        self._factory = factory
        self.axes = tuple(axes) if axes is not None else None
        self.model = model
        self._request: Callable[[int], Any] | None = None

    def open(
        self, params: Mapping[str, Any], endpoint: Endpoint, *, traced: bool, ready_s: float
    ) -> None:
        self.close()
        try:
            self._request = self._factory(params, endpoint)
        except StudyError:
            raise
        except Exception as error:
            raise StudyError(
                f"the request factory failed: {type(error).__name__}: {error}"
            ) from error

    def __call__(self, index: int) -> None:
        assert self._request is not None
        self._request(index)

    async def acall(self, index: int) -> None:
        """Awaits the request when the factory returned a coroutine function."""
        assert self._request is not None
        result = self._request(index)
        if not inspect.isawaitable(result):
            raise StudyError("the request factory returned no coroutine function: use threads")
        await result

    def close(self) -> None:
        request, self._request = self._request, None
        closer = getattr(request, "close", None)
        if callable(closer):
            closer()


def response_bytes(result: Any) -> int:
    """The tensor bytes of a tritonclient result: the HTTP response's binary outputs, or the
    gRPC response's raw contents (0 where neither can be read)."""
    try:
        response = result.get_response()
        if isinstance(response, dict):  # HTTP: each binary output says its size
            outputs = response.get("outputs", [])
            return sum(int(o.get("parameters", {}).get("binary_data_size", 0)) for o in outputs)
        return sum(len(c) for c in response.raw_output_contents)
    except Exception:  # the figure is missing, the request is not
        return 0


_NUMPY_TYPES = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": "object",
}


def batch_problem(max_batch_size: int | None, batch_size: int) -> str | None:
    """Why ``batch_size`` does not fit a model with ``max_batch_size``, or ``None`` if it does
    (``None``: a server that does not say, as KServe v2 servers other than Triton)."""
    if max_batch_size is None:
        return None
    if max_batch_size == 0 and batch_size != 1:
        return (
            f"the model has no batch dimension (max_batch_size 0): batch size 1 only, "
            f"not {batch_size}"
        )
    if max_batch_size > 0 and batch_size > max_batch_size:
        return (
            f"the model takes batches of at most {max_batch_size} (its max_batch_size), "
            f"not {batch_size}"
        )
    return None


def inputs_from_metadata(
    metadata: Mapping[str, Any],
    *,
    max_batch_size: int | None,
    batch_size: int = 1,
    free_dim: int = 16,
    seed: int = 0,
) -> dict[str, NDArray[Any]]:
    """Input arrays for a model, from its KServe v2 metadata (``inputs``: name, datatype, shape).

    ``max_batch_size`` is Triton's (0: no batch dimension); ``None`` when the server does not
    say: a first dimension of -1 is then taken as the batch's.
    """
    import numpy as np

    problem = batch_problem(max_batch_size, batch_size)
    if problem:
        raise ValueError(problem)
    rng = np.random.default_rng(seed)
    arrays: dict[str, NDArray[Any]] = {}
    for spec in metadata.get("inputs", ()):
        datatype = str(spec["datatype"])
        if datatype not in _NUMPY_TYPES:
            raise ValueError(
                f"input {spec['name']!r}: datatype {datatype} is not one a study makes"
            )
        shape = [int(d) for d in spec["shape"]]
        batched = max_batch_size > 0 if max_batch_size is not None else shape[:1] == [-1]
        if batched and shape:
            shape[0] = batch_size
        elif batch_size != 1:
            raise ValueError(f"input {spec['name']!r} has no batch dimension: batch size 1 only")
        shape = [free_dim if d < 0 else d for d in shape]
        arrays[str(spec["name"])] = _values(rng, datatype, tuple(shape))
    return arrays


def _values(rng: Any, datatype: str, shape: tuple[int, ...]) -> NDArray[Any]:
    import numpy as np

    if datatype == "BYTES":
        return np.full(shape, b"otelkit", dtype=object)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(bool)  # type: ignore[no-any-return]
    dtype = np.dtype(_NUMPY_TYPES[datatype])
    if dtype.kind == "f":
        return rng.random(size=shape).astype(dtype)  # type: ignore[no-any-return]
    return rng.integers(0, 10, size=shape).astype(dtype)  # type: ignore[no-any-return]


def to_infer_inputs(module: Any, arrays: Mapping[str, NDArray[Any]]) -> Sequence[Any]:
    """tritonclient ``InferInput``s (of ``module``, http or grpc) holding ``arrays``."""
    import numpy as np

    inputs = []
    for name, array in arrays.items():
        value = np.asarray(array)
        datatype = "BYTES" if value.dtype == object else _datatype(value.dtype)
        tensor = module.InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def _datatype(dtype: np.dtype[Any]) -> str:
    for datatype, name in _NUMPY_TYPES.items():
        if name == dtype.name:
            return datatype
    raise ValueError(f"numpy dtype {dtype} has no KServe v2 datatype")
