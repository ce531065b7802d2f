"""Lazy imports of optional dependencies, one extra per integration."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

from otelkit._errors import MissingExtraError

__all__ = ["locate", "require"]


def require(module: str, *, extra: str, feature: str) -> ModuleType:
    """Import ``module`` or raise ``MissingExtraError`` naming ``pip install 'otelkit[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name is not None and not module.startswith(exc.name.split(".")[0]):
            raise  # the module exists but one of *its* imports failed: show the real cause
        raise MissingExtraError(module, extra, feature) from exc


def locate(package: str, *, extra: str, feature: str) -> Path:
    """The directory of installed ``package``, without importing it (nor what it imports), or
    ``MissingExtraError`` naming ``pip install 'otelkit[extra]'``."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError(package, extra, feature)
    return Path(next(iter(spec.submodule_search_locations)))
