"""Grafana Tempo's HTTP API into the span store: ``otelkit import tempo://host:3200 --out store``.

``tempo://host[:port][/prefix]`` is read over HTTP (port 3200, Tempo's own, when none is given),
``tempo+https://host[:port][/prefix]`` over HTTPS (443); the prefix is Tempo's
``http_api_prefix``. ``user:password@`` in the URL becomes basic auth; other credentials go in
``headers``: ``Authorization: Bearer ...``, and ``X-Scope-OrgID`` for a multi-tenant Tempo
(which answers 401 ``no org id`` without it).

How the API is used, as grafana/tempo documents and implements it at commit
ad33aa8fafc41a4ea58519f7b7a88b1aa1383224 (``docs/sources/tempo/api_docs/_index.md``,
``pkg/api/http.go``, ``modules/frontend/`` and ``pkg/tempopb/tempo.proto``):

- Search: ``GET /api/search?q=<TraceQL>&limit=&start=&end=&spss=1``; ``start`` and ``end`` are
  whole Unix seconds (``end`` must exceed ``start``) and a trace matches when its own time span
  overlaps ``[start, end]``, both ends included. The TraceQL is the caller's ``query`` as given,
  else ``{ resource.service.name = "a" || resource.service.name = "b" }`` for ``services``,
  else ``{}`` (every trace). The answer is ``{"traces": [{"traceID", "rootServiceName",
  "rootTraceName", "startTimeUnixNano", "durationMs", "spanSets", ...}], "metrics": {...}}``,
  newest first, at most ``limit`` traces, and ``traces`` left out when there are none
  (protobuf's JSON mapping omits empty fields). ``traceID`` is hex with its leading zeros cut
  (``util.TraceIDToHexString``) unless the tenant sets ``left_pad_trace_ids``: it is padded back
  to 32 digits here. Tempo answers 400 with its message for a TraceQL it cannot parse
  (``invalid TraceQL query: parse error at line 1, col 3: ...``), which is passed on.
- Windows: the range is searched in windows of ``window_s`` (``_remote.windows``); a window
  whose search returns ``limit`` traces may have had more, so it is split in two at a whole
  second and both halves searched, down to one second, where the cap is counted
  (``Imported.capped``) and warned of, and the ``limit`` traces found are kept. Windows meet at
  whole seconds that both include, so a trace can be found twice: it is fetched once.
- Each trace, whole: ``GET /api/v2/traces/<32 hex digits>?start=&end=&span_pruning=false``,
  answered ``{"trace": {"resourceSpans": [...]}, "metrics": {...}, "status"?, "message"?}``:
  OTLP JSON in protobuf's mapping (ids base64, enums by name, 64-bit integers as strings),
  normalised by ``_decode.spans_of_doc``. ``start``/``end`` narrow the blocks Tempo reads (with
  none it reads every block); they are the trace's own time span from the search widened by
  an hour, since spans that arrive late can sit in a later block. ``span_pruning=false``: a
  query frontend configured to prune by default would otherwise collapse leaf spans.
  A Tempo older than this API (before 2.6) answers 404 there: the trace is then asked of
  ``GET /api/traces/<id>`` (``{"batches": [...]}``), and once that answers, every later
  trace too.

What is left out (``Imported.left_out``, each warned of with its trace id), never written:

- a trace not found: v2 answers 200 with an empty ``trace`` (gone since the search: retention,
  or it was only in the live store), 404 (hidden by an access policy), or v1 404;
- a trace Tempo marks partial: v2 ``"status": "PARTIAL"`` (larger than the tenant's
  ``max_bytes_per_trace``, or pruned on write; its ``message`` says which), v1 422 (too large);
  a truncated trace would give a wrong breakdown, not an incomplete one;
- a trace whose fetch Tempo answers with any other error status (429, 5xx).

A trace that comes back whole by Tempo's word but whose spans name a parent not among them (a
service that does not export, spans still arriving) is written as it is and counted
(``Imported.partial``, warned of): the breakdown joins or leaves out its orphans as it does
for the same spans from files.

Errors (``StoreError``, saying which server and what it answered): an unknown scheme, a server
that cannot be reached or does not answer within ``timeout_s`` (each connect and each read),
any error status to a search (its message passed on), 401/403 to a fetch, a body that is not
JSON or not the shape above. On an error the segments already written hold whole traces.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import math
import re
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote, urlencode, urlsplit

from otelkit.analysis._remote import Imported, orphaned, windows
from otelkit.analysis._spans import Span
from otelkit.analysis._store import SegmentWriter, StoreError

__all__ = ["SCHEMES", "import_tempo"]

#: the sources ``otelkit import`` hands to this module
SCHEMES = ("tempo://", "tempo+https://")
_log = logging.getLogger("otelkit.analysis")
_NS = 1_000_000_000
_SMALLEST_S = 1  # Tempo's search takes whole seconds: no window can be narrower
_FETCH_SLACK_S = 3600  # around a trace's span from the search: blocks holding late spans
_HEX = re.compile(r"[0-9a-fA-F]{1,32}")
_MESSAGE_CHARS = 300  # of an error body quoted in a message: an HTML error page can be long

_loads: Callable[[bytes], Any] = json.loads  # without orjson: the same values, slower
with contextlib.suppress(ImportError):  # orjson (the report extra) parses big traces faster
    from orjson import loads as _loads


class _Answer(NamedTuple):
    status: int
    body: bytes


class _Found(NamedTuple):
    """A trace as the search names it: its id padded to 32 hex digits, its time span (0 when
    the search did not say)."""

    trace_id: str
    start_ns: int
    end_ns: int


def _quoted(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    return text if len(text) <= _MESSAGE_CHARS else text[:_MESSAGE_CHARS] + "..."


class _Tempo:
    """One Tempo's HTTP API: GET requests, their answers as status and body."""

    def __init__(self, url: str, headers: Mapping[str, str] | None, timeout_s: float) -> None:
        scheme, _, rest = url.partition("://")
        if scheme not in ("tempo", "tempo+https") or not rest:
            raise StoreError(f"{url!r} is not a Tempo URL: tempo://host:3200 or tempo+https://host")
        parts = urlsplit(f"http://{rest}")
        try:
            port = parts.port
        except ValueError as error:
            raise StoreError(f"{url!r}: {error}") from None
        host = parts.hostname
        if not host:
            raise StoreError(f"{url!r} names no host: tempo://host:3200")
        https = scheme == "tempo+https"
        port = port or (443 if https else 3200)
        address = f"[{host}]" if ":" in host else host
        self.base = f"{'https' if https else 'http'}://{address}:{port}{parts.path.rstrip('/')}"
        shown_user = f"{parts.username}:***@" if parts.password is not None else ""
        self.shown = f"{scheme}://{shown_user}{address}:{port}{parts.path.rstrip('/')}"
        self.headers = {"Accept": "application/json", "User-Agent": "otelkit"}
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            self.headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        self.headers.update(headers or {})
        self.timeout_s = timeout_s
        import urllib.request  # on first use: it brings http.client and ssl

        # an opener of its own: it reads the proxy variables now, not at the process's first use
        self._opener = urllib.request.build_opener()

    def get(self, path: str, params: Mapping[str, str | int]) -> _Answer:
        """``path``'s answer, error statuses included; ``StoreError`` when there is none."""
        import urllib.error
        import urllib.request

        request = urllib.request.Request(
            f"{self.base}{path}?{urlencode(params)}", headers=self.headers
        )
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                return _Answer(response.status, response.read())
        except urllib.error.HTTPError as error:  # an answer, with an error status
            try:
                body = error.read()
            except (OSError, ValueError):
                body = b""
            return _Answer(error.code, body)
        except urllib.error.URLError as error:  # no answer: refused, no such host, TLS
            if isinstance(error.reason, TimeoutError):  # socket.timeout since 3.10
                raise self._timed_out(path) from None
            raise StoreError(f"cannot reach Tempo at {self.shown}: {error.reason}") from None
        except TimeoutError:  # connected, then no answer in time
            raise self._timed_out(path) from None
        except (OSError, ValueError) as error:  # reset, cut short (http.client's errors too)
            raise StoreError(f"Tempo at {self.shown}: {path} failed: {error}") from None

    def _timed_out(self, path: str) -> StoreError:
        return StoreError(
            f"Tempo at {self.shown} did not answer {path} within {self.timeout_s:g} s "
            "(a larger timeout_s, or a smaller window_s or limit)"
        )

    def parsed(self, answer: _Answer, path: str) -> Any:
        try:
            return _loads(answer.body)
        except ValueError:  # orjson's JSONDecodeError is a ValueError too
            raise StoreError(
                f"Tempo at {self.shown}: {path} answered a body that is not JSON: "
                f"{_quoted(answer.body)!r}"
            ) from None

    def refused(self, answer: _Answer, path: str, what: str) -> StoreError:
        hint = ""
        if answer.status == 401 and b"org id" in answer.body:  # dskit's ErrNoOrgID
            hint = " (a multi-tenant Tempo: give the tenant as the X-Scope-OrgID header)"
        return StoreError(
            f"Tempo at {self.shown} refused {what} ({path}): {answer.status} "
            f"{_quoted(answer.body)}{hint}"
        )


def _traceql(services: Sequence[str], query: str | None) -> str:
    if query is not None and services:
        raise StoreError("give services or a TraceQL query, not both: filter services in the query")
    if query is not None:
        return query
    if not services:
        return "{}"

    def text(name: str) -> str:  # a TraceQL string: Go's escapes
        return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'

    terms = " || ".join(f"resource.service.name = {text(name)}" for name in services)
    return f"{{ {terms} }}"


def _search(tempo: _Tempo, q: str, start_s: int, end_s: int, limit: int) -> list[_Found]:
    path = "/api/search"
    # spss=1: the matched spans are not needed, only the traces: keep the answer small
    params: dict[str, str | int] = {
        "q": q,
        "limit": limit,
        "start": start_s,
        "end": end_s,
        "spss": 1,
    }
    answer = tempo.get(path, params)
    if answer.status != 200:
        raise tempo.refused(answer, path, f"the search {q}")
    doc = tempo.parsed(answer, path)
    traces = doc.get("traces", []) if isinstance(doc, dict) else None
    if not isinstance(traces, list):
        raise StoreError(
            f"Tempo at {tempo.shown}: {path} answered {_quoted(answer.body)!r}, "
            'not a search result ({"traces": [...]})'
        )
    found = []
    for trace in traces:
        trace_id = trace.get("traceID") if isinstance(trace, dict) else None
        if not isinstance(trace_id, str) or not _HEX.fullmatch(trace_id):
            raise StoreError(
                f"Tempo at {tempo.shown}: {path} answered a trace without a hex traceID: "
                f"{str(trace)[:_MESSAGE_CHARS]}"
            )
        try:  # a uint64 in protobuf's mapping is a string; missing when zero
            start_ns = int(trace.get("startTimeUnixNano") or 0)
            end_ns = start_ns + int(trace.get("durationMs") or 0) * 1_000_000
        except (TypeError, ValueError):
            start_ns = end_ns = 0
        found.append(_Found(trace_id.lower().zfill(32), start_ns, end_ns))
    return found


class _Fetcher:
    """Traces by id: v2 first, v1 once v2 turns out not to be there."""

    def __init__(self, tempo: _Tempo) -> None:
        self.tempo = tempo
        self.v1 = False

    def spans(self, found: _Found, window: tuple[int, int]) -> list[Span] | None:
        """The trace's spans, or None (warned of) when it is left out."""
        got = self._fetch(found, window)
        if isinstance(got, str):
            _log.warning(
                "Tempo at %s: trace %s left out: %s", self.tempo.shown, found.trace_id, got
            )
            return None
        return got

    def _fetch(self, found: _Found, window: tuple[int, int]) -> list[Span] | str:
        """The trace's spans, or why it is left out."""
        from otelkit.analysis._decode import spans_of_doc

        start_ns, end_ns = (found.start_ns, found.end_ns) if found.start_ns else window
        params: dict[str, str | int] = {
            "start": max(start_ns // _NS - _FETCH_SLACK_S, 0),
            "end": -(-end_ns // _NS) + _FETCH_SLACK_S,
        }
        trace_id = found.trace_id
        doc: Any = None
        if not self.v1:
            path = f"/api/v2/traces/{trace_id}"
            answer = self.tempo.get(path, {**params, "span_pruning": "false"})
            if answer.status == 200:
                got = self.tempo.parsed(answer, path)
                if not isinstance(got, dict) or not isinstance(got.get("trace", {}), dict):
                    raise self._shape(path, answer, '{"trace": {"resourceSpans": [...]}}')
                if got.get("status") in ("PARTIAL", 1):
                    return f"partial: {got.get('message', '')}"
                doc = got.get("trace", {})
            elif answer.status != 404:
                return self._failed(path, answer, trace_id)
        if doc is None:  # no v2 here, or v2 said 404 (not found, or hidden): ask v1
            path = f"/api/traces/{trace_id}"
            answer = self.tempo.get(path, params)
            if answer.status == 404:
                return "not found"
            if answer.status == 422:  # v1's word for a trace over max_bytes_per_trace
                return f"partial: {_quoted(answer.body)}"
            if answer.status != 200:
                return self._failed(path, answer, trace_id)
            got = self.tempo.parsed(answer, path)
            if not isinstance(got, dict):
                raise self._shape(path, answer, '{"batches": [...]}')
            # "batches": Tempo's name before OTLP's; MarshalToJSONV1 still writes it
            doc = {"resourceSpans": got.get("batches", got.get("resourceSpans", []))}
            self.v1 = True
        if not doc.get("resourceSpans"):  # protobuf's mapping: an empty trace is {}
            return "not found"
        try:
            spans = spans_of_doc(doc)
        except ValueError as error:  # normalize_json: garbage, said where
            raise StoreError(f"Tempo at {self.tempo.shown}: trace {trace_id}: {error}") from None
        return spans or "not found"

    def _shape(self, path: str, answer: _Answer, shape: str) -> StoreError:
        return StoreError(
            f"Tempo at {self.tempo.shown}: {path} answered {_quoted(answer.body)!r}, not {shape}"
        )

    def _failed(self, path: str, answer: _Answer, trace_id: str) -> str:
        if answer.status in (401, 403):  # every other fetch would fail alike
            raise self.tempo.refused(answer, path, f"trace {trace_id}")
        return f"{path} answered {answer.status} {_quoted(answer.body)}"


def import_tempo(
    url: str,
    out: str | Path,
    *,
    since_ns: int,
    until_ns: int,
    services: Sequence[str] = (),
    query: str | None = None,
    window_s: float = 3600.0,
    limit: int = 1000,
    segment_spans: int = 1_000_000,
    timeout_s: float = 30.0,
    headers: Mapping[str, str] | None = None,
) -> Imported:
    """The traces Tempo at ``url`` holds overlapping ``[since_ns, until_ns)`` (of ``services``,
    or matching the TraceQL ``query``), whole, into segments of about ``segment_spans`` spans
    in ``out``. The module's docstring says how the API is read and what is left out."""
    if until_ns <= since_ns:
        raise StoreError(f"an empty time range: since {since_ns} ns is not before until {until_ns}")
    if limit < 1 or window_s < _SMALLEST_S:
        raise StoreError(f"limit {limit} and window_s {window_s:g} must be at least 1")
    q = _traceql(services, query)
    tempo = _Tempo(url, headers, timeout_s)
    fetcher = _Fetcher(tempo)
    Path(out).mkdir(parents=True, exist_ok=True)
    writer = SegmentWriter(out, max_spans=segment_spans, max_age_s=math.inf)
    seen: set[str] = set()
    traces = left_out = capped = partial = 0
    pending = deque(windows(since_ns, until_ns, int(window_s * _NS)))
    try:
        while pending:
            low, high = window = pending.popleft()
            start_s, end_s = low // _NS, -(-high // _NS)
            end_s = max(end_s, start_s + _SMALLEST_S)
            found = _search(tempo, q, start_s, end_s, limit)
            if len(found) >= limit:  # perhaps more: split, or count the cap
                if end_s - start_s > _SMALLEST_S:
                    middle = (start_s + end_s) // 2 * _NS  # strictly inside (low, high)
                    pending.extendleft([(middle, high), (low, middle)])  # the earlier first
                    continue
                capped += 1
                _log.warning(
                    "Tempo at %s: the search %s from %d to %d s still found %d traces, its "
                    "limit: traces beyond it are left out (a larger limit brings them)",
                    tempo.shown,
                    q,
                    start_s,
                    end_s,
                    limit,
                )
            for trace in found:
                if trace.trace_id in seen:
                    continue
                seen.add(trace.trace_id)
                spans = fetcher.spans(trace, window)
                if spans is None:
                    left_out += 1
                    continue
                writer.add(spans)
                traces += 1
                partial += orphaned(spans)
    finally:  # what was fetched is whole traces: written even when an error ends the import
        writer.close()
    if partial:
        _log.warning(
            "Tempo at %s: %d traces written partial: a span's parent is not in the trace",
            tempo.shown,
            partial,
        )
    return Imported(
        writer.spans_written, writer.segments_written, traces, left_out, capped, partial
    )
