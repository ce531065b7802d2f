"""The progress bars on a terminal: the running point's and the sweep's, with the time left."""

from __future__ import annotations

import io

from otelkit.study._runner import Progress, sweep_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_shows_the_point_bar_and_the_sweep_bar_with_the_time_left() -> None:
    out = Terminal()
    progress = Progress(4, stream=out)
    progress.start(0, "concurrency=1", planned_s=2.0)
    progress.tick(1.0, 120)
    first = out.getvalue().split("\r\033[K")[-1]
    assert first.startswith("[1/4] concurrency=1: [##########..........] 1.0 s, 120 requests | ")
    assert "sweep [....................] 0/4, 0s" in first  # nothing done: no estimate yet
    progress.done(0, "concurrency=1", "120.0 requests/s")
    progress.start(1, "concurrency=2", planned_s=2.0)
    progress.tick(0.5, 40)
    lines = out.getvalue().split("\n")
    assert lines[0].endswith("[1/4] concurrency=1: 120.0 requests/s")
    assert (
        "[2/4] concurrency=2: [#####...............] 0.5 s, 40 requests | sweep [#####"
        in (lines[-1])
    )
    assert "1/4" in lines[-1] and "left" in lines[-1]


def test_the_time_left_is_the_mean_point_time_for_each_point_to_come() -> None:
    assert sweep_bar(2, 4, elapsed_s=100.0, running_s=20.0) == (
        "sweep [##########..........] 2/4, 1m40s, ~1m00s left"  # 40 s a point, 2 to come, 20 s in
    )
    assert sweep_bar(4, 4, elapsed_s=61.0) == "sweep [####################] 4/4, 1m01s"
    assert sweep_bar(0, 0, elapsed_s=0.0) == "sweep [####################] 0/0, 0s"
