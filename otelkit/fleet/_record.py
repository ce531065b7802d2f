"""What a server registers: its name, site, endpoints and models, checked before anything is
rendered from it.

A record is JSON, at most 4 KiB: a name (letters, digits, ``.``, ``_``, ``-``; the key it is
registered under ends with it), the server's HTTP endpoint (Envoy's health checks ask its
``/v2/health/ready``), optionally its gRPC and metrics endpoints, the models it serves and its
site. An endpoint is ``host:port`` with an IPv4 address, a bracketed IPv6 address or a DNS
name. Anything else (a name that is a path, a port out of range, markup, a record of megabytes)
is refused with a ``RegistrationError`` that says what, at registration and again when the
renderer reads the registry: a hostile writer to etcd gets nothing rendered.

>>> record = ServerRecord("triton-0", http="10.0.0.5:8000", grpc="10.0.0.5:8001",
...                       models=("tracking",), site="perlmutter")
>>> ServerRecord.from_json(record.to_json(), key="/otelkit/fleet/servers/triton-0") == record
True
>>> ServerRecord("../etc", http="10.0.0.5:8000").check()
Traceback (most recent call last):
...
otelkit._errors.RegistrationError: otelkit fleet: registration refused: name '../etc': ...
"""

from __future__ import annotations

import ipaddress
import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from otelkit._errors import RegistrationError

__all__ = ["MAX_RECORD_BYTES", "ServerRecord", "parse_address"]

MAX_RECORD_BYTES = 4096
MAX_MODELS = 256
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")
_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)\Z")
_FIELDS = ("name", "http", "grpc", "metrics", "models", "site", "started")


def parse_address(text: str) -> tuple[str, int]:
    """``(host, port)`` of ``host:port``; ``ValueError`` saying what is wrong otherwise."""
    if not isinstance(text, str) or not 3 <= len(text) <= 261:
        raise ValueError("an address is host:port")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r}: the port is 1 to 65535")
    if host.startswith("[") and host.endswith("]"):
        try:
            return str(ipaddress.IPv6Address(host[1:-1])), int(port)
        except ValueError:
            raise ValueError(f"{text!r}: not an IPv6 address in brackets") from None
    try:
        return str(ipaddress.IPv4Address(host)), int(port)
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    if len(host) > 253 or not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"{text!r}: the host is an IP address or a DNS name")
    return host.lower(), int(port)


@dataclass(frozen=True)
class ServerRecord:
    """One server of the fleet as it registers itself."""

    name: str
    http: str
    grpc: str | None = None
    metrics: str | None = None
    models: tuple[str, ...] = ()
    site: str = ""
    started: float = field(default_factory=time.time)  # epoch seconds

    def problems(self) -> list[str]:
        """What is wrong with this record, in words; empty when it can be rendered."""
        found = []
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            found.append(f"name {str(self.name)[:80]!r}: 1 to 63 letters, digits, '.', '_', '-'")
        if self.site and (not isinstance(self.site, str) or not _NAME.match(self.site)):
            found.append(f"site {str(self.site)[:80]!r}: as a name")
        for kind in ("http", "grpc", "metrics"):
            value = getattr(self, kind)
            if value is None and kind != "http":
                continue
            try:
                parse_address(value)
            except ValueError as error:
                found.append(f"{kind}: {str(error)[:200]}")
        models = self.models
        if not isinstance(models, tuple) or len(models) > MAX_MODELS:
            found.append(f"models: a list of at most {MAX_MODELS} names")
        elif bad := [m for m in models if not isinstance(m, str) or not _MODEL.match(m)]:
            found.append(f"model {str(bad[0])[:80]!r}: letters, digits, '.', '_', '-'")
        if not isinstance(self.started, int | float) or isinstance(self.started, bool):
            found.append("started: epoch seconds")
        return found

    def check(self) -> ServerRecord:
        """This record, or ``RegistrationError`` naming its first problem."""
        if problems := self.problems():
            raise RegistrationError("; ".join(problems))
        self.to_json()  # its size
        return self

    def to_json(self) -> str:
        text = json.dumps({k: v for k, v in asdict(self).items() if v is not None}, sort_keys=True)
        if len(text.encode()) > MAX_RECORD_BYTES:
            raise RegistrationError(f"the record is over {MAX_RECORD_BYTES} bytes")
        return text

    @classmethod
    def from_json(cls, text: str | bytes, *, key: str) -> ServerRecord:
        """The record stored under ``key``; ``RegistrationError`` when it is malformed, hostile,
        or names another server than its key does."""
        if len(text) > MAX_RECORD_BYTES:
            raise RegistrationError(f"over {MAX_RECORD_BYTES} bytes", key=key)
        try:
            data: Any = json.loads(text)
        except (ValueError, RecursionError) as error:  # also bytes that are not UTF-8
            raise RegistrationError(f"not JSON: {str(error)[:120]}", key=key) from None
        if not isinstance(data, dict) or not isinstance(data.get("http"), str):
            raise RegistrationError("a JSON object with name and http", key=key)
        unknown = sorted(set(data) - set(_FIELDS))
        if unknown:
            raise RegistrationError(f"unknown field {unknown[0][:40]!r}", key=key)
        models = data.get("models", [])
        record = cls(
            name=data.get("name"),  # type: ignore[arg-type]  # checked below
            http=data["http"],
            grpc=data.get("grpc"),
            metrics=data.get("metrics"),
            models=tuple(models) if isinstance(models, list) else models,
            site=data.get("site", ""),
            started=data.get("started", 0.0),
        )
        if problems := record.problems():
            raise RegistrationError("; ".join(problems), key=key)
        if not key.endswith("/" + record.name):
            raise RegistrationError(f"names {record.name!r}, not the server of its key", key=key)
        return record
