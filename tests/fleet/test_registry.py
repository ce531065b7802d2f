"""Registration with heartbeats and the renderer, on a real etcd (Debian's etcd-server)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from otelkit._errors import FleetError
from otelkit.fleet import DirectoryRegistry, EtcdRegistry, Registration, Renderer, ServerRecord
from otelkit.fleet._etcd import Etcd
from otelkit.fleet._render import resolve_address
from otelkit.testing import wait_until
from tests.fleet.components import EtcdServer


def record(name: str, port: int = 8000, **fields: object) -> ServerRecord:
    return ServerRecord(
        name,
        http=f"127.0.0.1:{port}",
        grpc=f"127.0.0.1:{port + 1}",
        metrics=f"127.0.0.1:{port + 2}",
        **fields,
    )  # type: ignore[arg-type]


def seconds_until(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until ``condition`` holds, for the checks of how soon; fails after ``timeout_s``."""
    start = time.monotonic()
    wait_until(condition, timeout_s, what, interval=0.02)
    return time.monotonic() - start


def endpoints(eds_dir: Path, cluster: str = "otelkit_grpc") -> list[str]:
    try:
        document = json.loads((eds_dir / f"{cluster}.json").read_text())
    except FileNotFoundError:
        return []
    groups = document["resources"][0]["endpoints"]
    return [e["endpoint"]["hostname"] for g in groups for e in g["lb_endpoints"]]


def test_a_registration_lives_with_its_heartbeat_and_leaves_when_closed(
    registry: EtcdRegistry,
) -> None:
    with Registration(record("t0", site="s1"), registry, ttl_s=2) as registration:
        assert registration.wait(5)
        time.sleep(3)  # past one lease: the heartbeat renews it
        listing = registry.listing(ages=True)
        assert list(listing.servers) == ["t0"] and listing.servers["t0"].site == "s1"
        assert 0 <= listing.ages_s["t0"] <= 1.0  # renewed every 2/3 s
        assert registration.failures == 0 and registration.joins == 1
    assert registry.listing().servers == {}  # closed: the lease is revoked at once


def test_a_stopped_heartbeat_leaves_within_its_lease(registry: EtcdRegistry) -> None:
    registration = Registration(record("t0"), registry, ttl_s=2).start()
    assert registration.wait(5)
    registration.close(leave=False)  # the process hangs: no heartbeat, no goodbye
    gone = seconds_until(lambda: not registry.listing().servers, 5, "an empty listing")
    assert gone <= 2 + 1.0  # etcd expires a lease within about half a second of its TTL


def test_the_renderer_follows_the_registry_within_one_render(
    registry: EtcdRegistry, tmp_path: Path
) -> None:
    eds, targets = tmp_path / "eds", tmp_path / "targets.json"
    with Renderer(registry, eds_dir=eds, file_sd=targets, resync_s=30) as renderer:
        assert renderer.wait_for_render(5)
        assert endpoints(eds) == [] and json.loads(targets.read_text()) == []
        first = Registration(record("t0", site="s1", models=("m",)), registry, ttl_s=2).start()
        # joined: in Envoy's endpoints without waiting for the resync (the watch)
        assert seconds_until(lambda: endpoints(eds) == ["t0"], 2, "t0 rendered") < 1.0
        second = Registration(record("t1", 9000), registry, ttl_s=2).start()
        wait_until(lambda: endpoints(eds) == ["t0", "t1"], 2, "t0 and t1 rendered")
        assert json.loads(targets.read_text()) == [
            {
                "targets": ["127.0.0.1:8002"],
                "labels": {"otelkit_server": "t0", "otelkit_site": "s1"},
            },
            {"targets": ["127.0.0.1:9002"], "labels": {"otelkit_server": "t1", "otelkit_site": ""}},
        ]
        second.close(leave=False)  # its heartbeat stops: out of both within TTL + a render
        assert seconds_until(lambda: endpoints(eds) == ["t0"], 5, "t1 gone") <= 2 + 1.0
        assert [t["labels"]["otelkit_server"] for t in json.loads(targets.read_text())] == ["t0"]
        first.close()  # leaves at once
        assert seconds_until(lambda: endpoints(eds) == [], 2, "no endpoint") < 1.0
        assert renderer.errors == 0


def test_a_hostile_entry_is_refused_logged_and_never_rendered(
    registry: EtcdRegistry, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    etcd = registry.etcd
    lease = etcd.grant(30)
    bad = {
        "evil": json.dumps({"name": "evil", "http": "127.0.0.1:1", "models": ["<script>"]}),
        "posing": record("t0").to_json(),  # under another server's key
        "junk": "\x00\x01 not json",
    }
    for name, value in bad.items():
        etcd.put(registry.key(name), value, lease=lease)
    etcd.put(registry.key("t9"), record("t9").to_json())  # no lease: it would never leave
    good = Registration(record("t1", 9000), registry, ttl_s=5).start()
    caplog.set_level(logging.WARNING, logger="otelkit.fleet")
    renderer = Renderer(registry, eds_dir=tmp_path, resync_s=30)
    listing = renderer.render_once()
    assert list(listing.servers) == ["t1"] and endpoints(tmp_path) == ["t1"]
    refused = {key.rsplit("/", 1)[1]: reason for key, reason in listing.refused.items()}
    assert sorted(refused) == ["evil", "junk", "posing", "t9"]
    assert (
        "model '<script>'" in refused["evil"] and "not the server of its key" in refused["posing"]
    )
    assert "not on a lease" in refused["t9"]
    assert sum("refused, nothing rendered from it" in r.message for r in caplog.records) == 4
    renderer.render_once()  # logged once, not at every render
    assert sum("refused" in r.message for r in caplog.records) == 4
    good.close()
    etcd.revoke(lease)
    etcd.delete(registry.key("t9"))


def test_with_etcd_down_envoy_keeps_the_last_servers_and_all_recover(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    own = EtcdServer(tmp_path / "etcd").start()  # this one is stopped: not the shared one
    registry = EtcdRegistry(own.url, timeout_s=0.5)
    eds = tmp_path / "eds"
    caplog.set_level(logging.INFO, logger="otelkit.fleet")
    registration = Registration(record("t0"), registry, ttl_s=3).start()
    renderer = Renderer(registry, eds_dir=eds, resync_s=1).start()
    try:
        wait_until(lambda: endpoints(eds) == ["t0"], 3, "t0 rendered")
        before = (eds / "otelkit_grpc.json").read_text()
        own.stop()
        wait_until(lambda: renderer.errors > 0 and registration.failures > 0, 5, "failures")
        failed = renderer.errors  # two more failed passes: nothing raised, nothing rewritten
        wait_until(lambda: renderer.errors >= failed + 2, 5, "two more failed renders")
        assert (eds / "otelkit_grpc.json").read_text() == before
        assert renderer._thread is not None and renderer._thread.is_alive()
        warnings = [r.message for r in caplog.records if r.levelno == logging.WARNING]
        assert sum("keep the last servers rendered" in m for m in warnings) == 1  # once an outage
        assert sum("heartbeat failed" in m for m in warnings) == 1
        own.start()  # back, its data kept: the registration beats (or joins) again
        wait_until(
            lambda: registration.failures > 0 and not registration._failing, 10, "beats again"
        )
        wait_until(lambda: not renderer._failing, 10, "the renderer rendering again")
        assert endpoints(eds) == ["t0"]
        assert any("the registry answers again" in r.message for r in caplog.records)
    finally:
        renderer.close()
        registration.close()
        own.stop()


def test_a_registry_that_cannot_be_reached_is_a_clear_error() -> None:
    registry = EtcdRegistry("http://127.0.0.1:9", timeout_s=0.5)  # nothing listens on 9
    with pytest.raises(FleetError, match=r"etcd at http://127.0.0.1:9: kv/range: .*refused"):
        registry.listing()
    with pytest.raises(FleetError, match="give http://host:port"):
        Etcd("https://etcd:2379")
    # a server whose registry is down still starts, and says so
    registration = Registration(record("t0"), registry, ttl_s=3).start()
    assert not registration.registered and registration.failures == 1
    registration.close()


def test_the_shared_directory_registry_needs_a_fresh_heartbeat(tmp_path: Path) -> None:
    registry = DirectoryRegistry(tmp_path, poll_s=0.1)
    registration = Registration(record("t0"), registry, ttl_s=1).start()
    (tmp_path / "bad.json").write_text('{"name": "bad", "http": "x:1", "ttl_s": 5, "cmd": "rm"}')
    (tmp_path / "forever.json").write_text(record("forever").to_json())  # no ttl_s
    listing = registry.listing(ages=True)
    assert list(listing.servers) == ["t0"] and listing.ages_s["t0"] < 1
    assert sorted(Path(k).name for k in listing.refused) == ["bad.json", "forever.json"]
    time.sleep(1.5)  # beaten every third of a second: still there
    assert list(registry.listing().servers) == ["t0"]
    registration.close(leave=False)
    wait_until(lambda: not registry.listing().servers, 2.5, "no server")  # stale after ttl_s
    assert (tmp_path / "t0.json").exists()  # left on disk: its owner may come back
    with Renderer(registry, eds_dir=tmp_path / "eds", resync_s=5) as renderer:
        assert renderer.wait_for_render(5)
        assert endpoints(tmp_path / "eds") == []


def test_names_resolve_for_envoy() -> None:
    assert resolve_address("localhost", 80) in ("127.0.0.1", "::1")
    assert resolve_address("no-such-host.invalid", 80) is None
