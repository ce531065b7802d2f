"""A group of threads' CPU time, read from other threads, live and after they ended."""

from __future__ import annotations

import os
import threading
import time

import pytest

from otelkit._core.threads import ThreadGroup, _thread_cpu_s


def test_a_groups_cpu_time_counts_live_and_ended_members() -> None:
    group = ThreadGroup()
    busy, done = threading.Event(), threading.Event()
    spent: dict[str, float] = {}

    def burn(seconds: float, then: threading.Event | None) -> None:
        with group.member():
            start = time.thread_time()
            while time.thread_time() - start < seconds:
                pass
            spent[threading.current_thread().name] = time.thread_time()
            if then is not None:
                busy.set()
                then.wait(10)

    ended = threading.Thread(target=burn, args=(0.1, None), name="ended")
    ended.start()
    ended.join()
    live = threading.Thread(target=burn, args=(0.1, done), name="live")
    live.start()
    assert busy.wait(10)
    (native,) = group.native_ids
    # the kernel's ticks (/proc) and the thread's CPU clock agree within two ticks
    ticks = _thread_cpu_s(native, None)
    assert ticks == pytest.approx(spent["live"], abs=2 / os.sysconf("SC_CLK_TCK"))
    total = group.cpu_s()
    done.set()
    live.join()
    assert total == pytest.approx(spent["ended"] + spent["live"], abs=0.005)
    assert group.native_ids == set()
    assert group.cpu_s() == pytest.approx(total, abs=0.005)
