"""Locate the ``tritonserver`` bundled in the nvidia-pytriton wheel and prepare what it needs.

The wheel ships the binary but no ready backend directory, and its Python-backend stub links
``libpython`` dynamically, so ``triton_install()`` prepares three things once per (pytriton,
Python) version:

* a backend directory: the bundled ``backends/python`` plus the stub built for this Python
  (``--backend-directory``), in ``$XDG_CACHE_HOME/otelkit``;
* ``LD_LIBRARY_PATH``: this interpreter's ``LIBDIR`` first, or a pyenv interpreter's stub loads
  the system ``libpython`` and every model fails to load; then the wheel's
  ``nvidia_pytriton.libs``, which the copied stub and backend no longer find through their
  ``$ORIGIN``-relative run paths;
* ``PATH``: this interpreter's ``bin`` first, because the stub's embedded Python takes its
  ``sys.prefix`` from the first ``python3`` on ``PATH``: that is how models see this
  virtualenv's packages.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from otelkit._core.extras import locate
from otelkit._errors import TritonStartError

__all__ = ["TritonInstall", "triton_install"]

_STUB = "triton_python_backend_stub"


@dataclass(frozen=True)
class TritonInstall:
    """Where the bundled ``tritonserver`` lives and what its environment needs."""

    binary: Path
    backend_directory: Path
    library_path: tuple[Path, ...]  # put first on LD_LIBRARY_PATH, in this order
    bin_path: tuple[Path, ...]  # put first on PATH
    pytriton_version: str
    python_version: str

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default ``os.environ``) with this install's directories put first.

        ``PYTHONPATH`` gets this interpreter's import path: the Python-backend stub embeds the
        base interpreter's ``libpython``, which knows nothing of a virtual environment, and
        models import what this process can import (numpy, torch, otelkit).
        """
        env = dict(os.environ if base is None else base)
        env["LD_LIBRARY_PATH"] = _prepend(self.library_path, env.get("LD_LIBRARY_PATH", ""))
        env["PATH"] = _prepend(self.bin_path, env.get("PATH", os.defpath))
        here = [Path(path) for path in sys.path if path and Path(path).is_dir()]
        env["PYTHONPATH"] = _prepend(here, env.get("PYTHONPATH", ""))
        return env


def triton_install(cache_dir: Path | None = None) -> TritonInstall:
    """Locate the ``tritonserver`` in nvidia-pytriton and prepare its backend directory.

    >>> triton_install().binary.name
    'tritonserver'
    """
    # located, not imported: only its files are needed, not its Python client's dependencies
    pytriton = locate("pytriton", extra="pytriton", feature="the tritonserver launcher")
    dist = pytriton.resolve() / "tritonserver"
    binary = dist / "bin" / "tritonserver"
    if not os.access(binary, os.X_OK):
        raise TritonStartError(
            f"otelkit: tritonserver binary not found at {binary}: reinstall nvidia-pytriton",
            reason="not_found",
        )
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = dist / "python_backend_stubs" / python / _STUB
    if not stub.is_file():
        have = sorted(p.name for p in (dist / "python_backend_stubs").glob("*"))
        raise TritonStartError(
            f"otelkit: nvidia-pytriton has no Python-backend stub for Python {python} "
            f"(it has {', '.join(have) or 'none'}): run the server under one of those",
            reason="not_found",
        )
    # A wheel install keeps the vendored libraries beside the package; an editable one inside.
    candidates = (dist.parent.parent / "nvidia_pytriton.libs", dist / "external_libs")
    libs = next((p for p in candidates if p.is_dir()), None)
    if libs is None:
        raise TritonStartError(
            f"otelkit: nvidia-pytriton's libraries not found at {candidates[0]}",
            reason="not_found",
        )
    version = importlib.metadata.version("nvidia-pytriton")
    backends = _backend_directory(
        dist, stub, cache_dir or _cache_dir(), f"pytriton-{version}-py{python}"
    )
    bin_path = (Path(sys.executable).parent,) if sys.executable else ()
    return TritonInstall(binary, backends, (*_python_libdir(), libs), bin_path, version, python)


def _prepend(dirs: Sequence[Path], current: str) -> str:
    return os.pathsep.join([*(str(d) for d in dirs), *(p for p in current.split(os.pathsep) if p)])


def _python_libdir() -> list[Path]:
    """This interpreter's ``LIBDIR`` when it holds the shared ``libpython`` the stub links."""
    libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if libdir and soname and (Path(libdir) / soname).exists():
        return [Path(libdir)]
    return []


def _cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "otelkit"
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError:  # read-only home: fall back to a per-user temporary directory
        base = Path(tempfile.gettempdir()) / f"otelkit-{os.getuid()}"
    return base


def _backend_directory(dist: Path, stub: Path, cache: Path, key: str) -> Path:
    """``<cache>/triton-backends/<key>``, holding ``python/`` with the stub; built atomically."""
    final = cache / "triton-backends" / key
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # Build in a private directory, then rename: a racing process either wins the rename or
    # finds the directory complete, never half-copied.
    building = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=final.parent))
    try:
        shutil.copytree(
            dist / "backends" / "python",
            building / "python",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        shutil.copy2(stub, building / "python" / _STUB)
        building.chmod(0o755)
        try:
            os.rename(building, final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return final
