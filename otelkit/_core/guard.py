"""otelkit's own failures: never raised into the user's program, never silent.

Telemetry code runs inside the user's inference calls and request handlers; when it fails,
the call goes on untouched. The failure is counted (``INTERNAL_ERRORS``, exported as
``otelkit.telemetry.internal.errors``) and logged with its traceback the first time it
happens at each place. With ``OTELKIT_RAISE_INTERNAL_ERRORS=1`` (otelkit's tests) it is
raised instead, so that tests see otelkit's own bugs.
"""

from __future__ import annotations

import logging
import threading

from otelkit import _errors as errors

__all__ = ["INTERNAL_ERRORS", "InternalErrors", "caught", "internal_error"]

logger = logging.getLogger("otelkit")


class InternalErrors:
    """How many failures of otelkit's own code were caught, and where they were logged."""

    def __init__(self, places: int = 100) -> None:
        self.total = 0
        self._places = places  # at most this many places logged (a bound on memory)
        self._logged: set[str] = set()
        self._lock = threading.Lock()

    def count(self, where: str) -> bool:
        """Count one failure at ``where``; ``True`` when it is the first there (log it)."""
        with self._lock:
            self.total += 1
            if where in self._logged or len(self._logged) >= self._places:
                return False
            self._logged.add(where)
            return True


INTERNAL_ERRORS = InternalErrors()


def internal_error(where: str) -> None:
    """In an ``except`` block: ``caught(where)``, or re-raise when tests ask for that."""
    if errors.RAISE_INTERNAL_ERRORS:
        raise
    caught(where)


def caught(where: str) -> None:
    """In an ``except`` block: count the failure and log it the first time at ``where`` (a
    phrase such as "ending a client span")."""
    if INTERNAL_ERRORS.count(where):
        logger.exception(
            "otelkit: telemetry failed while %s; the program is unaffected (further failures "
            "are counted in otelkit_telemetry_internal_errors_total)",
            where,
        )
