"""etcd's v3 API through its JSON gateway: the few calls the fleet needs, over plain HTTP.

etcd serves its v3 gRPC API as JSON at ``/v3/...`` on the client port (etcd 3.4 and later,
on by default): keys and values in base64, 64-bit integers as strings. otelkit speaks it with
the standard library rather than a client package: the Python etcd3 clients pin old protobuf
and gRPC releases that clash with OpenTelemetry's, and the gateway's few calls (grant, keep
alive, put, range, watch, revoke) are stable across 3.4 and 3.5. Every failure (refused, a
timeout, an error answer) is a ``FleetError`` that names the call.

**Authentication**: with ``user`` and ``password`` every call carries the token etcd gives for
them (``auth/authenticate``), taken again when etcd says it expired. A site with ``auth
enable`` gives each server a user whose role may write only under the fleet's prefix, and the
renderer one that may only read it: a process without them cannot register a server.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import shutil
import socket
import threading
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from otelkit._errors import FleetError
from otelkit.fleet._child import LocalProcess

__all__ = ["Etcd", "LocalEtcd", "prefix_end"]


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _why(error: BaseException) -> str:
    return str(error) or type(error).__name__


# what etcd says when authentication is on, and what to do about it
_AUTH_HINTS = {
    "user name is empty": "etcd requires authentication: give a user and its password",
    "authentication failed": "etcd refused the user and password",
    "permission denied": "etcd refused: the user's role may not do this under the prefix",
}


def _said(detail: object) -> str:
    text = str(detail)
    hint = next((h for key, h in _AUTH_HINTS.items() if key in text), None)
    return f"{text} ({hint})" if hint else text


def prefix_end(prefix: str) -> str:
    """The end of the key range holding every key that starts with ``prefix`` (its last
    byte plus one), base64 as the gateway takes it."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return _b64(b"\0")
    raw[-1] += 1
    return _b64(bytes(raw))


class Etcd:
    """One etcd endpoint, ``http://host:2379``."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:2379",
        *,
        timeout_s: float = 2.0,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if parsed.scheme != "http" or not parsed.hostname:
            raise FleetError(f"etcd at {url!r}: give http://host:port (TLS is not supported)")
        self.url = f"http://{parsed.netloc}"
        self.host, self.port = parsed.hostname, parsed.port or 2379
        self.timeout_s = timeout_s
        if bool(user) != (password is not None):
            raise FleetError("etcd: give a user and its password together")
        self.user, self._password = user, password
        self._token: str | None = None
        self._watch_lock = threading.Lock()
        self._watching: http.client.HTTPConnection | None = None

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.user is not None:
            if self._token is None:
                answer = self._post(
                    "auth/authenticate", {"name": self.user, "password": self._password}, {}
                )
                self._token = str(answer.get("token", ""))
            headers["Authorization"] = self._token
        return headers

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``/v3/<path>``; the answer, or ``FleetError``."""
        try:
            return self._post(path, body, self._headers())
        except FleetError as error:
            if self.user is None or "invalid auth token" not in str(error):
                raise
        self._token = None  # it expired (etcd's simple tokens live 5 minutes): once more
        return self._post(path, body, self._headers())

    def _post(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            connection.request("POST", f"/v3/{path}", json.dumps(body), headers)
            response = connection.getresponse()
            text = response.read(1 << 24)
        except (OSError, http.client.HTTPException) as error:
            raise FleetError(f"etcd at {self.url}: {path}: {_why(error)}") from None
        finally:
            connection.close()
        try:
            answer = json.loads(text)
        except ValueError:
            answer = None
        if response.status != 200 or not isinstance(answer, dict) or "error" in answer:
            raw = text[:200].decode(errors="replace")
            detail = answer.get("error") if isinstance(answer, dict) else raw
            raise FleetError(f"etcd at {self.url}: {path}: {response.status} {_said(detail)}")
        return answer

    def grant(self, ttl_s: int) -> int:
        """A new lease of ``ttl_s`` seconds; its id."""
        return int(self.call("lease/grant", {"TTL": str(ttl_s)})["ID"])

    def keepalive(self, lease: int) -> int:
        """Renew ``lease``; the seconds it has now, 0 when it is gone (expired or revoked)."""
        result = self.call("lease/keepalive", {"ID": str(lease)}).get("result", {})
        return int(result.get("TTL", 0))

    def time_to_live(self, lease: int) -> tuple[int, int]:
        """``(seconds left, seconds granted)`` of ``lease``; ``(-1, 0)`` when it is gone."""
        answer = self.call("kv/lease/timetolive", {"ID": str(lease)})
        return int(answer.get("TTL", -1)), int(answer.get("grantedTTL", 0))

    def revoke(self, lease: int) -> None:
        """End ``lease`` now: its keys are deleted at once."""
        self.call("kv/lease/revoke", {"ID": str(lease)})

    def put(self, key: str, value: str, *, lease: int | None = None) -> None:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease is not None:
            body["lease"] = str(lease)
        self.call("kv/put", body)

    def delete(self, key: str) -> None:
        self.call("kv/deleterange", {"key": _b64(key)})

    def prefix(self, prefix: str) -> tuple[int, dict[str, tuple[bytes, int]]]:
        """The store's revision, and every key under ``prefix`` with its value and lease (0:
        none)."""
        answer = self.call("kv/range", {"key": _b64(prefix), "range_end": prefix_end(prefix)})
        revision = int(answer.get("header", {}).get("revision", 0))
        found: dict[str, tuple[bytes, int]] = {}
        for kv in answer.get("kvs", []):
            key = base64.b64decode(kv.get("key", "")).decode(errors="replace")
            found[key] = base64.b64decode(kv.get("value", "")), int(kv.get("lease", 0))
        return revision, found

    def wait_for_change(self, prefix: str, after: int, timeout_s: float) -> bool:
        """Block until a key under ``prefix`` changes after revision ``after``, or
        ``timeout_s`` passes, or ``interrupt()`` is called; True when something changed.
        ``FleetError`` when etcd cannot be watched."""
        body = {
            "create_request": {
                "key": _b64(prefix),
                "range_end": prefix_end(prefix),
                "start_revision": str(after + 1),
            }
        }
        headers = self._headers()
        connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)
        with self._watch_lock:
            self._watching = connection
        try:
            connection.request("POST", "/v3/watch", json.dumps(body), headers)
            response = connection.getresponse()
            if response.status != 200:
                self._token = None  # perhaps expired: taken again on the next call
                raise FleetError(f"etcd at {self.url}: watch: {response.status}")
            while line := response.readline(1 << 24):  # one JSON object a line
                result = json.loads(line).get("result", {})
                if result.get("events") or result.get("compact_revision"):
                    return True
                if result.get("canceled"):
                    self._token = None
                    raise FleetError(f"etcd at {self.url}: watch canceled: {result}")
            return False  # the stream ended: interrupted, or etcd went away
        except TimeoutError:
            return False
        except (OSError, http.client.HTTPException, ValueError) as error:
            raise FleetError(f"etcd at {self.url}: watch: {_why(error)}") from None
        finally:
            with self._watch_lock:
                self._watching = None
            connection.close()

    def interrupt(self) -> None:
        """End a ``wait_for_change`` blocked in another thread."""
        with self._watch_lock:
            sock = self._watching.sock if self._watching is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class LocalEtcd(LocalProcess):
    """An ``etcd`` child process on free loopback ports and a data directory of its own: the
    registry of ``make fleet``, the benchmarks and the tests (a site runs its own etcd).
    ``start()`` waits for ``/health``; ``stop()`` ends it (its data stays for a restart)."""

    what = "etcd"

    def __init__(self, directory: str | Path, *, binary: str | None = None) -> None:
        self.binary = binary or shutil.which("etcd")
        if self.binary is None:
            raise FleetError("etcd is not installed: apt-get install etcd-server")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        super().__init__(self.directory / "etcd.log")
        self.client_port, self.peer_port = _free_port(), _free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"

    def command(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            self.binary or "etcd",
            "--name",
            "otelkit",
            "--data-dir",
            str(self.directory / "data"),
            "--listen-client-urls",
            self.url,
            "--advertise-client-urls",
            self.url,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"otelkit={peer}",
        ]

    def serving(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/health", timeout=1) as response:
            return bool(json.load(response).get("health") == "true")

    def start(self, timeout_s: float = 20.0) -> LocalEtcd:
        super().start(timeout_s)
        return self

    def __enter__(self) -> LocalEtcd:
        return self.start()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
