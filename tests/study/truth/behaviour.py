"""The Python-backend models of the study's truth table: each spends known time per request in
named otelkit stages, so the resource that caps its throughput is known by construction.

A model's configuration names its stages in the parameter ``stages``, ``name=kind:ms`` joined
by ``;``:

- ``sleep``: waits ``ms`` without holding a CPU (a device, a remote call);
- ``spin``: burns ``ms`` of its own thread's CPU time (a busy core: under contention for the
  host's cores it takes longer by the clock);
- ``rows``: sleeps ``ms`` for each row of the request's input (its batch): work that grows
  with the batch size;
- ``lock``: sleeps ``ms`` holding an exclusive ``flock`` on the file ``OTELKIT_TRUTH_LOCK``,
  which every instance (a process of its own) opens (a file in the temporary folder by
  default): one request at a time across instances.

With ``per_execution`` set to ``true`` the stages run once per execution (a batch), not once
per request. Each model's ``1/model.py`` imports ``TritonPythonModel`` from here (the server's
``PYTHONPATH`` holds the repository, as the test process's path does).
"""

import fcntl
import json
import os
import tempfile
import time

import triton_python_backend_utils as pb_utils

import otelkit
from otelkit.server import triton_backend
from tests.study.truth.stages import parse
from tests.study.truth.work import spin


class TritonPythonModel:
    def initialize(self, args):
        otelkit.configure()  # OTEL_* from tritonserver's environment: the study's receiver
        self.model = args["model_name"]
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.stages = parse(parameters["stages"]["string_value"])
        per_execution = parameters.get("per_execution", {}).get("string_value", "false")
        self.per_execution = per_execution == "true"
        self.lock = None
        if any(kind == "lock" for _, kind, _ in self.stages):
            default = os.path.join(tempfile.gettempdir(), "otelkit-truth.lock")
            self.lock = open(os.environ.get("OTELKIT_TRUTH_LOCK", default), "a")  # noqa: SIM115

    def _run(self, name, kind, seconds, rows=1):
        with otelkit.stage(name):
            if kind == "sleep":
                time.sleep(seconds)
            elif kind == "rows":
                time.sleep(seconds * rows)
            elif kind == "spin":
                spin(seconds)
            else:
                fcntl.flock(self.lock, fcntl.LOCK_EX)
                try:
                    time.sleep(seconds)
                finally:
                    fcntl.flock(self.lock, fcntl.LOCK_UN)

    def execute(self, requests):
        if self.per_execution:
            with triton_backend.batch(requests, self.model):
                for stage in self.stages:
                    self._run(*stage)
        responses = []
        for request in triton_backend.each_request(requests, self.model):
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if not self.per_execution:
                for stage in self.stages:
                    self._run(*stage, rows=len(data) if data.ndim > 1 else 1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
        return responses

    def finalize(self):
        if self.lock is not None:
            self.lock.close()
        otelkit.shutdown()
