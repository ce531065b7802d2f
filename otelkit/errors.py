"""The exceptions otelkit raises, all in one place.

``ConfigError`` is a ``ValueError``: a bad option or environment variable fails fast at
``configure()``. ``MissingExtraError`` is an ``ImportError`` that names the ``pip install``
line for the optional integration that is missing.
"""

from __future__ import annotations

__all__ = ["ConfigError", "MissingExtraError", "OtelkitError"]


class OtelkitError(Exception):
    """Base class of every exception otelkit raises on purpose."""


class ConfigError(OtelkitError, ValueError):
    """An option or its environment variable holds a value otelkit cannot use."""

    def __init__(self, option: str, env_vars: tuple[str, ...], value: object, expected: str):
        self.option = option
        self.env_vars = env_vars
        self.value = value
        where = f" (environment: {' / '.join(env_vars)})" if env_vars else ""
        super().__init__(f"otelkit: invalid {option}={value!r}{where}: expected {expected}")


class MissingExtraError(OtelkitError, ImportError):
    """An optional dependency is not installed; the message says which extra brings it."""

    def __init__(self, module: str, extra: str, feature: str):
        self.extra = extra
        super().__init__(
            f"otelkit: {feature} needs the '{module}' package: pip install 'otelkit[{extra}]'",
            name=module,
        )
