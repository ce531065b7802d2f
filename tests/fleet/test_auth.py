"""Authentication at the ingress: a real Envoy in front of a real tritonserver checks a bearer
token on every call (JWTs against a local JWKS, or a static list), over HTTP and gRPC; the calls
it refuses never reach the server, are counted and traced as errors, and the token is written
nowhere."""

from __future__ import annotations

import base64
import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from secrets import token_hex
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from tritonclient.utils import InferenceServerException

import otelkit
from otelkit import semconv
from otelkit.analysis import SpanKind, StatusCode, load_spans
from otelkit.fleet import ServerRecord, envoy_config, envoy_hosts
from otelkit.fleet._auth import Auth
from otelkit.fleet._render import eds_response, write_if_changed
from otelkit.receiver import Receiver
from otelkit.testing import ReceiverCapture, wait_until
from otelkit.tritonserver import TritonServer
from tests.fleet.components import EnvoyProxy, loopback_envoy
from tests.paths import MODELS

pytestmark = pytest.mark.triton

MODEL = "identity_fp32"
ISSUER = "https://tokens.site.example"
AUDIENCE = "otelkit-fleet"
STATIC = "static-token-of-site-a-0123456789"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Issuer:
    """A site's token issuer: an RSA key, its JWKS, and RS256 JWTs signed with it."""

    def __init__(self, kid: str) -> None:
        self.kid = kid
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwks(self) -> dict[str, Any]:
        numbers = self.key.public_key().public_numbers()

        def whole(n: int) -> str:
            return _b64(n.to_bytes((n.bit_length() + 7) // 8, "big"))

        key = {"kty": "RSA", "alg": "RS256", "use": "sig", "kid": self.kid}
        return {"keys": [key | {"n": whole(numbers.n), "e": whole(numbers.e)}]}

    def token(self, *, issuer: str = ISSUER, expires_in_s: float = 600, **claims: Any) -> str:
        header = {"alg": "RS256", "typ": "JWT", "kid": self.kid}
        now = int(time.time())
        body = {"iss": issuer, "aud": AUDIENCE, "sub": "physicist", "iat": now}
        body |= {"exp": now + int(expires_in_s)} | claims
        signing = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(body).encode())}"
        signature = self.key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing}.{_b64(signature)}"


@dataclass
class Gate:
    """One Envoy in front of the server, checking tokens one way."""

    way: str
    envoy: EnvoyProxy
    http_url: str
    grpc_url: str
    good: str  # a token it accepts
    bad: dict[str, tuple[str, int]]  # tokens it refuses and the HTTP status it answers, by why


@dataclass
class Ingress:
    server: TritonServer
    receiver: Receiver
    gates: dict[str, Gate]
    written: list[Path]  # every folder the run writes into
    pages: list[str]  # the clients' metrics pages, as scraped


@pytest.fixture(scope="module")
def ingress(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ingress]:
    tmp = tmp_path_factory.mktemp("auth")
    receiver = Receiver(tmp / "traces").start()
    server = TritonServer(
        MODELS,
        model_control="explicit",
        load_models=[MODEL],
        trace_url=receiver.traces_url,
        trace_rate=1,
        log_path=tmp / "triton.log",
    ).start()
    issuer, stranger = Issuer("site-key"), Issuer("site-key")  # same kid, another key
    jwks = tmp / "jwks.json"
    jwks.write_text(json.dumps(issuer.jwks()))
    record = ServerRecord("triton", http=server.http_url, grpc=server.grpc_url)
    ways = {
        "jwt": (
            Auth(jwks_file=str(jwks), issuer=ISSUER, audiences=(AUDIENCE,)),
            issuer.token(),
            {
                "missing": ("", 401),
                "forged": (stranger.token(), 401),
                "expired": (issuer.token(expires_in_s=-120), 401),
                "another issuer": (issuer.token(issuer="https://elsewhere.example"), 401),
                # a valid token for another service: authenticated, not allowed here
                "another audience": (issuer.token(aud="another-service"), 403),
                "not a JWT": (STATIC, 401),
            },
        ),
        "static": (
            Auth(tokens=(STATIC,)),
            STATIC,
            {
                "missing": ("", 401),
                "unknown": (STATIC[:-1] + "X", 401),
                "a JWT": (issuer.token(), 401),
            },
        ),
    }
    gates: dict[str, Gate] = {}
    try:
        for way, (auth, good, bad) in ways.items():
            eds = tmp / f"eds-{way}"
            eds.mkdir()
            for protocol in ("http", "grpc"):
                cluster = f"otelkit_{protocol}"
                response, _ = eds_response(cluster, protocol, {"triton": record})
                write_if_changed(eds / f"{cluster}.json", response)
            envoy, ports = loopback_envoy(
                tmp,
                eds,
                f"envoy-{way}",
                traces_url=receiver.traces_url,
                sample_percent=100,  # Envoy traces every call, the refused ones too
                trace_flush_ms=200,
                auth=auth,
            )
            envoy.start()
            gates[way] = Gate(
                way,
                envoy,
                f"127.0.0.1:{ports['http']}",
                f"127.0.0.1:{ports['grpc']}",
                good,
                bad,
            )
        wait_until(lambda: all(map(_healthy, gates.values())), 15, "the server healthy in Envoy")
        yield Ingress(server, receiver, gates, [tmp], [])
    finally:
        for gate in gates.values():
            gate.envoy.stop()
        server.stop()
        receiver.stop()


def _healthy(gate: Gate) -> bool:
    hosts = envoy_hosts(gate.envoy.admin_url)
    return all(c["healthy"] for c in hosts.get("triton", {}).values()) and bool(hosts)


def served(server: TritonServer) -> float:
    """Requests the server has answered or failed so far: a refused call adds none."""
    with urllib.request.urlopen(server.metrics_url, timeout=5) as page:
        text = page.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("nv_inference_request_success{", "nv_inference_request_failure{")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def call(gate: Gate, protocol: str, token: str) -> None:
    """One inference through the gate, with ``token`` as tritonclient sends it."""
    module: Any = grpcclient if protocol == "grpc" else httpclient
    url = gate.grpc_url if protocol == "grpc" else gate.http_url
    client = otelkit.instrument(module.InferenceServerClient(url))
    tensor = module.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    headers = {"authorization": f"Bearer {token}"} if token else None
    try:
        client.infer(MODEL, [tensor], headers=headers)
    finally:
        client.close()


def client_errors(page_url: str, protocol: str) -> float:
    """The client's failed calls so far over ``protocol``, from its own Prometheus page."""
    with urllib.request.urlopen(page_url, timeout=5) as page:
        text = page.read().decode()
    name = semconv.prometheus_name(semconv.CLIENT_ERRORS) + "{"
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and f'{semconv.M_PROTOCOL}="{protocol}"' in line
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("way", ["jwt", "static"])
def test_a_call_without_a_valid_token_is_refused_before_any_server(
    ingress: Ingress, way: str, protocol: str, tmp_path: Path
) -> None:
    gate = ingress.gates[way]
    telemetry = otelkit.configure(
        service_name=f"auth-{way}",
        traces_dir=str(tmp_path),
        sampler="always_on",
        metrics_exporter="prometheus",
        prometheus_port=0,
        prometheus_host="127.0.0.1",
    )
    ingress.written.append(tmp_path)
    assert telemetry.prometheus_url is not None
    try:
        before, errors = served(ingress.server), client_errors(telemetry.prometheus_url, protocol)
        for why, (token, status) in gate.bad.items():
            with pytest.raises(InferenceServerException) as refused:
                call(gate, protocol, token)
            if protocol == "grpc":  # gRPC's own mapping of the HTTP status
                code = {
                    401: grpc.StatusCode.UNAUTHENTICATED,
                    403: grpc.StatusCode.PERMISSION_DENIED,
                }
                assert refused.value.status() == str(code[status]), why
            else:
                assert refused.value.status() == str(status), why
        assert served(ingress.server) == before  # none reached the server
        counted = client_errors(telemetry.prometheus_url, protocol) - errors
        assert counted == len(gate.bad)
        call(gate, protocol, gate.good)  # and the site's token is served
        # The Python backend sends its answer before its execute() returns and the server counts
        # the request only after that: the count may trail the answer the client already has.
        now = wait_until(lambda: (n := served(ingress.server)) > before and n, 10, "the count")
        assert now == before + 1  # the good call alone: no refused call was counted on the way
        ingress.pages.append(urllib.request.urlopen(telemetry.prometheus_url).read().decode())
        otelkit.flush()
    finally:
        otelkit.shutdown()
    spans = [s for s in load_spans(tmp_path) if s.kind == SpanKind.CLIENT]
    failed = [s for s in spans if s.status_code == StatusCode.ERROR]
    assert len(failed) == len(gate.bad) and len(spans) == len(gate.bad) + 1
    statuses = sorted(str(s.attributes.get("error.type")) for s in failed)
    wanted = {401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED"} if protocol == "grpc" else {}
    assert statuses == sorted(wanted.get(c, str(c)) for _, c in gate.bad.values())


def marker_call(gate: Gate) -> str:
    """A call through the gate with the site's token and a sampled context; its trace id."""
    trace_id = token_hex(16)
    client = httpclient.InferenceServerClient(gate.http_url)
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    headers = {
        "authorization": f"Bearer {gate.good}",
        "traceparent": f"00-{trace_id}-{token_hex(8)}-01",
    }
    try:
        client.infer(MODEL, [tensor], headers=headers)
    finally:
        client.close()
    return trace_id


def test_no_token_is_written_anywhere(ingress: Ingress) -> None:
    """After every call above, the tokens are in no file the run wrote (the traces of the
    client, Envoy and Triton, Envoy's and Triton's logs) and in none of the metrics pages."""
    spans = ReceiverCapture(ingress.receiver)
    for gate in ingress.gates.values():
        call(gate, "http", gate.good)
        call(gate, "grpc", gate.good)
    # The markers: a sampled call through each gate after those, whose spans from Envoy and
    # Triton arrive after anything those calls had them export
    markers = [marker_call(gate) for gate in ingress.gates.values()]

    def marked() -> bool:
        arrived = spans.spans()
        return all(
            {"envoy", "triton-inference-server"}
            <= {str(s.resource.get("service.name")) for s in arrived if s.trace_id == marker}
            for marker in markers
        )

    wait_until(marked, 15, "each marker's spans from Envoy and Triton")
    secrets = {gate.good for gate in ingress.gates.values()}
    secrets |= {t for gate in ingress.gates.values() for t, _ in gate.bad.values() if t}
    secrets = {s.split(".")[-1] for s in secrets}  # a JWT's signature is its own part
    pages = [*ingress.pages, *(gate.envoy.stats() for gate in ingress.gates.values())]
    with urllib.request.urlopen(ingress.server.metrics_url, timeout=5) as page:
        pages.append(page.read().decode())
    files = [p for folder in ingress.written for p in folder.rglob("*") if p.is_file()]
    assert any(p.name.startswith("envoy-") and p.suffix == ".log" for p in files)
    checked = [p for p in files if not p.name.startswith(("envoy-jwt.json", "envoy-static.json"))]
    for path in checked:
        text = path.read_text(errors="replace")
        leaked = [s for s in secrets if s in text]
        assert not leaked, f"a token in {path}"
    for text in pages:
        assert not [s for s in secrets if s in text]
    # the search finds a token where one is: in the static list's configuration, a secret
    assert STATIC in next(p for p in files if p.name == "envoy-static.json").read_text()
    # and it read Envoy's spans and Triton's among the files
    services = {s.resource.get("service.name") for s in load_spans(ingress.receiver.out_dir)}
    assert {"envoy", "triton-inference-server"} <= services, services


def test_a_bad_setting_is_refused_with_the_reason(tmp_path: Path) -> None:
    empty = tmp_path / "jwks.json"
    empty.write_text('{"keys": []}')
    cases = {
        "one of the two": Auth(),
        "holds no keys": Auth(jwks_file=str(empty), issuer=ISSUER),
        "issuer": Auth(jwks_file=str(empty)),
        "16 to 512": Auth(tokens=("short",)),
        "16 to 512 letters": Auth(tokens=('quote"-in-a-token-here',)),
    }
    from otelkit._errors import FleetError

    for reason, auth in cases.items():
        with pytest.raises(FleetError, match=reason):
            envoy_config(http_port=1, grpc_port=2, admin_port=3, eds_dir=tmp_path, auth=auth)
