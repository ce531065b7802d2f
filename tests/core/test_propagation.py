"""W3C Trace Context (Level 1 and 2) and W3C Baggage propagation against the spec text.

Vectors follow https://www.w3.org/TR/trace-context-2/, the W3C test suite
(w3c/trace-context test/test.py) and https://www.w3.org/TR/baggage/.
"""

from __future__ import annotations

import email
import http.client
import io
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import pytest
from multidict import CIMultiDict
from opentelemetry import baggage, propagate, trace
from opentelemetry.context import Context, attach, detach
from opentelemetry.propagators import textmap
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    NonRecordingSpan,
    SpanContext,
    TraceFlags,
    TraceState,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.datastructures import Headers, MutableHeaders

from otelkit._propagation import (
    W3CPropagator,
    W3CTraceState,
    extract,
    format_traceparent,
    format_tracestate,
    inject,
    parse_traceparent,
    parse_tracestate,
)

T = "4bf92f3577b34da6a3ce929d0e0e4736"  # trace-id and parent-id of the spec's examples
S = "00f067aa0ba902b7"
TP = f"00-{T}-{S}-01"


def remote(flags: int, entries: list[tuple[str, str]] | None = None) -> SpanContext:
    state = W3CTraceState(entries) if entries else None
    return SpanContext(int(T, 16), int(S, 16), True, TraceFlags(flags), state)


def summary(context: Context) -> tuple[SpanContext, list[tuple[str, str]], dict[str, object]]:
    """Everything a context propagates; the list keeps tracestate order, which == ignores."""
    span_context = trace.get_current_span(context).get_span_context()
    return span_context, list(span_context.trace_state.items()), dict(baggage.get_all(context))


def context_of(span_context: SpanContext, **entries: str) -> Context:
    context = trace.set_span_in_context(NonRecordingSpan(span_context))
    for key, value in entries.items():
        context = baggage.set_baggage(key, value, context)
    return context


# --- traceparent -----------------------------------------------------------------------------

VALID_TRACEPARENTS = [
    pytest.param(TP, 0x01, id="v00-sampled"),
    pytest.param(f"00-{T}-{S}-00", 0x00, id="v00-unsampled"),
    pytest.param(f"00-{T}-{S}-02", 0x02, id="level2-random"),
    pytest.param(f"00-{T}-{S}-03", 0x03, id="sampled-and-random"),
    pytest.param(f"00-{T}-{S}-ff", 0x03, id="unknown-bits-zeroed"),
    pytest.param(f"00-{T}-{S}-08", 0x00, id="only-unknown-bit"),
    pytest.param(f" \t{TP}\t ", 0x01, id="surrounding-ows"),
    pytest.param(f"cc-{T}-{S}-01", 0x01, id="future-version-55-chars"),
    pytest.param(f"cc-{T}-{S}-01-what-the-future-will-be-like", 0x01, id="future-version-more"),
    pytest.param(f"01-{T}-{S}-09-", 0x01, id="future-version-trailing-dash"),
    pytest.param(f"fe-{T}-{S}-00-x-y", 0x00, id="highest-version"),
]

INVALID_TRACEPARENTS = [
    pytest.param("", id="empty"),
    pytest.param(" \t ", id="only-ows"),
    pytest.param(f"00-{T.upper()}-{S}-01", id="uppercase-trace-id"),
    pytest.param(f"00-{T}-{S.upper()}-01", id="uppercase-parent-id"),
    pytest.param(f"0A-{T}-{S}-01", id="uppercase-version"),
    pytest.param(f"00-{T}-{S}-0A", id="uppercase-flags"),
    pytest.param(f"0-{T}-{S}-01", id="version-too-short"),
    pytest.param(f"000-{T}-{S}-01", id="version-too-long"),
    pytest.param(f"00-{T[:-1]}-{S}-01", id="trace-id-31"),
    pytest.param(f"00-{T}0-{S}-01", id="trace-id-33"),
    pytest.param(f"00-{T}-{S[:-1]}-01", id="parent-id-15"),
    pytest.param(f"00-{T}-{S}0-01", id="parent-id-17"),
    pytest.param(f"00-{T}-{S}-1", id="flags-too-short"),
    pytest.param(f"00-{T}-{S}-011", id="flags-too-long"),
    pytest.param(f".0-{T}-{S}-01", id="version-bad-char"),
    pytest.param(f"00-{T[:-1]}g-{S}-01", id="trace-id-bad-char"),
    pytest.param(f"00-{T}-{S[:-1]}.-01", id="parent-id-bad-char"),
    pytest.param(f"00-{T}-{S}-0.", id="flags-bad-char"),
    pytest.param(f"00-{T[:8]}_{T[9:]}-{S}-01", id="underscore-that-int-accepts"),
    pytest.param(f"00-\u0664{T[1:]}-{S}-01", id="unicode-digit-that-int-accepts"),
    pytest.param(f"00_{T}_{S}_01", id="wrong-separators"),
    pytest.param(f"00 -{T}-{S}-01", id="ows-inside"),
    pytest.param(f"ff-{T}-{S}-01", id="version-ff"),
    pytest.param(f"00-{'0' * 32}-{S}-01", id="zero-trace-id"),
    pytest.param(f"00-{T}-{'0' * 16}-01", id="zero-parent-id"),
    pytest.param(f"00-{T}-{S}-01-what-the-future-will-be-like", id="v00-extra-field"),
    pytest.param(f"00-{T}-{S}-01-", id="v00-trailing-dash"),
    pytest.param(f"00-{T}-{S}-01.", id="v00-trailing-char"),
    pytest.param(f"cc-{T}-{S}-01.what-the-future-will-be-like", id="future-56th-not-dash"),
    pytest.param(f"cc-{T}-{S}-01what", id="future-glued"),
    pytest.param(f"cc-{T}-{S}-0", id="future-too-short"),
    pytest.param(f"{TP},{TP}", id="two-headers-combined"),
    pytest.param(f"cc-{T}-{S}-01,cc-{T}-{S}-01", id="two-future-headers-combined"),
]


@pytest.mark.parametrize(("value", "flags"), VALID_TRACEPARENTS)
def test_valid_traceparent(value: str, flags: int) -> None:
    assert parse_traceparent(value) == remote(flags)
    assert summary(extract({"traceparent": value})) == (remote(flags), [], {})


@pytest.mark.parametrize("value", INVALID_TRACEPARENTS)
def test_invalid_traceparent_gives_no_span_and_drops_tracestate(value: str) -> None:
    headers = {"traceparent": value, "tracestate": "rojo=00f067aa0ba902b7", "baggage": "k=v"}
    assert parse_traceparent(value) is None
    assert summary(extract(headers)) == (INVALID_SPAN_CONTEXT, [], {"k": "v"})


def test_extract_starts_from_an_empty_context_not_the_current_one() -> None:
    token = attach(context_of(remote(1), leaked="1"))
    try:
        assert summary(extract({"baggage": "k=v"})) == (INVALID_SPAN_CONTEXT, [], {"k": "v"})
    finally:
        detach(token)


def test_invalid_traceparent_leaves_the_given_context_unchanged() -> None:
    given = context_of(remote(1))
    assert extract({"traceparent": f"ff-{T}-{S}-01"}, given) == given


def test_inject_writes_version_00_with_known_flags_only() -> None:
    incoming = {"traceparent": f"cc-{T}-{S}-ff-future-data"}
    assert inject({}, extract(incoming)) == {"traceparent": f"00-{T}-{S}-03"}
    assert format_traceparent(SpanContext(1, 2, False, TraceFlags(0x85))) == (
        "00-00000000000000000000000000000001-0000000000000002-01"
    )


def test_format_traceparent_refuses_an_invalid_span_context() -> None:
    with pytest.raises(ValueError, match="invalid span context"):
        format_traceparent(INVALID_SPAN_CONTEXT)


# --- tracestate ------------------------------------------------------------------------------

ALL_VALUE_CHARS = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) not in ",=")
MEMBERS_32 = [(f"k{i}", str(i)) for i in range(32)]

VALID_TRACESTATES = [
    pytest.param("rojo=00f067aa0ba902b7", [("rojo", "00f067aa0ba902b7")], id="one"),
    pytest.param("congo=t61rcWkgMzE,rojo=1", [("congo", "t61rcWkgMzE"), ("rojo", "1")], id="order"),
    pytest.param(" \ta=1 \t, \tb=2\t ", [("a", "1"), ("b", "2")], id="ows-around-members"),
    pytest.param(",, a=1 ,,\t,b=2,", [("a", "1"), ("b", "2")], id="empty-members"),
    pytest.param("", [], id="empty-header"),
    pytest.param("a=1 ", [("a", "1")], id="trailing-space-is-ows"),
    pytest.param("a= x y", [("a", " x y")], id="inner-and-leading-spaces-kept"),
    pytest.param(
        f"a_-*/@0={ALL_VALUE_CHARS[1:]}", [("a_-*/@0", ALL_VALUE_CHARS[1:])], id="all-chars"
    ),
    pytest.param("1abc=1", [("1abc", "1")], id="key-starts-with-digit"),
    pytest.param(
        "a@b@c=1,foo@=2,foo@@bar=3",
        [("a@b@c", "1"), ("foo@", "2"), ("foo@@bar", "3")],
        id="level2-at-signs",
    ),
    pytest.param(f"{'k' * 256}={'v' * 256}", [("k" * 256, "v" * 256)], id="256-char-key-and-value"),
    pytest.param(",".join(f"{k}={v}" for k, v in MEMBERS_32), MEMBERS_32, id="32-members"),
    # Level 2: a duplicated key keeps the header; the first (most recent vendor's) value stays
    pytest.param("a=1,a=2", [("a", "1")], id="duplicate-keys"),
    pytest.param(
        "rojo=1,congo=2,rojo=3,x=4",
        [("rojo", "1"), ("congo", "2"), ("x", "4")],
        id="duplicate-key-among-others",
    ),
]

INVALID_TRACESTATES = [
    pytest.param(f"{'k' * 257}=1", id="257-char-key"),
    pytest.param(f"k={'v' * 257}", id="257-char-value"),
    pytest.param(",".join(f"k{i}={i}" for i in range(33)), id="33-members"),
    pytest.param("Rojo=1", id="uppercase-key"),
    pytest.param("a b=1", id="space-in-key"),
    pytest.param("a =1", id="space-before-equals"),
    pytest.param("_a=1", id="key-starts-with-underscore"),
    pytest.param("@a=1", id="key-starts-with-at"),
    pytest.param("a.b=1", id="dot-in-key"),
    pytest.param("a=", id="empty-value"),
    pytest.param("a", id="no-equals"),
    pytest.param("=1", id="no-key"),
    pytest.param("a=1=2", id="equals-in-value"),
    pytest.param("a=\t1", id="tab-in-value"),
    pytest.param("a=caf\u00e9", id="non-ascii-value"),
    pytest.param("a=1\x7f", id="del-in-value"),
    pytest.param("ok=1,BAD=2", id="one-bad-member-discards-all"),
]


@pytest.mark.parametrize(("value", "entries"), VALID_TRACESTATES)
def test_valid_tracestate(value: str, entries: list[tuple[str, str]]) -> None:
    assert parse_tracestate(value) == entries
    context = extract({"traceparent": TP, "tracestate": value})
    assert summary(context) == (remote(1, entries), entries, {})
    reinjected = {"traceparent": TP, "tracestate": ",".join(f"{k}={v}" for k, v in entries)}
    assert inject({}, context) == (reinjected if entries else {"traceparent": TP})


@pytest.mark.parametrize("value", INVALID_TRACESTATES)
def test_invalid_tracestate_is_discarded_whole_but_the_span_is_kept(value: str) -> None:
    assert parse_tracestate(value) is None
    context = extract({"traceparent": TP, "tracestate": value})
    assert summary(context) == (remote(1), [], {})
    assert inject({}, context) == {"traceparent": TP}


@pytest.mark.parametrize(
    "key",
    ["1abc", "a@b@c", "foo@", "foo@@bar", "tenant@1system", f"t@{'s' * 15}", f"{'k' * 242}@v"],
)
def test_level2_keys_that_opentelemetry_python_rejects_are_kept(key: str) -> None:
    headers = {"traceparent": TP, "tracestate": f"{key}=1,rojo=2"}
    theirs = TraceContextTextMapPropagator().extract(headers)
    assert summary(theirs) == (remote(1), [], {})  # OpenTelemetry's drops the whole tracestate
    assert TraceState([(key, "1")]) == {}
    assert summary(extract(headers)) == (
        remote(1, [(key, "1"), ("rojo", "2")]),
        [(key, "1"), ("rojo", "2")],
        {},
    )
    assert inject({}, extract(headers)) == headers


def test_w3c_trace_state_validates_like_the_header_parser() -> None:
    state = W3CTraceState(
        [("1abc", "x"), ("a@b@c", "y"), ("Bad", "z"), ("v", "trailing "), ("1abc", "dup")]
    )
    assert list(state.items()) == [("1abc", "x"), ("a@b@c", "y")]
    assert W3CTraceState([*MEMBERS_32, ("k32", "32")]) == {}
    assert list(W3CTraceState.from_header(["a=1", " b@c=2"]).items()) == [("a", "1"), ("b@c", "2")]
    assert list(W3CTraceState.from_header(["a=1", "a=2"]).items()) == [("a", "1")]  # Level 2


def test_w3c_trace_state_mutations_put_the_changed_key_first_and_stay_level2() -> None:
    state = W3CTraceState([("a", "1"), ("b", "2")])
    added, updated, deleted = state.add("1x@y", "3"), state.update("b", "9"), state.delete("a")
    assert [type(s) for s in (added, updated, deleted)] == [W3CTraceState] * 3
    assert list(added.items()) == [("1x@y", "3"), ("a", "1"), ("b", "2")]
    assert list(updated.items()) == [("b", "9"), ("a", "1")]
    assert list(deleted.items()) == [("b", "2")]
    assert list(added.update("1x@y", "4").delete("b").items()) == [("1x@y", "4"), ("a", "1")]
    for unchanged in (state.add("a", "5"), state.add("A", "5"), state.update("b", "x,y")):
        assert unchanged is state
    full = W3CTraceState(MEMBERS_32)
    assert full.add("new", "1") is full
    assert list(full.update("k5", "x").items())[:2] == [("k5", "x"), ("k0", "0")]


def test_format_tracestate_keeps_order_without_ows_and_validates_plain_mappings() -> None:
    assert format_tracestate(W3CTraceState([("z", "1"), ("a", "2")])) == "z=1,a=2"
    assert format_tracestate({"z": "1", "Bad": "x", "a@b": "2"}) == "z=1,a@b=2"


# --- carriers --------------------------------------------------------------------------------

Pairs = list[tuple[str, str]]


def as_dict_of_lists(pairs: Pairs) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for key, value in pairs:
        grouped.setdefault(key.lower(), []).append(value)
    return grouped


def as_email_message(pairs: Pairs) -> Any:
    return email.message_from_string("".join(f"{k}: {v}\r\n" for k, v in pairs) + "\r\n")


def as_http_message(pairs: Pairs) -> Any:
    raw = "".join(f"{k}: {v}\r\n" for k, v in pairs) + "\r\n"
    return http.client.parse_headers(io.BytesIO(raw.encode("latin-1")))


def as_starlette(pairs: Pairs) -> Any:
    return Headers(raw=[(k.lower().encode(), v.encode()) for k, v in pairs])


CARRIERS: dict[str, Callable[[Pairs], Any]] = {
    "dict": dict,
    "dict-of-lists": as_dict_of_lists,
    "grpc-metadata-list": list,
    "grpc-metadata-tuple": tuple,
    "grpc-aio-metadata": lambda pairs: grpc.aio.Metadata(*pairs),
    "asgi-raw-headers": lambda pairs: [(k.encode(), v.encode()) for k, v in pairs],
    "email-message": as_email_message,
    "http-client-message": as_http_message,
    "starlette-headers": as_starlette,
    "multidict": CIMultiDict,
}


@pytest.mark.parametrize("build", CARRIERS.values(), ids=CARRIERS.keys())
def test_extract_matches_names_in_any_case_and_combines_repeats(
    build: Callable[[Pairs], Any],
) -> None:
    pairs = [
        ("TraceParent", TP),
        ("TRACESTATE", "rojo=1"),
        ("x-request-id", "7"),
        ("tracestate", "1abc@x=2"),
        ("Baggage", "model=gnn"),
    ]
    entries = [("rojo", "1"), ("1abc@x", "2")]
    assert summary(extract(build(pairs))) == (remote(1, entries), entries, {"model": "gnn"})
    pairs.append(("traceparent", TP))  # a second traceparent makes it invalid
    assert summary(extract(build(pairs))) == (INVALID_SPAN_CONTEXT, [], {"model": "gnn"})


def test_duplicate_keys_across_tracestate_headers_keep_the_first() -> None:
    """Level 2: headers combined with ``,`` are one list; a duplicated key keeps the header."""
    context = extract([("traceparent", TP), ("tracestate", "a=1"), ("tracestate", "a=2,b=3")])
    entries = [("a", "1"), ("b", "3")]
    assert summary(context) == (remote(1, entries), entries, {})


OUTGOING = remote(3, [("congo", "t61rcWkgMzE"), ("1abc@x", "y")])
NEW_HEADERS = [("traceparent", f"00-{T}-{S}-03"), ("tracestate", "congo=t61rcWkgMzE,1abc@x=y")]


def test_inject_into_a_dict_replaces_ours_in_any_case_and_keeps_the_rest() -> None:
    carrier = {
        "Content-Type": "application/json",
        "TraceParent": "stale",
        "x-id": "7",
        "TRACESTATE": "old=1",
    }
    assert inject(carrier, context_of(OUTGOING)) is carrier
    assert carrier == {"Content-Type": "application/json", "x-id": "7", **dict(NEW_HEADERS)}


def test_inject_into_lists_and_tuples_keeps_caller_pairs_in_order() -> None:
    context = context_of(OUTGOING)
    metadata = [("authorization", "Bearer t"), ("Traceparent", "stale"), ("x-id", "7")]
    assert inject(metadata, context) is metadata
    assert metadata == [("authorization", "Bearer t"), ("x-id", "7"), *NEW_HEADERS]
    frozen = (("authorization", "Bearer t"), ("tracestate", "old=1"))
    assert inject(frozen, context) == (("authorization", "Bearer t"), *NEW_HEADERS)
    assert frozen == (("authorization", "Bearer t"), ("tracestate", "old=1"))
    raw = [(b"host", b"triton:8001"), (b"traceparent", b"stale")]
    assert inject(raw, context) == [
        (b"host", b"triton:8001"),
        *((k.encode(), v.encode()) for k, v in NEW_HEADERS),
    ]


@pytest.mark.parametrize(
    "build", [as_email_message, lambda p: MutableHeaders(raw=as_starlette(p).raw), CIMultiDict]
)
def test_inject_into_header_objects_leaves_one_of_each(build: Callable[[Pairs], Any]) -> None:
    carrier = build([("Accept", "*/*"), ("Traceparent", "a"), ("traceparent", "b")])
    inject(carrier, context_of(OUTGOING))
    assert [(k.lower(), v) for k, v in carrier.items()] == [("accept", "*/*"), *NEW_HEADERS]


def test_inject_with_an_invalid_span_context_writes_no_trace_headers() -> None:
    carrier = {"tracestate": "caller=1", "baggage": "caller=1"}
    assert inject(carrier, Context()) == {"tracestate": "caller=1", "baggage": "caller=1"}
    assert inject({"tracestate": "caller=1"}, context_of(INVALID_SPAN_CONTEXT, k="v")) == {
        "tracestate": "caller=1",
        "baggage": "k=v",
    }


def test_inject_drops_a_stale_tracestate_but_not_a_callers_baggage() -> None:
    carrier = {"tracestate": "stale=1", "Baggage": "caller=1"}
    assert inject(carrier, context_of(remote(1))) == {"Baggage": "caller=1", "traceparent": TP}


def test_inject_defaults_to_the_current_context() -> None:
    with trace.use_span(NonRecordingSpan(remote(0))):
        assert inject({}) == {"traceparent": f"00-{T}-{S}-00"}


# --- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("flags", ["00", "01", "02", "03"])
def test_extract_then_inject_gives_the_same_headers(flags: str) -> None:
    headers = {
        "traceparent": f"00-{T}-{S}-{flags}",
        "tracestate": "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7,1abc@x*/_-=a b",
        "baggage": "user=alice,score=0.5,note=caf%C3%A9%20%2C%3B",
    }
    assert inject({}, extract(headers)) == headers


def test_extract_then_inject_normalises_what_the_spec_lets_vary() -> None:
    incoming = {
        "TraceParent": f" cc-{T}-{S}-ff-future",
        "tracestate": " rojo=1 ,, congo=2\t",
        "baggage": "k = v ; prop=1",
    }
    assert inject({}, extract(incoming)) == {
        "traceparent": f"00-{T}-{S}-03",
        "tracestate": "rojo=1,congo=2",
        "baggage": "k=v",
    }


# --- baggage ---------------------------------------------------------------------------------

BAGGAGE_VECTORS = [
    pytest.param("k=v", {"k": "v"}, id="one"),
    pytest.param(" k1 = v1 ,\tk2=v2 ", {"k1": "v1", "k2": "v2"}, id="ows"),
    pytest.param("k=v;prop=1;flag, j=w ; p = 2", {"k": "v", "j": "w"}, id="properties-dropped"),
    pytest.param("k=a%20b%2C%3B%3D%25", {"k": "a b,;=%"}, id="percent-decoded"),
    pytest.param("k=%E2%9C%93", {"k": "\u2713"}, id="utf8"),
    pytest.param("k=%FFx", {"k": "\ufffdx"}, id="bad-utf8-is-replacement-char"),
    pytest.param("k=a+b", {"k": "a+b"}, id="plus-is-literal"),
    pytest.param("k=", {"k": ""}, id="empty-value"),
    pytest.param("!#$%&'*+-.^_`|~09AZaz=x", {"!#$%&'*+-.^_`|~09AZaz": "x"}, id="token-chars"),
    pytest.param(",,k=v,,", {"k": "v"}, id="empty-members"),
    pytest.param("bad key=1,k=v", {"k": "v"}, id="space-in-key-skipped"),
    pytest.param('k="v",j=1', {"j": "1"}, id="dquote-skipped"),
    pytest.param("k=a b,j=1", {"j": "1"}, id="space-in-value-skipped"),
    pytest.param("novalue,j=1", {"j": "1"}, id="no-equals-skipped"),
    pytest.param("k=v;=x,j=1", {"j": "1"}, id="bad-property-skipped"),
    pytest.param("k=caf\u00e9,j=1", {"j": "1"}, id="raw-non-ascii-skipped"),
]


@pytest.mark.parametrize(("header", "entries"), BAGGAGE_VECTORS)
def test_extract_baggage(header: str, entries: dict[str, str]) -> None:
    assert summary(extract({"baggage": header})) == (INVALID_SPAN_CONTEXT, [], entries)


def test_extract_baggage_adds_to_the_given_context_and_keeps_the_first_64() -> None:
    given = baggage.set_baggage("tenant", "cern", Context())
    header = ",".join(f"k{i}={i}" for i in range(70))
    expected = {"tenant": "cern", **{f"k{i}": str(i) for i in range(64)}}
    assert dict(baggage.get_all(extract({"baggage": header}, given))) == expected


def test_inject_baggage_percent_encodes_values_and_skips_keys_that_are_not_tokens() -> None:
    values = {"user": "Zo\u00eb \u03a9", "list": "a,b;c", "pct": "50%", "eq": "x=y", "plus": "a+b"}
    context = context_of(INVALID_SPAN_CONTEXT, **values)
    context = baggage.set_baggage("bad key", "x", context)
    expected = "user=Zo%C3%AB%20%CE%A9,list=a%2Cb%3Bc,pct=50%25,eq=x=y,plus=a+b"
    assert inject({}, context) == {"baggage": expected}
    assert dict(baggage.get_all(extract({"baggage": expected}))) == values


@pytest.mark.parametrize("first", [0, 64])
def test_baggage_round_trips_any_text(first: int) -> None:
    values = {f"k{i}": f"{chr(i)}{chr(i)} \u00e9\u2603\U0001f600" for i in range(first, first + 63)}
    context = context_of(INVALID_SPAN_CONTEXT, **values)
    assert dict(baggage.get_all(extract(inject({}, context)))) == values


def test_inject_baggage_drops_whole_members_past_the_w3c_limits() -> None:
    many = context_of(INVALID_SPAN_CONTEXT, **{f"k{i}": "v" for i in range(70)})
    assert inject({}, many) == {"baggage": ",".join(f"k{i}=v" for i in range(64))}
    big = context_of(INVALID_SPAN_CONTEXT, a="x" * 5000, b="y" * 5000, c="z")
    assert inject({}, big) == {"baggage": f"a={'x' * 5000},c=z"}


# --- OpenTelemetry interface, SDK and real transports ----------------------------------------


@pytest.fixture
def w3c_global_textmap() -> Iterator[None]:
    previous = propagate.get_global_textmap()
    propagate.set_global_textmap(W3CPropagator())
    yield
    propagate.set_global_textmap(previous)


@pytest.mark.usefixtures("w3c_global_textmap")
@pytest.mark.parametrize("flags", ["00", "01"])
def test_sdk_span_under_a_remote_parent_through_opentelemetry_propagate(flags: str) -> None:
    tracer = TracerProvider().get_tracer(__name__)
    incoming = {
        "traceparent": f"00-{T}-{S}-{flags}",
        "tracestate": "1abc=x,a@b@c=y",
        "baggage": "model=gnn",
    }
    token = attach(propagate.extract(incoming))  # as a server instrumentation does
    try:
        with tracer.start_as_current_span("infer") as span:
            outgoing = {"content-type": "application/json"}
            propagate.inject(outgoing)
    finally:
        detach(token)
    child = span.get_span_context()
    assert child.span_id != int(S, 16)
    assert outgoing == {
        "content-type": "application/json",
        "traceparent": f"00-{T}-{child.span_id:016x}-{flags}",
        "tracestate": "1abc=x,a@b@c=y",
        "baggage": "model=gnn",
    }


@pytest.mark.usefixtures("w3c_global_textmap")
@pytest.mark.parametrize(("sampler", "flags"), [(ALWAYS_ON, "03"), (ALWAYS_OFF, "02")])
def test_sdk_root_span_keeps_the_level2_random_flag(sampler: Sampler, flags: str) -> None:
    tracer = TracerProvider(sampler=sampler).get_tracer(__name__)
    with tracer.start_as_current_span("root") as span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
    root = span.get_span_context()
    assert carrier == {"traceparent": f"00-{root.trace_id:032x}-{root.span_id:016x}-{flags}"}
    assert summary(propagate.extract(carrier))[0] == SpanContext(
        root.trace_id, root.span_id, True, TraceFlags(int(flags, 16))
    )


@pytest.mark.usefixtures("w3c_global_textmap")
def test_propagate_with_default_getter_and_setter_handles_carriers_like_extract_and_inject() -> (
    None
):
    raw = [(b"host", b"triton"), (b"traceparent", TP.encode()), (b"tracestate", b"a=1")]
    raw += [(b"tracestate", b"b=2"), (b"baggage", b"k=v")]
    assert summary(propagate.extract(raw)) == summary(extract(raw))
    assert summary(propagate.extract(raw))[1:] == ([("a", "1"), ("b", "2")], {"k": "v"})
    carrier = {"TraceParent": "stale", "TraceState": "stale=1", "x-id": "7"}
    propagate.inject(carrier, context_of(OUTGOING))
    assert carrier == {"x-id": "7", **dict(NEW_HEADERS)}


def test_propagator_uses_custom_getters_and_setters() -> None:
    class ListGetter(textmap.Getter[dict[bytes, list[bytes]]]):  # like an ASGI getter
        def get(self, carrier: dict[bytes, list[bytes]], key: str) -> list[str] | None:
            values = carrier.get(key.encode())
            return None if values is None else [value.decode() for value in values]

        def keys(self, carrier: dict[bytes, list[bytes]]) -> list[str]:
            return [k.decode() for k in carrier]

    class PairSetter(textmap.Setter[list[tuple[str, str]]]):
        def set(self, carrier: list[tuple[str, str]], key: str, value: str) -> None:
            carrier.append((key, value))

    propagator = W3CPropagator()
    incoming = {b"traceparent": [TP.encode()], b"tracestate": [b"a=1", b"b@c=2"]}
    context = propagator.extract(incoming, getter=ListGetter())
    entries = [("a", "1"), ("b@c", "2")]
    assert summary(context) == (remote(1, entries), entries, {})
    written: list[tuple[str, str]] = []
    propagator.inject(written, context, setter=PairSetter())
    assert written == [("traceparent", TP), ("tracestate", "a=1,b@c=2")]
    assert propagator.fields == {"traceparent", "tracestate", "baggage"}


def test_over_real_http_duplicate_headers_arrive_combined() -> None:
    seen: list[Any] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(summary(extract(self.headers)))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for extra in ([], [("TraceParent", TP)]):
            connection = http.client.HTTPConnection(
                "127.0.0.1", server.server_address[1], timeout=10
            )
            connection.putrequest("GET", "/infer")
            for name, value in [
                ("traceparent", TP),
                ("tracestate", "a=1"),
                ("TraceState", "b@c=2"),
                *extra,
            ]:
                connection.putheader(name, value)
            connection.endheaders()
            assert connection.getresponse().status == 204
            connection.close()
    finally:
        server.shutdown()
        server.server_close()
    entries = [("a", "1"), ("b@c", "2")]
    assert seen == [(remote(1, entries), entries, {}), (INVALID_SPAN_CONTEXT, [], {})]


def test_over_real_grpc_metadata_from_inject_reaches_the_server() -> None:
    seen: list[Any] = []

    def infer(request: bytes, context: grpc.ServicerContext) -> bytes:
        seen.append(summary(extract(context.invocation_metadata())))
        return request

    handler = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"ModelInfer": grpc.unary_unary_rpc_method_handler(infer)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            metadata = inject((("x-request-id", "7"),), context_of(OUTGOING, model="gnn"))
            assert call(b"payload", metadata=metadata, timeout=10) == b"payload"
    finally:
        server.stop(None).wait()
    entries = list(OUTGOING.trace_state.items())
    assert seen == [(OUTGOING, entries, {"model": "gnn"})]
