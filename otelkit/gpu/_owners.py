"""Who a GPU process is: the Triton model instance or otelkit service behind a pid, from /proc.

Triton's Python backend runs each model instance in a ``triton_python_backend_stub`` process
whose arguments name the instance (``<model>_<group>_<n>``, after the model file, the shared
memory region and its sizes, the parent pid, the backend directory and a handle). A process
configured with ``OTEL_SERVICE_NAME`` (or ``OTELKIT_SERVICE_NAME``) names its service.
Unreadable entries (another user's process without privileges, a pid gone) give ``""``.

>>> owner(os.getpid())  # 'tracking-server' when OTEL_SERVICE_NAME=tracking-server
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["owner", "process_name"]

_STUB = "triton_python_backend_stub"
_STUB_INSTANCE_ARG = 8  # argv[8] of the stub, in Triton 2.40 to 2.51
_SERVICE_VARIABLES = (b"OTELKIT_SERVICE_NAME=", b"OTEL_SERVICE_NAME=")


def _read(proc: str, pid: int, entry: str) -> bytes:
    try:
        return Path(proc, str(pid), entry).read_bytes()
    except OSError:
        return b""


def process_name(pid: int, proc: str = "/proc") -> str:
    """The executable's name of ``pid``, or ``""``."""
    argv = _read(proc, pid, "cmdline").split(b"\0")
    if argv[0]:
        return os.path.basename(argv[0].decode(errors="replace"))
    return _read(proc, pid, "comm").decode(errors="replace").strip()


def _stub_instance(argv: list[str]) -> str:
    if len(argv) > _STUB_INSTANCE_ARG and argv[_STUB_INSTANCE_ARG]:
        return argv[_STUB_INSTANCE_ARG]
    parts = Path(argv[1]).parts if len(argv) > 1 else ()  # <repository>/<model>/<version>/model.py
    return parts[-3] if len(parts) >= 3 else ""


def owner(pid: int, proc: str = "/proc") -> str:
    """``triton:<model instance>``, ``triton`` for the server, the service name, or ``""``."""
    argv = [a.decode(errors="replace") for a in _read(proc, pid, "cmdline").split(b"\0")]
    program = os.path.basename(argv[0])
    if program == _STUB:
        instance = _stub_instance(argv)
        return f"triton:{instance}" if instance else "triton"
    if program == "tritonserver":
        return "triton"
    environ = _read(proc, pid, "environ").split(b"\0")
    for prefix in _SERVICE_VARIABLES:
        for entry in environ:
            if entry.startswith(prefix) and len(entry) > len(prefix):
                return entry[len(prefix) :].decode(errors="replace")
    return ""
