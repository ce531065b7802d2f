"""Lazy imports of optional dependencies, one extra per integration."""

from __future__ import annotations

import importlib
from types import ModuleType

from otelkit.errors import MissingExtraError

__all__ = ["require"]


def require(module: str, *, extra: str, feature: str) -> ModuleType:
    """Import ``module`` or raise ``MissingExtraError`` naming ``pip install 'otelkit[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name is not None and not module.startswith(exc.name.split(".")[0]):
            raise  # the module exists but one of *its* imports failed: show the real cause
        raise MissingExtraError(module, extra, feature) from exc
