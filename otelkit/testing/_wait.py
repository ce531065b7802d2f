"""Waiting for what another thread or process does: poll a check, fail naming what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_until"]

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
