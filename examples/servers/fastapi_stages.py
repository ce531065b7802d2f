"""A FastAPI server whose handler runs in otelkit stages: one SERVER span per request.

    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4318/v1/traces \\
        python examples/servers/fastapi_stages.py --port 8010
    # or, from examples/servers: uvicorn fastapi_stages:app --port 8010
    curl -s localhost:8010/features -H 'content-type: application/json' \\
        -H 'traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01' \\
        -d '{"hits": [[30, 40, 10], [-60, 80, -25]]}'

The SERVER span joins the caller's trace (its ``traceparent``); the stages nest under it.
Spans go to ``$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (``otelkit receive`` listens on the URL
above) or ``$OTEL_EXPORTER_OTLP_ENDPOINT`` (a Collector); with neither, to OTLP-JSON lines
under ``./otelkit-traces``. Stops on Ctrl-C or SIGTERM (uvicorn's handlers): the requests in
flight get ``GRACE_S`` to finish, the spans otelkit's ``exit_timeout_s`` (5 s) to leave.
"""

from __future__ import annotations

import argparse

import numpy as np
import uvicorn
from fastapi import FastAPI
from numpy.typing import NDArray
from pydantic import BaseModel

import otelkit

Array = NDArray[np.float64]
MODEL = "hit_features"  # the label of the stages' metrics
GRACE_S = 2  # for the requests in flight at Ctrl-C (uvicorn's default: as long as they take)
otelkit.configure(service_name="hit-features-fastapi")  # OTEL_* env vars too
app = otelkit.instrument(FastAPI(title="hit features"))


class Event(BaseModel):
    hits: list[list[float]]  # (x, y, z) in mm


class Features(BaseModel):
    features: list[list[float]]  # (r / 1000, phi / pi, z / 1000)


@otelkit.stage("scale", model=MODEL)  # a stage as a decorator: one span per call
def scale(r: Array, phi: Array, z: Array) -> Array:
    return np.stack([r / 1000, phi / np.pi, z / 1000], axis=1)


@app.post("/features")
def features(event: Event) -> Features:  # a def handler runs in a thread, in the request's context
    hits = np.asarray(event.hits, dtype=np.float64).reshape(-1, 3)
    with otelkit.stage("cylindrical", model=MODEL, hits=len(hits)):  # keywords: attributes
        r = np.hypot(hits[:, 0], hits[:, 1])
        phi = np.arctan2(hits[:, 1], hits[:, 0])
    return Features(features=scale(r, phi, hits[:, 2]).round(4).tolist())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Serve /features with FastAPI, traced.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8010)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port, timeout_graceful_shutdown=GRACE_S)
