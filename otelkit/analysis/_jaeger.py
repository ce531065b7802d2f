"""Jaeger v2's query API, api_v3, into the span store: ``jaeger://host:16685`` (gRPC) or
``jaeger+http://host:16686`` (HTTP; ``jaeger+https://`` through TLS).

The API as published, read (never copied) at jaeger-idl commit
74be5630c18f2cd8446073a101b6c9e30bc4b4b6 (``proto/api_v3/query_service.proto``) and jaeger commit
8498073ff809b1a3923521920a9b1b017ea97ecf (``cmd/jaeger/internal/extension/jaegerquery/internal/
apiv3``: ``grpc_handler.go``, ``http_gateway.go``, ``query_parser.go``):

- gRPC: ``jaeger.api_v3.QueryService/FindTraces`` takes ``FindTracesRequest { query = 1 }``, a
  ``TraceQueryParameters`` of which this reader sets ``service_name = 1``, ``operation_name =
  2``, ``start_time_min = 4`` and ``start_time_max = 5`` (``google.protobuf.Timestamp``),
  ``search_depth = 8`` and ``raw_traces = 9`` (``attributes = 3``, ``duration_min/max = 6, 7``
  and ``filter = 10`` stay unset). The request is built from a descriptor written here, so no
  generated stubs are needed. The answer streams OTLP ``TracesData`` messages: with
  ``raw_traces`` a large trace may come split across consecutive messages (chunks as stored),
  so spans are grouped by trace id, never by message. No match: an empty stream.
- HTTP: ``GET /api/v3/traces?query.service_name=...&query.start_time_min=...`` (RFC 3339 with
  nanoseconds) ``&query.start_time_max=...&query.search_depth=N&query.num_traces=N&
  query.raw_traces=true`` (``query.operation_name`` when asked). The snake_case names are read
  by every release with the hand-written gateway (1.53 on); 2.19 made camelCase canonical, kept
  these as aliases, and renamed ``num_traces`` to ``search_depth``: both are sent, the same
  number, as releases before 2.19 read only ``num_traces``. The answer is one document, ``{"result":
  TracesData}`` in OTLP JSON (hex ids, integer enums), all the traces of the search together;
  none found is a 404 whose body is Jaeger's error JSON (``{"error": {"httpCode": 404, ...}}``),
  which reads as an empty window. Any other 404 (a path that is not the API) is an error.

What a search finds: a trace with one span of the service (its resource's ``service.name``) and
operation that started in ``[start_time_min, start_time_max)``; Jaeger requires the service and
the window. It answers whole traces (every span, ``raw_traces``: as stored, without the clock
skew adjustment), so a trace with spans in two windows, or of two services searched, comes
back more than once: it is written once, by trace id. At most ``search_depth`` traces come
back, with nothing saying the answer was cut: an answer holding that many is taken as cut, and
its window split in two and searched again, down to a window of 1 s, where the cap is counted
(``Imported.capped``) and warned of.

What is counted: ``traces`` are the traces written. A trace found with a span whose parent is
in no copy of it Jaeger answered is held while later windows may find it again (copies are
joined by span id, so one whose spans arrived meanwhile is written whole); once no later window
can, it is written as it is and counted in ``Imported.partial`` (warned of with its id): a hop
exported elsewhere or a service that does not export leaves a trace partial for good, and the
breakdown joins or leaves out its orphans as it does from files. A search that fails (the
server unreachable, an error status, no answer within ``timeout_s``, an answer that is not
TracesData) ends the import with ``StoreError`` naming the service and window: what that
window held is unknown, so nothing could be counted for it. The segments written before it
stay.

Memory holds one search's answer at a time, the ids of traces written until a window after their
last span started, and partial traces until then.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlencode, urlsplit

from otelkit.analysis._remote import Imported, windows
from otelkit.analysis._spans import Span
from otelkit.analysis._store import SegmentWriter, StoreError

__all__ = ["SCHEMES", "import_jaeger"]

#: the sources this module reads: api_v3 over gRPC, over HTTP, over HTTPS
SCHEMES = ("jaeger://", "jaeger+http://", "jaeger+https://")
_PORTS = {"jaeger://": 16685, "jaeger+http://": 16686, "jaeger+https://": 443}
_METHOD = "/jaeger.api_v3.QueryService/FindTraces"
_PATH = "/api/v3/traces"
_SMALLEST_NS = 1_000_000_000  # a capped window is split down to this
_MAX_MESSAGE = 512 << 20  # gRPC's default 4 MiB would refuse one large trace's chunk
_CHUNK = 1 << 20  # an HTTP body is read this much at a time, checking the deadline between
_SHOWN = 5  # trace ids a warning names
_log = logging.getLogger("otelkit.analysis")


class _Query(NamedTuple):
    """One search: what Jaeger's ``TraceQueryParameters`` carry."""

    service: str
    operation: str | None
    min_ns: int
    max_ns: int
    depth: int

    def __str__(self) -> str:
        operation = f" operation {self.operation!r}" if self.operation else ""
        window = f"[{_rfc3339(self.min_ns)}, {_rfc3339(self.max_ns)})"
        return f"service {self.service!r}{operation} in {window}"


def import_jaeger(
    url: str,
    out: str | Path,
    *,
    since_ns: int,
    until_ns: int,
    services: Sequence[str],
    operation: str | None = None,
    window_s: float = 3600.0,
    search_depth: int = 1000,
    segment_spans: int = 1_000_000,
    timeout_s: float = 30.0,
) -> Imported:
    """The traces at ``url`` with a span of one of ``services`` (and ``operation``) that
    started in ``[since_ns, until_ns)`` into segments in ``out``, ``segment_spans`` a segment
    at most. The range is searched ``window_s`` at a time, each service in turn; each search
    (connecting included) has ``timeout_s``. Raises ``StoreError`` for a search that fails."""
    if isinstance(services, str):  # one name, not its letters
        services = (services,)
    wanted = list(dict.fromkeys(services))
    if not wanted or not all(wanted):
        raise StoreError(
            f"{url}: Jaeger searches one service at a time (query.service_name is required): "
            f"name at least one service, not {list(services)!r}"
        )
    if since_ns >= until_ns:
        raise StoreError(f"{url}: an empty time window: since {since_ns} ns, until {until_ns} ns")
    if since_ns < 0:
        raise StoreError(f"{url}: a time window before 1970: since {since_ns} ns")
    for name, value in (("window_s", window_s), ("timeout_s", timeout_s)):
        if not (value > 0 and math.isfinite(value)):
            raise StoreError(f"{url}: {name} must be a positive number of seconds, not {value}")
    for name, number in (("search_depth", search_depth), ("segment_spans", segment_spans)):
        if number < 1:
            raise StoreError(f"{url}: {name} must be at least 1, not {number}")
    client = _client(url, timeout_s)
    Path(out).mkdir(parents=True, exist_ok=True)
    # no age limit: segments are cut by size alone, as the import writes as fast as it reads
    writer = SegmentWriter(out, max_spans=segment_spans, max_age_s=math.inf)
    found = _Found(writer, segment_spans)
    capped = 0
    try:
        step = max(1, round(window_s * 1e9))
        for start, end in windows(since_ns, until_ns, step):
            for service in wanted:
                query = _Query(service, operation or None, start, end, search_depth)
                capped += _walk(client, found, query, url)
            # a trace whose spans all started before this window (a window's margin) is found
            # by no later one: its id, or its partial copy, need not be held any longer
            found.forget(before_ns=start)
        found.finish()
    finally:
        try:
            writer.close()  # what was written before an error stays usable
        finally:
            client.close()
    if found.partial:
        shown = ", ".join(found.partial[:_SHOWN])
        more = ", ..." if len(found.partial) > _SHOWN else ""
        _log.warning(
            "%s: %d traces written partial: a span's parent is not in the trace Jaeger "
            "answered (%s%s)",
            url,
            len(found.partial),
            shown,
            more,
        )
    return Imported(
        writer.spans_written,
        writer.segments_written,
        found.traces,
        capped=capped,
        partial=len(found.partial),
    )


def _walk(client: _Grpc | _Http, found: _Found, query: _Query, url: str) -> int:
    """Search ``query``'s window, splitting it while an answer holds ``search_depth`` traces;
    the number of smallest windows whose answer still did (capped: traces may be missing)."""
    capped = 0
    pending = [query]
    while pending:
        searched = pending.pop()
        answer = _by_trace(client.find(searched))
        _log.debug("%s: %s: %d traces", url, searched, len(answer))
        found.take(answer)  # kept even when cut: the halves find these again, written once
        if len(answer) < searched.depth:
            continue
        width = searched.max_ns - searched.min_ns
        if width > _SMALLEST_NS:
            middle = searched.min_ns + width // 2
            # the earlier half popped first: windows are searched in time order
            pending += [searched._replace(min_ns=middle), searched._replace(max_ns=middle)]
            continue
        capped += 1
        _log.warning(
            "%s: %s: the search answered its limit of %d traces even in a window of %g s: "
            "traces beyond it are not imported (raise search_depth)",
            url,
            searched,
            searched.depth,
            width / 1e9,
        )
    return capped


def _by_trace(spans: list[Span]) -> dict[str, list[Span]]:
    """``spans`` by trace id, in order: a trace's spans may come in several messages."""
    traces: dict[str, list[Span]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, []).append(span)
    return traces


def _whole(spans: Sequence[Span]) -> bool:
    """Whether every span's parent is in ``spans``."""
    ids = {span.span_id for span in spans}
    return all(span.parent_span_id is None or span.parent_span_id in ids for span in spans)


class _Found:
    """The traces an import has met, by id: written once, whole, or held while partial."""

    def __init__(self, writer: SegmentWriter, segment_spans: int) -> None:
        self.writer, self.segment_spans = writer, segment_spans
        self.traces = 0  # written
        self.partial: list[str] = []  # ids of traces written partial
        self._added = 0  # spans given to the writer
        self._written: dict[str, int] = {}  # id: start of its last span, to forget it after
        self._partial: dict[str, dict[str, Span]] = {}  # id: its spans by id

    def take(self, answer: dict[str, list[Span]]) -> None:
        """Write the traces of one answer not written before, if whole; hold the others."""
        whole: list[Span] = []
        for trace_id, spans in answer.items():
            if trace_id in self._written:
                continue
            held = self._partial.pop(trace_id, None)
            if held is not None:  # found partial before: the copies joined, the first of an id
                for span in spans:
                    held.setdefault(span.span_id, span)
                spans = list(held.values())
            if _whole(spans):
                whole += spans
                self._written[trace_id] = max(span.start_ns for span in spans)
                self.traces += 1
            else:
                if held is None:
                    held = {}
                    for span in spans:
                        held.setdefault(span.span_id, span)
                self._partial[trace_id] = held
        self._add(whole)

    def forget(self, before_ns: int) -> None:
        """Drop the traces whose last span started before ``before_ns``: no later window finds
        them, so one still partial is written as it is."""
        self._written = {key: last for key, last in self._written.items() if last >= before_ns}
        for trace_id, held in list(self._partial.items()):
            if max(span.start_ns for span in held.values()) < before_ns:
                self._write_partial(trace_id)

    def finish(self) -> None:
        """Write the traces still partial as they are: the last window has been searched (a
        trace found in it may have spans starting after it, which no search covers)."""
        for trace_id in list(self._partial):
            self._write_partial(trace_id)

    def _write_partial(self, trace_id: str) -> None:
        held = self._partial.pop(trace_id)
        self._add(list(held.values()))
        self.traces += 1
        self.partial.append(trace_id)

    def _add(self, spans: list[Span]) -> None:
        # in pieces that fill the segment being written exactly: a segment holds
        # ``segment_spans`` at most (the writer writes one as soon as it holds that many)
        while spans:
            room = self.segment_spans - (self._added - self.writer.spans_written)
            piece, spans = spans[:room], spans[room:]
            self.writer.add(piece)
            self._added += len(piece)


def _client(url: str, timeout_s: float) -> _Grpc | _Http:
    """The client of ``url``'s API, which names no path for gRPC and a base path for HTTP."""
    scheme = next((known for known in SCHEMES if url.startswith(known)), None)
    if scheme is None:
        raise StoreError(
            f"{url}: not a Jaeger address: jaeger://host:16685 (api_v3 over gRPC) or "
            "jaeger+http://host:16686 (over HTTP)"
        )
    parts = urlsplit(url)
    try:
        port = parts.port or _PORTS[scheme]
    except ValueError as error:
        raise StoreError(f"{url}: not a Jaeger address: {error}") from error
    host = parts.hostname
    if not host or parts.query or parts.fragment or parts.username:
        raise StoreError(f"{url}: not a Jaeger address: host[:port] and, over HTTP, a base path")
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if scheme == "jaeger://":
        if parts.path.strip("/"):
            raise StoreError(f"{url}: a gRPC address has no path")
        return _Grpc(url, address, timeout_s)
    http = "https" if scheme == "jaeger+https://" else "http"
    return _Http(url, f"{http}://{address}{parts.path.rstrip('/')}", timeout_s)


def _rfc3339(ns: int) -> str:
    """``ns`` since the epoch as RFC 3339 in UTC with nanoseconds (Go's ``RFC3339Nano`` reads
    it whole)."""
    seconds, nanos = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{nanos:09d}Z"


def _spans_of(doc: Any, where: str) -> list[Span]:
    """The spans of an OTLP JSON ``TracesData``; ``StoreError`` for anything else."""
    from otelkit.analysis._decode import spans_of_doc

    if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans"), list):
        raise StoreError(f"{where}: the answer is not OTLP TracesData: {str(doc)[:200]}")
    try:
        return spans_of_doc(doc)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
        raise StoreError(f"{where}: the answer is not OTLP TracesData: {error}") from error


@functools.cache
def _request_class() -> Any:
    """``jaeger.api_v3.FindTracesRequest`` from a descriptor written after the published proto,
    the fields this reader sets with their numbers there, in a pool of its own (generated
    Jaeger stubs elsewhere in the process keep theirs)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="otelkit/jaeger/api_v3/query_service.proto",
        package="jaeger.api_v3",
        syntax="proto3",
        dependency=[timestamp_pb2.DESCRIPTOR.name],
    )
    query = proto.message_type.add(name="TraceQueryParameters")
    timestamp = ".google.protobuf.Timestamp"
    for name, number, kind, type_name in (
        ("service_name", 1, field.TYPE_STRING, ""),
        ("operation_name", 2, field.TYPE_STRING, ""),
        ("start_time_min", 4, field.TYPE_MESSAGE, timestamp),
        ("start_time_max", 5, field.TYPE_MESSAGE, timestamp),
        ("search_depth", 8, field.TYPE_INT32, ""),
        ("raw_traces", 9, field.TYPE_BOOL, ""),
    ):
        added = query.field.add(name=name, number=number, type=kind, label=field.LABEL_OPTIONAL)
        if type_name:  # set, even empty, it would make a scalar a message
            added.type_name = type_name
    request = proto.message_type.add(name="FindTracesRequest")
    request.field.add(
        name="query",
        number=1,
        type=field.TYPE_MESSAGE,
        type_name=".jaeger.api_v3.TraceQueryParameters",
        label=field.LABEL_OPTIONAL,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(timestamp_pb2.DESCRIPTOR.serialized_pb))
    pool.Add(proto)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("jaeger.api_v3.FindTracesRequest")
    )


class _Grpc:
    """``FindTraces`` over gRPC: one channel for the import, each search one stream."""

    def __init__(self, url: str, address: str, timeout_s: float) -> None:
        import grpc

        self.url, self.timeout_s = url, timeout_s
        self._grpc = grpc
        self._channel = grpc.insecure_channel(
            address, options=[("grpc.max_receive_message_length", _MAX_MESSAGE)]
        )
        # bytes both ways: the request is serialised here, and an answer that is not
        # TracesData is named so, not as gRPC's "Exception deserializing response"
        self._find = self._channel.unary_stream(_METHOD)

    def find(self, query: _Query) -> list[Span]:
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

        from otelkit.export._otlp_json import request_to_json

        request = _request_class()()
        params = request.query
        params.service_name = query.service
        if query.operation:
            params.operation_name = query.operation
        for stamp, ns in (
            (params.start_time_min, query.min_ns),
            (params.start_time_max, query.max_ns),
        ):
            stamp.seconds, stamp.nanos = divmod(ns, 1_000_000_000)
        params.search_depth = query.depth
        params.raw_traces = True  # as stored: every span, none adjusted for clock skew
        where = f"{self.url}: searching {query}"
        spans: list[Span] = []
        stream = self._find(request.SerializeToString(), timeout=self.timeout_s)
        try:
            for message in stream:
                try:
                    data: Any = TracesData.FromString(message)
                except DecodeError as error:
                    raise StoreError(
                        f"{where}: a message is not OTLP TracesData: {error}"
                    ) from None
                # request_to_json reads resource_spans alone, field 1 of TracesData too
                spans += _spans_of(request_to_json(data), where)
        except self._grpc.RpcError as error:
            raise StoreError(f"{where}: {self._problem(error)}") from None
        finally:
            stream.cancel()  # a stream left on an error would hold the call open
        return spans

    def _problem(self, error: Any) -> str:
        codes = self._grpc.StatusCode
        code = error.code() if callable(getattr(error, "code", None)) else None
        details = error.details() if callable(getattr(error, "details", None)) else str(error)
        if code == codes.UNAVAILABLE:
            return f"cannot reach Jaeger's api_v3 over gRPC: {details}"
        if code == codes.DEADLINE_EXCEEDED:
            return f"no answer within {self.timeout_s:g} s"
        if code == codes.UNIMPLEMENTED:
            return f"no {_METHOD[1:]} there ({details}): is this Jaeger's query gRPC port (16685)?"
        return f"Jaeger answered {getattr(code, 'name', code)}: {details}"

    def close(self) -> None:
        self._channel.close()


class _Http:
    """``GET /api/v3/traces``: each search one request, its answer one document."""

    def __init__(self, url: str, base: str, timeout_s: float) -> None:
        self.url, self.base, self.timeout_s = url, base, timeout_s

    def find(self, query: _Query) -> list[Span]:
        params = [
            ("query.service_name", query.service),
            ("query.start_time_min", _rfc3339(query.min_ns)),
            ("query.start_time_max", _rfc3339(query.max_ns)),
            ("query.search_depth", str(query.depth)),
            ("query.num_traces", str(query.depth)),  # the same limit, for releases before 2.19
            ("query.raw_traces", "true"),
        ]
        if query.operation:
            params.insert(1, ("query.operation_name", query.operation))
        where = f"{self.url}: searching {query}"
        status, body = self._get(f"{self.base}{_PATH}?{urlencode(params)}", where)
        if status != 200:
            error = _error_json(body)
            if status == 404 and error is not None:
                return []  # Jaeger's answer when nothing matched
            if status == 404:
                raise StoreError(
                    f"{where}: 404 without Jaeger's error JSON: no api_v3 at {self.base}{_PATH} "
                    "(is this Jaeger's query HTTP port, 16686, and its base path?)"
                )
            said = error if error is not None else body[:200].decode(errors="replace")
            raise StoreError(f"{where}: Jaeger answered HTTP {status}: {said}")
        try:
            doc = json.loads(body)
        except ValueError as error:
            raise StoreError(f"{where}: the answer is not JSON: {error}") from None
        if not isinstance(doc, dict) or "result" not in doc:
            raise StoreError(f"{where}: not Jaeger's answer, no result: {body[:200]!r}")
        return _spans_of(doc["result"], where)

    def _get(self, address: str, where: str) -> tuple[int, bytes]:
        import http.client
        import urllib.error
        import urllib.request

        # the socket's timeout bounds each wait; the deadline bounds a body that trickles in
        deadline = time.monotonic() + self.timeout_s
        request = urllib.request.Request(address, headers={"Accept": "application/json"})
        try:
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    status = int(response.status)
                    chunks = []
                    while chunk := response.read1(_CHUNK):
                        chunks.append(chunk)
                        if time.monotonic() > deadline:
                            raise TimeoutError("the answer is still coming")
                    return status, b"".join(chunks)
            except urllib.error.HTTPError as error:  # a status that is not 2xx, with its body
                with error:
                    return int(error.code), error.read(_CHUNK)
        except urllib.error.URLError as error:  # not an answer: connecting failed
            reason = error.reason
            if isinstance(reason, TimeoutError):
                raise StoreError(f"{where}: no answer within {self.timeout_s:g} s") from None
            raise StoreError(f"{where}: cannot reach Jaeger: {reason}") from None
        except TimeoutError:
            raise StoreError(f"{where}: no answer within {self.timeout_s:g} s") from None
        except http.client.BadStatusLine:  # HTTP/2 frames, say, from a gRPC port
            raise StoreError(
                f"{where}: the answer is not HTTP/1.1: is this Jaeger's query HTTP port (16686)?"
            ) from None
        except (OSError, http.client.HTTPException) as error:
            raise StoreError(f"{where}: the answer broke off: {error!r}") from None

    def close(self) -> None:
        pass


def _error_json(body: bytes) -> str | None:
    """The message of Jaeger's error JSON (``{"error": {"httpCode": ..., "message": ...}}``),
    None for any other body."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    error = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(error, dict):
        return None
    return str(error.get("message", error))
