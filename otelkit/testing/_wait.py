"""Waiting for what another thread or process does: poll a check, fail naming what was awaited."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["answers", "wait_until"]

T = TypeVar("T")


def wait_until(
    check: Callable[[], T | None],
    timeout: float = 15.0,
    what: str = "the check",
    *,
    interval: float = 0.05,
    explain: Callable[[], object] | None = None,
) -> T:
    """Call ``check`` until it returns a true value, and return that value.

    After ``timeout`` seconds it raises ``AssertionError`` naming ``what`` it waited for, the
    last value ``check`` returned (unless a bare ``False`` or ``None``) and what ``explain()``
    adds (a server's log, say). An exception raised by ``check`` ends the wait at once: a check
    that sees its server exit can fail the test there and then.

    >>> wait_until(lambda: [1, 2], what="two spans")
    [1, 2]
    >>> wait_until(lambda: [], timeout=0.1, what="a span")
    Traceback (most recent call last):
    AssertionError: a span: not within 0.1 s; last seen: []
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            message = f"{what}: not within {timeout:g} s"
            if value is not None and value is not False:
                message += f"; last seen: {value!r}"
            if explain is not None:
                message += f"\n{explain()}"
            raise AssertionError(message)
        time.sleep(interval)


def answers(url: str, process: subprocess.Popen[Any] | None = None) -> Callable[[], bool]:
    """A check for ``wait_until``: whether a GET of ``url`` is answered with a 2xx status (a
    refused connection or an error status: not yet). With ``process``, the server's, the check
    fails at once, with its exit status, when that process has exited.

    >>> wait_until(answers("http://127.0.0.1:9/"), timeout=0.1, what="a server on port 9")
    Traceback (most recent call last):
    AssertionError: a server on port 9: not within 0.1 s
    """

    def check() -> bool:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{process.args!r} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return 200 <= int(response.status) < 300
        except OSError:  # refused, reset, timed out; an error status (HTTPError) too
            return False

    return check
