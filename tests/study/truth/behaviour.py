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
  default): one request at a time across instances;
- ``poolK`` (``pool2``, ``pool3``): sleeps ``ms`` holding one of k tokens that every instance
  of the model shares (a GPU semaphore, a connection pool, licences): k requests at a time.
  The tokens are bytes in a named pipe beside the lock file: a holder reads one (blocking
  while none is left, woken by the kernel when one is written back) and writes it back.

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
from tests.study.truth.stages import parse, pool_size
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
        default = os.path.join(tempfile.gettempdir(), "otelkit-truth.lock")
        lock_path = os.environ.get("OTELKIT_TRUTH_LOCK", default)
        if any(kind == "lock" for _, kind, _ in self.stages):
            self.lock = open(lock_path, "a")  # noqa: SIM115
        self.pools = {
            name: _pool(f"{lock_path}.{self.model}.{name}", pool_size(kind))
            for name, kind, _ in self.stages
            if pool_size(kind)
        }

    def _run(self, name, kind, seconds, rows=1):
        with otelkit.stage(name):
            if kind == "sleep":
                time.sleep(seconds)
            elif kind == "rows":
                time.sleep(seconds * rows)
            elif kind == "spin":
                spin(seconds)
            elif name in self.pools:
                token = os.read(self.pools[name], 1)
                try:
                    time.sleep(seconds)
                finally:
                    os.write(self.pools[name], token)
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
        for fd in self.pools.values():
            os.close(fd)
        otelkit.shutdown()


def _pool(path, k):
    """The named pipe of a pool of ``k``, opened for reading and writing (so that it never
    reads an end of file); the first instance to take the pipe's lock makes it and puts the k
    tokens in, and every instance keeps it open, so the tokens live as long as the server."""
    with open(f"{path}.init", "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        fresh = not os.path.exists(path)
        if fresh:
            os.mkfifo(path)
        fd = os.open(path, os.O_RDWR)
        if fresh:
            os.write(fd, b"t" * k)
    return fd
