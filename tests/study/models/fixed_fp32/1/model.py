"""Returns its input after a fixed 10 ms in the stage "fixed" (a sleep: it holds no CPU, so
two instances serve twice as many requests on two cores)."""

import time

import triton_python_backend_utils as pb_utils

import otelkit
from otelkit.server import triton_backend

SERVICE_S = 0.010


class TritonPythonModel:
    def initialize(self, args):
        otelkit.configure()  # OTEL_* from tritonserver's environment: the study's receiver
        self.model = args["model_name"]

    def execute(self, requests):
        responses = []
        for request in triton_backend.each_request(requests, self.model):
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            with otelkit.stage("fixed"):
                time.sleep(SERVICE_S)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
        return responses

    def finalize(self):
        otelkit.shutdown()
