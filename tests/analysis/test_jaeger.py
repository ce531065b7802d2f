"""otelkit.analysis._jaeger: Jaeger v2's api_v3 into the span store, over gRPC and HTTP, against
real servers answering as the published API says (``tests/analysis/jaeger_api.py``).

The committed demo traces, held by the server and imported, must come back span for span and
give the breakdown their JSON lines give; the parameters must be sent as the API names them;
the range must be walked in windows, a window answering its limit split and searched again, and
a cap left at the smallest window counted and warned of; a trace found in two windows or by two
services must be written once; a partial trace counted as left out, or written once it is
whole; a window without traces (HTTP's 404) is empty; and every bad address, server error,
garbled answer and silent server must give a ``StoreError`` saying so, within the timeout.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otelkit.analysis import Span, load_spans
from otelkit.analysis._jaeger import import_jaeger
from otelkit.analysis._remote import Imported, windows
from otelkit.analysis._store import StoreError
from otelkit.cli import main
from tests.analysis.jaeger_api import JaegerAPI
from tests.analysis.summaries import assert_breaks_down_as

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

DEMO = Path(__file__).resolve().parents[1] / "report" / "data" / "demo-traces.jsonl"
S = 1_000_000_000
SPANS = load_spans(DEMO)
SERVICES = sorted({str(span.resource["service.name"]) for span in SPANS})
FIRST = min(span.start_ns for span in SPANS)
LAST = max(span.start_ns for span in SPANS)
CLIENT = "gnn-tracking-client"  # a service with a span in every demo trace
TRANSPORTS = ["grpc", "http"]


@pytest.fixture
def jaeger() -> Iterator[JaegerAPI]:
    with JaegerAPI(DEMO) as api:
        yield api


def url(api: JaegerAPI, transport: str) -> str:
    return api.grpc_url if transport == "grpc" else api.http_url


def traces(spans: list[Span]) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = {}
    for span in spans:
        out.setdefault(span.trace_id, []).append(span)
    return out


def ids(span: Span) -> tuple[str, str]:
    return span.trace_id, span.span_id


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_imported_traces_come_back_whole_and_break_down_as_their_json_lines(
    jaeger: JaegerAPI, transport: str, tmp_path: Path
) -> None:

    jaeger.chunk_spans = 7  # raw traces may come in consecutive chunks: grouped by trace id
    since, until = FIRST - S, LAST + S
    got = import_jaeger(
        url(jaeger, transport),
        tmp_path / "store",
        since_ns=since,
        until_ns=until,
        services=SERVICES,
        window_s=20,
        segment_spans=150,
    )
    assert got == Imported(spans=len(SPANS), segments=3, traces=24, left_out=0, capped=0)
    back = load_spans(tmp_path / "store")
    assert sorted(back, key=ids) == sorted(SPANS, key=ids)  # every field, attributes typed
    assert_breaks_down_as(tmp_path / "store", SPANS, tmp_path / "files")

    # the windows walked, each service in turn, every parameter as the API names it
    walked = list(windows(since, until, 20 * S))
    assert len(walked) == 4
    sent = [(r.start_time_min, r.start_time_max, r.service_name) for r in jaeger.requests]
    assert sent == [(lo, hi, service) for lo, hi in walked for service in SERVICES]
    for request in jaeger.requests:
        assert (request.transport, request.search_depth, request.raw_traces) == (
            transport,
            1000,
            True,
        )
        assert request.operation_name == ""
        if transport == "grpc":  # service_name, start_time_min/max, search_depth, raw_traces
            assert request.fields == [1, 4, 5, 8, 9]
        else:
            assert set(request.params) == {
                "query.service_name",
                "query.start_time_min",
                "query.start_time_max",
                "query.search_depth",
                "query.num_traces",
                "query.raw_traces",
            }
            assert request.params["query.num_traces"] == request.params["query.search_depth"]
            for name in ("query.start_time_min", "query.start_time_max"):  # RFC 3339, to the ns
                assert re.fullmatch(
                    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z", request.params[name][0]
                )


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_window_answering_its_limit_is_split_and_searched_again(
    jaeger: JaegerAPI, transport: str, tmp_path: Path
) -> None:
    since, until = FIRST, FIRST + 80 * S
    got = import_jaeger(
        url(jaeger, transport),
        tmp_path,
        since_ns=since,
        until_ns=until,
        services=[CLIENT],
        window_s=80,
        search_depth=5,
    )
    assert got == Imported(spans=len(SPANS), segments=1, traces=24, left_out=0, capped=0)
    searched = [(r.start_time_min, r.start_time_max) for r in jaeger.requests]
    answered = {(r.start_time_min, r.start_time_max): len(r.answered) for r in jaeger.requests}
    assert searched[0] == (since, until) and answered[(since, until)] == 5
    assert len(searched) == len(set(searched)) > 3  # each window searched once
    # each answer holding the limit was followed by both its halves, and nothing else searched
    halves = {(since, until)}
    for (lo, hi), count in answered.items():
        assert count <= 5
        if count == 5:
            middle = lo + (hi - lo) // 2
            assert {(lo, middle), (middle, hi)} <= set(searched)
            halves |= {(lo, middle), (middle, hi)}
    assert halves == set(searched)
    # the windows answering less than the limit tile the range, searched in time order
    leaves = [window for window in searched if answered[window] < 5]
    assert leaves == sorted(leaves)
    assert leaves[0][0] == since and leaves[-1][1] == until
    assert all(a[1] == b[0] for a, b in itertools.pairwise(leaves))


def test_a_trace_found_in_two_windows_and_by_several_services_is_written_once(
    jaeger: JaegerAPI, tmp_path: Path
) -> None:
    by_trace = traces(SPANS)

    def spread(spans: list[Span]) -> int:
        return max(s.start_ns for s in spans) - min(s.start_ns for s in spans)

    # the trace whose spans' starts spread widest, of several services: a window's end inside
    trace_id, spans = max(
        (
            (key, spans)
            for key, spans in by_trace.items()
            if len({s.resource["service.name"] for s in spans}) > 1
        ),
        key=lambda item: spread(item[1]),
    )
    services = sorted({str(s.resource["service.name"]) for s in spans})
    starts = sorted(s.start_ns for s in spans)
    boundary = starts[0] + spread(spans) // 2
    since = FIRST
    got = import_jaeger(
        jaeger.grpc_url,
        tmp_path,
        since_ns=since,
        until_ns=LAST + S,
        services=services,
        window_s=(boundary - since) / 1e9,
    )
    windows_of = {
        (r.start_time_min, r.service_name) for r in jaeger.requests if trace_id in r.answered
    }
    assert len({lo for lo, _ in windows_of}) == 2 and len({s for _, s in windows_of}) > 1
    answered = {key for r in jaeger.requests for key in r.answered}
    wanted = [span for key in answered for span in by_trace[key]]
    back = load_spans(tmp_path)
    assert sorted(back, key=ids) == sorted(wanted, key=ids)  # each span once
    assert got.traces == len(answered) and got.spans == len(wanted)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_cap_left_at_the_smallest_window_is_counted_and_warned(
    jaeger: JaegerAPI, transport: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # the two traces starting closest together: within one window of 1 s
    starts = sorted(min(s.start_ns for s in spans) for spans in traces(SPANS).values())
    gap, first = min((b - a, a) for a, b in itertools.pairwise(starts))
    assert gap < S
    low = first - (S - gap) // 2  # [low, low + 1 s) holds both, nothing else within a second
    assert [t for t in starts if low - S <= t < low + S] == [first, first + gap]
    with caplog.at_level(logging.WARNING, logger="otelkit.analysis"):
        got = import_jaeger(
            url(jaeger, transport),
            tmp_path,
            since_ns=low - S,
            until_ns=low + S,
            services=[CLIENT],
            window_s=2,
            search_depth=2,
        )
    assert (got.traces, got.capped, got.left_out) == (2, 1, 0)
    searched = [(r.start_time_min, r.start_time_max, len(r.answered)) for r in jaeger.requests]
    assert searched == [(low - S, low + S, 2), (low - S, low, 0), (low, low + S, 2)]
    warned = [r for r in caplog.records if r.name == "otelkit.analysis" and "limit" in r.message]
    assert len(warned) == 1 and "limit of 2 traces" in warned[0].getMessage()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_partial_trace_is_written_and_counted_or_written_once_whole(
    jaeger: JaegerAPI, transport: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    parents = {s.parent_span_id for s in SPANS}
    # a span between a root and its children: without it, the children's parent is missing
    middle = next(s for s in SPANS if s.parent_span_id and s.span_id in parents)
    jaeger.hidden = {middle.span_id}
    # the range ends inside the trace: it is written partial all the same, not forgotten
    until = min(s.start_ns for s in SPANS if s.trace_id == middle.trace_id) + 1
    found = {s.trace_id for s in SPANS if s.start_ns < until}
    with caplog.at_level(logging.WARNING, logger="otelkit.analysis"):
        got = import_jaeger(
            url(jaeger, transport),
            tmp_path / "partial",
            since_ns=FIRST,
            until_ns=until,
            services=SERVICES,
            window_s=10,
        )
    assert (got.traces, got.partial, got.left_out, got.capped) == (len(found), 1, 0, 0)
    written = [s for s in load_spans(tmp_path / "partial") if s.trace_id == middle.trace_id]
    expected = [s for s in SPANS if s.trace_id == middle.trace_id and s.span_id != middle.span_id]
    assert sorted(written, key=ids) == sorted(expected, key=ids)  # as Jaeger holds it
    assert any(
        "1 traces written partial" in r.message and middle.trace_id in r.message
        for r in caplog.records
    )

    # found again after the span arrived: the whole copy is written, once
    jaeger.requests.clear()
    jaeger.on_search = lambda request: jaeger.hidden.clear() if len(jaeger.requests) > 1 else None
    jaeger.hidden = {middle.span_id}
    got = import_jaeger(
        url(jaeger, transport),
        tmp_path / "whole",
        since_ns=FIRST,
        until_ns=LAST + 1,
        services=SERVICES,
    )
    assert (got.traces, got.left_out, got.spans) == (24, 0, len(SPANS))
    assert sorted(load_spans(tmp_path / "whole"), key=ids) == sorted(SPANS, key=ids)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_window_without_traces_is_empty(
    jaeger: JaegerAPI, transport: str, tmp_path: Path
) -> None:
    got = import_jaeger(
        url(jaeger, transport),
        tmp_path,
        since_ns=FIRST - 3600 * S,
        until_ns=FIRST,
        services=[CLIENT, "no-such-service"],
        operation="reconstruct event",
    )
    assert got == Imported(0, 0, 0)
    assert not list(tmp_path.glob("*.parquet"))
    assert [(r.service_name, r.operation_name, r.answered) for r in jaeger.requests] == [
        (CLIENT, "reconstruct event", []),
        ("no-such-service", "reconstruct event", []),
    ]
    if transport == "http":  # Jaeger's 404 for no traces, read as an empty window
        status, body = jaeger.http_find(jaeger.requests[0].params)
        assert status == 404 and b"No traces found" in body
    else:
        assert jaeger.requests[0].fields == [1, 2, 4, 5, 8, 9]


def test_an_operation_narrows_the_search(jaeger: JaegerAPI, tmp_path: Path) -> None:
    operation = next(s.name for s in SPANS if s.resource["service.name"] == "triton")
    got = import_jaeger(
        jaeger.http_url,
        tmp_path,
        since_ns=FIRST,
        until_ns=LAST + 1,
        services=["triton"],
        operation=operation,
    )
    (request,) = jaeger.requests
    assert request.params["query.operation_name"] == [operation]
    with_it = {
        s.trace_id for s in SPANS if s.name == operation and s.resource["service.name"] == "triton"
    }
    assert {s.trace_id for s in load_spans(tmp_path)} == with_it and got.traces == len(with_it)


def _bad(api: JaegerAPI, case: str) -> tuple[str, dict[str, Any]]:
    """The address and arguments of a case that must fail, the server set up for it."""
    grpc_, http = api.grpc_url, api.http_url
    if case.endswith("slow"):
        api.delay_s = 10.0
    if case.endswith("error"):
        api.error = "elasticsearch: search failed: shard unavailable"
    replies = {
        "http not json": b"<html>busy</html>",
        "http no result": b'{"data": []}',
        "http not traces": b'{"result": {"resourceSpans": [{"scopeSpans": [{"spans": '
        b'[{"traceId": 5}]}]}]}}',
        "grpc not traces": b"\xff\xff\xff\xff",
    }
    api.reply = replies.get(case)
    return {
        "unknown scheme": "tempo://127.0.0.1:3200",
        "port not a number": "jaeger://127.0.0.1:port",
        "grpc with a path": f"{grpc_}/api",
        "no service": grpc_,
        "grpc unreachable": "jaeger://127.0.0.1:9",  # the discard port: refused at once
        "http unreachable": "jaeger+http://127.0.0.1:9",
        "grpc error": grpc_,
        "http error": http,
        "grpc slow": grpc_,
        "http slow": http,
        "grpc to the http port": f"jaeger://127.0.0.1:{api.http_port}",
        "http to the grpc port": f"jaeger+http://127.0.0.1:{api.grpc_port}",
        "http wrong path": f"{http}/jaeger",
        **dict.fromkeys(replies, grpc_ if case.startswith("grpc") else http),
    }[case], {"services": [] if case == "no service" else [CLIENT]}


BAD = {
    "unknown scheme": "not a Jaeger address: jaeger://host:16685",
    "port not a number": "not a Jaeger address: Port could not be cast",
    "grpc with a path": "a gRPC address has no path",
    "no service": "query.service_name is required",
    "grpc unreachable": "cannot reach Jaeger's api_v3 over gRPC: .*Connection refused",
    "http unreachable": "cannot reach Jaeger: .*Connection refused",
    "grpc error": "Jaeger answered INTERNAL: elasticsearch: search failed",
    "http error": "Jaeger answered HTTP 500: elasticsearch: search failed",
    "grpc slow": r"no answer within 0.5 s",
    "http slow": r"no answer within 0.5 s",
    "grpc to the http port": "cannot reach Jaeger's api_v3 over gRPC: .*HTTP/2",
    "http to the grpc port": r"not HTTP/1.1: is this Jaeger's query HTTP port \(16686\)",
    "http wrong path": "404 without Jaeger's error JSON: no api_v3 at http://127.0.0.1:\\d+/jaeger",
    "http not json": "the answer is not JSON",
    "http no result": "not Jaeger's answer, no result",
    "http not traces": "the answer is not OTLP TracesData",
    "grpc not traces": "a message is not OTLP TracesData",
}


@pytest.mark.parametrize("case", list(BAD))
def test_what_cannot_be_read_is_a_store_error_within_the_timeout(
    jaeger: JaegerAPI, case: str, tmp_path: Path
) -> None:
    address, arguments = _bad(jaeger, case)
    began = time.monotonic()
    with pytest.raises(StoreError, match=BAD[case]):
        import_jaeger(
            address, tmp_path, since_ns=FIRST, until_ns=LAST + 1, timeout_s=0.5, **arguments
        )
    assert time.monotonic() - began < 3.0
    assert not list(tmp_path.glob("*.parquet"))


def test_requests_the_server_refuses_say_why(jaeger: JaegerAPI, tmp_path: Path) -> None:
    """The server refuses as Jaeger does (a window whose minimum is not before its maximum,
    sent by hand: the reader never would), and the reader checks its own arguments before it
    sends anything."""
    status, body = jaeger.http_find(
        {
            "query.service_name": [CLIENT],
            "query.start_time_min": ["2026-11-26T05:05:10.000000000Z"],
            "query.start_time_max": ["2026-11-26T05:05:10.000000000Z"],
        }
    )
    assert status == 400 and b"must be before" in body
    assert [(r.transport, r.answered) for r in jaeger.requests] == []  # refused before searching
    for bad in (dict(window_s=0.0), dict(search_depth=0), dict(timeout_s=float("nan"))):
        with pytest.raises(StoreError, match="must be"):
            import_jaeger(
                jaeger.grpc_url, tmp_path, since_ns=FIRST, until_ns=LAST, services=[CLIENT], **bad
            )
    with pytest.raises(StoreError, match="an empty time window"):
        import_jaeger(jaeger.grpc_url, tmp_path, since_ns=LAST, until_ns=FIRST, services=[CLIENT])
    assert jaeger.requests == []


def test_the_test_server_decodes_requests_by_the_published_numbers() -> None:
    """The server's decoder, against bytes written by hand from the proto's text."""
    from tests.analysis import jaeger_api

    def varint(value: int) -> bytes:
        out = b""
        while value > 0x7F:
            out, value = out + bytes([value & 0x7F | 0x80]), value >> 7
        return out + bytes([value])

    def length(number: int, data: bytes) -> bytes:
        return varint(number << 3 | 2) + varint(len(data)) + data

    stamp = varint(1 << 3) + varint(1_795_669_510) + varint(2 << 3) + varint(733_392_976)
    query = (
        length(1, b"triton")
        + length(4, stamp)
        + length(5, stamp)
        + varint(8 << 3)
        + varint(20)
        + varint(9 << 3)
        + varint(1)
    )
    fields = jaeger_api._message(query, jaeger_api._TRACE_QUERY_PARAMETERS)
    assert fields["service_name"] == b"triton" and fields["search_depth"] == 20
    assert jaeger_api._timestamp(fields["start_time_min"]) == 1_795_669_510_733_392_976
    assert fields["numbers"] == [1, 4, 5, 8, 9] and fields["unknown"] == []
    with pytest.raises(ValueError, match="wire type 0, the proto says 2"):  # a number misread
        jaeger_api._message(varint(4 << 3) + varint(7), jaeger_api._TRACE_QUERY_PARAMETERS)


def test_breakdown_and_import_read_jaeger_through_the_source_seam(
    jaeger: JaegerAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``otelkit breakdown --source jaeger://...`` prints the JSON lines' table; ``otelkit
    import`` of the same window writes the same spans."""
    window = ["--since", f"{FIRST / 1e9:.6f}", "--until", f"{(LAST + 1) / 1e9 + 1:.6f}"]
    chosen = [*window, "--service", CLIENT]
    group = ["--group-by", "gnn_tracking.option"]
    cache = ["--cache", str(tmp_path / "cache")]
    assert main(["breakdown", "--source", jaeger.grpc_url, *chosen, *group, *cache]) == 0
    from_jaeger = capsys.readouterr().out
    assert main(["breakdown", str(DEMO), *group]) == 0
    assert from_jaeger == capsys.readouterr().out and "server gnn" in from_jaeger
    assert main(["import", jaeger.http_url, *chosen, "--out", str(tmp_path / "store")]) == 0
    assert sorted(load_spans(tmp_path / "store"), key=ids) == sorted(SPANS, key=ids)
    assert main(["import", jaeger.http_url, *window, "--out", str(tmp_path / "none")]) == 2
    assert "service" in capsys.readouterr().err  # Jaeger searches a service at a time
