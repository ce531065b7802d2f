"""Where the fleet's servers register: etcd under leases, or a shared directory; and the
heartbeat that keeps a server registered while it lives.

``EtcdRegistry(url)`` keeps each server's record under ``<prefix>servers/<name>``, attached to
a lease of ``ttl_s`` seconds that the server renews every third of it: a server that dies, hangs
or loses its network stops renewing, etcd deletes its key when the lease runs out, and the
renderer (``render.py``), which watches the prefix, drops it from Envoy's endpoints and
Prometheus' targets. ``DirectoryRegistry(path)`` is the fallback for a site without etcd, as
NERSC's prototype runs on its shared file system: each server writes ``<name>.json`` there and
touches it as its heartbeat; a file older than its ``ttl_s`` is left out.

``Registration(record, registry)`` is the server's side: started, it registers and beats in a
thread of its own; the server goes on serving whatever the registry does (a registry that
cannot be reached is logged, counted in ``failures``, and tried again at the next beat: a
server is never stopped by its registration). ``close()`` leaves at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from otelkit._errors import FleetError, RegistrationError
from otelkit.fleet._etcd import Etcd
from otelkit.fleet._record import MAX_RECORD_BYTES, ServerRecord

__all__ = [
    "DEFAULT_PREFIX",
    "DirectoryRegistry",
    "EtcdRegistry",
    "Listing",
    "Registration",
    "Registry",
]

_log = logging.getLogger("otelkit.fleet")

DEFAULT_PREFIX = "/otelkit/fleet/"


@dataclass
class Listing:
    """The registry as read once: its servers by name, the entries refused (by key, with the
    reason), and each server's heartbeat age in seconds where the registry knows it."""

    servers: dict[str, ServerRecord] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    ages_s: dict[str, float] = field(default_factory=dict)
    revision: int = 0


class Registry(Protocol):
    """What the renderer reads and a registration writes."""

    def join(self, record: ServerRecord, ttl_s: float) -> int:
        """Register ``record`` for ``ttl_s`` seconds; a handle for ``beat`` and ``leave``."""
        ...

    def beat(self, record: ServerRecord, handle: int) -> bool:
        """Renew the registration; False when it is gone and must join again."""
        ...

    def leave(self, record: ServerRecord, handle: int) -> None: ...

    def listing(self, *, ages: bool = False) -> Listing:
        """Every valid record (``FleetError`` when the registry cannot be read)."""
        ...

    def wait_for_change(self, after: Listing, timeout_s: float) -> None:
        """Return when the registry may have changed since ``after``, or after ``timeout_s``."""
        ...

    def interrupt(self) -> None:
        """End a ``wait_for_change`` blocked in another thread."""
        ...

    def describe(self) -> str: ...


class EtcdRegistry:
    """Records under ``<prefix>servers/`` in etcd, each on its server's lease; as ``user``
    when etcd's authentication is on."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:2379",
        *,
        prefix: str = DEFAULT_PREFIX,
        timeout_s: float = 2.0,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        self.etcd = Etcd(url, timeout_s=timeout_s, user=user, password=password)
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.servers_prefix = f"{self.prefix}servers/"

    def key(self, name: str) -> str:
        return self.servers_prefix + name

    def join(self, record: ServerRecord, ttl_s: float) -> int:
        lease = self.etcd.grant(max(1, round(ttl_s)))
        self.etcd.put(self.key(record.name), record.to_json(), lease=lease)
        return lease

    def beat(self, record: ServerRecord, handle: int) -> bool:
        return self.etcd.keepalive(handle) > 0

    def leave(self, record: ServerRecord, handle: int) -> None:
        self.etcd.revoke(handle)

    def listing(self, *, ages: bool = False) -> Listing:
        revision, entries = self.etcd.prefix(self.servers_prefix)
        found = Listing(revision=revision)
        for key, (value, lease) in sorted(entries.items()):
            try:
                record = ServerRecord.from_json(value, key=key)
            except RegistrationError as error:
                found.refused[key] = error.reason
                continue
            if not lease:  # put without a lease: it would never leave; no heartbeat, no entry
                found.refused[key] = "not on a lease: a registration must carry a heartbeat"
                continue
            found.servers[record.name] = record
            if ages:
                left, granted = self.etcd.time_to_live(lease)
                if left >= 0:
                    found.ages_s[record.name] = max(0.0, float(granted - left))
        return found

    def wait_for_change(self, after: Listing, timeout_s: float) -> None:
        self.etcd.wait_for_change(self.servers_prefix, after.revision, timeout_s)

    def interrupt(self) -> None:
        self.etcd.interrupt()

    def describe(self) -> str:
        return f"etcd {self.etcd.url} {self.servers_prefix}"


class DirectoryRegistry:
    """Records as ``<name>.json`` files in a shared directory, their age the heartbeat."""

    def __init__(self, path: str | Path, *, poll_s: float = 1.0) -> None:
        self.path = Path(path)
        self.poll_s = poll_s
        self._interrupted = threading.Event()

    def join(self, record: ServerRecord, ttl_s: float) -> int:
        self.path.mkdir(parents=True, exist_ok=True)
        data = json.loads(record.to_json())
        data["ttl_s"] = ttl_s
        target = self.path / f"{record.name}.json"
        temporary = self.path / f".{record.name}.json.{os.getpid()}.tmp"
        try:
            temporary.write_text(json.dumps(data, sort_keys=True))
            temporary.replace(target)  # readers see the old file or the new one, never half
        except OSError as error:
            raise FleetError(f"cannot write {target}: {error.strerror or error}") from None
        return 1

    def beat(self, record: ServerRecord, handle: int) -> bool:
        try:
            os.utime(self.path / f"{record.name}.json")
        except FileNotFoundError:
            return False  # removed by hand, or the directory was cleaned: join again
        except OSError as error:
            raise FleetError(f"cannot touch {self.path / record.name}.json: {error}") from None
        return True

    def leave(self, record: ServerRecord, handle: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.path / f"{record.name}.json").unlink()

    def listing(self, *, ages: bool = False) -> Listing:
        found = Listing()
        try:
            files = sorted(self.path.glob("*.json"))
        except OSError as error:
            raise FleetError(f"cannot list {self.path}: {error}") from None
        now = time.time()
        for path in files:
            key = str(path)
            try:
                stat = path.stat()
                if stat.st_size > MAX_RECORD_BYTES + 64:
                    raise RegistrationError(f"over {MAX_RECORD_BYTES} bytes", key=key)
                data = json.loads(path.read_bytes())
                ttl_s = data.pop("ttl_s", None) if isinstance(data, dict) else None
                if not isinstance(ttl_s, int | float) or isinstance(ttl_s, bool) or ttl_s <= 0:
                    raise RegistrationError(
                        "no ttl_s: a registration must carry a heartbeat", key=key
                    )
                record = ServerRecord.from_json(json.dumps(data), key=str(path.with_suffix("")))
            except RegistrationError as error:
                found.refused[key] = error.reason
                continue
            except (OSError, ValueError) as error:  # gone meanwhile, or not JSON
                found.refused[key] = str(error)[:200]
                continue
            age = now - stat.st_mtime
            if age > ttl_s:
                continue  # its heartbeat stopped: the server is gone
            found.servers[record.name] = record
            found.ages_s[record.name] = max(0.0, age)
        return found

    def wait_for_change(self, after: Listing, timeout_s: float) -> None:
        # a shared file system notifies nothing across nodes: read it again every poll_s
        self._interrupted.wait(min(timeout_s, self.poll_s))

    def interrupt(self) -> None:
        self._interrupted.set()

    def describe(self) -> str:
        return f"directory {self.path}"


class Registration:
    """Keeps ``record`` registered in ``registry`` while this process lives.

    >>> etcd = EtcdRegistry("http://etcd:2379")
    >>> registration = Registration(record, etcd).start()  # doctest: +SKIP
    >>> registration.close()  # doctest: +SKIP
    """

    def __init__(self, record: ServerRecord, registry: Registry, *, ttl_s: float = 10.0) -> None:
        if not ttl_s >= 1:
            raise RegistrationError(
                f"ttl_s is the heartbeat's lease in seconds, 1 or more, not {ttl_s}"
            )
        self.record = record.check()
        self.registry, self.ttl_s = registry, ttl_s
        self.failures = 0  # beats or joins the registry did not take
        self.joins = 0
        self._handle: int | None = None
        self._stop = threading.Event()
        self._joined = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    @property
    def registered(self) -> bool:
        return self._handle is not None

    def start(self) -> Registration:
        """Register now if the registry answers, then beat every third of ``ttl_s`` in a
        thread; returns at once either way."""
        self._tick()
        self._thread = threading.Thread(
            target=self._run, name="otelkit-fleet-heartbeat", daemon=True
        )
        self._thread.start()
        return self

    def wait(self, timeout_s: float) -> bool:
        """True once registered, waiting at most ``timeout_s``."""
        return self._joined.wait(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            self._tick()

    def _tick(self) -> None:
        try:
            if self._handle is not None and self.registry.beat(self.record, self._handle):
                self._recovered()
                return
            self._handle = None
            self._handle = self.registry.join(self.record, self.ttl_s)
            self.joins += 1
            self._joined.set()
            self._recovered()
            _log.info(
                "%s registered in %s (heartbeat every %.1f s, lease %.0f s)",
                self.record.name,
                self.registry.describe(),
                self.ttl_s / 3,
                self.ttl_s,
            )
        except (FleetError, RegistrationError) as error:
            self.failures += 1
            if not self._failing:  # once an outage, not once a beat
                _log.warning(
                    "%s: heartbeat failed, retrying every %.1f s: %s",
                    self.record.name,
                    self.ttl_s / 3,
                    error,
                )
            self._failing = True

    def _recovered(self) -> None:
        if self._failing:
            _log.info("%s: heartbeat back after %d failures", self.record.name, self.failures)
        self._failing = False

    def close(self, *, leave: bool = True) -> None:
        """Stop beating and, with ``leave``, deregister at once (else the registration runs
        out with its lease, as when the process dies)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl_s)
        if leave and self._handle is not None:
            try:
                self.registry.leave(self.record, self._handle)
            except FleetError as error:
                _log.warning(
                    "%s: could not leave (the lease runs out instead): %s", self.record.name, error
                )
        self._handle = None

    def __enter__(self) -> Registration:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
