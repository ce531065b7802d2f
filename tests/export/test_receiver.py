"""The embedded OTLP/HTTP receiver, fed by the OpenTelemetry SDK's exporter and by raw bodies."""

from __future__ import annotations

import gzip
import http.client
import importlib.util
import json
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from google.protobuf.json_format import MessageToJson
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from otelkit.export._otlp_json import request_to_json, spans_to_json
from otelkit.receiver import Receiver, ReceiverProcess

PROTOBUF = {"Content-Type": "application/x-protobuf"}
# segments where the span store is installed (otelkit[store]; not in check-lowest's venv)
SEGMENTS = all(importlib.util.find_spec(m) is not None for m in ("pyarrow", "duckdb"))
FORMATS = ("parquet",) if SEGMENTS else ("jsonl",)
JSON = {"Content-Type": "application/json"}
TRACE_ID, SPAN_ID = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    with Receiver(tmp_path / "out") as started:
        yield started


def stored(receiver: Receiver) -> list[Any]:
    return [json.loads(line) for line in receiver.out_path.read_text().splitlines()]


def make_spans(n: int = 3) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "tests"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("tests")
    with tracer.start_as_current_span("infer", kind=SpanKind.CLIENT) as root:
        root.set_attribute("server.port", 8001)
        for i in range(n - 1):
            with tracer.start_as_current_span(f"stage-{i}") as stage:
                stage.add_event("COMPUTE_START", {"gpu": i})
    provider.shutdown()
    return list(memory.get_finished_spans())


def triton_body() -> dict[str, Any]:
    """What Triton's OpenTelemetry exporter posts: OTLP JSON with hex ids."""
    span = {
        "traceId": TRACE_ID,
        "spanId": SPAN_ID,
        "parentSpanId": "eee19b7ec3c1b173",
        "name": "compute",
        "kind": 2,
        "startTimeUnixNano": "1544712660000000000",
        "endTimeUnixNano": "1544712661000000000",
        "events": [{"timeUnixNano": "1544712660300000000", "name": "COMPUTE_START"}],
    }
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "triton"}}]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": [span]}]}]}


def test_sdk_exporter_through_a_tracer_provider(receiver: Receiver) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "client"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=receiver.traces_url)))
    tracer = provider.get_tracer("tests")
    with tracer.start_as_current_span("infer", kind=SpanKind.CLIENT) as root:
        root.set_attribute("rpc.method", "ModelInfer")
        with tracer.start_as_current_span("serialize") as child:
            child.add_event("done", {"bytes": 12})
    provider.shutdown()
    assert receiver.wait_for_spans(2, timeout=10)
    # SimpleSpanProcessor exports each span alone: one request, one line, per span.
    assert stored(receiver) == [spans_to_json([span]) for span in memory.get_finished_spans()]
    assert (receiver.spans_stored, receiver.requests_rejected) == (2, 0)


@pytest.mark.parametrize("compression", [Compression.Gzip, Compression.Deflate])
def test_sdk_exporter_compressed(receiver: Receiver, compression: Compression) -> None:
    spans = make_spans(5)
    exporter = OTLPSpanExporter(endpoint=receiver.traces_url, compression=compression)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert stored(receiver) == [spans_to_json(spans)]


def test_keeps_the_connection_alive_and_answers_in_protobuf(receiver: Receiver) -> None:
    body = encode_spans(make_spans(2)).SerializeToString()
    connection = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=10)
    sockets = []
    for _ in range(3):
        connection.request("POST", "/v1/traces", body=body, headers=PROTOBUF)
        response = connection.getresponse()
        reply = response.read()
        assert (response.status, response.getheader("Content-Type")) == (
            200,
            PROTOBUF["Content-Type"],
        )
        assert ExportTraceServiceResponse.FromString(reply) == ExportTraceServiceResponse()
        sockets.append(connection.sock)
    connection.close()
    assert sockets[0] is not None and sockets == [sockets[0]] * 3
    assert receiver.spans_stored == 6


def _exchange(receiver: Receiver, raw: bytes, hang_up: bool = False) -> tuple[bytes, bytes]:
    """``raw`` sent on one connection (then its sending side shut, with ``hang_up``); the first
    reply's status line, and what follows once the receiver closes the connection or 1 s
    passes (b"" when closed at once)."""
    with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as connection:
        connection.sendall(raw)
        if hang_up:
            connection.shutdown(socket.SHUT_WR)
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += connection.recv(4096)
        head, _, rest = reply.partition(b"\r\n\r\n")
        connection.settimeout(1.0)
        try:
            while chunk := connection.recv(4096):
                rest += chunk
        except TimeoutError:
            rest += b"(still open)"
    return head.split(b"\r\n")[0], rest


def chunked(body: bytes, size: int) -> bytes:
    """``body`` in chunks of ``size`` bytes, with an extension on the first and a trailer."""
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    coded = [
        f"{len(p):x}{';ext=1' if i == 0 else ''}\r\n".encode() + p + b"\r\n"
        for i, p in enumerate(pieces)
    ]
    return b"".join(coded) + b"0\r\nX-Trailer: ignored\r\n\r\n"


def test_chunked_bodies_are_stored_as_envoys_exporter_sends_them(receiver: Receiver) -> None:
    spans = make_spans(4)
    body = encode_spans(spans).SerializeToString()
    # requests sends a generator's pieces as chunks, with no Content-Length
    response = requests.post(
        receiver.traces_url,
        data=iter([body[:7], body[7:50], body[50:]]),
        headers=PROTOBUF,
        timeout=10,
    )
    assert response.request.headers.get("Transfer-Encoding") == "chunked"
    assert response.status_code == 200
    head = (
        b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    gzipped = gzip.compress(json.dumps(triton_body()).encode())
    status, _ = _exchange(receiver, head + chunked(gzipped, 10))
    assert status == b"HTTP/1.1 200 OK"
    assert stored(receiver) == [spans_to_json(spans), stored(receiver)[1]]
    assert stored(receiver)[1]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["name"] == (
        "compute"
    )
    assert (receiver.spans_stored, receiver.requests_rejected) == (5, 0)


@pytest.mark.parametrize(
    ("headers", "body", "status"),
    [
        ("Transfer-Encoding: chunked", b"zz\r\nabc\r\n0\r\n\r\n", b"400"),  # not hex
        ("Transfer-Encoding: chunked", b"a\r\nabc", b"400"),  # cut short: the client hangs up
        ("Transfer-Encoding: chunked", b"3\r\nabcXY0\r\n\r\n", b"400"),  # no CRLF after data
        ("Transfer-Encoding: chunked", b"f" * 5000 + b"\r\n", b"400"),  # a size line too long
        ("Transfer-Encoding: chunked", b"100001\r\n", b"413"),  # over max_body_bytes
        ("Transfer-Encoding: chunked\r\nContent-Length: 3", b"abc", b"400"),  # smuggling
        ("Transfer-Encoding: gzip, chunked", b"0\r\n\r\n", b"400"),
        ("", b"", b"411"),  # neither a length nor chunks
    ],
)
def test_malformed_framing_is_refused_and_the_connection_closed(
    tmp_path: Path, headers: str, body: bytes, status: bytes
) -> None:
    with Receiver(tmp_path, max_body_bytes=1 << 20) as receiver:
        extra = f"{headers}\r\n" if headers else ""
        head = f"POST /v1/traces HTTP/1.1\r\nHost: x\r\n{PROTOBUF_HEADER}{extra}\r\n"
        line, after = _exchange(receiver, head.encode() + body, hang_up=body.endswith(b"abc"))
        assert line.split(b" ")[1] == status
        assert after == b"" or not after.endswith(b"(still open)")  # closed: framing is lost
        assert (receiver.spans_stored, receiver.requests_rejected) == (0, 1)
        # the receiver serves the next connection as before
        ok = requests.post(receiver.traces_url, json=triton_body(), timeout=10)
        assert ok.status_code == 200 and receiver.spans_stored == 1


PROTOBUF_HEADER = "Content-Type: application/x-protobuf\r\n"


def test_json_with_hex_ids_as_triton_sends(receiver: Receiver) -> None:
    response = requests.post(receiver.traces_url, json=triton_body(), timeout=10)
    assert (response.status_code, response.json()) == (200, {})
    assert response.headers["Content-Type"] == "application/json"
    assert stored(receiver) == [triton_body()]


def test_json_with_base64_ids_as_protobuf_maps_them(receiver: Receiver) -> None:
    request = encode_spans(make_spans(3))
    body = MessageToJson(request)  # protobuf's canonical mapping: base64 ids, enum names
    assert '"kind": "SPAN_KIND_CLIENT"' in body
    headers = {"Content-Type": "application/json; charset=utf-8"}
    response = requests.post(receiver.traces_url, data=body, headers=headers, timeout=10)
    assert response.status_code == 200
    assert stored(receiver) == [request_to_json(request)]


def test_gzip_json(receiver: Receiver) -> None:
    body = gzip.compress(json.dumps(triton_body()).encode())
    headers = {**JSON, "Content-Encoding": "gzip"}
    assert requests.post(receiver.traces_url, data=body, headers=headers, timeout=10).ok
    assert stored(receiver) == [triton_body()]


@pytest.mark.parametrize(
    ("body", "headers", "message"),
    [
        (b"\xff\xff\xff", PROTOBUF, "invalid protobuf body"),
        (b'{"resourceSpans": [', JSON, "invalid JSON body"),
        (b'{"resourceSpans": {}}', JSON, "resourceSpans is not a list"),
        (json.dumps(triton_body()).replace(SPAN_ID, "eee19b").encode(), JSON, "spanId"),
        (b"not gzip", {**PROTOBUF, "Content-Encoding": "gzip"}, "invalid gzip body"),
        (gzip.compress(b"{}")[:-4], {**JSON, "Content-Encoding": "gzip"}, "truncated gzip"),
    ],
)
def test_malformed_body_gets_400_and_the_next_request_is_stored(
    receiver: Receiver, body: bytes, headers: dict[str, str], message: str
) -> None:
    with requests.Session() as session:  # one connection: the 400 must not break it
        response = session.post(receiver.traces_url, data=body, headers=headers, timeout=10)
        assert response.status_code == 400
        assert message in response.text
        valid = session.post(receiver.traces_url, json=triton_body(), timeout=10)
        assert valid.status_code == 200
    assert stored(receiver) == [triton_body()]
    assert (receiver.spans_stored, receiver.requests_rejected) == (1, 1)


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Type": "text/plain"},
        {"Content-Type": "application/x-protobuf", "Content-Encoding": "br"},
    ],
)
def test_unsupported_content_type_or_encoding_gets_415(
    receiver: Receiver, headers: dict[str, str]
) -> None:
    response = requests.post(receiver.traces_url, data=b"{}", headers=headers, timeout=10)
    assert response.status_code == 415
    assert "application/x-protobuf" in response.text


def test_unknown_path_gets_404_and_get_405(receiver: Receiver) -> None:
    assert requests.post(receiver.endpoint + "/v1/metrics", json={}, timeout=10).status_code == 404
    assert requests.get(receiver.traces_url, timeout=10).status_code == 405
    assert receiver.requests_rejected == 2


def test_oversized_and_inflating_bodies_get_413(tmp_path: Path) -> None:
    receiver = Receiver(tmp_path, max_body_bytes=16384, max_decoded_bytes=65536)
    with receiver, requests.Session() as session:
        big = session.post(receiver.traces_url, data=b"x" * 20000, headers=PROTOBUF, timeout=10)
        assert big.status_code == 413
        bomb = gzip.compress(b" " * 10_000_000)  # 10 MB of JSON whitespace in ~10 kB
        assert len(bomb) < 16384
        headers = {**JSON, "Content-Encoding": "gzip"}
        tracemalloc.start()
        inflated = session.post(receiver.traces_url, data=bomb, headers=headers, timeout=10)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 2_000_000  # the receiver stopped inflating at the limit
        assert (inflated.status_code, inflated.text) == (
            413,
            "413 Request Entity Too Large: body inflates past 65536 bytes\n",
        )
        assert session.post(receiver.traces_url, json=triton_body(), timeout=10).status_code == 200
        assert (receiver.spans_stored, receiver.requests_rejected) == (1, 2)


def _hold_the_slot(receiver: Receiver, body: bytes) -> socket.socket:
    """A connection that holds a slot while the rest of its body (after 10 bytes) waits."""
    slow = socket.create_connection(("127.0.0.1", receiver.port), timeout=10)
    head = (
        "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    slow.sendall(head.encode() + body[:10])
    return slow


def test_busy_receiver_answers_503_and_the_exporter_retries(tmp_path: Path) -> None:
    spans = make_spans(2)
    with Receiver(tmp_path, max_concurrent=1, slot_wait_s=0) as receiver:
        body = encode_spans(spans).SerializeToString()
        slow = _hold_the_slot(receiver, body)  # the only slot, while its body trickles in
        deadline, busy = time.monotonic() + 10, None
        while busy is None and time.monotonic() < deadline:
            response = requests.post(receiver.traces_url, data=b"", headers=PROTOBUF, timeout=10)
            busy = response if response.status_code == 503 else None
        assert busy is not None and busy.headers["Retry-After"] == "1"

        exporter = OTLPSpanExporter(endpoint=receiver.traces_url, timeout=20)
        results: list[SpanExportResult] = []
        thread = threading.Thread(target=lambda: results.append(exporter.export(spans)))
        thread.start()
        time.sleep(0.3)  # the exporter meets 503 and waits Retry-After before trying again
        slow.sendall(body[10:])
        assert slow.recv(1024).startswith(b"HTTP/1.1 200")
        thread.join(timeout=20)
        assert results == [SpanExportResult.SUCCESS]
        assert receiver.spans_stored == 4
        slow.close()


def test_a_request_waits_for_a_slot_before_it_is_refused(tmp_path: Path) -> None:
    """Exporters that never retry (Triton's) lose nothing to a burst shorter than the wait."""
    spans = make_spans(3)
    with Receiver(tmp_path, max_concurrent=1, slot_wait_s=10) as receiver:
        body = encode_spans(spans).SerializeToString()
        slow = _hold_the_slot(receiver, body)
        time.sleep(0.2)  # the slow request holds the slot now
        answers: list[int] = []
        waiting = threading.Thread(
            target=lambda: answers.append(
                requests.post(
                    receiver.traces_url, data=body, headers=PROTOBUF, timeout=20
                ).status_code
            )
        )
        waiting.start()
        time.sleep(0.5)
        assert answers == []  # still waiting for the slot, not refused
        slow.sendall(body[10:])
        assert slow.recv(1024).startswith(b"HTTP/1.1 200")
        waiting.join(timeout=20)
        assert answers == [200]
        assert (receiver.spans_stored, receiver.requests_rejected) == (6, 0)
        slow.close()


def test_stop_flushes_and_the_port_is_freed(tmp_path: Path) -> None:
    receiver = Receiver(tmp_path).start()
    port = receiver.port
    assert OTLPSpanExporter(endpoint=receiver.traces_url).export(make_spans(3)).name == "SUCCESS"
    receiver.stop()
    receiver.stop()  # idempotent
    assert len(stored(receiver)[0]["resourceSpans"][0]["scopeSpans"][0]["spans"]) == 3
    with pytest.raises(requests.ConnectionError):
        requests.post(f"http://127.0.0.1:{port}/v1/traces", json={}, timeout=2)


def test_run_serves_until_sigterm_and_logs_what_it_stored(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = textwrap.dedent(
        """
        import argparse, logging, sys
        from otelkit import receiver
        logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
        parser = argparse.ArgumentParser()
        receiver.add_arguments(parser)
        sys.exit(receiver.run(parser.parse_args(sys.argv[1:])))
        """
    )
    out = tmp_path / "traces"
    cmd = [sys.executable, "-c", script, "--port", str(port), "--out", str(out)]
    process = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    first = process.stderr.readline()
    url, path = f"http://127.0.0.1:{port}/v1/traces", out / "traces.jsonl"
    assert first == f"otelkit.receiver receiving OTLP/HTTP traces on {url}, writing {path}\n"
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")
    assert exporter.export(make_spans(4)) is SpanExportResult.SUCCESS
    process.send_signal(signal.SIGTERM)
    _, rest = process.communicate(timeout=30)
    assert process.returncode == 0
    assert rest.splitlines()[-1] == (
        f"otelkit.receiver stopped: 4 spans stored in {out / 'traces.jsonl'}, 0 requests rejected"
    )


def test_a_receiver_process_writes_what_arrived_on_each_flush_and_stops_with_its_input(
    tmp_path: Path,
) -> None:
    """What a study runs: the receiver in a process of its own, writing the span store's
    segments; each ``flush`` makes what arrived readable (a segment has no footer until it is
    written) and says how many spans it stored."""
    from otelkit.analysis import open_source
    from otelkit.analysis._loader import iter_spans

    receiver = ReceiverProcess(tmp_path / "traces", formats=FORMATS).start()
    try:
        assert receiver.pid is not None and receiver.cpu_s() is None
        exporter = OTLPSpanExporter(endpoint=receiver.traces_url)
        assert exporter.export(make_spans(4)) is SpanExportResult.SUCCESS
        receiver.flush()
        assert receiver.spans_stored == 4 and receiver.flushes_failed == 0
        files = open_source([tmp_path / "traces"]).files
        assert [f.suffix for f in files] == [".parquet" if SEGMENTS else ".jsonl"]
        assert sorted(s.name for s in iter_spans(*files)) == [
            "infer",
            "stage-0",
            "stage-1",
            "stage-2",
        ]
        assert exporter.export(make_spans(3)) is SpanExportResult.SUCCESS
        receiver.flush()
        assert receiver.spans_stored == 7
        assert len(open_source([tmp_path / "traces"]).files) == (2 if SEGMENTS else 1)
    finally:
        port, pid = receiver.port, receiver.pid
        receiver.stop()
        receiver.stop()  # idempotent
    with pytest.raises(requests.ConnectionError):
        requests.post(f"http://127.0.0.1:{port}/v1/traces", json={}, timeout=2)
    # the process is gone, and what it logged says what it stored
    assert pid is not None and not Path(f"/proc/{pid}").exists()
    log = (tmp_path / "traces" / "receiver.log").read_text()
    assert "stopped: 7 spans stored" in log
    # a flush after the stop is counted, not raised
    receiver.flush()
    assert receiver.flushes_failed == 1


def test_a_receiver_process_never_outlives_its_parent(tmp_path: Path) -> None:
    """A parent that dies without stopping it (killed, crashed) closes its input: the
    receiver stops within its next read, its segment written."""
    script = textwrap.dedent(
        f"""
        import os, sys
        from otelkit.receiver import ReceiverProcess
        receiver = ReceiverProcess({str(tmp_path / "traces")!r}, formats={FORMATS!r}).start()
        print(receiver.pid, receiver.port, flush=True)
        sys.stdin.readline()
        os._exit(9)  # no stop(), no atexit: as SIGKILL would leave it
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None and parent.stdin is not None
    pid, port = map(int, parent.stdout.readline().split())
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")
    assert exporter.export(make_spans(2)) is SpanExportResult.SUCCESS
    parent.stdin.write("go\n")
    parent.stdin.close()
    assert parent.wait(timeout=30) == 9
    deadline = time.monotonic() + 15
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists(), "the receiver outlived its parent"
    assert "stopped: 2 spans stored" in (tmp_path / "traces" / "receiver.log").read_text()


def test_a_receiver_process_that_cannot_bind_says_why(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=r"the receiver did not start.*cannot start the receiver"):
            ReceiverProcess(tmp_path, port=port).start()
