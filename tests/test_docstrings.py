"""Every ``>>>`` example in otelkit's docstrings runs as written and shows what it prints.

Except the illustrations listed here, whose examples need what a test cannot give them in
place (a Triton or model server, a GPU, a FastAPI or PyTriton app) or would change the whole
test process (its telemetry pipeline, tritonclient instrumented globally, PyTriton's tracer).
An example can also mark a line ``# doctest: +SKIP``.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import otelkit

ILLUSTRATIONS = {
    "otelkit": "a Triton server, a client and a model server",
    "otelkit._instrumentation.instrument": "a Triton server and a FastAPI app",
    "otelkit._core.hotmetrics": "a call's trace and span ids",
    "otelkit.auto": "tritonclient instrumented for the whole process",
    "otelkit.auto.TritonClientInstrumentor": "tritonclient instrumented for the whole process",
    "otelkit.gpu._owners": "another process on a GPU",
    "otelkit.gpu._sampler": "a GPU",
    "otelkit.server._stage.stage": "a model's inputs",
    "otelkit.server.fastapi.instrument_app": "a FastAPI app",
    "otelkit.server.ray_serve.instrument_deployment": "Ray Serve deployments",
    "otelkit.server.pytriton": "PyTriton's tracer, set up once per process",
    "otelkit.server.pytriton.install_tracer": "PyTriton's tracer, set up once per process",
    "otelkit.server.pytriton.traced": "a PyTriton model",
    "otelkit.telemetry.configure": "the process's telemetry pipeline and a Prometheus port",
    "otelkit.tritonserver.TritonServer": "a Triton server started for the example",
}

MODULES = ["otelkit", *sorted(i.name for i in pkgutil.walk_packages(otelkit.__path__, "otelkit."))]


def with_examples(module_name: str) -> list[doctest.DocTest]:
    """The docstrings of ``module_name`` (its own objects, not those it imports) with examples."""
    module = importlib.import_module(module_name)
    found = doctest.DocTestFinder(exclude_empty=True).find(module, module_name)
    return [test for test in found if test.examples]


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run(module_name: str) -> None:
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in with_examples(module_name):
        if test.name not in ILLUSTRATIONS:
            runner.run(test)
    assert runner.failures == 0, f"{runner.failures} failing example(s) in {module_name}"


def test_every_illustration_exists_and_the_rest_is_checked() -> None:
    """The list above names real docstrings with examples, and most examples run."""
    names = {test.name for module_name in MODULES for test in with_examples(module_name)}
    assert set(ILLUSTRATIONS) <= names
    assert len(names - set(ILLUSTRATIONS)) >= 20  # the finder still finds them
