"""What a server may register, and what the renderer writes from it: no component needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from otelkit._errors import RegistrationError
from otelkit.fleet._record import MAX_RECORD_BYTES, ServerRecord, parse_address
from otelkit.fleet._render import eds_response, file_sd_targets, write_if_changed

KEY = "/otelkit/fleet/servers/"


def stored(**fields: object) -> str:
    return json.dumps({"name": "t0", "http": "127.0.0.1:8000", **fields})


@pytest.mark.parametrize(
    ("address", "parsed"),
    [
        ("10.0.0.5:8000", ("10.0.0.5", 8000)),
        ("[::1]:8001", ("::1", 8001)),
        ("Node-7.perlmutter.nersc.gov:8002", ("node-7.perlmutter.nersc.gov", 8002)),
    ],
)
def test_addresses_are_ip_or_dns_names_with_a_port(address: str, parsed: tuple[str, int]) -> None:
    assert parse_address(address) == parsed


@pytest.mark.parametrize(
    "address",
    [
        "10.0.0.5",
        "10.0.0.5:0",
        "10.0.0.5:65536",
        "10.0.0.5:80a",
        "::1:8000",
        "[::g]:80",
        "host_with_underscore:80",
        "-lead.example:80",
        "a..b:80",
        "<script>:80",
        "x" * 300 + ":80",
        "10.0.0.5:\uff18\uff10",  # digits, but not ASCII,
    ],
)
def test_malformed_addresses_are_refused(address: str) -> None:
    with pytest.raises(ValueError):
        parse_address(address)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (stored(name="../../etc/passwd"), "name '../../etc/passwd'"),
        (stored(http="127.0.0.1:99999"), "http: '127.0.0.1:99999': the port is 1 to 65535"),
        (stored(grpc="<img src=x onerror=alert(1)>:1"), "grpc:"),
        (stored(models=["ok", "</script><script>alert(1)</script>"]), "model '</script>"),
        (stored(models=["m"] * 300), "models: a list of at most 256"),
        (stored(site="a b"), "site 'a b'"),
        (stored(started="yesterday"), "started: epoch seconds"),
        (stored(admin=True), "unknown field 'admin'"),
        (stored(name="t1"), "names 't1', not the server of its key"),
        ('{"name": "t0", "http": ' + "[" * 100_000 + "]" * 100_000 + "}", "over 4096 bytes"),
        ("[" * 2000 + "]" * 2000, "not JSON: maximum recursion depth"),
        ("\xff\xfe not json", "not JSON"),
        ("null", "a JSON object with name and http"),
    ],
)
def test_a_hostile_or_malformed_registration_is_refused_saying_why(text: str, reason: str) -> None:
    with pytest.raises(RegistrationError) as refused:
        ServerRecord.from_json(text, key=KEY + "t0")
    assert reason in refused.value.reason
    assert refused.value.key == KEY + "t0"


def test_a_record_round_trips_and_is_checked_before_it_is_written() -> None:
    record = ServerRecord(
        "t0",
        http="127.0.0.1:8000",
        grpc="127.0.0.1:8001",
        metrics="127.0.0.1:8002",
        models=("tracking",),
        site="s1",
    )
    assert ServerRecord.from_json(record.to_json(), key=KEY + "t0") == record
    with pytest.raises(RegistrationError, match="name"):
        ServerRecord("", http="127.0.0.1:8000").check()
    with pytest.raises(RegistrationError, match=f"over {MAX_RECORD_BYTES} bytes"):
        models = tuple(f"m{i:0>100}" for i in range(50))
        ServerRecord("t0", http="127.0.0.1:8000", models=models).check()


def test_eds_health_checks_each_server_on_its_http_port_and_names_it() -> None:
    servers = {
        "a": ServerRecord("a", http="127.0.0.1:8000", grpc="127.0.0.1:8001", site="s1"),
        "b": ServerRecord("b", http="10.0.0.9:9000", grpc="10.0.0.8:9001"),  # two hosts
        "c": ServerRecord("c", http="127.0.0.1:7000"),  # no gRPC: in the HTTP cluster only
    }
    grpc, unresolved = eds_response("otelkit_grpc", "grpc", servers, resolve=lambda h, p: h)
    endpoints = grpc["resources"][0]["endpoints"][0]["lb_endpoints"]
    assert unresolved == []
    assert [e["endpoint"]["hostname"] for e in endpoints] == ["a", "b"]
    assert endpoints[0]["endpoint"]["health_check_config"] == {"port_value": 8000}
    elsewhere = {"socket_address": {"address": "10.0.0.9", "port_value": 9000}}
    assert endpoints[1]["endpoint"]["health_check_config"] == {
        "port_value": 9000,
        "address": elsewhere,
    }
    assert endpoints[0]["metadata"]["filter_metadata"]["otelkit"] == {"server": "a", "site": "s1"}
    http, _ = eds_response("otelkit_http", "http", servers, resolve=lambda h, p: h)
    assert len(http["resources"][0]["endpoints"][0]["lb_endpoints"]) == 3
    assert (
        "health_check_config"
        not in http["resources"][0]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    )  # checked where it serves
    # a name that does not resolve is left out, and said
    _, unresolved = eds_response(
        "otelkit_http", "http", servers, resolve=lambda h, p: None if h == "10.0.0.9" else h
    )
    assert unresolved == ["b"]
    empty, _ = eds_response("otelkit_http", "http", {})
    assert empty["resources"][0]["endpoints"] == []


def test_file_sd_labels_each_target_with_its_server_and_site() -> None:
    servers = {
        "a": ServerRecord("a", http="h:1", metrics="h:2", site="s"),
        "b": ServerRecord("b", http="h:3"),
    }
    assert file_sd_targets(servers) == [
        {"targets": ["h:2"], "labels": {"otelkit_server": "a", "otelkit_site": "s"}}
    ]


def test_files_are_replaced_whole_and_only_when_they_change(tmp_path: Path) -> None:
    path = tmp_path / "otelkit_http.json"
    assert write_if_changed(path, {"a": 1})
    inode = path.stat().st_ino
    assert not write_if_changed(path, {"a": 1})
    assert path.stat().st_ino == inode
    assert write_if_changed(path, {"a": 2})
    assert path.stat().st_ino != inode  # renamed into place: Envoy's watch sees a move
    assert json.loads(path.read_text()) == {"a": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["otelkit_http.json"]
