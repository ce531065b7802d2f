"""Registration when etcd's authentication is on (a real etcd of its own, with users and roles
as a site sets them): only a user whose role may write under the fleet's prefix registers a
server; the renderer's user reads and watches; everyone else is refused with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from otelkit._errors import FleetError
from otelkit.fleet import EtcdRegistry, Registration, ServerRecord
from otelkit.fleet._etcd import Etcd, _b64, prefix_end
from otelkit.fleet._registry import DEFAULT_PREFIX
from otelkit.testing import wait_until
from tests.fleet.components import EtcdServer
from tests.paths import ROOT

SERVERS = f"{DEFAULT_PREFIX}servers/"
USERS = {"root": "root-pass-0", "server-a": "server-pass-1", "renderer": "reader-pass-2"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An etcd with auth on: ``server-a`` may read and write the fleet's servers, ``renderer``
    may read them; nobody else may do anything."""
    server = EtcdServer(tmp_path_factory.mktemp("etcd-auth")).start()
    admin = Etcd(server.url)
    span = {"key": _b64(SERVERS), "range_end": prefix_end(SERVERS)}
    for role, permission in (("fleet-server", "READWRITE"), ("fleet-reader", "READ")):
        admin.call("auth/role/add", {"name": role})
        admin.call("auth/role/grant", {"name": role, "perm": {"permType": permission, **span}})
    admin.call("auth/role/add", {"name": "root"})
    roles = {"root": "root", "server-a": "fleet-server", "renderer": "fleet-reader"}
    for user, password in USERS.items():
        admin.call("auth/user/add", {"name": user, "password": password})
        admin.call("auth/user/grant", {"user": user, "role": roles[user]})
    admin.call("auth/enable", {})
    yield server.url
    server.stop()


def registry(url: str, user: str | None = None, password: str | None = None) -> EtcdRegistry:
    if user is not None and password is None:
        password = USERS[user]
    return EtcdRegistry(url, user=user, password=password)


def record(name: str = "triton-a") -> ServerRecord:
    return ServerRecord(name, http="127.0.0.1:8000", grpc="127.0.0.1:8001")


def test_a_process_without_credentials_cannot_register(secured: str) -> None:
    with pytest.raises(FleetError, match="requires authentication"):
        registry(secured).join(record(), 5)
    with pytest.raises(FleetError, match="refused the user and password"):
        registry(secured, "server-a", "not-the-password").join(record(), 5)
    assert registry(secured, "renderer").listing().servers == {}


def test_the_readers_role_may_list_and_watch_but_not_register(secured: str) -> None:
    reader = registry(secured, "renderer")
    with pytest.raises(FleetError, match="permission denied"):
        reader.join(record("intruder"), 5)
    before = reader.listing()
    woke: list[float | BaseException] = []

    def watch() -> None:
        began = time.monotonic()
        try:
            reader.wait_for_change(before, 10)
            woke.append(time.monotonic() - began)
        except FleetError as error:
            woke.append(error)

    watcher = threading.Thread(target=watch)
    watcher.start()
    time.sleep(0.3)
    with Registration(record("triton-b"), registry(secured, "server-a"), ttl_s=5) as joined:
        assert joined.wait(5)
        watcher.join(10)
        assert set(reader.listing().servers) == {"triton-b"}
    assert reader.listing().servers == {}  # it left on close
    (after,) = woke
    assert isinstance(after, float) and after < 5, after  # woken by the change, not the timeout


def test_an_expired_token_is_taken_again(secured: str) -> None:
    server = registry(secured, "server-a")
    lease = server.join(record("triton-c"), 5)
    server.etcd._token = "expired.token.0"  # as etcd's 5-minute simple token would be
    assert server.beat(record("triton-c"), lease)
    server.leave(record("triton-c"), lease)


def test_the_command_line_takes_the_password_from_a_file_or_the_environment(
    secured: str, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "otelkit.cli", "fleet", "register", "--etcd", secured]
    command += ["--name", "triton-d", "--http", "127.0.0.1:8000", "--etcd-user", "server-a"]
    env = {k: v for k, v in os.environ.items() if k != "OTELKIT_ETCD_PASSWORD"}
    env["PYTHONPATH"] = str(ROOT)
    refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "--etcd-password-file or $OTELKIT_ETCD_PASSWORD" in refused.stderr
    secret = tmp_path / "password"
    secret.write_text(USERS["server-a"] + "\n")
    process = subprocess.Popen(
        [*command, "--etcd-password-file", str(secret), "--ttl", "3"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    reader = registry(secured, "renderer")
    try:

        def registered() -> bool:
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            return "triton-d" in reader.listing().servers

        wait_until(registered, 20, "triton-d registered", interval=0.1)
    finally:
        process.terminate()
        output = process.communicate(timeout=20)[0].decode()
    assert reader.listing().servers == {}
    assert USERS["server-a"] not in output  # the password is in no log line
