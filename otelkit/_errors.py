"""The exceptions otelkit raises, all in one place.

``ConfigError`` is a ``ValueError``: a bad option or environment variable fails fast at
``configure()``. ``MissingExtraError`` is an ``ImportError`` that names the ``pip install``
line for the optional integration that is missing. ``TritonStartError`` says why the
``tritonserver`` launcher could not get a server ready. ``StudyError`` says which point of a
study could not be measured, and why. ``FleetError`` says why the fleet's registry could not be
read or written; ``RegistrationError`` why a server's registration was refused.
"""

from __future__ import annotations

import os
from typing import Any, Literal

__all__ = [
    "ConfigError",
    "FleetError",
    "MissingExtraError",
    "OtelkitError",
    "RegistrationError",
    "StartFailure",
    "StudyError",
    "TritonStartError",
]

#: Tests set ``OTELKIT_RAISE_INTERNAL_ERRORS=1``: otelkit's own failures, which a user's program
#: only sees counted and logged, are raised instead (``guard.internal_error``, ``Later``).
RAISE_INTERNAL_ERRORS = os.environ.get("OTELKIT_RAISE_INTERNAL_ERRORS", "") == "1"

StartFailure = Literal["port_in_use", "model_failed", "not_found", "timeout", "exited"]


class OtelkitError(Exception):
    """Base class of every exception otelkit raises on purpose."""


class ConfigError(OtelkitError, ValueError):
    """An option or its environment variable holds a value otelkit cannot use."""

    def __init__(
        self,
        option: str,
        env_vars: tuple[str, ...],
        value: object,
        expected: str,
        *,
        message: str | None = None,  # for an option otelkit does not have, what it is not
    ):
        self.option = option
        self.env_vars = env_vars
        self.value = value
        where = f" (environment: {' / '.join(env_vars)})" if env_vars else ""
        super().__init__(
            message or f"otelkit: invalid {option}={value!r}{where}: expected {expected}"
        )


class MissingExtraError(OtelkitError, ImportError):
    """An optional dependency is not installed; the message says which extra brings it."""

    def __init__(self, module: str, extra: str, feature: str):
        self.extra = extra
        super().__init__(
            f"otelkit: {feature} needs the '{module}' package: pip install 'otelkit[{extra}]'",
            name=module,
        )


class TritonStartError(OtelkitError):
    """``tritonserver`` could not start or never became ready.

    ``reason`` is one of ``port_in_use`` (``port`` names it), ``model_failed`` (``model`` names
    the first model that failed to load), ``not_found`` (binary or stub), ``timeout`` or
    ``exited``; ``log_tail`` holds the server's last log lines.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: StartFailure,
        log_tail: str = "",
        model: str | None = None,
        port: int | None = None,
    ):
        super().__init__(message)
        self.reason: StartFailure = reason
        self.log_tail = log_tail
        self.model = model
        self.port = port


class StudyError(OtelkitError):
    """A study could not measure a point, or was asked for one that makes no sense.

    ``point`` names the point (its parameters, e.g. ``instances=2 concurrency=4``), or is
    ``None`` for a problem of the whole study; the points measured before it are kept in the
    results file.
    """

    def __init__(self, message: str, *, point: str | None = None):
        where = "" if point is None else f"point {point}: "
        if point is not None and point.startswith("the "):  # a study without a sweep
            where = f"{point}: "
        super().__init__(f"otelkit study: {where}{message}")
        self.point = point
        self.reason = message
        self.results: Any = None  # the study's results up to the failure, when it ran


class FleetError(OtelkitError):
    """The fleet's registry (etcd, or the shared directory) could not be read or written."""


class RegistrationError(OtelkitError, ValueError):
    """A server's registration is malformed or hostile: nothing is rendered from it.

    ``key`` is where it was found in the registry (``None`` before it was written), ``reason``
    what is wrong with it.
    """

    def __init__(self, reason: str, *, key: str | None = None):
        where = f" {key!r}" if key else ""
        super().__init__(f"otelkit fleet: registration{where} refused: {reason}")
        self.key, self.reason = key, reason
