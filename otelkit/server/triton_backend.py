"""Triton Python backend: each request's work under that request's trace context.

Triton hands a Python-backend model the W3C context of its own model span for every request
(``request.trace().get_context()``, a JSON carrier, ``None`` when the request is not traced).
Run a request's work under it and ``otelkit.stage`` spans hang under Triton's model span, in
the client's trace. A stage that runs once over a whole dynamic batch gets one span, a child of
the first request's context, linked to every request of the batch.

>>> from otelkit.server import triton_backend as otb
>>> class TritonPythonModel:
...     def initialize(self, args):
...         otelkit.configure(service_name="gnn-tracking")   # OTEL_* from tritonserver's env
...         self.model = args["model_name"]
...     def execute(self, requests):
...         with otb.batch(requests, self.model):             # one span over the whole batch
...             embedded = embed_all(requests)
...         responses = []
...         for request in otb.each_request(requests, self.model):
...             with otelkit.stage("filter"):                  # under this request's model span
...                 responses.append(respond(request))
...         return responses
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link

from otelkit._core.guard import internal_error
from otelkit._propagation import extract
from otelkit.server._stage import BATCH_LINKS, CURRENT_MODEL

__all__ = ["batch", "each_request", "request_context", "serving"]


def request_context(request: Any) -> Context | None:
    """The context of Triton's model span for ``request``; ``None`` if it is not traced.

    A malformed carrier gives ``None`` too: the work then runs untraced, never fails.
    """
    try:
        inference_trace = request.trace()
        carrier = inference_trace.get_context() if inference_trace is not None else None
        if not carrier:
            return None
        parsed = json.loads(carrier)
        if not isinstance(parsed, dict):
            return None
        context = extract({str(key): str(value) for key, value in parsed.items()})
        return context if trace.get_current_span(context).get_span_context().is_valid else None
    except Exception:
        internal_error("reading a Triton request's trace context")
        return None


@contextmanager
def serving(request: Any, model: str = "") -> Iterator[Context | None]:
    """Run the block under ``request``'s context, with ``model`` as the stages' model label."""
    context = request_context(request)
    model_token = CURRENT_MODEL.set(model) if model else None
    token = otel_context.attach(context) if context is not None else None
    try:
        yield context
    finally:
        if token is not None:
            otel_context.detach(token)
        if model_token is not None:
            CURRENT_MODEL.reset(model_token)


def each_request(requests: Sequence[Any], model: str = "") -> Iterator[Any]:
    """Iterate over ``requests``; the loop body of each runs under that request's context."""
    for request in requests:
        with serving(request, model):
            yield request


@contextmanager
def batch(requests: Sequence[Any], model: str = "") -> Iterator[None]:
    """Run the block once for the whole batch: its outermost stages get one span each, a child
    of the first traced request's context and linked to every traced request."""
    contexts = [c for c in map(request_context, requests) if c is not None]
    links = [Link(trace.get_current_span(c).get_span_context()) for c in contexts]
    model_token = CURRENT_MODEL.set(model) if model else None
    token = otel_context.attach(contexts[0]) if contexts else None
    links_token = BATCH_LINKS.set(links)
    try:
        yield
    finally:
        BATCH_LINKS.reset(links_token)
        if token is not None:
            otel_context.detach(token)
        if model_token is not None:
            CURRENT_MODEL.reset(model_token)
