"""otelkit.analysis._fast_import: ``otelkit import`` by DuckDB writes the Python path's segments.

Each case imports the same files both ways (the Python path: ``OTELKIT_IMPORT_ENGINE=python``)
and compares the segments as pyarrow reads them: the same files, schemas and rows, in order.
The committed traces and every JSON-lines fixture of the tests that holds spans, plain and
gzipped, go the fast way; so do hand-written documents with every kind of value, escapes,
empty and missing parts, the Collector's tail sampling on the scope. Files the fast path cannot
show it reads alike (base64 ids, enum names, nulls, NaN, trailing commas, duplicate keys,
malformed lines, deep nesting, ...) go the Python way, whole, with the reason, in a folder that
mixes both; one refused after its first segments were written takes them back.
"""

from __future__ import annotations

import base64
import gzip
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from otelkit.analysis import _fast_import, load_spans
from otelkit.analysis._fast_import import (
    MEMORY_LIMIT,
    _compression,
    _Engine,
    _nests_at_most,
    import_files,
)
from otelkit.cli import main
from tests.analysis.test_store import DEMO

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("duckdb")

TESTS = Path(__file__).resolve().parents[1]
T1, T2 = "0af7651916cd43dd8448eb211c80319c", "4BF92F3577B34DA6A3CE929D0E0E4736"
S1, S2, S3 = "b7ad6b7169203331", "00F067AA0BA902B7", "53995c3f42cd8ad8"


def python_path(
    files: list[Path], out: Path, segment_spans: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``otelkit import`` by the Python path, as a user runs it."""
    with monkeypatch.context() as patch:
        patch.setenv("OTELKIT_IMPORT_ENGINE", "python")
        arguments = ["import", *map(str, files), "--out", str(out)]
        main([*arguments, "--segment-spans", str(segment_spans)])


def segments(folder: Path) -> list[tuple[str, Any]]:
    return [(path.name, pq.read_table(path)) for path in sorted(folder.glob("*.parquet"))]


def same_segments(
    files: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, segment_spans: int = 1000
) -> Any:
    """Import ``files`` both ways; assert the segments are the same; the fast path's result."""
    fast, slow = tmp_path / "fast", tmp_path / "python"
    shutil.rmtree(fast, ignore_errors=True)
    shutil.rmtree(slow, ignore_errors=True)
    try:
        python_path(files, slow, segment_spans, monkeypatch)
    except Exception as error:  # a file the Python path cannot write: the fast path neither
        with pytest.raises(type(error)):
            import_files(files, fast, segment_spans)
        return None
    result = import_files(files, fast, segment_spans)
    ours, theirs = segments(fast), segments(slow)
    assert [name for name, _ in ours] == [name for name, _ in theirs]
    assert not list(fast.glob(".*"))  # no temporary file left
    for (name, table), (_, expected) in zip(ours, theirs, strict=True):
        assert table.schema.equals(expected.schema, check_metadata=True), name
        if not table.equals(expected):
            for column in expected.column_names:
                got, want = table[column].to_pylist(), expected[column].to_pylist()
                assert got == want, (name, column)
        assert table.equals(expected), name
    assert result.spans == sum(table.num_rows for _, table in theirs)
    assert [p.name for p in result.segments] == [name for name, _ in theirs]
    return result


def lines(path: Path, *docs: Any, only_ascii: bool = False) -> Path:
    """A JSON-lines file of ``docs``: a dict written compact (``only_ascii``: all but ASCII
    as \\u escapes), a str as it is."""
    text = "".join(
        (d if isinstance(d, str) else json.dumps(d, separators=(",", ":"), ensure_ascii=only_ascii))
        + "\n"
        for d in docs
    )
    path.write_text(text, encoding="utf-8")
    return path


def value(kind: str, v: Any) -> dict[str, Any]:
    return {kind: v}


def kv(key: str, any_value: dict[str, Any] | None) -> dict[str, Any]:
    return {"key": key} if any_value is None else {"key": key, "value": any_value}


def span(span_id: str = S1, trace_id: str = T1, **fields: Any) -> dict[str, Any]:
    base = {
        "traceId": trace_id,
        "spanId": span_id,
        "name": "infer",
        "kind": 3,
        "startTimeUnixNano": "1795669510733530504",
        "endTimeUnixNano": "1795669510754758485",
    }
    return {**base, **fields}


def document(
    *spans: dict[str, Any],
    resource: list[dict[str, Any]] | None = None,
    scope: dict[str, Any] | None = None,
) -> dict[str, Any]:
    rs: dict[str, Any] = {
        "resource": {"attributes": resource or [kv("service.name", value("stringValue", "c"))]},
        "scopeSpans": [{"scope": scope or {"name": "otelkit.client"}, "spans": list(spans)}],
    }
    return {"resourceSpans": [rs]}


def test_the_demo_traces_go_the_fast_way_and_make_the_same_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = same_segments([DEMO], tmp_path, monkeypatch)
    assert result.fallback == {} and result.fast == [DEMO]
    assert result.spans == len(load_spans(DEMO)) > 0


def fixtures() -> list[Path]:
    """Every JSON-lines fixture of the tests that holds spans (a study's results are not
    traces: the Python path reads none from them)."""
    found = sorted({*TESTS.glob("**/data/*.jsonl"), *TESTS.glob("**/data/*.jsonl.gz")})
    return [path for path in found if load_spans(path)]


def test_every_json_lines_fixture_with_spans_plain_and_gzipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = fixtures()
    assert DEMO in files
    for path in files:
        zipped = tmp_path / "gz" / f"{path.name}.gz"
        zipped.parent.mkdir(exist_ok=True)
        zipped.write_bytes(gzip.compress(path.read_bytes()))
        for each in (path, zipped):
            result = same_segments([each], tmp_path / each.name, monkeypatch)
            assert result.fast == [each], result.fallback
    # a study's results: no span either way, no fallback
    studies = sorted(TESTS.glob("**/data/study*.jsonl"))
    assert studies
    result = import_files(studies, tmp_path / "studies", 1000)
    assert (result.spans, result.fallback) == (0, {})


def odd_documents() -> list[Any]:
    """Documents of every kind of value, escape and empty part (a str: a line as it is)."""
    odd = 'quote " backslash \\ tab \t newline \n bell \x07 escape \x1b del \x7f é ∑ 😀 \u2028 /'
    attributes = [
        kv("string", value("stringValue", "plain")),
        kv("escaped", value("stringValue", odd)),
        kv("empty", value("stringValue", "")),
        kv("int", value("intValue", "6124")),
        kv("negative", value("intValue", "-42")),
        kv("leading zero", value("intValue", "007")),
        kv("int number", value("intValue", 12)),
        kv("beyond int64", value("intValue", "123456789012345678901234")),
        kv("double", value("doubleValue", 0.000151514)),
        kv("small", value("doubleValue", 9.9336e-05)),
        kv("large", value("doubleValue", 1.5e300)),
        kv("whole", value("doubleValue", 5)),
        kv("negative zero", value("doubleValue", -0.0)),
        kv("double string", value("doubleValue", "1.25")),
        kv("true", value("boolValue", True)),
        kv("false", value("boolValue", False)),
        kv("array", value("arrayValue", {"values": [{"stringValue": "a"}, {"intValue": "1"}]})),
        kv("kvlist", value("kvlistValue", {"values": [kv("k", value("boolValue", True))]})),
        kv("bytes", value("bytesValue", base64.b64encode(b"\x00\x01").decode())),
        kv("no value", None),
        kv("empty value", {}),
        kv("unknown value", {"futureValue": 1}),
        kv("two values", {"stringValue": "wins", "intValue": "1"}),
        kv(odd, value("stringValue", "an odd key")),
    ]
    resource = [
        kv("service.name", value("intValue", "7")),
        kv("process.command_args", value("arrayValue", {"values": [{"stringValue": "-m"}]})),
        kv("host.name", value("stringValue", odd)),
    ]
    spans = [
        span(S1, attributes=attributes),
        span(S2, T2, parentSpanId=S1, kind=2, status={"code": 2, "message": odd}),
        span(S3, parentSpanId="", kind=9, status={"code": 7}, name=odd),
        span("1" * 16, kind=-1, startTimeUnixNano=5, endTimeUnixNano="0000012"),
        {"traceId": T1, "spanId": "2" * 16},  # nothing else: the defaults
        span(
            "3" * 16,
            events=[
                {"name": "QUEUE_START", "timeUnixNano": "1795669510733530600"},
                {"timeUnixNano": 17, "attributes": [kv("a", value("doubleValue", 0.1))]},
                {},
            ],
            links=[
                {"traceId": T2, "spanId": S2},
                {"traceId": T1, "spanId": S1, "attributes": attributes[:3], "flags": 1},
            ],
            flags=256,
            droppedAttributesCount=0,
            traceState="a=b",
        ),
    ]
    docs: list[Any] = [
        document(*spans, resource=resource, scope={"name": odd, "version": "1"}),
        # no resource, no scope, another resource with a bool service name
        {"resourceSpans": [{"scopeSpans": [{"spans": [span("4" * 16)]}]}]},
        document(span("5" * 16), resource=[kv("service.name", value("boolValue", True))]),
        # a resource without scopes, a scope without spans, two resources on a line
        {"resourceSpans": [{"resource": {}}, {"scopeSpans": [{"scope": {"name": "x"}}]}]},
        {"resourceSpans": [document(span("6" * 16))["resourceSpans"][0]] * 2},
        {"resourceSpans": []},
        "",
        "   ",
        {"resourceMetrics": [{"scopeMetrics": []}]},  # the Collector's metrics: no spans
        json.dumps(document(span("7" * 16)), indent=1).replace("\n", " "),  # blanks between
    ]
    return docs


@pytest.mark.parametrize("batch", [3, 16_384])
def test_every_kind_of_value_escape_and_empty_part_goes_the_fast_way(
    batch: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # small batches: a resource and a scope carried from one batch to the next
    monkeypatch.setattr(_fast_import, "_BATCH_ROWS", batch)
    docs = odd_documents()
    path = lines(tmp_path / "values.jsonl", *docs)  # UTF-8 as it is
    escaped = lines(tmp_path / "escaped.jsonl", *docs, only_ascii=True)  # \\u escapes
    result = same_segments([path, escaped], tmp_path, monkeypatch)
    assert result.fast == [path, escaped], result.fallback


def tail_sampled_documents() -> list[dict[str, Any]]:
    """Spans of a scope that says which tail sampling policy kept them, one overriding it."""
    policy = kv("tailsampling.policy", value("stringValue", "slow"))
    scope = {"name": "tail", "attributes": [policy, kv("other", value("intValue", "1"))]}
    overridden = kv("tailsampling.policy", value("stringValue", "the span's"))
    return [
        document(span(S1), span(S2, attributes=[kv("a", value("intValue", "1"))]), scope=scope),
        document(
            span(S3, attributes=[kv("z", value("boolValue", False)), overridden]), scope=scope
        ),
        document(span("1" * 16)),
    ]


def test_the_collectors_tail_sampling_on_the_scope_is_merged_as_the_python_path_merges_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = lines(tmp_path / "tail.jsonl", *tail_sampled_documents())
    result = same_segments([path], tmp_path, monkeypatch)
    assert result.fast == [path], result.fallback


def test_segments_are_cut_as_the_python_path_cuts_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_fast_import, "_BATCH_ROWS", 33)
    other = lines(tmp_path / "other.jsonl", document(span(S1), span(S2)))
    result = same_segments([DEMO, other, DEMO], tmp_path, monkeypatch, segment_spans=100)
    assert len(result.segments) == -(-(2 * 396 + 2) // 100)
    assert result.fallback == {}
    # a second import numbers its segments after the first's
    again = import_files([other], tmp_path / "fast", 100)
    assert [p.name for p in again.segments] == ["spans-00008.parquet"]


def refused(tmp_path: Path, name: str, bad: Any) -> Path:
    """A file of good documents with ``bad`` (a line) between them."""
    good = document(span(S1), span(S2, parentSpanId=S1))
    return lines(tmp_path / name, good, bad, good)


def text_of(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"))


BASE64 = base64.b64encode(bytes.fromhex(T1)).decode()
DEEP = '{"resourceSpans":[],"x":' + "[" * 1100 + "]" * 1100 + "}"
CASES: dict[str, Callable[[], Any]] = {
    "base64 ids": lambda: document(span(trace_id=BASE64)),
    "enum names": lambda: document(span(kind="SPAN_KIND_SERVER")),
    "kind as a string": lambda: document(span(kind="2")),
    "a null value": lambda: text_of(document(span(name="x"))).replace('"x"', "null"),
    "a null in a field read": lambda: document(span(status={"code": None})),
    "NaN": lambda: text_of(document(span(flags=1))).replace('"flags":1', '"flags":NaN'),
    "Infinity": lambda: text_of(document(span(flags=1))).replace('"flags":1', '"flags":-inf'),
    "beyond a double": lambda: text_of(document(span(flags=1))).replace('s":1', 's":1e400'),
    "a trailing comma": lambda: text_of(document(span())).replace("]}]}]}", "],}]}]}"),
    "a duplicate key": lambda: text_of(document(span())).replace('"kind":3', '"kind":3,"kind":2'),
    "a duplicate attribute key": lambda: document(
        span(attributes=[kv("a", value("intValue", "1")), kv("a", value("intValue", "2"))])
    ),
    "a duplicate event attribute key": lambda: document(
        span(events=[{"attributes": [kv("a", {}), kv("a", {})]}])
    ),
    "a key not a string": lambda: document(span(attributes=[{"key": 5, "value": {}}])),
    "a negative time": lambda: document(span(startTimeUnixNano=-5)),
    "a time with a sign": lambda: document(span(startTimeUnixNano="+5")),
    "a time beyond int64": lambda: document(span(startTimeUnixNano="99999999999999999999")),
    "a name not a string": lambda: document(span(name=5)),
    "an id too short": lambda: document(span(span_id="abc")),
    "a link without an id": lambda: document(span(links=[{"traceId": T1}])),
    "a malformed line": lambda: text_of(document(span()))[:-7],
    "a line not an object": lambda: "[1, 2]",
    "a carriage return": lambda: text_of(document(span())).replace(",", ",\r", 1),
    "nested too deep": lambda: DEEP,
    "a resource not an object": lambda: {"resourceSpans": [{"resource": "x"}]},
    "an int beyond the Python path's int()": lambda: document(
        span(attributes=[kv("a", value("intValue", "1.5x"))])
    ),
    "a NaN double": lambda: document(span(attributes=[kv("a", value("doubleValue", "NaN"))])),
}


#: what the Python path reads but cannot write (pyarrow refuses an int as a map's key, a time
#: beyond an int64)
FAILING = {"a key not a string", "a time beyond int64"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_file_the_fast_path_cannot_read_alike_goes_the_python_way(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = refused(tmp_path, "refused.jsonl", CASES[case]())
    result = same_segments([path], tmp_path, monkeypatch)
    if result is None:  # the Python path fails: so did the fast path, by it
        assert case in FAILING
        return
    assert list(result.fallback) == [path], case
    assert result.fast == []


def test_a_folder_mixes_both_ways_and_a_late_refusal_takes_its_segments_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # batches of 40 rows: the late refusal comes after segments were closed
    monkeypatch.setattr(_fast_import, "_BATCH_ROWS", 40)
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(DEMO, folder / "a-demo.jsonl")
    lines(folder / "b-base64.jsonl", document(span(trace_id=BASE64)))
    # passes the pre-scan, refused by the renderer at its last line: after segments were
    # written from it and from the file before it
    many = [document(*(span(f"{n:016x}", T2) for n in range(k, k + 50))) for k in range(0, 250, 50)]
    lines(folder / "c-late.jsonl", *many, document(span(kind="SPAN_KIND_CLIENT")))
    (folder / "d-demo.jsonl.gz").write_bytes(gzip.compress(DEMO.read_bytes()))
    lines(folder / "e-malformed.jsonl", text_of(document(span())), '{"resourceSpans": [')
    files = sorted(folder.iterdir())
    result = same_segments(files, tmp_path, monkeypatch, segment_spans=150)
    assert sorted(p.name for p in result.fallback) == [
        "b-base64.jsonl",
        "c-late.jsonl",
        "e-malformed.jsonl",
    ]
    assert [p.name for p in result.fast] == ["a-demo.jsonl", "d-demo.jsonl.gz"]


def test_the_command_takes_the_fast_path_and_says_what_went_the_python_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = refused(tmp_path, "bad.jsonl", document(span(kind="SPAN_KIND_SERVER")))
    store = tmp_path / "store"
    assert main(["import", str(DEMO), str(bad), "--out", str(store)]) == 0
    said = capsys.readouterr()
    assert said.out.startswith(f"{396 + 5} spans from 2 files into 1 segments")
    assert "1 of 2 files read by the Python path" in said.err and "bad.jsonl" in said.err


def test_files_the_fast_path_leaves_alone_and_its_memory_limit(tmp_path: Path) -> None:
    text = DEMO.read_bytes()
    (tmp_path / "gzip-not-named-so.jsonl").write_bytes(gzip.compress(text))
    (tmp_path / "text-named.jsonl.gz").write_bytes(text)
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + text)
    (tmp_path / "framed.bin").write_bytes(len(b"xy").to_bytes(4, "big") + b"xy")
    (tmp_path / "a[1].jsonl").write_bytes(text)  # DuckDB would read a1.jsonl
    names = ("gzip-not-named-so.jsonl", "text-named.jsonl.gz", "bom.jsonl", "framed.bin")
    for name in (*names, "a[1].jsonl"):
        assert _compression(tmp_path / name) is None, name
    assert _compression(DEMO) == "none"
    engine = _Engine(MEMORY_LIMIT, None)
    try:
        ((limit,),) = engine.con.execute("SELECT current_setting('memory_limit')").fetchall()
        assert limit.replace(" ", "").upper().startswith(("953", "1000", "1.0G", "1G", "0.9"))
    finally:
        engine.close()


def test_a_file_refused_by_the_pre_scan_leaves_the_next_one_to_the_fast_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    null = text_of(document(span(name="x"))).replace('"x"', "null")
    first = lines(tmp_path / "a.jsonl", null, null, document(span()))
    second = lines(tmp_path / "b.jsonl", document(span(S2)), "{" + '"a":' * 0 + '"b": ", nice"}')
    result = same_segments([first, second], tmp_path, monkeypatch)
    assert list(result.fallback) == [first] and result.fast == [second]


def test_the_bound_on_nesting_steps_over_strings_and_escapes() -> None:
    deep = b'{"x":' + b"[" * 200 + b"]" * 200 + b"}"
    assert not _nests_at_most(deep, 64)
    assert _nests_at_most(b'{"a":[{"b":[[1]]},{"c":2}]}', 4)
    # brackets in strings, escaped quotes and backslashes neither deepen nor hide depth
    strings = rb'{"a":"]]]]]]]]","b":"[[[[\\","c":"\"[[[","d":[[["\\"]]]}' * 3
    assert _nests_at_most(strings, 4) and not _nests_at_most(strings, 1)
    hidden = b'{"x":' + b'["]",' * 100 + b"1" + b"]" * 100 + b"}"
    assert not _nests_at_most(hidden, 64)


def test_the_collectors_metrics_and_logs_lines_give_no_span_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gauge = {"name": "g", "gauge": {"dataPoints": [{"asDouble": 1.5, "timeUnixNano": "1"}]}}
    metrics = {"resourceMetrics": [{"scopeMetrics": [{"metrics": [gauge]}]}]}
    logs = {"resourceLogs": [{"scopeLogs": [{"logRecords": [{"body": {"stringValue": "x"}}]}]}]}
    path = lines(tmp_path / "mixed.jsonl", metrics, document(span()), logs, document(span(S2)))
    result = same_segments([path], tmp_path, monkeypatch)
    assert result.fast == [path] and result.spans == 2
