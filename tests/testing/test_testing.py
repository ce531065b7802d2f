"""``otelkit.testing``: captures in this process and through a real receiver from child
processes, waits that name what they awaited, absence asserted only after a marker."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import otelkit
from otelkit import semconv, telemetry
from otelkit.analysis import Span, SpanKind
from otelkit.receiver import Receiver
from otelkit.testing import MemoryCapture, ReceiverCapture, components, tree, wait_until
from tests.paths import ROOT

# A child process that traces a request of two stages and exports it to argv[1], then exits.
CHILD = textwrap.dedent(
    """
    import sys
    import otelkit
    otelkit.configure(service_name="child", traces_endpoint=sys.argv[1], metrics_exporter="none")
    with otelkit.stage("request"):
        with otelkit.stage(sys.argv[2]):
            pass
    otelkit.shutdown()
    """
)


def child_exports(url: str, stage: str = "scale") -> None:
    subprocess.run([sys.executable, "-c", CHILD, url, stage], check=True, cwd=ROOT, timeout=60)


def span(
    name: str, span_id: str, parent: str | None, start: int, trace_id: str = "ab" * 16
) -> Span:
    return Span(trace_id, span_id * 8, parent and parent * 8, name, SpanKind.INTERNAL, start, 99)


# -- wait_until ---------------------------------------------------------------------------------


def test_wait_until_returns_the_first_true_value() -> None:
    values = iter([None, [], [1], [1, 2]])
    assert wait_until(lambda: next(values), timeout=5, interval=0) == [1]


def test_wait_until_names_what_it_waited_for_the_last_value_and_the_explanation() -> None:
    with pytest.raises(AssertionError) as failed:
        wait_until(lambda: {}, timeout=0.05, what="the registry", explain=lambda: "log: boom")
    assert str(failed.value) == "the registry: not within 0.05 s; last seen: {}\nlog: boom"
    with pytest.raises(AssertionError, match=r"^a flag: not within 0 s$"):
        wait_until(lambda: False, timeout=0, what="a flag")


def test_wait_until_lets_the_checks_exception_end_the_wait_at_once() -> None:
    def exited() -> bool:
        raise RuntimeError("the server exited")

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="exited"):
        wait_until(exited, timeout=30)
    assert time.monotonic() - started < 5


def test_the_fixture_is_the_function(wait_until: Callable[..., Any]) -> None:
    assert wait_until(lambda: 3, what="three") == 3


# -- tree and components ------------------------------------------------------------------------


def test_tree_walks_each_trace_depth_first_in_start_order() -> None:
    first = [span("b", "02", "01", 3), span("a", "01", None, 1), span("c", "03", "02", 4)]
    second = [span("z", "04", None, 0, trace_id="cd" * 16), span("y", "05", "04", 2, "cd" * 16)]
    orphan = span("o", "06", "07", 5, trace_id="ef" * 16)
    assert tree([*first, orphan, *second]) == [
        (0, "z", "INTERNAL"),
        (1, "y", "INTERNAL"),
        (0, "a", "INTERNAL"),
        (1, "b", "INTERNAL"),
        (2, "c", "INTERNAL"),
        (0, "o", "INTERNAL"),
    ]


def test_components_split_a_root_into_its_stages(otelkit_spans: MemoryCapture) -> None:
    with otelkit.stage("request"):
        with otelkit.stage("scale"):
            time.sleep(0.02)
        with otelkit.stage("pack"):
            time.sleep(0.01)
    found = components(otelkit_spans.wait_for_spans(count=3))
    assert found.keys() == {"client scale", "client pack", "client other", "total"}
    assert found["client scale"] >= 0.02 and found["client pack"] >= 0.01
    parts = found["client scale"] + found["client pack"] + found["client other"]
    assert parts == pytest.approx(found["total"], rel=1e-9)


# -- MemoryCapture ------------------------------------------------------------------------------


def test_the_memory_capture_keeps_this_processes_spans_and_stage_metrics(
    otelkit_spans: MemoryCapture,
) -> None:
    @otelkit.stage("scale", model="m")
    def scale() -> None:
        with otelkit.stage("pack", model="m"):
            pass

    for _ in range(3):
        scale()
    spans = otelkit_spans.spans()
    assert tree(spans) == [(0, "scale", "INTERNAL"), (1, "pack", "INTERNAL")] * 3
    assert {s.resource.get("service.name") for s in spans} == {telemetry_service()}
    points = otelkit_spans.metrics()[semconv.STAGE_DURATION.name]
    counts = {p.attributes["stage"]: p.count for p in points}  # type: ignore[union-attr]
    assert counts == {"scale": 3, "pack": 3}
    otelkit_spans.clear()
    assert otelkit_spans.spans() == []
    scale()
    assert [s.name for s in otelkit_spans.spans()] == ["pack", "scale"]


def telemetry_service() -> str:
    current = telemetry.current()
    assert current is not None
    return current.settings.service_name


def test_a_capture_keeps_the_service_name_in_force_and_shuts_down_after() -> None:
    otelkit.configure(service_name="shop", traces_exporter="none", metrics_exporter="none")
    with MemoryCapture() as capture:
        with otelkit.stage("scale"):
            pass
        assert [s.resource.get("service.name") for s in capture.spans()] == ["shop"]
    assert telemetry.current() is None
    with pytest.raises(RuntimeError, match="not started"):
        capture.spans()


def test_absence_is_asserted_once_the_marker_arrived(otelkit_spans: MemoryCapture) -> None:
    with otelkit.stage("kept"):
        pass
    with otelkit.stage("marker"):
        pass
    marker = otelkit_spans.assert_absent(lambda s: s.name == "absent", after=is_named("marker"))
    assert [s.name for s in marker] == ["marker"]
    with pytest.raises(AssertionError, match=r"1 span\(s\) that must be absent arrived"):
        otelkit_spans.assert_absent(lambda s: s.name == "kept", after=is_named("marker"))
    with pytest.raises(AssertionError, match="the marker's span"):
        otelkit_spans.assert_absent(lambda s: False, after="00" * 16, timeout=0.1)


def is_named(name: str) -> Callable[[Span], bool]:
    return lambda s: s.name == name


def test_waiting_for_a_trace_lists_what_arrived(otelkit_spans: MemoryCapture) -> None:
    with otelkit.stage("request") as run:
        assert run is not None
    (root,) = otelkit_spans.spans()
    assert otelkit_spans.wait_for_trace(root.trace_id) == [root]
    with pytest.raises(AssertionError) as failed:
        otelkit_spans.wait_for_trace(root.trace_id, count=2, timeout=0.1)
    assert f"trace {root.trace_id}: 2 span(s): not within 0.1 s" in str(failed.value)
    assert "1 of 2 arrived: [(" in str(failed.value) and "'request', None)]" in str(failed.value)


# -- ReceiverCapture ----------------------------------------------------------------------------


def test_the_receiver_capture_reads_what_child_processes_export(
    otelkit_receiver: ReceiverCapture,
) -> None:
    child_exports(otelkit_receiver.traces_url)
    spans = otelkit_receiver.wait_for_spans(lambda s: s.resource["service.name"] == "child", 2)
    assert tree(spans) == [(0, "request", "INTERNAL"), (1, "scale", "INTERNAL")]
    assert otelkit_receiver.trace(spans[0].trace_id) == spans


def test_each_test_reads_only_what_arrived_during_it(otelkit_receiver: ReceiverCapture) -> None:
    """The test above exported to the same session receiver: none of its spans show here."""
    assert otelkit_receiver.spans() == []
    child_exports(otelkit_receiver.traces_url, stage="pack")
    spans = otelkit_receiver.wait_for_spans(count=2)
    assert sorted(s.name for s in spans) == ["pack", "request"]
    otelkit_receiver.clear()
    assert otelkit_receiver.spans() == []


def test_a_line_being_written_when_the_capture_begins_belongs_before_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Read from the middle of that line, its rest would be a broken line, logged and skipped."""
    with Receiver(tmp_path) as receiver:
        child_exports(receiver.traces_url, stage="before")
        assert receiver.wait_for_spans(2, timeout=10)
        whole = receiver.out_path.read_bytes()
        with receiver.out_path.open("ab") as file:  # the writer is between two writes of a line
            file.write(whole[:50])
            file.flush()
            capture = ReceiverCapture(receiver)
            file.write(whole[50:])
        child_exports(receiver.traces_url, stage="after")
        spans = capture.wait_for_spans(count=2)
    assert sorted(s.name for s in spans) == ["after", "request"]
    assert [r.getMessage() for r in caplog.records if r.name == "otelkit.analysis"] == []
