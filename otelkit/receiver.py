"""An embedded OTLP/HTTP trace receiver: the local default sink, no Collector needed.

``POST /v1/traces`` in protobuf or JSON, gzip, deflate or plain, with a ``Content-Length`` or
chunked (Envoy's OTLP exporter sends chunks); each request becomes one OTLP JSON line of
``traces.jsonl``, which ``otelkit.analysis`` loads, or (``formats``) the span store's rows, its
segments made of the requests as they came (``_staged``). Memory stays bounded: bodies
over the size limits get 413; a request beyond the concurrency limit waits for a slot, and
after ``slot_wait_s`` gets 503 with ``Retry-After``, which OTLP exporters retry, so a busy
receiver slows clients, losing nothing (exporters that do not retry, as Triton's, lose only
what waited longer than ``slot_wait_s``). Its threads are a ``ThreadGroup``: a process that
embeds it reads their CPU time apart from its own (``cpu_s``). ``ReceiverProcess`` runs it in a
process of its own instead, controlled through that process's standard input: what a process
that measures its own CPU and needs its own GIL (a study's driver) runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
import zlib
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otelkit._core.signals import stop_on_signals
from otelkit._core.threads import ThreadGroup
from otelkit.analysis._staged import StagedSegmentWriter
from otelkit.analysis._store import StoreError
from otelkit.export._jsonl import JsonLinesWriter
from otelkit.export._otlp_json import dumps, request_to_json, span_count
from otelkit.export._otlp_json_normalize import normalize_json

__all__ = ["Receiver", "ReceiverProcess", "add_arguments", "run"]

_log = logging.getLogger("otelkit.receiver")

TRACES_PATH = "/v1/traces"
#: what the receiver writes: OTLP JSON lines (``traces.jsonl``), the span store's segments
FORMATS = ("jsonl", "parquet")
_PROTOBUF, _JSON = "application/x-protobuf", "application/json"
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}  # deflate is zlib-wrapped
_CHUNK_LINE_LIMIT = 4096  # a chunk's size line, with its extensions; a trailer line
_DRAIN_LIMIT = 64 << 20  # a rejected body up to this size is read, to keep the connection


class _Reject(Exception):
    def __init__(self, status: HTTPStatus, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status, self.close = status, close


class _Served:
    """Where a receiver serves: its host and bound port, and the URLs an exporter takes."""

    host: str
    _port: int

    @property
    def port(self) -> int:
        """The bound TCP port (the chosen one when constructed with ``port=0``)."""
        if not self._port:
            raise RuntimeError("the receiver is not started: call start() first")
        return self._port

    @property
    def endpoint(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:4318``: what ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes."""
        return f"http://{self.host}:{self.port}"

    @property
    def traces_url(self) -> str:
        """The traces URL, ``<endpoint>/v1/traces``: what ``OTLPSpanExporter(endpoint=)`` takes."""
        return self.endpoint + TRACES_PATH


class Receiver(_Served):
    """An OTLP/HTTP trace receiver serving on a background thread; a context manager.

    ``max_body_bytes`` bounds a body as sent, ``max_decoded_bytes`` once inflated (a gzip bomb
    stops there); ``max_concurrent`` bounds the requests decoded at once, and a request waits
    at most ``slot_wait_s`` for one before it is refused (503). A protobuf request
    takes about 20 times its decoded size while converted: 1.3 GB at worst with the defaults.

    >>> with Receiver("./otelkit-traces") as receiver:  # doctest: +SKIP
    ...     print(receiver.traces_url)
    http://127.0.0.1:40123/v1/traces
    """

    def __init__(
        self,
        out_dir: str | Path,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_body_bytes: int = 16 << 20,
        max_decoded_bytes: int = 16 << 20,
        max_concurrent: int = 4,
        slot_wait_s: float = 2.0,
        max_file_bytes: int | None = None,
        formats: tuple[str, ...] = ("jsonl",),
        segment_spans: int = 100_000,
        segment_age_s: float = 60.0,
    ) -> None:
        unknown = set(formats) - set(FORMATS)
        if unknown or not formats:
            raise ValueError(f"formats: one or both of {FORMATS}, not {formats!r}")
        self.out_dir, self.host, self._requested_port = Path(out_dir), host, port
        self.out_path = self.out_dir / "traces.jsonl"
        self.formats = tuple(formats)
        self._segment_spans, self._segment_age_s = segment_spans, segment_age_s
        self._segments: StagedSegmentWriter | None = None
        self._spans_unsegmented = 0  # of the segment writers stopped
        self.max_body_bytes, self.max_decoded_bytes = max_body_bytes, max_decoded_bytes
        self.max_concurrent, self.max_file_bytes = max_concurrent, max_file_bytes
        self.slot_wait_s = slot_wait_s
        self._slots = threading.Semaphore(max_concurrent)
        self._changed = threading.Condition()
        self._spans_stored = self._requests_rejected = self._port = 0
        self._server: _Server | None = None
        self._writer: JsonLinesWriter | None = None
        self._threads = ThreadGroup()  # the serving thread and one per connection

    def start(self) -> Receiver:
        """Bind, open ``out_dir/traces.jsonl`` for appending and serve on a daemon thread."""
        server = _Server((self.host, self._requested_port), _Handler)
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            if "jsonl" in self.formats:
                self._writer = JsonLinesWriter(self.out_path, max_bytes=self.max_file_bytes)
            if "parquet" in self.formats:
                self._segments = StagedSegmentWriter(
                    self.out_dir,
                    max_spans=self._segment_spans,
                    max_age_s=self._segment_age_s,
                )
        except (OSError, StoreError):
            server.server_close()
            raise
        self._server, server.receiver, server.connections = server, self, set()
        self._port = int(server.server_address[1])
        serve = threading.Thread(target=self._serve, args=(server,), daemon=True)
        serve.name = f"otelkit-receiver-{self.port}"
        serve.start()
        return self

    def _serve(self, server: _Server) -> None:
        with self._threads.member():
            server.serve_forever(0.1)

    def flush(self) -> None:
        """Make every span stored so far readable: the JSON lines flushed, the segment being
        filled written (a study calls it at the end of each point)."""
        if self._segments is not None:  # JSON lines are flushed line by line
            self._segments.flush()

    def rotate(self) -> None:
        """Write the segment being filled if its first span has waited ``segment_age_s``: what
        a receiver left running calls now and then (spans arriving check it too)."""
        if self._segments is not None:
            self._segments.rotate()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, let requests in progress finish, then flush and close the files."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        deadline = time.monotonic() + timeout
        held = sum(  # every slot held: no request is in progress
            self._slots.acquire(timeout=max(0.0, deadline - time.monotonic()))
            for _ in range(self.max_concurrent)
        )
        for connection in list(self._server.connections):  # wake idle keep-alive threads
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        if self._writer is not None:
            self._writer.close()
        if self._segments is not None:
            self._segments.close()
            self._spans_unsegmented += self._segments.spans_failed
        self._server = self._writer = self._segments = None
        for _ in range(held):
            self._slots.release()

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def spans_stored(self) -> int:
        """Spans written to the file so far."""
        return self._spans_stored

    @property
    def spans_unsegmented(self) -> int:
        """Spans stored but in no segment: a staging file that could not become one (kept,
        for ``otelkit import``), or a message no way reads; each is logged as it happens."""
        found = self._segments.spans_failed if self._segments is not None else 0
        return self._spans_unsegmented + found

    @property
    def requests_rejected(self) -> int:
        """Requests answered with an error status (4xx or 5xx) so far."""
        return self._requests_rejected

    @property
    def thread_ids(self) -> set[int]:
        """The native ids (``threading.get_native_id()``) of the threads it runs now."""
        return self._threads.native_ids

    def cpu_s(self) -> float | None:
        """CPU seconds its threads have used so far (ended ones too), ``None`` where a thread's
        CPU time cannot be read: what a process embedding it leaves out of its own figure."""
        return self._threads.cpu_s()

    def wait_for_spans(self, n: int, timeout: float) -> bool:
        """Block until at least ``n`` spans are stored; False if ``timeout`` seconds pass first."""
        with self._changed:
            return self._changed.wait_for(lambda: self._spans_stored >= n, timeout)

    def _store(self, body: bytes, content_type: str) -> None:
        request, line = None, b""
        if content_type == _PROTOBUF:
            try:
                request = ExportTraceServiceRequest.FromString(body)
            except DecodeError as exc:
                raise _Reject(HTTPStatus.BAD_REQUEST, f"invalid protobuf body: {exc}") from exc
            spans = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        else:
            try:
                doc = normalize_json(json.loads(body))
            except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
                raise _Reject(HTTPStatus.BAD_REQUEST, f"invalid JSON body: {exc}") from exc
            spans, line = span_count(doc), dumps(doc)
        if not spans:
            self._count()
            return
        if self._writer is None and self._segments is None:
            raise _Reject(HTTPStatus.SERVICE_UNAVAILABLE, "the receiver is stopping")
        if self._segments is not None:
            # a segment is made of the request as it came; a staged message beginning with
            # "{" is read as OTLP JSON (the Collector's framing), which no exporter's
            # protobuf does (a group of field 15): written again, it begins with its fields
            if request is not None and body[:1] == b"{":
                body = request.SerializeToString()
            self._segments.add_message(body if request is not None else line, spans)
        if self._writer is not None:
            self._writer.write_line(line if request is None else dumps(request_to_json(request)))
        self._count(spans=spans)

    def _count(self, spans: int = 0, rejected: int = 0) -> None:
        with self._changed:
            self._spans_stored += spans
            self._requests_rejected += rejected
            self._changed.notify_all()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    receiver: Receiver
    connections: set[socket.socket]

    def process_request(self, request: Any, client_address: Any) -> None:
        self.connections.add(request)
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self.receiver._threads.member():  # a connection's thread, for as long as it lasts
            super().process_request_thread(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-request is routine; anything else is a bug worth a trace.
        if isinstance(sys.exc_info()[1], OSError):
            _log.debug("connection from %s dropped", client_address, exc_info=True)
        else:
            _log.exception("error serving %s", client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: OTel exporters reuse one connection
    disable_nagle_algorithm = True  # headers and body go out in separate writes
    timeout = 75  # idle keep-alive connections close; longer than the batch processor's 5 s
    server: _Server
    _unread = 0  # bytes of the request body not read yet
    _chunked = False  # a chunked body not read yet: a reject closes the connection

    def do_POST(self) -> None:
        receiver, self._unread, self._chunked = self.server.receiver, 0, False
        try:
            content_type, coding = self._check_headers(receiver)
            if not receiver._slots.acquire(timeout=receiver.slot_wait_s):
                raise _Reject(HTTPStatus.SERVICE_UNAVAILABLE, "receiver busy, retry later")
            try:
                body = self._read_body(receiver.max_body_bytes)
                receiver._store(_decode(body, coding, receiver.max_decoded_bytes), content_type)
            finally:
                receiver._slots.release()
        except Exception as exc:
            if not isinstance(exc, _Reject):  # a full disk, say: 503, and the client retries
                _log.exception("cannot store a request")
                exc = _Reject(HTTPStatus.SERVICE_UNAVAILABLE, f"cannot store: {exc}")
            receiver._count(rejected=1)
            self._reject(exc)
            return
        self._reply(HTTPStatus.OK, b"" if content_type == _PROTOBUF else b"{}", content_type)

    def do_GET(self) -> None:
        traces = self.path.split("?")[0] == TRACES_PATH
        status = HTTPStatus.METHOD_NOT_ALLOWED if traces else HTTPStatus.NOT_FOUND
        self.server.receiver._count(rejected=1)
        self._unread = 0
        self._reject(_Reject(status, f"{self.command} {self.path}: only POST {TRACES_PATH}"))

    def _check_headers(self, receiver: Receiver) -> tuple[str, str]:
        length = self.headers.get("Content-Length")
        transfer = self.headers.get("Transfer-Encoding")
        if transfer is not None:
            # a length beside it is how requests are smuggled past proxies: refuse both
            if transfer.strip().lower() != "chunked" or length is not None:
                raise _Reject(
                    HTTPStatus.BAD_REQUEST,
                    f"Transfer-Encoding {transfer!r}: only chunked, and without Content-Length",
                    close=True,
                )
            self._chunked = True
        elif length is None or not length.strip().isdigit():
            raise _Reject(
                HTTPStatus.LENGTH_REQUIRED, "Content-Length or chunked required", close=True
            )
        else:
            self._unread = int(length)
        if (path := self.path.split("?")[0]) != TRACES_PATH:
            raise _Reject(HTTPStatus.NOT_FOUND, f"no such path {path}: use {TRACES_PATH}")
        if self._unread > receiver.max_body_bytes:
            raise _Reject(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"body of {self._unread} bytes exceeds the limit of {receiver.max_body_bytes}",
            )
        content_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        coding = self.headers.get("Content-Encoding", "identity").strip().lower()
        if content_type not in (_PROTOBUF, _JSON) or coding not in ("identity", *_WBITS):
            raise _Reject(
                HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                f"unsupported Content-Type {content_type!r} / Content-Encoding {coding!r}: "
                f"send {_PROTOBUF} or {_JSON}, optionally gzip or deflate",
            )
        return content_type, coding

    def _read_body(self, limit: int) -> bytes:
        if not self._chunked:
            body = self.rfile.read(self._unread)
            if len(body) < self._unread:
                raise _Reject(HTTPStatus.BAD_REQUEST, "body cut short", close=True)
            self._unread = 0
            return body
        chunks: list[bytes] = []
        size = 0
        while True:  # RFC 9112, 7.1: size in hex, extensions after ";", CRLF, data, CRLF
            line = self._chunk_line()
            digits = line.split(b";", 1)[0].strip()
            try:
                chunk = int(digits, 16)
            except ValueError:
                raise _Reject(
                    HTTPStatus.BAD_REQUEST, f"bad chunk size {digits[:32]!r}", close=True
                ) from None
            if chunk == 0:
                break
            size += chunk
            if size > limit:
                raise _Reject(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    f"chunked body over the limit of {limit} bytes",
                    close=True,
                )
            data = self.rfile.read(chunk)
            if len(data) < chunk or self.rfile.read(2) != b"\r\n":
                raise _Reject(HTTPStatus.BAD_REQUEST, "chunk cut short", close=True)
            chunks.append(data)
        while self._chunk_line():  # trailer fields, up to the empty line; none is used
            pass
        self._chunked = False
        return b"".join(chunks)

    def _chunk_line(self) -> bytes:
        line = self.rfile.readline(_CHUNK_LINE_LIMIT + 1)
        if len(line) > _CHUNK_LINE_LIMIT or not line.endswith(b"\n"):
            raise _Reject(HTTPStatus.BAD_REQUEST, "chunked body cut short", close=True)
        return line.rstrip(b"\r\n")

    def _reject(self, reject: _Reject) -> None:
        close = reject.close or self._chunked or self._unread > _DRAIN_LIMIT
        while self._unread > 0 and not close:  # drop the body to keep the connection usable
            chunk = self.rfile.read(min(self._unread, 1 << 16))
            close, self._unread = not chunk, self._unread - len(chunk)
        headers = {"Connection": "close"} if close else {}
        if reject.status == HTTPStatus.SERVICE_UNAVAILABLE:
            headers["Retry-After"] = "1"  # OTLP exporters wait this long, then retry
        body = f"{reject.status.value} {reject.status.phrase}: {reject}\n".encode()
        self._reply(reject.status, body, "text/plain; charset=utf-8", **headers)

    def _reply(self, status: HTTPStatus, body: bytes, content_type: str, **headers: str) -> None:
        self.send_response(status)
        headers = {"Content-Type": content_type, "Content-Length": str(len(body)), **headers}
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("%s %s", self.address_string(), format % args)


def _decode(body: bytes, coding: str, limit: int) -> bytes:
    if coding == "identity":
        return body
    inflater = zlib.decompressobj(_WBITS[coding])
    try:
        data = inflater.decompress(body, limit + 1)  # never inflate more than the limit
    except zlib.error as exc:
        raise _Reject(HTTPStatus.BAD_REQUEST, f"invalid {coding} body: {exc}") from exc
    if len(data) > limit:
        raise _Reject(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body inflates past {limit} bytes")
    if not inflater.eof:
        raise _Reject(HTTPStatus.BAD_REQUEST, f"truncated {coding} body")
    return data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``otelkit receive`` options: ``--host``, ``--port`` and ``--out``."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=4318, help="TCP port (OTLP/HTTP: 4318)")
    parser.add_argument(
        "--out", default="./otelkit-traces", help="directory for traces.jsonl and segments"
    )
    parser.add_argument(
        "--format",
        choices=("jsonl", "parquet", "both"),
        default="jsonl",
        help="OTLP JSON lines (traces.jsonl, the default), the span store's zstd Parquet "
        "segments (spans-NNNNN.parquet: otelkit[store]), or both",
    )
    parser.add_argument(
        "--segment-spans",
        type=int,
        default=100_000,
        help="spans a segment holds before it is written (default 100,000)",
    )
    parser.add_argument(
        "--segment-age",
        type=float,
        default=60.0,
        help="seconds a segment's first span waits at most before it is written (default 60)",
    )
    parser.add_argument(
        "--max-concurrent",
        type=int,
        default=4,
        help="requests decoded at once; one beyond waits for a slot (default 4)",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="for a parent process: print 'listening PORT' once serving, write what has "
        "arrived on each 'flush' line read from standard input (answering 'flushed N', the "
        "spans stored), and stop at its end",
    )


def run(args: argparse.Namespace, *, log_every: float = 30.0) -> int:
    """Serve until SIGTERM or SIGINT (or, with ``--control``, the end of standard input), then
    flush and return 0 (1 if it cannot start)."""
    formats = ("jsonl", "parquet") if args.format == "both" else (args.format,)
    receiver = Receiver(
        args.out,
        args.host,
        args.port,
        formats=formats,
        segment_spans=args.segment_spans,
        segment_age_s=args.segment_age,
        max_concurrent=getattr(args, "max_concurrent", 4),
    )
    try:
        receiver.start()
    except (OSError, StoreError) as exc:
        _log.error("cannot start the receiver on %s:%s: %s", args.host, args.port, exc)
        return 1
    written = receiver.out_path if "jsonl" in formats else receiver.out_dir
    _log.info("receiving OTLP/HTTP traces on %s, writing %s", receiver.traces_url, written)
    logged, last = (0, 0), time.monotonic()
    with stop_on_signals() as stop:
        if getattr(args, "control", False):
            _answer(f"listening {receiver.port}")
            control = threading.Thread(target=_controlled, args=(receiver, stop), daemon=True)
            control.name = "otelkit-receiver-control"
            control.start()
        try:
            while not stop.wait(min(log_every, 1.0)):
                receiver.rotate()
                if time.monotonic() - last < log_every:
                    continue
                last = time.monotonic()
                if (receiver.spans_stored, receiver.requests_rejected) != logged:
                    logged = (receiver.spans_stored, receiver.requests_rejected)
                    _log.info("%d spans stored, %d requests rejected", *logged)
        finally:
            receiver.stop()
    stored, rejected = receiver.spans_stored, receiver.requests_rejected
    _log.info("stopped: %d spans stored in %s, %d requests rejected", stored, written, rejected)
    if receiver.spans_unsegmented:
        _log.error("%d of the spans stored are in no segment", receiver.spans_unsegmented)
    return 0


def _answer(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _controlled(receiver: Receiver, stop: threading.Event) -> None:
    """``--control``: each ``flush`` line read makes what arrived readable and is answered
    with the spans stored; the end of standard input (the parent gone, or done) stops the
    receiver, which therefore never outlives its parent."""
    try:
        for line in sys.stdin:
            if line.strip() == "flush":
                receiver.flush()
                _answer(f"flushed {receiver.spans_stored}")
            elif line.strip():
                _answer(f"unknown {line.strip()[:40]!r}")
    except (OSError, ValueError) as exc:  # the pipe broken, or closed under the read
        _log.warning("control input lost: %s", exc)
    finally:
        stop.set()


class ReceiverProcess(_Served):
    """``otelkit receive --control`` in a process of its own, serving on loopback: the
    receiver of a process that measures its own CPU and GIL. Decoding and writing what it
    receives (about 10 µs of Python a span) then takes neither; ``flush`` makes what arrived
    readable (a segment has no footer until it is written) and waits for the answer.

    A receiver that does not answer within ``reply_timeout_s`` is not waited for again: its
    flushes are counted as ``flushes_failed`` and logged, and what it wrote stays readable.
    """

    def __init__(
        self,
        out_dir: str | Path,
        port: int = 0,
        *,
        formats: tuple[str, ...] = ("jsonl",),
        max_concurrent: int = 4,
        log_path: str | Path | None = None,
        start_timeout_s: float = 30.0,
        reply_timeout_s: float = 10.0,
    ) -> None:
        unknown = set(formats) - set(FORMATS)
        if unknown or not formats:
            raise ValueError(f"formats: one or both of {FORMATS}, not {formats!r}")
        self.out_dir, self.host, self._requested_port = Path(out_dir), "127.0.0.1", port
        self.formats, self.max_concurrent = tuple(formats), max_concurrent
        self.log_path = Path(log_path) if log_path is not None else None
        self.start_timeout_s, self.reply_timeout_s = start_timeout_s, reply_timeout_s
        self.spans_stored = self.flushes_failed = self._port = 0
        self._process: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self._broken = False

    def start(self) -> ReceiverProcess:
        """Start the process and wait until it serves; OSError where it cannot (its log's
        last lines said)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_path or self.out_dir / "receiver.log"
        fmt = "both" if len(self.formats) == 2 else self.formats[0]
        command = [sys.executable, "-m", "otelkit.cli", "receive", "--control"]
        command += ["--host", self.host, "--port", str(self._requested_port)]
        command += ["--out", str(self.out_dir), "--format", fmt]
        command += ["--max-concurrent", str(self.max_concurrent)]
        # the child imports this otelkit, wherever it was imported from here
        root = str(Path(__file__).resolve().parents[1])
        path = os.environ.get("PYTHONPATH", "")
        env = dict(os.environ, PYTHONPATH=root + (os.pathsep + path if path else ""))
        with open(log_path, "ab") as log:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
            )
        line = self._read_line(self.start_timeout_s)
        if line is None or not line.startswith("listening "):
            self.stop()
            tail = log_path.read_text(errors="replace").splitlines()[-5:]
            raise OSError(
                f"the receiver did not start ({line or 'no answer'}): " + " | ".join(tail)
            )
        self._port = int(line.split()[1])
        return self

    def _read_line(self, timeout_s: float) -> str | None:
        """The process's next answer, or None after ``timeout_s`` or at its end."""
        process = self._process
        if process is None or process.stdout is None:
            return None
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            if not selector.select(timeout_s):
                return None
        line = process.stdout.readline()
        return line.strip() or None

    def flush(self) -> None:
        """Make every span received so far readable, and wait for the process to say so."""
        with self._lock:
            process = self._process
            if process is None or process.stdin is None or self._broken:
                self.flushes_failed += 1
                return
            try:
                process.stdin.write("flush\n")
                process.stdin.flush()
            except (OSError, ValueError) as exc:
                self._fail(f"cannot ask it to flush: {exc}")
                return
            line = self._read_line(self.reply_timeout_s)
            if line is None or not line.startswith("flushed "):
                self._fail(f"no answer to a flush within {self.reply_timeout_s:g} s ({line})")
                return
            self.spans_stored = int(line.split()[1])

    def _fail(self, why: str) -> None:
        self._broken = True
        self.flushes_failed += 1
        _log.warning("the receiver process %s: %s", self._process and self._process.pid, why)

    def stop(self, timeout: float = 10.0) -> None:
        """End its input (it flushes, closes its files and exits); killed after ``timeout``."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if process.stdin is not None:
                process.stdin.close()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            _log.warning(
                "the receiver process %d did not stop in %g s: killed", process.pid, timeout
            )
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> ReceiverProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def cpu_s(self) -> float | None:
        """None: its CPU is its own process's, not this one's."""
        return None
