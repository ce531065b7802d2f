"""The five ways to split the pipeline between client and server (the seeds' service options).

    0  no server: every stage in the client process
    1  the torch models served (embed, filter, gnn); graph building and labelling in the client
    2  graph building served too; labelling in the client
    3  every stage served as its own model, called one after another
    4  one call to the ensemble of all five stages

The same ``reconstruct`` runs each option; a remote stage goes through an instrumented
``tritonclient`` (HTTP or gRPC) to Triton or to the FastAPI twin, so every call is a CLIENT
span carrying the trace to the server. An event's work is one span, ``reconstruct event``,
with the option as attribute: the root that ``otelkit.analysis._breakdown`` splits.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from opentelemetry import trace

import otelkit
from gnn_tracking.physics.models import Models
from gnn_tracking.serving.stages import (
    ENSEMBLE_STAGE,
    FEATURES,
    STAGE_ORDER,
    STAGES,
    TRACK_LABELS,
    Stage,
)

__all__ = [
    "OPTIONS",
    "OPTION_ATTRIBUTE",
    "PACK",
    "UNPACK",
    "Remote",
    "ServiceOption",
    "reconstruct",
]

Protocol = Literal["http", "grpc"]
OPTION_ATTRIBUTE = "gnn_tracking.option"
THREADS_ATTRIBUTE = "gnn_tracking.threads"
SERVER_ATTRIBUTE = "gnn_tracking.server"
HITS_ATTRIBUTE = "gnn_tracking.hits"
ROOT_SPAN = "reconstruct event"
PACK, UNPACK = "pack", "unpack"  # the client stages around each call


@dataclass(frozen=True)
class ServiceOption:
    number: int
    title: str
    served: tuple[str, ...]  # the models the client calls; the other stages run in process

    @property
    def runs_locally(self) -> bool:
        """Whether some stage runs in the client process (which then needs the weights)."""
        return self.served != (ENSEMBLE_STAGE.name,) and set(self.served) != set(STAGE_ORDER)


OPTIONS: tuple[ServiceOption, ...] = (
    ServiceOption(0, "no server", ()),
    ServiceOption(1, "torch models served", ("embed", "filter", "gnn")),
    ServiceOption(2, "graph building served", ("embed", "build_graph", "filter", "gnn")),
    ServiceOption(3, "every stage served", STAGE_ORDER),
    ServiceOption(4, "one ensemble", (ENSEMBLE_STAGE.name,)),
)


class Remote:
    """Calls served stages through an instrumented tritonclient at ``url`` (``host:port``).

    gRPC shares one client (one channel) between threads; tritonclient's HTTP client is not
    thread-safe, so each thread gets its own. ``instrument=False`` sends no trace context; a
    call waits at most ``timeout_s`` for its answer.
    """

    def __init__(
        self,
        url: str,
        protocol: Protocol = "grpc",
        *,
        instrument: bool = True,
        timeout_s: float = 60.0,
    ) -> None:
        if protocol not in ("http", "grpc"):
            raise ValueError(f"protocol must be http or grpc, not {protocol!r}")
        self.url, self.protocol, self._instrument = url, protocol, instrument
        self.timeout_s = timeout_s
        if protocol == "grpc":
            import tritonclient.grpc as module
        else:
            import tritonclient.http as module
        self._module: Any = module
        self._shared = self._new_client() if protocol == "grpc" else None
        self._local = threading.local()
        self._clients: list[Any] = []

    def _new_client(self) -> Any:
        if self.protocol == "http":
            client = self._module.InferenceServerClient(
                self.url, connection_timeout=self.timeout_s, network_timeout=self.timeout_s
            )
        else:
            client = self._module.InferenceServerClient(self.url)
        return otelkit.instrument(client) if self._instrument else client

    def _client(self) -> Any:
        if self._shared is not None:
            return self._shared
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._new_client()
            self._local.client = client
            self._clients.append(client)
        return client

    def infer(self, stage: Stage, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Call ``stage``'s model with its inputs taken from ``tensors``; its outputs, on CPU.

        Turning torch tensors into the client's inputs and its outputs back into tensors are
        client stages (``pack``, ``unpack``: SONIC's acquire and produce), so the breakdown
        shows them beside the call instead of in ``client other``."""
        with otelkit.stage(PACK, gpu=False):
            inputs = []
            for spec in stage.inputs:
                array = tensors[spec.name].detach().cpu().numpy()
                tensor = self._module.InferInput(spec.name, list(array.shape), spec.datatype)
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            outputs = [self._module.InferRequestedOutput(spec.name) for spec in stage.outputs]
        timeout = {"client_timeout": self.timeout_s} if self.protocol == "grpc" else {}
        result = self._client().infer(stage.name, inputs, outputs=outputs, **timeout)
        with otelkit.stage(UNPACK, gpu=False):
            # tritonclient's arrays view its read-only response buffer: torch wants its own copy
            return {spec.name: torch.tensor(result.as_numpy(spec.name)) for spec in stage.outputs}

    def is_ready(self) -> bool:
        return bool(self._client().is_server_ready())

    def close(self) -> None:
        for client in [self._shared, *self._clients]:
            if client is not None:
                client.close()


_tracer = trace.get_tracer("gnn_tracking")


def reconstruct(
    option: ServiceOption,
    features: torch.Tensor,
    models: Models | None,
    remote: Remote | None,
    attributes: Mapping[str, str | int] | None = None,
) -> torch.Tensor:
    """Track labels of one event under ``option``: served stages via ``remote``, the others
    with the local ``models``. One ``reconstruct event`` span covers it."""
    span_attributes: dict[str, str | int] = {
        OPTION_ATTRIBUTE: option.number,
        HITS_ATTRIBUTE: int(features.shape[0]),
        **(attributes or {}),
    }
    with _tracer.start_as_current_span(ROOT_SPAN, attributes=span_attributes):
        if option.served == (ENSEMBLE_STAGE.name,):
            return _remote(remote).infer(ENSEMBLE_STAGE, {FEATURES: features})[TRACK_LABELS]
        tensors = {FEATURES: features}
        for name in STAGE_ORDER:
            stage = STAGES[name]
            if name in option.served:
                tensors.update(_remote(remote).infer(stage, tensors))
            else:
                if models is None:
                    raise ValueError(f"option {option.number} runs {name} locally: pass models")
                with torch.inference_mode():
                    tensors.update(stage.run(models, tensors))
        return tensors[TRACK_LABELS]


def _remote(remote: Remote | None) -> Remote:
    if remote is None:
        raise ValueError("this option calls a server: pass a Remote")
    return remote
