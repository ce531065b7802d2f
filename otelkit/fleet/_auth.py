"""Who may call the fleet: a bearer token on every request, checked by Envoy before anything else.

Two ways a site issues tokens:

- **JWT** (``Auth(jwks_file=..., issuer=...)``): the site's identity provider signs tokens, and
  Envoy's ``jwt_authn`` filter checks each one against the provider's public keys (a JWKS file on
  the balancer's node): signature, issuer, audiences, expiry. Keys rotate by replacing the file
  and restarting Envoy;
- **static tokens** (``Auth(tokens=...)``), for a small site: a Lua filter compares the token with
  a list written into Envoy's configuration (which then is a secret: ``write_config`` makes it
  readable by its owner only).

Either way a call without a valid token is answered 401 (gRPC clients read it as
``UNAUTHENTICATED``) and never reaches a server; the token is taken off every request Envoy
forwards, so no server, log, span or metric behind Envoy sees it. Clients send it as tritonclient
does, ``headers={"authorization": "Bearer <token>"}``; ``otelkit.instrument`` passes headers on
untouched and records none of them.

>>> [f["name"] for f in auth_filters(Auth(tokens=("s3cr3t-token-of-site-a",)))]
['envoy.filters.http.lua']
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otelkit._errors import FleetError

__all__ = ["Auth", "auth_filters", "read_tokens"]

_TYPE = "type.googleapis.com/envoy.extensions.filters.http"
_JWT = f"{_TYPE}.jwt_authn.v3.JwtAuthentication"
_LUA = f"{_TYPE}.lua.v3.Lua"
# a token goes into Lua source as a string: only characters that need no escaping, and long
# enough not to be guessed
_TOKEN = re.compile(r"^[A-Za-z0-9._~+/=-]{16,512}$")
PROVIDER = "otelkit"


@dataclass(frozen=True)
class Auth:
    """The tokens Envoy accepts: JWTs checked against ``jwks_file`` (the public keys of the
    site's ``issuer``; ``audiences`` when the site sets them), or the static ``tokens``."""

    jwks_file: str | None = None
    issuer: str | None = None
    audiences: tuple[str, ...] = ()
    tokens: tuple[str, ...] = ()

    def problems(self) -> list[str]:
        """What is wrong with this setting, in words; empty when Envoy can be given it."""
        if bool(self.jwks_file) == bool(self.tokens):
            return ["give a JWKS file (JWTs) or static tokens, one of the two"]
        if self.tokens:
            bad = [t for t in self.tokens if not _TOKEN.match(t)]
            if bad:
                return [f"{len(bad)} static token(s) not 16 to 512 letters, digits and ._~+/=-"]
            return []
        found = []
        if not self.issuer:
            found.append("a JWT needs the issuer it must carry (iss)")
        try:
            keys = json.loads(Path(self.jwks_file or "").read_text()).get("keys")
        except (OSError, ValueError, AttributeError) as error:
            return [*found, f"JWKS file {self.jwks_file}: {error}"]
        if not isinstance(keys, list) or not keys:
            found.append(f"JWKS file {self.jwks_file} holds no keys")
        return found


def read_tokens(path: str | Path) -> tuple[str, ...]:
    """The static tokens of a file, one a line (blank lines and ``#`` comments left out)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as error:
        raise FleetError(f"cannot read the tokens file {path}: {error.strerror}") from None
    return tuple(s for line in lines if (s := line.strip()) and not s.startswith("#"))


def _jwt(auth: Auth) -> dict[str, Any]:
    provider: dict[str, Any] = {
        "issuer": auth.issuer,
        "local_jwks": {"filename": str(Path(auth.jwks_file or "").resolve())},
        # the header only (not the access_token query parameter, which lands in access logs),
        # and taken off before the request goes on (forward: false)
        "from_headers": [{"name": "authorization", "value_prefix": "Bearer "}],
        "forward": False,
    }
    if auth.audiences:
        provider["audiences"] = list(auth.audiences)
    return {
        "name": "envoy.filters.http.jwt_authn",
        "typed_config": {
            "@type": _JWT,
            "providers": {PROVIDER: provider},
            "rules": [{"match": {"prefix": "/"}, "requires": {"provider_name": PROVIDER}}],
        },
    }


def _static(tokens: Sequence[str]) -> dict[str, Any]:
    table = ", ".join(f'["{token}"] = true' for token in sorted(set(tokens)))
    source = f"""local allowed = {{ {table} }}
function envoy_on_request(handle)
  local headers = handle:headers()
  local value = headers:get("authorization")
  local token = value and string.match(value, "^Bearer%s+(%S+)%s*$")
  if token == nil or not allowed[token] then
    handle:respond({{[":status"] = "401", ["www-authenticate"] = "Bearer"}}, "unauthenticated")
    return
  end
  headers:remove("authorization")
end
"""
    return {
        "name": "envoy.filters.http.lua",
        "typed_config": {"@type": _LUA, "default_source_code": {"inline_string": source}},
    }


def auth_filters(auth: Auth) -> list[dict[str, Any]]:
    """The HTTP filter that checks ``auth``'s tokens, to go first on each listener;
    ``FleetError`` naming what is wrong with ``auth``."""
    problems = auth.problems()
    if problems:
        raise FleetError(f"authentication: {'; '.join(problems)}")
    return [_static(auth.tokens)] if auth.tokens else [_jwt(auth)]
