"""A Grafana Tempo HTTP API for tests: ``/api/search``, ``/api/v2/traces/<id>`` and
``/api/traces/<id>`` answered from a fixed set of OTLP JSON documents, on a real HTTP server
(127.0.0.1, a free port, a thread).

The answers follow Tempo as its docs and source say (grafana/tempo at commit
ad33aa8fafc41a4ea58519f7b7a88b1aa1383224: ``pkg/api/http.go``, ``modules/frontend/``,
``pkg/traceql/``, ``pkg/tempopb/tempo.proto``):

- search: ``start``/``end`` whole seconds, ``end`` after ``start``, a trace matching when its
  time span overlaps ``[start, end]``; ``limit`` (20 when not given; 0 is a 400); the newest
  ``limit`` traces, newest first; ``traceID`` hex with its leading zeros cut; ``traces`` left
  out when there are none; the TraceQL subset ``{}`` and ``{ resource.service.name = "a" ||
  ... }``, anything else a 400 ``invalid TraceQL query: parse error ...``;
- trace by id: protobuf's JSON mapping of the OTLP trace (ids base64, enums by name, zero
  values left out), spans grouped by resource and scope; v2 ``{"trace": {...}, "metrics":
  {...}}``, ``{"trace": {}}`` for a trace it does not hold, 404 with no body for one hidden;
  v1 ``{"batches": [...]}`` or 404; ``start``/``end`` restricting where the trace is looked for;
- a multi-tenant Tempo's 401 ``no org id`` without ``X-Scope-OrgID``; another tenant sees
  nothing; Go's ``404 page not found`` for a path it does not serve.

Set the attributes to simulate trouble: ``gone`` (found by the search, then not held),
``hidden`` (404), ``partial`` (v2 ``PARTIAL``, half the spans), ``trace_status`` (an error
status for a trace), ``search_answer`` (a fixed answer to every search), ``delay_s`` (a slow
server), ``org_id`` (tenancy required), ``v1_only`` (a Tempo before the v2 API). Every request
is recorded in ``requests``, with the trace ids a search answered.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

NS = 1_000_000_000
KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
CODES = ("UNSET", "OK", "ERROR")
NOT_FOUND = b"404 page not found\n"  # Go's http.NotFound, what gorilla/mux answers
_TERM = re.compile(r'\s*resource\.service\.name\s*=\s*"((?:[^"\\]|\\.)*)"\s*')


@dataclass
class Request:
    """One request the server saw."""

    path: str
    params: dict[str, str]
    headers: dict[str, str]  # names in lowercase
    answered: list[str] = field(default_factory=list)  # a search's trace ids


@dataclass
class Trace:
    spans: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]]  # key, res, scope
    start_ns: int
    end_ns: int
    services: set[str]


def _b64(hex_id: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_id)).decode()


def _tempo_span(span: dict[str, Any]) -> dict[str, Any]:
    """A span as Tempo's jsonpb writes it: base64 ids, enum names, zero values left out."""
    out = dict(span)
    for key in ("traceId", "spanId", "parentSpanId"):
        if out.get(key):
            out[key] = _b64(out[key])
        else:
            out.pop(key, None)
    kind = out.pop("kind", 0)
    if kind:
        out["kind"] = f"SPAN_KIND_{KINDS[kind]}"
    status = dict(out.pop("status", {}))
    if status.get("code"):
        status["code"] = f"STATUS_CODE_{CODES[status['code']]}"
    else:
        status.pop("code", None)
    out["status"] = status
    if out.get("links"):
        out["links"] = [
            {**link, "traceId": _b64(link["traceId"]), "spanId": _b64(link["spanId"])}
            for link in out["links"]
        ]
    return out


def _service(resource: dict[str, Any]) -> str:
    for kv in resource.get("attributes", ()):
        if kv["key"] == "service.name":
            return str(kv["value"].get("stringValue", ""))
    return ""


def traces_of(docs: Iterable[dict[str, Any]]) -> dict[str, Trace]:
    """OTLP JSON documents (hex ids, integer enums) grouped by trace."""
    grouped: dict[str, list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]]]
    grouped = defaultdict(list)
    for doc in docs:
        for rs in doc.get("resourceSpans", ()):
            resource = rs.get("resource", {})
            key = json.dumps(resource, sort_keys=True)
            for ss in rs.get("scopeSpans", ()):
                scope = ss.get("scope", {})
                for span in ss.get("spans", ()):
                    grouped[span["traceId"].lower()].append((key, resource, scope, span))
    traces = {}
    for trace_id, spans in grouped.items():
        traces[trace_id] = Trace(
            spans,
            min(int(s["startTimeUnixNano"]) for *_, s in spans),
            max(int(s["endTimeUnixNano"]) for *_, s in spans),
            {_service(resource) for _, resource, _, _ in spans},
        )
    return traces


def load_docs(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _resource_spans(
    spans: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]],
) -> list[dict[str, Any]]:
    """A trace's spans as Tempo returns them: one resourceSpans a resource, one scopeSpans a
    scope within it."""
    batches: dict[str, tuple[dict[str, Any], dict[str, list[Any]], dict[str, Any]]] = {}
    for key, resource, scope, span in spans:
        _, by_scope, scopes = batches.setdefault(key, (resource, defaultdict(list), {}))
        scope_key = json.dumps(scope, sort_keys=True)
        scopes[scope_key] = scope
        by_scope[scope_key].append(_tempo_span(span))
    return [
        {
            "resource": resource,
            "scopeSpans": [{"scope": scopes[k], "spans": spans_} for k, spans_ in by_scope.items()],
        }
        for resource, by_scope, scopes in batches.values()
    ]


class ParseError(ValueError):
    pass


def parse_traceql(q: str) -> set[str] | None:
    """The services a query of the subset asks for; None for every trace."""
    text = q.strip()
    if not text.startswith("{"):
        raise ParseError("parse error at line 1, col 1: syntax error: unexpected IDENTIFIER")
    if not text.endswith("}"):
        raise ParseError(f"parse error at line 1, col {len(text)}: syntax error: unexpected $end")
    body = text[1:-1]
    if not body.strip():
        return None
    names, at = set(), 0
    while True:
        term = _TERM.match(body, at)
        if term is None:
            raise ParseError(f"parse error at line 1, col {at + 2}: syntax error: unexpected")
        names.add(re.sub(r"\\(.)", r"\1", term[1]))
        at = term.end()
        if at == len(body):
            return names
        if not body.startswith("||", at):
            raise ParseError(f"parse error at line 1, col {at + 2}: syntax error: unexpected")
        at += 2


class TempoApi:
    """The server; a context manager: ``with TempoApi(docs) as tempo: tempo.url``."""

    def __init__(self, docs: Iterable[dict[str, Any]], *, org_id: str | None = None) -> None:
        self.traces = traces_of(docs)
        self.org_id = org_id
        self.gone: set[str] = set()
        self.hidden: set[str] = set()
        self.partial: set[str] = set()
        self.trace_status: dict[str, tuple[int, bytes]] = {}
        self.search_answer: tuple[int, bytes] | None = None
        self.delay_s = 0.0
        self.v1_only = False
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"tempo://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> TempoApi:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()  # a slow answer still waiting gives up
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def searches(self) -> list[Request]:
        return [r for r in self.requests if r.path == "/api/search"]

    def fetches(self) -> list[Request]:
        return [r for r in self.requests if r.path.startswith(("/api/traces/", "/api/v2/traces"))]

    # the answers

    def answer(self, path: str, params: dict[str, str], headers: dict[str, str]) -> Any:
        """(status, body bytes or a JSON value) for one request."""
        tenant = headers.get("x-scope-orgid")
        if self.org_id is not None and not tenant:
            return 401, b"no org id\n"
        visible = self.traces if tenant == self.org_id else {}
        if path == "/api/search":
            return self._search(params, visible)
        found = re.fullmatch(r"/api/(v2/)?traces/([^/]+)", path)
        if found is None or (found[1] and self.v1_only):
            return 404, NOT_FOUND
        return self._trace(found[2], params, visible, v2=bool(found[1]))

    def _search(self, params: dict[str, str], visible: dict[str, Trace]) -> Any:
        if self.search_answer is not None:
            return self.search_answer
        try:
            start, end = int(params.get("start", 0)), int(params.get("end", 0))
            limit = int(params.get("limit", 20))
        except ValueError as error:
            return 400, f"invalid start, end or limit: {error}".encode()
        if limit == 0:
            return 400, b"invalid limit: must be a positive number"
        if (start or end) and end <= start:
            message = f"http parameter start must be before end. received start={start} end={end}"
            return 400, message.encode()
        try:
            services = parse_traceql(params.get("q", "{}"))
        except ParseError as error:
            return 400, f"invalid TraceQL query: {error}".encode()
        spss = int(params.get("spss", 3))
        matched = []
        for trace_id, trace in visible.items():
            if start and not (trace.start_ns <= end * NS and trace.end_ns >= start * NS):
                continue
            spans = [
                span
                for _, resource, _, span in trace.spans
                if services is None or _service(resource) in services
            ]
            if spans:
                matched.append((trace_id, trace, spans))
        matched.sort(key=lambda found: found[1].start_ns, reverse=True)  # newest first
        return 200, self._search_result(matched[:limit], spss, len(visible))

    @staticmethod
    def _search_result(matched: list[Any], spss: int, inspected: int) -> dict[str, Any]:
        traces = []
        for trace_id, trace, spans in matched:
            roots = [(r, span) for _, r, _, span in trace.spans if not span.get("parentSpanId")]
            spanset = {
                "spans": [
                    {
                        "spanID": span["spanId"],
                        "name": span.get("name", ""),
                        "startTimeUnixNano": span["startTimeUnixNano"],
                        "durationNanos": str(
                            int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])
                        ),
                    }
                    for span in spans[:spss]
                ],
                "matched": len(spans),
            }
            found: dict[str, Any] = {
                "traceID": trace_id.lstrip("0"),  # util.TraceIDToHexString
                # the frontend's text for a trace whose root has not arrived
                "rootServiceName": _service(roots[0][0])
                if roots
                else "<root span not yet received>",
                "startTimeUnixNano": str(trace.start_ns),
                "spanSet": spanset,  # deprecated, still written
                "spanSets": [spanset],
                "serviceStats": {
                    name: {"spanCount": sum(1 for _, r, _, _ in trace.spans if _service(r) == name)}
                    for name in sorted(trace.services)
                },
            }
            if roots:
                found["rootTraceName"] = roots[0][1].get("name", "")
            if duration_ms := (trace.end_ns - trace.start_ns) // 1_000_000:
                found["durationMs"] = duration_ms
            traces.append(found)
        doc: dict[str, Any] = {
            "metrics": {
                "inspectedTraces": inspected,
                "inspectedBytes": "1024",
                "totalBlocks": 1,
                "completedJobs": 1,
                "totalJobs": 1,
            }
        }
        if traces:
            doc = {"traces": traces, **doc}
        return doc

    def _trace(
        self, given: str, params: dict[str, str], visible: dict[str, Trace], *, v2: bool
    ) -> Any:
        if not re.fullmatch(r"[0-9a-fA-F]{1,32}", given):
            return 400, b"trace IDs can only contain hex characters"
        trace_id = given.lower().zfill(32)
        if trace_id in self.trace_status:
            return self.trace_status[trace_id]
        if trace_id in self.hidden:
            return 404, b""
        trace = None if trace_id in self.gone else visible.get(trace_id)
        if trace is not None and "start" in params and "end" in params:
            start, end = int(params["start"]), int(params["end"])  # only blocks in range
            if not (trace.start_ns <= end * NS and trace.end_ns >= start * NS):
                trace = None
        if not v2:
            if trace is None:
                return 404, b""
            return 200, {"batches": _resource_spans(trace.spans)}
        metrics = {"inspectedBytes": "2048"}
        if trace is None:
            return 200, {"trace": {}, "metrics": metrics}
        if trace_id in self.partial:
            half = trace.spans[: len(trace.spans) // 2]
            return 200, {
                "trace": {"resourceSpans": _resource_spans(half)},
                "metrics": metrics,
                "status": "PARTIAL",
                "message": "Trace exceeds maximum size of 5000000 bytes, a partial trace is "
                "returned",
            }
        return 200, {"trace": {"resourceSpans": _resource_spans(trace.spans)}, "metrics": metrics}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                params = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                headers = {k.lower(): v for k, v in self.headers.items()}  # case-blind, as HTTP
                request = Request(parts.path, params, headers)
                with api._lock:
                    api.requests.append(request)
                if api.delay_s and api._stop.wait(api.delay_s):
                    return  # the server is closing
                status, body = api.answer(parts.path, params, headers)
                kind = "text/plain; charset=utf-8"
                if not isinstance(body, bytes):
                    request.answered = [t["traceID"] for t in body.get("traces", ())]
                    body, kind = json.dumps(body).encode(), "application/json"
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:  # quiet: pytest shows what matters
                pass

        return Handler
