"""configure() and its lifecycle: exporters built once, flushed at every exit, counted loss."""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import metrics, propagate, trace
from prometheus_client.openmetrics.parser import text_string_to_metric_families

import otelkit
from otelkit import semconv
from otelkit._core.worker import DrainFirst
from otelkit._propagation import W3CPropagator
from otelkit._resource import detect
from otelkit.analysis import load_spans
from otelkit.export._processor import BatchExportProcessor


@pytest.fixture(autouse=True)
def _shutdown_after() -> Iterator[None]:
    yield
    otelkit.shutdown()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(url: str) -> str:
    request = urllib.request.Request(url, headers={"Accept": "application/openmetrics-text"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return str(response.read().decode())


def samples(exposition: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    found = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def end_spans(count: int, name: str = "work") -> None:
    tracer = trace.get_tracer("tests")
    for index in range(count):
        with tracer.start_as_current_span(name) as span:
            span.set_attribute("index", index)


def test_embedded_default_writes_json_lines_and_says_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    caplog.set_level(logging.INFO, logger="otelkit")
    telemetry = otelkit.configure(service_name="embedded", traces_dir=str(tmp_path))
    end_spans(5)
    otelkit.shutdown()
    files = list(tmp_path.glob("traces-embedded-*.jsonl"))
    assert len(files) == 1
    assert telemetry.traces_destination == f"OTLP-JSON lines in {files[0]}"
    assert sum(f"OTLP-JSON lines in {files[0]}" in r.getMessage() for r in caplog.records) == 1
    spans = load_spans(tmp_path)
    assert [s.name for s in spans] == ["work"] * 5
    assert spans[0].resource["service.name"] == "embedded"


def test_configure_twice_never_duplicates_exporters(tmp_path: Path) -> None:
    first = otelkit.configure(service_name="twice", traces_dir=str(tmp_path))
    again = otelkit.configure(service_name="twice", traces_dir=str(tmp_path))
    assert again is first
    processors = first.tracer_provider._active_span_processor._span_processors
    # the first only drains calls whose telemetry waits to end (otelkit._core.worker)
    assert [type(p) for p in processors] == [DrainFirst, BatchExportProcessor]
    end_spans(3)
    otelkit.shutdown()
    assert len(load_spans(tmp_path)) == 3  # one exporter: each span written once


def test_reconfigure_moves_existing_tracers_to_the_new_pipeline(tmp_path: Path) -> None:
    otelkit.configure(service_name="old", traces_dir=str(tmp_path / "a"))
    tracer = trace.get_tracer("held-across-reconfigure")
    histogram = metrics.get_meter("held").create_histogram("held.duration", unit="s")
    with tracer.start_as_current_span("before"):
        pass
    new = otelkit.configure(service_name="new", traces_dir=str(tmp_path / "b"), prometheus_port=0)
    with tracer.start_as_current_span("after"):
        histogram.record(0.5)
    assert new.prometheus_url is not None
    exposition = scrape(new.prometheus_url)
    otelkit.shutdown()
    assert [(s.name, s.resource["service.name"]) for s in load_spans(tmp_path / "a")] == [
        ("before", "old")
    ]
    assert [(s.name, s.resource["service.name"]) for s in load_spans(tmp_path / "b")] == [
        ("after", "new")
    ]
    assert samples(exposition, "held_duration_seconds_count") == {(): 1.0}


def test_spec_exact_propagator_is_installed_globally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_PROPAGATORS", raising=False)
    otelkit.configure(traces_dir=str(tmp_path))
    assert isinstance(propagate.get_global_textmap(), W3CPropagator)


def test_dead_collector_loses_spans_counted_never_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="otelkit")
    telemetry = otelkit.configure(
        service_name="dead-collector",
        endpoint=f"http://127.0.0.1:{closed_port()}",
        export_timeout_ms=200,
        bsp_max_queue_size=8,
        bsp_max_export_batch_size=4,
        bsp_schedule_delay_ms=20,
        prometheus_port=0,
        metrics_exporter="prometheus",
        drop_log_interval_s=0,
    )
    end_spans(50)  # far more than the queue holds while exports fail
    telemetry.flush(timeout_s=5)
    stats = telemetry.stats()
    assert stats["exported"] == 0
    assert stats.get("dropped_queue_full", 0) > 0
    assert stats.get("dropped_export_failed", 0) > 0
    assert telemetry.prometheus_url is not None
    dropped = samples(scrape(telemetry.prometheus_url), "otelkit_telemetry_spans_dropped_total")
    assert dropped[(("reason", "queue_full"),)] == stats["dropped_queue_full"]
    assert dropped[(("reason", "export_failed"),)] == stats["dropped_export_failed"]
    otelkit.shutdown()
    lost = sum(n for key, n in stats.items() if key.startswith("dropped_"))
    final = telemetry.stats()
    assert sum(n for k, n in final.items() if k.startswith("dropped_")) == 50
    assert lost <= 50
    assert any("lost" in r.getMessage() and "spans" in r.getMessage() for r in caplog.records)


def test_histogram_buckets_carry_the_trace_id_as_exemplar(tmp_path: Path) -> None:
    telemetry = otelkit.configure(traces_dir=str(tmp_path), prometheus_port=0)
    histogram = metrics.get_meter("tests").create_histogram("tests.call.duration", unit="s")
    with trace.get_tracer("tests").start_as_current_span("call") as span:
        histogram.record(0.003, {"model": "gnn"})
        trace_id = f"{span.get_span_context().trace_id:032x}"
    assert telemetry.prometheus_url is not None
    exposition = scrape(telemetry.prometheus_url)
    exemplars = [
        (sample.labels.get("le"), sample.exemplar.labels["trace_id"], sample.exemplar.value)
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == "tests_call_duration_seconds_bucket" and sample.exemplar
    ]
    assert exemplars == [("0.005", trace_id, 0.003)]


def test_an_sdk_metric_named_like_a_hot_one_does_not_break_the_scrape(tmp_path: Path) -> None:
    """FastAPI >= 0.165 records http.server.request.duration through the SDK by itself; two
    families of one name make Prometheus reject the whole scrape, so otelkit's own one wins."""
    telemetry = otelkit.configure(traces_dir=str(tmp_path), prometheus_port=0)
    from otelkit._core.hotmetrics import HOT

    labels = (semconv.M_HTTP_METHOD, semconv.M_HTTP_ROUTE, semconv.M_HTTP_STATUS)
    HOT.histogram(semconv.HTTP_SERVER_DURATION, labels).series(("GET", "/x", "200")).observe(0.01)
    spec = semconv.HTTP_SERVER_DURATION
    clash = metrics.get_meter("fastapi").create_histogram(spec.name, unit=spec.unit)
    clash.record(0.5, {"http.request.method": "GET"})
    assert telemetry.prometheus_url is not None
    families = list(text_string_to_metric_families(scrape(telemetry.prometheus_url)))
    name = semconv.prometheus_name(spec)
    (family,) = [f for f in families if f.name == name]
    routes = [
        s.labels.get(semconv.M_HTTP_ROUTE) for s in family.samples if s.name == f"{name}_count"
    ]
    assert "/x" in routes  # otelkit's own series, the SDK's (no route label) left out
    assert None not in routes


def test_a_taken_prometheus_port_is_logged_and_tracing_still_works(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Five Triton stub processes sharing one environment must not fail to load their models
    because the first took the port: configure() logs why there is no endpoint and goes on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        with caplog.at_level(logging.ERROR, logger="otelkit"):
            telemetry = otelkit.configure(
                traces_dir=str(tmp_path), prometheus_port=port, prometheus_host="127.0.0.1"
            )
    assert telemetry.prometheus_url is None
    assert f"no Prometheus endpoint on 127.0.0.1:{port}" in caplog.text
    end_spans(3)
    otelkit.shutdown()
    assert len(load_spans(tmp_path)) == 3


def test_telemetry_health_metric_names_come_from_semconv(tmp_path: Path) -> None:
    telemetry = otelkit.configure(traces_dir=str(tmp_path), prometheus_port=0)
    end_spans(2)
    telemetry.flush()
    assert telemetry.prometheus_url is not None
    exposition = scrape(telemetry.prometheus_url)
    names = {s.name for f in text_string_to_metric_families(exposition) for s in f.samples}
    for spec in semconv.TELEMETRY_METRICS:
        assert semconv.prometheus_name(spec) in names
    exported = samples(exposition, semconv.prometheus_name(semconv.TELEMETRY_SPANS_EXPORTED))
    assert exported == {(): 2.0}


def test_resource_detects_slurm_and_kubernetes(tmp_path: Path) -> None:
    namespace = tmp_path / "namespace"
    namespace.write_text("physics\n")
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "3",
        "SLURMD_NODENAME": "nid001",
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "HOSTNAME": "triton-7f9c",
    }
    found = detect(env, pid=7, host="nid001", namespace_file=namespace)
    assert {k: v for k, v in found.items() if k.startswith(("slurm.", "k8s."))} == {
        "slurm.job.id": "4242",
        "slurm.step.id": "3",
        "slurm.node.name": "nid001",
        "k8s.pod.name": "triton-7f9c",
        "k8s.namespace.name": "physics",
    }
    outside = detect({"HOSTNAME": "laptop"}, pid=7, host="laptop", namespace_file=namespace)
    assert not [k for k in outside if k.startswith(("slurm.", "k8s."))]


def test_resource_attributes_argument_and_service_name(tmp_path: Path) -> None:
    telemetry = otelkit.configure(
        service_name="svc",
        resource_attributes={"deployment.environment": "test"},
        traces_dir=str(tmp_path),
    )
    attributes = telemetry.tracer_provider.resource.attributes
    assert attributes["service.name"] == "svc"
    assert attributes["deployment.environment"] == "test"
    assert attributes["host.name"] == socket.gethostname()


def run_script(code: str, tmp_path: Path, **popen: object) -> subprocess.Popen[str]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "traces")],
        stdout=subprocess.PIPE,
        text=True,
        **popen,  # type: ignore[call-overload]
    )


def test_sigterm_after_n_spans_leaves_exactly_n_in_the_sink(tmp_path: Path) -> None:
    process = run_script(
        """
        import sys, time, otelkit
        from opentelemetry import trace
        otelkit.configure(service_name="killed", traces_dir=sys.argv[1],
                          bsp_schedule_delay_ms=600_000, bsp_max_export_batch_size=2048)
        tracer = trace.get_tracer("t")
        for i in range(137):
            tracer.start_span("s").end()
        print("ready", flush=True)
        time.sleep(60)
        """,
        tmp_path,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == -signal.SIGTERM
    assert len(load_spans(tmp_path / "traces")) == 137


def test_forked_children_get_working_exporters(tmp_path: Path) -> None:
    process = run_script(
        """
        import multiprocessing, os, sys, otelkit
        from opentelemetry import trace
        otelkit.configure(service_name="forking", traces_dir=sys.argv[1],
                          bsp_schedule_delay_ms=600_000)
        tracer = trace.get_tracer("t")
        tracer.start_span("parent-before-fork").end()

        def child(n):
            for _ in range(n):
                tracer.start_span(f"child-{os.getpid()}").end()

        ctx = multiprocessing.get_context("fork")
        workers = [ctx.Process(target=child, args=(10,)) for _ in range(3)]
        for w in workers: w.start()
        for w in workers: w.join()
        tracer.start_span("parent-after-fork").end()
        print(",".join(str(w.pid) for w in workers), flush=True)
        """,
        tmp_path,
    )
    stdout, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    pids = stdout.strip().split(",")
    spans = load_spans(tmp_path / "traces")
    names = sorted(s.name for s in spans)
    expected = sorted(
        ["parent-before-fork", "parent-after-fork"]
        + [f"child-{pid}" for pid in pids for _ in range(10)]
    )
    assert names == expected
    files = sorted(p.name for p in (tmp_path / "traces").glob("*.jsonl"))
    assert len(files) == 4  # one per process: the parent and each child


def test_flush_makes_spans_visible_before_exit(tmp_path: Path) -> None:
    telemetry = otelkit.configure(traces_dir=str(tmp_path), bsp_schedule_delay_ms=600_000)
    end_spans(7)
    start = time.monotonic()
    assert otelkit.flush(timeout_s=5)
    assert time.monotonic() - start < 5
    lines = [
        json.loads(line) for f in tmp_path.glob("*.jsonl") for line in f.read_text().splitlines()
    ]
    assert (
        sum(
            len(ss["spans"])
            for doc in lines
            for rs in doc["resourceSpans"]
            for ss in rs["scopeSpans"]
        )
        == 7
    )
    assert telemetry.stats()["exported"] == 7
