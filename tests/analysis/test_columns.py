"""otelkit.analysis._columns: the compiled breakdown's own ways, beyond test_sql's fixtures (which
it breaks down alike): traces spread over segments, the shapes it hands to the Python path, a
segment it cannot read."""

from __future__ import annotations

from pathlib import Path

import pytest

from otelkit import semconv
from otelkit.analysis import Span, SpanKind, build_traces, load_spans
from otelkit.analysis._breakdown import breakdown
from otelkit.analysis._columns import breakdown_columns
from otelkit.analysis._store import StoreError, write_segment
from tests.analysis.test_sql import _same, shapes
from tests.analysis.test_store import DEMO

MS = 1_000_000


def test_traces_spread_over_segments_wait_for_their_last_span(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each trace's spans dealt round-robin into three segments of row groups of 30 rows,
    read in units of 40 (a unit across two row groups is a slice of their columns): a trace
    is broken down once its last span is read, and lands in its place."""
    import otelkit.analysis._columns as columns
    import otelkit.analysis._store as store

    monkeypatch.setattr(store, "_ROWS_PER_GROUP", 30)
    monkeypatch.setattr(columns, "_UNIT_ROWS", 40)
    monkeypatch.setattr(columns, "_BATCH_ROWS", 32)
    spans = load_spans(DEMO) + shapes()
    for index in range(3):
        write_segment(spans[index::3], tmp_path / f"spans-{index:05d}.parquet")
    arrived = spans[0::3] + spans[1::3] + spans[2::3]
    python = breakdown(build_traces(arrived).values(), group_by=("gnn_tracking.option",))
    found = breakdown_columns(sorted(tmp_path.glob("*.parquet")), ("gnn_tracking.option",))
    _same(python, found.groups)
    assert found.traces == len({s.trace_id for s in spans})
    assert found.delegated == 2  # shapes' orphan and parent cycle


def _trace(trace: str, stages: list[str], **attributes: object) -> list[Span]:
    root = Span(trace, "1" * 16, None, "event", SpanKind.INTERNAL, 0, 900 * MS, attributes)
    out = [root]
    for index, name in enumerate(stages):
        out.append(
            Span(
                trace,
                f"{index + 2:016x}",
                root.span_id,
                name,
                SpanKind.INTERNAL,
                index * MS,
                (index + 1) * MS,
                {semconv.STAGE_NAME: name},
            )
        )
    return out


def _call(trace: str, attributes: dict[str, object]) -> list[Span]:
    """A root, its call with ``attributes`` and the call's server span."""
    root = Span(trace, "1" * 16, None, "event", SpanKind.INTERNAL, 0, 9 * MS, {"option": 2})
    call = Span(trace, "2" * 16, root.span_id, "infer", SpanKind.CLIENT, MS, 8 * MS, attributes)
    server = Span(trace, "3" * 16, call.span_id, "infer", SpanKind.SERVER, 2 * MS, 7 * MS)
    return [root, call, server]


def test_shapes_the_kernel_cannot_hold_take_the_python_path(tmp_path: Path) -> None:
    """A client stage named ``other`` (the Python path overwrites ``client other`` with the
    remainder), group values whose string is not their typed text (a bool), a root with more
    components than the kernel holds: each such trace is the Python path's, alike. A number
    Arrow's cast refuses is read as Python reads it, and its trace stays the kernel's."""
    spans = load_spans(DEMO)
    spans += _trace("a" * 32, ["load", "other"], option=1)
    spans += _trace("b" * 32, ["load"], option=True)
    spans += _trace("c" * 32, [f"stage {n}" for n in range(600)], option=1)
    # a call's serialising time as text that Python's float reads and Arrow's cast does not:
    # read as Python reads it, the trace stays the kernel's
    spans += _call("d" * 32, {semconv.SERIALIZE_S: " 0.002"})
    write_segment(spans, tmp_path / "spans-00000.parquet")
    for group_by in (("option",), ()):
        python = breakdown(build_traces(spans).values(), group_by=group_by)
        found = breakdown_columns([tmp_path / "spans-00000.parquet"], group_by)
        _same(python, found.groups)
        # the bool is the Python path's only where it groups
        assert found.delegated == (3 if group_by else 2)
    assert 0.002 in [v for g in found.groups.values() for v in g.components["client serialize"]]
    assert found.spans == len(spans)


def test_a_segment_it_cannot_read_is_named(tmp_path: Path) -> None:
    """A segment whose footer is whole but whose pages are not: a StoreError naming it, not
    a crash in the kernel; a segment cut short (no footer) is left out, the rest read."""
    spans = load_spans(DEMO)
    good, bad, short = (tmp_path / f"spans-0000{n}.parquet" for n in range(3))
    for path in (good, bad, short):
        write_segment(spans, path)
    data = bytearray(bad.read_bytes())
    data[8:4096] = bytes(4088)  # the first column chunk's pages zeroed
    bad.write_bytes(bytes(data))
    short.write_bytes(short.read_bytes()[:-64])
    with pytest.raises(StoreError, match=bad.name):
        breakdown_columns([good, bad])
    found = breakdown_columns([good, short])
    assert found.spans == len(spans) and found.groups
