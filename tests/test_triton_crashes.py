"""The suite's handling of a tritonserver that crashes under a test (``tests/triton_crashes.py``),
on real tritonservers in pytest runs of their own, each under CI's rules (``CI=true``)."""

from __future__ import annotations

import builtins
import urllib.error
from pathlib import Path

import pytest
from geventhttpclient.response import HTTPParseError
from tritonclient.utils import InferenceServerException

from tests.paths import MODELS, ROOT
from tests.triton_crashes import race_known_on, transport_error

pytest_plugins = ["pytester"]

CONFTEST = f"""
import pytest
from otelkit.tritonserver import TritonServer, free_port

pytest_plugins = ["tests.triton_crashes"]

# Triton's tracer runs and exports to a port nothing listens on
TRACES = f"http://127.0.0.1:{{free_port()}}/v1/traces"


@pytest.fixture(scope="session")
def triton():
    with TritonServer({str(MODELS)!r}, trace_url=TRACES) as server:
        yield server


@pytest.fixture(scope="session")
def untraced_triton():
    with TritonServer({str(MODELS)!r}) as server:
        yield server


@pytest.fixture(scope="module")
def module_triton():
    with TritonServer({str(MODELS)!r}, trace_url=TRACES) as server:
        yield server
"""

# what the tests of each run share
CALLS = """
import os
import signal
import threading
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc
import tritonclient.http


def ready(triton):
    url = f"http://{triton.http_url}/v2/health/ready"
    with urllib.request.urlopen(url, timeout=5) as answer:
        return answer.status


def crash(triton):
    os.kill(triton.pid, signal.SIGSEGV)
    triton._proc.wait(10)


def infer(client):
    module = tritonclient.grpc if "grpc" in type(client).__module__ else tritonclient.http
    tensor = module.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    client.infer("sleep_fp32", [tensor])  # 0.5 s in the model


def crash_during_a_call(triton, client):
    killer = threading.Timer(0.2, os.kill, (triton.pid, signal.SIGSEGV))
    killer.start()
    try:
        infer(client)
    finally:
        killer.join()
        triton._proc.wait(10)
    infer(client)  # in case the first call was answered before the crash
"""

TESTS = """
def test_1_the_server_segfaults_under_it(triton):
    crash(triton)
    ready(triton)


def test_2_the_next_test_finds_it_serving_on_the_same_port(triton):
    assert ready(triton) == 200


def test_3_the_server_is_killed_on_purpose(triton):
    os.kill(triton.pid, signal.SIGKILL)
    triton._proc.wait(10)
    ready(triton)


def test_4_a_killed_server_is_left_as_it_is(triton):
    assert not triton.running
"""

NOT_THE_RACE = """
def test_an_unrelated_assertion(triton):
    crash(triton)
    assert 2 + 2 == 5


def test_a_bare_key_error(triton):
    crash(triton)
    {}["missing"]


def test_a_broken_connection_to_an_untraced_server(untraced_triton):
    crash(untraced_triton)
    ready(untraced_triton)


@pytest.mark.triton_must_survive
def test_a_server_that_must_survive_the_call(triton):
    crash_during_a_call(triton, tritonclient.grpc.InferenceServerClient(triton.grpc_url))


def test_both_serve_again(triton, untraced_triton):
    assert ready(triton) == ready(untraced_triton) == 200
"""

OVER_HTTP = """
def test_it_serves(module_triton):
    assert ready(module_triton) == 200


def test_its_last_test_crashes_it_during_an_http_call(module_triton):
    client = tritonclient.http.InferenceServerClient(module_triton.http_url)
    crash_during_a_call(module_triton, client)
"""

OVER_GRPC = """
def test_its_last_test_crashes_it_during_a_grpc_call(module_triton):
    client = tritonclient.grpc.InferenceServerClient(module_triton.grpc_url)
    crash_during_a_call(module_triton, client)
"""


@pytest.fixture
def run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> pytest.Pytester:
    """A pytest run of its own under CI, with the plugin and the markers pyproject.toml
    registers (``--strict-markers`` refuses any other)."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("CI", "true")
    pytester.makeconftest(CONFTEST)
    markers = request.config.getini("markers")
    pytester.makeini("[pytest]\nmarkers =\n" + "".join(f"    {line}\n" for line in markers))
    return pytester


def runpytest(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-rx", "-p", "no:cacheprovider", "--strict-markers", *args)


@pytest.mark.triton
def test_a_crash_fails_only_its_own_test_by_name_and_the_server_serves_again(
    run: pytest.Pytester,
) -> None:
    run.makepyfile(test_crashes=CALLS + TESTS)
    result = runpytest(run)
    result.assert_outcomes(xfailed=1, passed=2, failed=1)
    first = "test_1_the_server_segfaults_under_it"
    result.stdout.fnmatch_lines(
        [
            "*tritonserver crashes, forgiven as*upstream issue 7795*: 1 allowed under CI*",
            f"forgiven: *{first}: tritonserver was killed by signal 11*log kept at *"
            "the test failed by ConnectionRefusedError: [[]Errno 111[]] Connection refused",
            f"XFAIL*{first}*killed by signal 11*kept at *upstream issue 7795*",
        ]
    )
    assert not [line for line in result.stdout.lines if "kept at" in line and "test_3" in line]
    kept = list(Path(run.path).glob("**/triton-crashes/1-*.log"))
    assert len(kept) == 1 and "Started HTTPService" in kept[0].read_text()


@pytest.mark.triton
def test_a_crash_is_forgiven_only_as_a_broken_connection_to_a_traced_server(
    run: pytest.Pytester,
) -> None:
    """An unrelated failure, an untraced server, a test marked to show the server survives:
    each fails although its server crashed, saying why the crash was not forgiven."""
    run.makepyfile(test_not_the_race=CALLS + NOT_THE_RACE)
    result = runpytest(run)
    result.assert_outcomes(failed=4, passed=1)
    crash = "tritonserver was killed by signal 11*log kept at *"
    result.stdout.fnmatch_lines(
        [
            "*- tritonserver crash, not forgiven -*",
            "not forgiven: the test failed by AssertionError: assert (2 + 2) == 5, not by a "
            "broken connection to the server",
            "*tritonserver crashes, forgiven as*",
            "forgiven: none",
            f"not forgiven: *::test_an_unrelated_assertion: {crash}; the test failed by "
            "AssertionError*",
            f"not forgiven: *::test_a_bare_key_error: {crash}; the test failed by KeyError: "
            "'missing', not by a broken connection to the server",
            f"not forgiven: *::test_a_broken_connection_to_an_untraced_server: {crash}; the "
            "server did not trace, and the race is in Triton's tracer",
            f"not forgiven: *::test_a_server_that_must_survive_the_call: {crash}; the test is "
            "marked triton_must_survive: it shows that the server survives",
        ]
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED


@pytest.mark.triton
def test_under_ci_a_second_forgiven_crash_fails_the_run_and_both_are_named(
    run: pytest.Pytester,
) -> None:
    """Each crash in the last test of a module's server, recorded though that server stops
    at the module's end: one is forgiven, two fail the run."""
    run.makepyfile(test_http=CALLS + OVER_HTTP, test_grpc=CALLS + OVER_GRPC)
    result = runpytest(run)
    result.assert_outcomes(xfailed=2, passed=1)
    crash = "tritonserver was killed by signal 11*log kept at *"
    result.stdout.fnmatch_lines_random(
        [
            f"forgiven: test_grpc.py::test_its_last_test_crashes_it_during_a_grpc_call: {crash}; "
            "the test failed by InferenceServerException: *StatusCode.UNAVAILABLE*",
            f"forgiven: test_http.py::test_its_last_test_crashes_it_during_an_http_call: {crash}; "
            "the test failed by *",
            "2 crashes forgiven where CI allows 1: the run fails*",
        ]
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED

    alone = runpytest(run, "test_grpc.py")
    alone.assert_outcomes(xfailed=1)
    alone.stdout.fnmatch_lines(["forgiven: test_grpc.py::test_its_last_test_crashes_it_*"])
    assert "the run fails" not in alone.stdout.str()
    assert alone.ret == pytest.ExitCode.OK


def test_a_healthy_run_says_no_crash_was_forgiven(run: pytest.Pytester) -> None:
    run.makepyfile(test_healthy="def test_nothing_crashes():\n    pass\n")
    result = runpytest(run)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*= tritonserver crashes, forgiven as *: 1 allowed under CI =*", "forgiven: none"]
    )
    assert result.ret == pytest.ExitCode.OK


def test_the_race_is_known_from_2_51_until_2_57() -> None:
    known = ["2.51.0", "2.56.3", "2.51"]
    unknown = ["2.50.0", "2.57.0", "2.60.0", "3.51.0", "", None, "r24.10"]
    assert [race_known_on(v) for v in known + unknown] == [True] * 3 + [False] * 7


def test_a_transport_error_is_found_wherever_the_failure_holds_it() -> None:
    refused = ConnectionRefusedError(111, "Connection refused")
    reset = ConnectionResetError(104, "Connection reset by peer")
    try:
        try:
            raise reset
        except ConnectionResetError as error:
            raise RuntimeError("the call failed") from error
    except RuntimeError as error:
        chained = error
    assert transport_error(urllib.error.URLError(refused)) is refused
    assert transport_error(chained) is reset
    group = getattr(builtins, "ExceptionGroup", None)  # Python 3.11 and later
    if group is not None:
        nested = group("threads", [KeyError("x"), group("inner", [refused])])
        assert transport_error(nested) is refused
    closed_early = HTTPParseError("connection closed before end of the headers")
    assert transport_error(closed_early) is closed_early
    not_found = InferenceServerException("Request for unknown model", "StatusCode.NOT_FOUND")
    for error in (KeyError("x"), HTTPParseError("invalid constant string"), not_found):
        assert transport_error(error) is None
    # a call that timed out broke no connection, even one to a server hung in its crash handler
    assert transport_error(TimeoutError("timed out")) is None


OWN_XFAIL = """
def test_a_test_that_proves_the_cause_itself(triton):
    crash(triton)
    pytest.xfail("the crash under traced load, its cause checked by the test")


def test_then_a_forgiven_crash(triton):
    crash(triton)
    ready(triton)


def test_a_crash_of_a_server_in_a_process_of_its_own(request):
    from tests.triton_crashes import forgive_elsewhere

    forgive_elsewhere(request, ["the demo's Triton restarted after signal 11"])
"""


@pytest.mark.triton
def test_a_tests_own_expected_failure_on_a_crash_counts_in_the_budget(
    run: pytest.Pytester,
) -> None:
    """tests/client/test_traced_load.py checks the crash's cause and calls ``pytest.xfail``,
    tests/examples/test_demo.py proves its own process's crashes (``forgive_elsewhere``): each
    is forgiven by the test, not the plugin, and still counts in the budget."""
    run.makepyfile(test_own=CALLS + OWN_XFAIL)
    result = runpytest(run)
    result.assert_outcomes(xfailed=3)
    result.stdout.fnmatch_lines_random(
        [
            "forgiven: *::test_a_test_that_proves_the_cause_itself: tritonserver was killed by "
            "signal 11*; the test's own: the crash under traced load, its cause checked by *",
            "forgiven: *::test_then_a_forgiven_crash: *the test failed by *Connection refused*",
            "forgiven: *::test_a_crash_of_a_server_in_a_process_of_its_own: the demo's Triton "
            "restarted after signal 11",
            "3 crashes forgiven where CI allows 1: the run fails*",
        ]
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
