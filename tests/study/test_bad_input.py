"""Bad input and faults: each ends the study with a message that names the point, keeps the
points done in the results file and exits non-zero."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest

from otelkit._errors import StudyError
from otelkit.cli import main
from otelkit.study import Load, Study, Triton, read_results
from otelkit.testing import wait_until
from otelkit.tritonserver import TritonServer, free_port
from tests.paths import MODELS
from tests.study.conftest import answered, points_written

pytestmark = pytest.mark.triton


def records(path: Path) -> list[str]:
    return [json.loads(line)["record"] for line in path.read_text().splitlines()]


def study(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> tuple[int, str, Path]:
    out = tmp_path / "study.jsonl"
    code = main(
        [
            "study",
            "run",
            *args,
            "--seconds",
            "0.6",
            "--warmup",
            "0.2",
            "--no-traces",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    return code, capsys.readouterr().err, out


def test_an_unreachable_server(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    port = free_port()
    code, err, out = study(
        capsys,
        tmp_path,
        "--url",
        f"127.0.0.1:{port}",
        "--model",
        "identity_fp32",
        "--sweep",
        "concurrency=1,2",
    )
    assert code == 1
    assert (
        f"otelkit study: point concurrency=1: the server at 127.0.0.1:{port} (http) does not "
        "answer (ConnectionRefusedError"
    ) in err
    assert records(out) == ["study", "point", "end"]
    results = read_results(out)
    assert (results.status, results.points[0].status) == ("failed", "failed")


def test_a_model_that_does_not_exist(
    untraced_triton: TritonServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, err, _ = study(capsys, tmp_path, "--url", untraced_triton.http_url, "--model", "nope")
    assert code == 1
    assert (
        f"otelkit study: the point: the server at {untraced_triton.http_url} (http) has no "
        "model 'nope' ready (its models: identity_fp32, sleep_fp32, staged_fp32)"
    ) in err


def test_a_sweep_value_that_makes_no_sense(
    untraced_triton: TritonServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # found before anything runs: a usage error
    code, err, out = study(
        capsys,
        tmp_path,
        "--url",
        untraced_triton.http_url,
        "--model",
        "identity_fp32",
        "--sweep",
        "concurrency=1,0",
    )
    assert code == 2
    assert "point concurrency=0: concurrency is the number of requests in flight" in err
    assert not out.exists()
    # found at the server: the point before it is kept
    code, err, out = study(
        capsys,
        tmp_path,
        "--url",
        untraced_triton.http_url,
        "--model",
        "identity_fp32",
        "--sweep",
        "batch_size=2,64",
        "--metrics-url",
        untraced_triton.metrics_url,
    )
    assert code == 1
    assert (
        "point batch_size=64: model 'identity_fp32': the model takes batches of at most 8 (its "
        "max_batch_size), not 64"
    ) in err
    results = read_results(out)
    assert [(p.label, p.status) for p in results.points] == [
        ("batch_size=2", "ok"),
        ("batch_size=64", "failed"),
    ]
    assert results.points[0].throughput > 0
    assert results.points[0].triton["identity_fp32"].batch_size == pytest.approx(2, rel=0.01)


def _sweep_killed_during_its_second_point(out: Path, restarts: int) -> Study:
    """A three-point sweep whose tritonserver is killed once its second point's requests are
    answered: the point lasts 3.2 s from then."""
    server = Triton(MODELS)
    sweep = Study(
        model="identity_fp32",
        server=server,
        sweep={"concurrency": [1, 2, 3]},
        load=Load(seconds=3.0, warmup_s=0.2),
        out=out,
        progress=False,
        restarts=restarts,
    )

    def kill_during_the_second_point() -> None:
        # the server starts (up to its startup_timeout, 120 s), then the point's 3.2 s
        wait_until(lambda: out.exists() and points_written(out), 180, "the first point")
        triton = server.server
        assert triton is not None and triton.pid is not None
        first = answered(
            triton.http_url, "identity_fp32"
        )  # the first point's requests, every one returned
        wait_until(
            lambda: answered(triton.http_url, "identity_fp32") > first,
            60,
            "the second point's requests",
        )
        os.killpg(triton.pid, signal.SIGKILL)

    threading.Thread(target=kill_during_the_second_point, daemon=True).start()
    return sweep


def test_a_server_that_dies_mid_sweep(tmp_path: Path) -> None:
    out = tmp_path / "study.jsonl"
    sweep = _sweep_killed_during_its_second_point(out, restarts=0)
    with pytest.raises(StudyError) as caught:
        sweep.run()
    message = str(caught.value)
    assert message.startswith(
        "otelkit study: point concurrency=2: the server died during the point: tritonserver "
        "was killed by signal 9 (Killed) (log: "
    ), message
    assert caught.value.point == "concurrency=2"
    results = read_results(out)
    assert [p.status for p in results.points] == ["ok", "failed"]
    assert results.status == "failed" and results.message == message
    assert caught.value.results is not None and len(caught.value.results.points) == 2


def test_a_point_cut_short_by_the_server_is_measured_again_on_a_restarted_one(
    tmp_path: Path,
) -> None:
    out = tmp_path / "study.jsonl"
    results = _sweep_killed_during_its_second_point(out, restarts=1).run()
    assert [p.status for p in results.points] == ["ok", "ok", "ok"]
    assert [len(p.restarts) for p in results.points] == [0, 1, 0]
    (failure,) = results.points[1].restarts
    assert failure.startswith("the server died during the point: tritonserver was killed by")
    assert results.points[1].requests > 0
    assert read_results(out).points[1].restarts == [failure]  # kept in the file
    assert "measured again after 1 server failure(s): the server died" in results.summary()
    logs = sorted(p.name for p in (tmp_path / "study-files").glob("tritonserver-*.log"))
    assert logs == ["tritonserver-1.log", "tritonserver-2.log"]  # the failed server's log kept
