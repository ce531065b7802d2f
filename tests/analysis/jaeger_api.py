"""A Jaeger v2 query service's api_v3 ``FindTraces``, over a real gRPC server and a real HTTP
server, answering from fixed spans: what otelkit's Jaeger reader is tested against.

Written from the published API (jaeger-idl ``proto/api_v3/query_service.proto`` at
74be5630c18f2cd8446073a101b6c9e30bc4b4b6; jaeger's api_v3 handlers, ``grpc_handler.go``,
``http_gateway.go`` and ``query_parser.go`` under ``cmd/jaeger/internal/extension/jaegerquery/
internal/apiv3`` at 8498073ff809b1a3923521920a9b1b017ea97ecf), and independently of
``otelkit.analysis._jaeger``: the gRPC request is decoded here from its wire format by hand, by
the field numbers and types of the proto's text, so a request the reader numbered wrongly is
refused rather than read back by the same mistake.

As Jaeger does:

- a trace matches when one of its spans is of the service (its resource's ``service.name``),
  has the operation's name (when one is asked) and started in ``[start_time_min,
  start_time_max)``; whole traces are answered, most recent first, ``search_depth`` at most (a
  LIMIT: with more matches, exactly ``search_depth`` come back, saying nothing of the rest;
  unset or 0: 100);
- gRPC streams one ``TracesData`` a trace, or, as raw traces may come, a trace in consecutive
  messages of ``chunk_spans`` spans; nothing matched: an empty stream; a request without a
  query, a window or a service: ``INVALID_ARGUMENT``;
- HTTP answers ``{"result": TracesData}`` in OTLP JSON (hex ids, integer enums), every trace of
  the search in one document; nothing matched: 404 with Jaeger's error JSON; parameters read by
  their canonical camelCase names first, then the snake_case aliases, ``query.num_traces``
  last; a missing or malformed one: 400 with the error JSON; any other path: Go's plain 404.

Every request is recorded (``requests``) with what was answered. It can also be told to
answer slowly (``delay_s``), with an error (``error``), with bytes that are not TracesData
(``reply``), without some spans (``hidden``: a partial trace), and to call ``on_search`` with
each request before it answers (to change what it holds between searches).
"""

from __future__ import annotations

import base64
import calendar
import contextlib
import copy
import json
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import grpc
from google.protobuf import json_format
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

SERVICE = "jaeger.api_v3.QueryService"
DEFAULT_SEARCH_DEPTH = 100  # Jaeger's, for a search that names none
NOT_FOUND = {"error": {"httpCode": 404, "message": "No traces found"}}

# The proto's text, field by field: (name, wire type: 0 varint, 2 length-delimited)
_FIND_TRACES_REQUEST = {1: ("query", 2)}
_TRACE_QUERY_PARAMETERS = {
    1: ("service_name", 2),
    2: ("operation_name", 2),
    3: ("attributes", 2),
    4: ("start_time_min", 2),
    5: ("start_time_max", 2),
    6: ("duration_min", 2),
    7: ("duration_max", 2),
    8: ("search_depth", 0),
    9: ("raw_traces", 0),
    10: ("filter", 2),
}
_TIMESTAMP = {1: ("seconds", 0), 2: ("nanos", 0)}
# Go's time.RFC3339Nano as time.Parse reads it
_RFC3339 = re.compile(
    r"^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$"
)


@dataclass
class Request:
    """One search as the server read it; ``answered``: the trace ids it sent back."""

    transport: str  # "grpc" or "http"
    service_name: str = ""
    operation_name: str = ""
    start_time_min: int = 0  # ns since the epoch
    start_time_max: int = 0
    search_depth: int = 0
    raw_traces: bool = False
    params: dict[str, list[str]] = field(default_factory=dict)  # HTTP: the query string
    fields: list[int] = field(default_factory=list)  # gRPC: TraceQueryParameters' numbers
    answered: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Held:
    """One span as the store holds it, with the resource and scope it came under."""

    trace_id: str
    span_id: str
    service: str
    name: str
    start_ns: int
    group: tuple[int, int, int]  # line, resourceSpans, scopeSpans: the spans sent together
    resource_spans: dict[str, Any]  # without its scopeSpans
    scope_spans: dict[str, Any]  # without its spans
    span: dict[str, Any]


def _held(path: Path) -> list[_Held]:
    """The spans of an OTLP JSON lines file (hex ids, as the Collector and otelkit write)."""
    out = []
    for line_no, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        for r, rs in enumerate(json.loads(line).get("resourceSpans", ())):
            attributes = rs.get("resource", {}).get("attributes", ())
            service = next(
                (
                    a["value"].get("stringValue", "")
                    for a in attributes
                    if a["key"] == "service.name"
                ),
                "",
            )
            resource = {key: value for key, value in rs.items() if key != "scopeSpans"}
            for s, ss in enumerate(rs.get("scopeSpans", ())):
                scope = {key: value for key, value in ss.items() if key != "spans"}
                for span in ss.get("spans", ()):
                    out.append(
                        _Held(
                            span["traceId"],
                            span["spanId"],
                            service,
                            span.get("name", ""),
                            int(span.get("startTimeUnixNano", 0)),
                            (line_no, r, s),
                            resource,
                            scope,
                            span,
                        )
                    )
    return out


def otlp_json(spans: list[_Held]) -> dict[str, Any]:
    """``spans`` as one OTLP JSON TracesData, each resource and scope with its spans."""
    resource_spans: list[dict[str, Any]] = []
    scopes: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
    for held in spans:
        if held.group not in scopes:
            scopes[held.group] = []
            scope = {**held.scope_spans, "spans": scopes[held.group]}
            resource_spans.append({**held.resource_spans, "scopeSpans": [scope]})
        scopes[held.group].append(held.span)
    return {"resourceSpans": resource_spans}


def traces_data(doc: dict[str, Any]) -> bytes:
    """An OTLP JSON document as a serialised ``TracesData`` (protobuf's JSON reads ids as
    base64, OTLP JSON writes them as hex)."""
    doc = copy.deepcopy(doc)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for holder in (span, *span.get("links", ())):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if holder.get(key):
                            holder[key] = base64.b64encode(bytes.fromhex(holder[key])).decode()
    message: bytes = json_format.ParseDict(doc, TracesData()).SerializeToString()
    return message


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("a varint cut short")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return value, at


def _message(data: bytes, fields: dict[int, tuple[str, int]]) -> dict[str, Any]:
    """A protobuf message's fields by name, each field's wire type checked against the proto;
    ``"unknown"``: the numbers of fields it does not name; ``"numbers"``: all, in order."""
    out: dict[str, Any] = {"unknown": [], "numbers": []}
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value: int | bytes
            value, at = _varint(data, at)
        elif wire == 2:
            size, at = _varint(data, at)
            value, at = data[at : at + size], at + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, at = data[at : at + size], at + size
        else:
            raise ValueError(f"field {number}: wire type {wire}")
        out["numbers"].append(number)
        if number not in fields:
            out["unknown"].append(number)
            continue
        name, expected = fields[number]
        if wire != expected:
            raise ValueError(
                f"field {number} ({name}): wire type {wire}, the proto says {expected}"
            )
        out[name] = value
    return out


def _timestamp(data: bytes) -> int:
    stamp = _message(data, _TIMESTAMP)
    return int(stamp.get("seconds", 0)) * 1_000_000_000 + int(stamp.get("nanos", 0))


def _parse_rfc3339(text: str) -> int:
    found = _RFC3339.match(text)
    if found is None:
        raise ValueError(f"parsing time {text!r} as RFC3339Nano")
    year, month, day, hour, minute, second, fraction, zone = found.groups()
    seconds = calendar.timegm(
        (int(year), int(month), int(day), int(hour), int(minute), int(second), 0, 0, 0)
    )
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        seconds -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return seconds * 1_000_000_000 + int((fraction or "").ljust(9, "0"))


class JaegerAPI:
    """The api_v3 FindTraces of a Jaeger holding the spans of ``path`` (OTLP JSON lines), on
    127.0.0.1: ``grpc_url`` and ``http_url`` once started (a context manager)."""

    def __init__(self, path: Path) -> None:
        self.spans = _held(path)
        self.requests: list[Request] = []
        self.chunk_spans = 0
        self.delay_s = 0.0
        self.error: str | None = None
        self.reply: bytes | None = None
        self.hidden: set[str] = set()
        self.on_search: Callable[[Request], None] | None = None
        self._released = threading.Event()
        self._grpc: Any = None
        self._http: ThreadingHTTPServer | None = None

    # the servers

    def __enter__(self) -> JaegerAPI:
        self._grpc = grpc.server(ThreadPoolExecutor(max_workers=4))
        handler = grpc.method_handlers_generic_handler(
            SERVICE, {"FindTraces": grpc.unary_stream_rpc_method_handler(self._grpc_find)}
        )
        self._grpc.add_generic_rpc_handlers((handler,))
        self.grpc_port = self._grpc.add_insecure_port("127.0.0.1:0")
        self._grpc.start()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._http.daemon_threads = True
        self.http_port = self._http.server_address[1]
        threading.Thread(target=self._http.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._released.set()  # a delayed answer stops waiting
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        if self._grpc is not None:
            self._grpc.stop(grace=None).wait(5)

    @property
    def grpc_url(self) -> str:
        return f"jaeger://127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"jaeger+http://127.0.0.1:{self.http_port}"

    # the search, as both transports share it

    def matches(self, request: Request) -> list[list[_Held]]:
        """The traces ``request`` finds, whole, most recent first, ``search_depth`` at most."""
        traces: dict[str, list[_Held]] = {}
        for held in self.spans:
            if held.span_id not in self.hidden:
                traces.setdefault(held.trace_id, []).append(held)
        found = [
            spans
            for spans in traces.values()
            if any(
                held.service == request.service_name
                and (not request.operation_name or held.name == request.operation_name)
                and request.start_time_min <= held.start_ns < request.start_time_max
                for held in spans
            )
        ]
        found.sort(key=lambda spans: min(held.start_ns for held in spans), reverse=True)
        depth = request.search_depth if request.search_depth > 0 else DEFAULT_SEARCH_DEPTH
        return found[:depth]

    def _searched(self, request: Request) -> list[list[_Held]] | None:
        """Record ``request``, wait ``delay_s``, and find its traces (None: ``error``/``reply``
        answer instead)."""
        self.requests.append(request)
        if self.on_search is not None:
            self.on_search(request)
        if self.delay_s:
            self._released.wait(self.delay_s)
        if self.error is not None or self.reply is not None:
            return None
        found = self.matches(request)
        request.answered = [spans[0].trace_id for spans in found]
        return found

    # gRPC

    def _grpc_find(self, body: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        query: dict[str, Any] | None = None
        request = Request("grpc")
        try:
            outer = _message(body, _FIND_TRACES_REQUEST)
            if "query" in outer:
                query = _message(outer["query"], _TRACE_QUERY_PARAMETERS)
            if query is not None:
                request.service_name = query.get("service_name", b"").decode()
                request.operation_name = query.get("operation_name", b"").decode()
                request.start_time_min = _timestamp(query.get("start_time_min", b""))
                request.start_time_max = _timestamp(query.get("start_time_max", b""))
                request.search_depth = int(query.get("search_depth", 0))
                request.raw_traces = bool(query.get("raw_traces", 0))
                request.fields = query["numbers"]
        except (ValueError, UnicodeDecodeError) as error:
            context.abort(grpc.StatusCode.INTERNAL, f"grpc: error unmarshalling request: {error}")
        if query is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "missing query")
        if not request.start_time_min or not request.start_time_max:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "start time min and max are required parameters"
            )
        if not request.service_name:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "service name is required")
        found = self._searched(request)
        if self.error is not None:
            context.abort(grpc.StatusCode.INTERNAL, self.error)
        if self.reply is not None:
            yield self.reply
            return
        for spans in found or ():
            step = self.chunk_spans or len(spans)
            for start in range(0, len(spans), step):
                yield traces_data(otlp_json(spans[start : start + step]))

    # HTTP

    def http_find(self, params: dict[str, list[str]]) -> tuple[int, bytes]:
        """``GET /api/v3/traces`` with ``params``: the status and the body."""

        def get(*names: str) -> tuple[str, str]:
            for name in names:
                if params.get(name, [""])[0]:
                    return params[name][0], name
            return "", names[-1]

        request = Request("http", params=params)
        request.service_name = get("query.serviceName", "query.service_name")[0]
        request.operation_name = get("query.operationName", "query.operation_name")[0]
        low, low_name = get("query.startTimeMin", "query.start_time_min")
        high, high_name = get("query.startTimeMax", "query.start_time_max")
        if not low or not high:
            return _error(400, "query.startTimeMin and query.startTimeMax are required")
        try:
            request.start_time_min = _parse_rfc3339(low)
        except ValueError as error:
            return _error(400, f"malformed parameter {low_name}: {error}")
        try:
            request.start_time_max = _parse_rfc3339(high)
        except ValueError as error:
            return _error(400, f"malformed parameter {high_name}: {error}")
        if request.start_time_min >= request.start_time_max:
            return _error(400, "query.startTimeMin must be before query.startTimeMax")
        depth, depth_name = get("query.searchDepth", "query.search_depth", "query.num_traces")
        raw, raw_name = get("query.rawTraces", "query.raw_traces")
        try:
            request.search_depth = int(depth) if depth else DEFAULT_SEARCH_DEPTH
        except ValueError as error:
            return _error(400, f"malformed parameter {depth_name}: {error}")
        if raw and raw.lower() not in ("1", "t", "true", "0", "f", "false"):
            return _error(400, f"malformed parameter {raw_name}: invalid syntax")
        request.raw_traces = raw.lower() in ("1", "t", "true")
        if not request.service_name:
            return _error(400, "service name is required")
        found = self._searched(request)
        if self.error is not None:
            return _error(500, self.error)
        if self.reply is not None:
            return 200, self.reply
        if not found:
            return 404, json.dumps(NOT_FOUND).encode() + b"\n"
        doc = otlp_json([held for spans in found for held in spans])
        return 200, json.dumps({"result": doc}).encode()


def _error(status: int, message: str) -> tuple[int, bytes]:
    """Jaeger's error JSON, as its gateway writes it (``http.Error``: a newline after)."""
    body = {"error": {"httpCode": status, "message": message}}
    return status, json.dumps(body).encode() + b"\n"


def _handler(api: JaegerAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path != "/api/v3/traces":
                self._send(404, b"404 page not found\n", plain=True)
                return
            status, body = api.http_find(parse_qs(url.query, keep_blank_values=True))
            self._send(status, body, plain=status != 200)

        def _send(self, status: int, body: bytes, *, plain: bool) -> None:
            self.send_response(status)
            # http.Error's type for errors, even its JSON ones; the marshaller's for answers
            kind = "text/plain; charset=utf-8" if plain else "application/json"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            # a client that stopped waiting (the slow server's) is gone
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the requests are recorded

    return Handler
