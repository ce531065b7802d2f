"""otelkit.analysis._tempo: Grafana Tempo's HTTP API into the span store.

A real HTTP server (``tests/analysis/tempo_api.py``) answers Tempo's search and trace-by-id
API from the committed demo traces as Tempo writes them (ids base64, enums by name, search ids
with their leading zeros cut). Imported and broken down, they must give what the same spans
give from their JSON lines; the range must be walked in windows, a full window split, a trace
found twice fetched once, a cap at one second counted and warned of, a trace not brought
counted; every kind of bad input must say what is wrong, within the timeout.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otelkit.analysis import load_spans
from otelkit.analysis._store import StoreError
from otelkit.analysis._tempo import import_tempo
from otelkit.cli import main
from tests.analysis.summaries import assert_breaks_down_as
from tests.analysis.tempo_api import NS, TempoApi, load_docs
from tests.analysis.test_store import DEMO

pytest.importorskip("pyarrow")

S0 = 1795669510  # the second the demo's first trace starts in
SINCE, UNTIL = S0 * NS, (S0 + 70) * NS  # every demo trace
CLIENT = "gnn-tracking-client"


@pytest.fixture
def tempo() -> Iterator[TempoApi]:
    with TempoApi(load_docs(DEMO)) as server:
        yield server


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server is on 127.0.0.1: never through a proxy the environment names."""
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def test_imports_and_breaks_down_as_its_json_lines(tempo: TempoApi, tmp_path: Path) -> None:
    got = import_tempo(
        tempo.url, tmp_path / "store", since_ns=SINCE, until_ns=UNTIL, segment_spans=150
    )
    spans = load_spans(DEMO)
    assert got == (len(spans), 3, 24, 0, 0, 0)
    [search] = tempo.searches()
    assert search.params == {
        "q": "{}",
        "limit": "1000",
        "start": str(S0),
        "end": str(S0 + 70),
        "spss": "1",
    }
    # Tempo cuts a trace id's leading zeros in its search answer: fetched padded back
    trimmed = [trace_id for trace_id in search.answered if len(trace_id) < 32]
    assert trimmed and all(
        f"/api/v2/traces/{t.zfill(32)}" in {f.path for f in tempo.fetches()} for t in trimmed
    )
    back = load_spans(tmp_path / "store")
    assert sorted((s.trace_id, s.span_id) for s in back) == sorted(
        (s.trace_id, s.span_id) for s in spans
    )
    by_id = {s.span_id: s for s in spans}
    for span in back:  # every field as the files hold it: Tempo keeps attributes typed
        assert span == by_id[span.span_id]
    for fetch in tempo.fetches():  # the trace's own time span, an hour either side
        trace = tempo.traces[fetch.path.rsplit("/", 1)[1]]
        assert fetch.params["span_pruning"] == "false"
        assert int(fetch.params["start"]) == trace.start_ns // NS - 3600
        assert 0 <= int(fetch.params["end"]) - (trace.end_ns // NS + 3600) <= 1
    assert_breaks_down_as(tmp_path / "store", load_spans(DEMO), tmp_path / "files")


def test_windows_are_walked_and_a_full_one_split(tempo: TempoApi, tmp_path: Path) -> None:
    got = import_tempo(tempo.url, tmp_path, since_ns=SINCE, until_ns=UNTIL, window_s=40, limit=4)
    assert got.traces == 24 and got.capped == 0
    searched = [
        (int(r.params["start"]) - S0, int(r.params["end"]) - S0, len(r.answered))
        for r in tempo.searches()
    ]
    assert searched == [
        (0, 40, 4),
        (0, 20, 4),
        (0, 10, 4),
        (0, 5, 2),
        (5, 10, 2),
        (10, 20, 4),
        (10, 15, 2),
        (15, 20, 2),
        (20, 40, 4),
        (20, 30, 3),
        (30, 40, 3),
        (40, 70, 4),
        (40, 55, 4),
        (40, 47, 4),
        (40, 43, 2),
        (43, 47, 2),
        (47, 55, 2),
        (55, 70, 4),
        (55, 62, 2),
        (62, 70, 2),
    ]
    assert {r.params["limit"] for r in tempo.searches()} == {"4"}
    fetched = [r.path for r in tempo.fetches()]
    assert len(fetched) == len(set(fetched)) == 24  # found again in the halves: fetched once


def test_a_trace_found_in_two_windows_is_fetched_once(tempo: TempoApi, tmp_path: Path) -> None:
    got = import_tempo(tempo.url, tmp_path, since_ns=SINCE, until_ns=UNTIL, window_s=30)
    searches = tempo.searches()
    assert [(int(r.params["start"]) - S0, int(r.params["end"]) - S0) for r in searches] == [
        (0, 30),
        (30, 60),
        (60, 70),
    ]
    twice = set(searches[1].answered) & set(searches[2].answered)  # 59.93 s to 60.03 s
    assert len(twice) == 1
    fetched = [r.path for r in tempo.fetches()]
    assert len(fetched) == len(set(fetched)) == 24 == got.traces
    assert len(load_spans(tmp_path)) == 396


def test_a_cap_at_one_second_is_counted_and_warned_of(
    tempo: TempoApi, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="otelkit.analysis"):
        got = import_tempo(
            tempo.url, tmp_path, since_ns=(S0 + 13) * NS, until_ns=(S0 + 16) * NS, limit=1
        )
    searched = [(int(r.params["start"]) - S0, int(r.params["end"]) - S0) for r in tempo.searches()]
    assert searched == [(13, 16), (13, 14), (14, 16), (14, 15), (15, 16)]
    assert (got.traces, got.capped, got.left_out) == (2, 2, 0)
    warned = [r.getMessage() for r in caplog.records if "its limit" in r.getMessage()]
    assert len(warned) == 2
    assert f"from {S0 + 13} to {S0 + 14} s" in warned[0] and "larger limit" in warned[0]


def test_traces_not_brought_are_counted(
    tempo: TempoApi, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ids = sorted(tempo.traces)
    gone, hidden, partial, failing = ids[:4]
    tempo.gone.add(gone)  # v2: 200 with an empty trace
    tempo.hidden.add(hidden)  # v2 and v1: 404
    tempo.partial.add(partial)  # v2: PARTIAL, half the spans
    tempo.trace_status[failing] = (503, b"too many outstanding requests")
    with caplog.at_level(logging.WARNING, logger="otelkit.analysis"):
        got = import_tempo(tempo.url, tmp_path, since_ns=SINCE, until_ns=UNTIL)
    assert (got.traces, got.left_out) == (20, 4)
    kept = [t for t in ids if t not in (gone, hidden, partial, failing)]
    assert got.spans == sum(len(tempo.traces[t].spans) for t in kept)
    assert {s.trace_id for s in load_spans(tmp_path)} == set(kept)
    warned = "\n".join(r.getMessage() for r in caplog.records)
    assert f"{gone} left out: not found" in warned and f"{hidden} left out: not found" in warned
    assert f"{partial} left out: partial: Trace exceeds maximum size" in warned
    assert f"{failing} left out: /api/v2/traces/{failing} answered 503 too many" in warned
    # a 404 from v2 (hidden, or no v2 API) is asked of v1; the others are not
    v1 = [r.path for r in tempo.fetches() if r.path.startswith("/api/traces/")]
    assert v1 == [f"/api/traces/{hidden}"]


def test_a_tempo_before_the_v2_api_is_read_through_v1(tempo: TempoApi, tmp_path: Path) -> None:
    tempo.v1_only = True
    got = import_tempo(tempo.url, tmp_path, since_ns=SINCE, until_ns=UNTIL)
    assert (got.spans, got.traces, got.left_out) == (396, 24, 0)
    fetched = [r.path for r in tempo.fetches()]
    assert fetched[0].startswith("/api/v2/traces/")  # tried once, answered 404
    assert all(p.startswith("/api/traces/") for p in fetched[1:]) and len(fetched) == 25


def test_services_and_a_query_become_traceql(tempo: TempoApi, tmp_path: Path) -> None:
    got = import_tempo(
        tempo.url, tmp_path / "a", since_ns=SINCE, until_ns=UNTIL, services=["triton"]
    )
    assert got.traces == 16
    assert tempo.searches()[-1].params["q"] == '{ resource.service.name = "triton" }'
    got = import_tempo(
        tempo.url,
        tmp_path / "b",
        since_ns=SINCE,
        until_ns=UNTIL,
        services=["gnn-tracking-fastapi", 'a "quoted" \\ name'],
    )
    assert got.traces == 4
    assert tempo.searches()[-1].params["q"] == (
        '{ resource.service.name = "gnn-tracking-fastapi" || '
        'resource.service.name = "a \\"quoted\\" \\\\ name" }'
    )
    query = '{ resource.service.name = "gnn-tracking-models" }'
    got = import_tempo(tempo.url, tmp_path / "c", since_ns=SINCE, until_ns=UNTIL, query=query)
    assert got.traces == 16 and tempo.searches()[-1].params["q"] == query
    with pytest.raises(StoreError, match="services or a TraceQL query, not both"):
        import_tempo(
            tempo.url, tmp_path, since_ns=SINCE, until_ns=UNTIL, services=["a"], query=query
        )


def test_credentials_and_tenant_travel_as_headers(tmp_path: Path) -> None:
    with TempoApi(load_docs(DEMO), org_id="team-a") as tempo:
        with pytest.raises(
            StoreError, match=r"401 no org id \(a multi-tenant Tempo: give .*X-Scope-OrgID"
        ):
            import_tempo(tempo.url, tmp_path, since_ns=SINCE, until_ns=UNTIL)
        headers = {"X-Scope-OrgID": "team-a", "Authorization": "Bearer t0ken"}
        got = import_tempo(tempo.url, tmp_path, since_ns=SINCE, until_ns=UNTIL, headers=headers)
        assert got.traces == 24
        seen = tempo.requests[1:]
        assert all(r.headers["x-scope-orgid"] == "team-a" for r in seen)
        assert all(r.headers["authorization"] == "Bearer t0ken" for r in seen)
        other = import_tempo(
            tempo.url,
            tmp_path / "b",
            since_ns=SINCE,
            until_ns=UNTIL,
            headers={"X-Scope-OrgID": "b"},
        )
        assert other.traces == 0  # another tenant's Tempo holds none of them
        url = tempo.url.replace("://", "://reader:s3cret@")
        got = import_tempo(
            url, tmp_path / "c", since_ns=SINCE, until_ns=UNTIL, headers={"X-Scope-OrgID": "team-a"}
        )
        basic = base64.b64encode(b"reader:s3cret").decode()
        assert got.traces == 24 and tempo.requests[-1].headers["authorization"] == f"Basic {basic}"


def _refused_port() -> int:
    with socket.socket() as probe:  # a port nothing listens on once it is closed
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_bad_input_says_what_is_wrong(tempo: TempoApi, tmp_path: Path) -> None:
    def run(url: str = tempo.url, **options: Any) -> str:
        with pytest.raises(StoreError) as raised:
            import_tempo(url, tmp_path, **{"since_ns": SINCE, "until_ns": UNTIL, **options})
        return str(raised.value)

    assert "not a Tempo URL" in run("http://127.0.0.1:3200")
    assert "not a Tempo URL" in run("jaeger://127.0.0.1:16686")
    assert "names no host" in run("tempo://:3200")
    assert "empty time range" in run(since_ns=UNTIL, until_ns=SINCE)
    assert "must be at least 1" in run(limit=0)
    port = _refused_port()
    message = run(f"tempo://reader:s3cret@127.0.0.1:{port}")
    assert f"cannot reach Tempo at tempo://reader:***@127.0.0.1:{port}" in message
    assert "s3cret" not in message
    message = run(query="{ span.http.status_code = 500 | rate() }")
    assert "refused the search" in message and "400 invalid TraceQL query: parse error" in message
    tempo.search_answer = (500, b"internal error: querier unavailable")
    assert "500 internal error: querier unavailable" in run()
    tempo.search_answer = (200, b"<html>a proxy's login page</html>")
    assert 'not JSON: "<html>a proxy\'s login page</html>"' in run()
    tempo.search_answer = (200, b'{"traces": {"traceID": "ab"}}')
    assert 'not a search result ({"traces": [...]})' in run()
    tempo.search_answer = (200, b'{"traces": [{"traceID": "not hex"}]}')
    assert "a trace without a hex traceID" in run()
    tempo.search_answer = None
    first = min(tempo.traces, key=lambda t: tempo.traces[t].start_ns)
    tempo.trace_status[first] = (200, b'{"trace": [1, 2]}')
    assert 'not {"trace": {"resourceSpans": [...]}}' in run(until_ns=SINCE + NS)
    tempo.trace_status[first] = (
        200,
        json.dumps(
            {"trace": {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "xyz"}]}]}]}}
        ).encode(),
    )
    assert f"trace {first}: OTLP JSON: resourceSpans[0].scopeSpans[0].spans[0].traceId" in run(
        until_ns=SINCE + NS
    )
    tempo.trace_status[first] = (403, b"forbidden")
    assert f"refused trace {first}" in run(until_ns=SINCE + NS)
    assert not list(tmp_path.glob("*.parquet"))


def test_a_slow_server_is_given_up_on_within_the_timeout(tempo: TempoApi, tmp_path: Path) -> None:
    tempo.delay_s = 5.0
    began = time.monotonic()
    with pytest.raises(StoreError, match=r"did not answer /api/search within 0.3 s"):
        import_tempo(tempo.url, tmp_path, since_ns=SINCE, until_ns=UNTIL, timeout_s=0.3)
    assert time.monotonic() - began < 2.0


def test_breakdown_reads_tempo_through_the_source_seam(
    tempo: TempoApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``otelkit breakdown --source tempo://...``: the same table as from the JSON lines, and
    an ended window read from the cache the second time (no search sent)."""
    window = ["--since", str(S0), "--until", str(S0 + 70), "--cache", str(tmp_path / "cache")]
    group = ["--group-by", "gnn_tracking.option", "--service", CLIENT]
    assert main(["breakdown", "--source", tempo.url, *window, *group]) == 0
    from_tempo = capsys.readouterr().out
    assert main(["breakdown", str(DEMO), "--group-by", "gnn_tracking.option"]) == 0
    assert from_tempo == capsys.readouterr().out and "server gnn" in from_tempo
    searched = len(tempo.searches())
    assert searched >= 1
    assert main(["breakdown", "--source", tempo.url, *window, *group]) == 0
    assert len(tempo.searches()) == searched  # the cache answered


def test_a_trace_missing_a_parent_is_written_and_counted_partial(tmp_path: Path) -> None:
    """A trace Tempo holds whole by its own word, whose spans name a parent it never got (a
    service that does not export): written as it is, counted, the breakdown's to judge."""
    spans = load_spans(DEMO)
    parents = {s.parent_span_id for s in spans}
    middle = next(s for s in spans if s.parent_span_id and s.span_id in parents)
    docs = load_docs(DEMO)
    for doc in docs:
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                ss["spans"] = [s for s in ss["spans"] if s["spanId"] != middle.span_id]
    with TempoApi(docs) as server:
        got = import_tempo(server.url, tmp_path, since_ns=SINCE, until_ns=UNTIL)
    assert (got.traces, got.partial, got.left_out) == (24, 1, 0)
    assert got.spans == len(spans) - 1
