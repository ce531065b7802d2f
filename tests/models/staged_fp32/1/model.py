"""Doubles its input in three otelkit stages; one of them runs once over the whole batch.

otelkit is configured from tritonserver's environment (OTEL_*/OTELKIT_* variables), so the
stage spans go where the test points them and join the client's trace under Triton's model span.
"""

import triton_python_backend_utils as pb_utils

import otelkit
from otelkit.server import triton_backend


class TritonPythonModel:
    def initialize(self, args):
        otelkit.configure()
        self.model = args["model_name"]

    def execute(self, requests):
        with triton_backend.batch(requests, self.model), otelkit.stage("gather"):
            arrays = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        responses = []
        for index, _ in enumerate(triton_backend.each_request(requests, self.model)):
            data = arrays[index]
            with otelkit.stage("scale") as run:
                run.set(elements=int(data.size))
                doubled = data * 2
            with otelkit.stage("pack"):
                output = pb_utils.Tensor("OUTPUT0", doubled)
                responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses

    def finalize(self):
        otelkit.shutdown()
