"""The CPU a point used: the whole host's cores, and the server's processes when the study
knows them, read from ``/proc`` when the window opens and when it closes.

The capacity model (``capacity.py``) needs the demand of every resource a request uses. The
cores of the host that serves are one: a model with more busy instances than cores slows down
as it is given more load, and only the host's CPU time says why. The host's figure counts
every process on it (the client too, when it runs there): on a shared host that is what the
cores are asked for. Where ``/proc`` cannot be read (not Linux), the figures are missing and
the model goes without that resource.

>>> host = CpuSample(10.0, at=100.0), CpuSample(13.0, at=102.0)
>>> server = CpuSample(4.0, at=99.0), CpuSample(6.0, at=103.0)
>>> usage = HostUsage.between(host, server, cores=2)
>>> usage.busy_cores, usage.server_cores
(1.5, 0.5)
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CpuSample",
    "HostUsage",
    "host_sample",
    "idle_cores",
    "is_local",
    "listening_pids",
    "python_pids",
    "server_sample",
]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC = Path("/proc")


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds used so far, read ``at`` (``time.perf_counter()``); ``None`` if unreadable."""

    seconds: float | None
    at: float

    def rate(self, later: CpuSample) -> float | None:
        """Cores kept busy from this sample to ``later``."""
        span = later.at - self.at
        if self.seconds is None or later.seconds is None or span <= 0:
            return None
        grown = later.seconds - self.seconds
        return grown / span if grown >= 0 else None


@dataclass(frozen=True)
class HostUsage:
    """A window's CPU use: ``busy_cores`` of the host's ``cores``, ``server_cores`` of the
    server's processes (``None`` when unknown), over ``seconds``."""

    cores: int
    busy_cores: float | None
    server_cores: float | None
    seconds: float
    # the server's own processes that are Python interpreters (a FastAPI or gRPC server): each
    # runs its Python under one GIL; their CPU, without their children's
    python_processes: int = 0
    python_cores: float | None = None
    # the cores the host kept busy just before the load, with no request in flight
    idle_cores: float | None = None

    @classmethod
    def between(
        cls,
        host: tuple[CpuSample, CpuSample],
        server: tuple[CpuSample, CpuSample],
        cores: int,
        python: tuple[int, CpuSample, CpuSample] = (0, CpuSample(None, 0.0), CpuSample(None, 0.0)),
    ) -> HostUsage:
        """From the host's busy time at the window's two ends, and the server's processes'
        around the whole load (a walk over a server's processes takes long under a busy GIL:
        it stays out of the window's hooks, and the rate over the load is the window's)."""
        busy = host[0].rate(host[1])
        busy = min(busy, cores) if busy is not None else None
        count, first, last = python
        return cls(
            cores,
            busy,
            server[0].rate(server[1]),
            host[1].at - host[0].at,
            count,
            first.rate(last) if count else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostUsage:
        return cls(
            int(data["cores"]),
            data.get("busy_cores"),
            data.get("server_cores"),
            float(data.get("seconds", 0.0)),
            int(data.get("python_processes", 0)),
            data.get("python_cores"),
            data.get("idle_cores"),
        )


def host_cores() -> int:
    """The cores this process may run on (its affinity), which a container's limit narrows."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _host_busy_s(stat: Path = _PROC / "stat") -> float | None:
    """Seconds all cores spent busy since boot: every field of ``cpu`` but idle and iowait."""
    try:
        first = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    ticks = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICKS


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = list((_PROC / str(pid) / "task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return found


def _process_s(pid: int) -> float | None:
    """User and system seconds of one process (all its threads), ``None`` once it is gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # the name may hold spaces and parentheses
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


def _tree_s(roots: Iterable[int], children: bool = True) -> float | None:
    """CPU seconds of ``roots`` and every process below them (a Triton and its Python stubs).

    A child that exits within the window takes its time with it: the figure is for servers
    whose processes live through the point, as a model's instances do."""
    total, seen, queue = 0.0, set(), list(roots)
    if not queue:
        return None
    while queue:
        pid = queue.pop()
        if pid in seen:
            continue
        seen.add(pid)
        spent = _process_s(pid)
        if spent is None:
            continue
        total += spent
        if children:
            queue += _children(pid)
    return total


def host_sample() -> CpuSample:
    """The host's busy seconds, now: one read, cheap enough for a window's hooks."""
    return CpuSample(_host_busy_s(), time.perf_counter())


def idle_cores(seconds: float = 0.3) -> float | None:
    """The cores this host keeps busy over ``seconds`` now (call it with no load running)."""
    first = host_sample()
    time.sleep(seconds)
    return first.rate(host_sample())


def server_sample(pids: Iterable[int], children: bool = True) -> CpuSample:
    """The CPU seconds of ``pids`` and (with ``children``) their children, now (``None``
    without pids)."""
    found = list(pids)
    return CpuSample(_tree_s(found, children) if found else None, time.perf_counter())


def python_pids(pids: Iterable[int]) -> tuple[int, ...]:
    """Those of ``pids`` that run a Python interpreter (whose code shares one GIL)."""
    found = []
    for pid in pids:
        try:
            name = os.path.basename(os.readlink(_PROC / str(pid) / "exe"))
        except OSError:
            continue
        if name.startswith("python"):
            found.append(pid)
    return tuple(found)


def is_local(url: str | None) -> bool:
    """Whether ``host:port`` names this host (loopback, or one of its own names)."""
    if not url:
        return False
    host = url.rsplit(":", 1)[0].strip("[]") if ":" in url else url
    if host in ("localhost", socket.gethostname()):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{inode}]")
    return inodes


def listening_pids(url: str | None) -> tuple[int, ...]:
    """The processes of this host listening on ``url``'s port: a server the study did not
    start but that runs here (its children, a Triton's stubs, are counted with it)."""
    if not url or ":" not in url:
        return ()
    try:
        inodes = _listening_inodes(int(url.rsplit(":", 1)[1]))
    except ValueError:
        return ()
    found = []
    for entry in _PROC.iterdir() if inodes else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            links = {os.readlink(fd) for fd in (entry / "fd").iterdir()}
        except OSError:
            continue
        if links & inodes:
            found.append(int(entry.name))
    return tuple(found)
