"""Write the chart's Envoy configurations (``otelkit-fleet/files/envoy*.json``) as
``otelkit fleet envoy-config`` makes them, with the names the chart fills in at install
(``AGENT``, ``ISSUER``, ``AUDIENCE``) in place of a release's. ``tests/deploy/test_chart.py``
checks that the files are what this writes today.

    python charts/render_envoy.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from otelkit.fleet._auth import Auth
from otelkit.fleet._envoy import envoy_config

HERE = Path(__file__).resolve().parent / "otelkit-fleet" / "files"
EDS = "/etc/otelkit/eds"
JWKS = "/etc/otelkit/auth/jwks.json"
AGENT = "otelkit-agent-host"  # the chart puts the release's agent Service here
ISSUER = "https://otelkit-issuer.invalid"  # and the site's issuer here
AUDIENCE = "otelkit-audience"  # and its audience here


def configurations() -> dict[str, dict[str, Any]]:
    """``{file name: configuration}``: without and with JWT authentication."""
    common: dict[str, Any] = {
        "http_port": 8000,
        "grpc_port": 8001,
        "admin_port": 9901,
        "admin_host": "0.0.0.0",  # the pod's: Prometheus scrapes /stats/prometheus
        "eds_dir": EDS,
        "traces_url": f"http://{AGENT}:4318/v1/traces",
    }
    with tempfile.TemporaryDirectory() as work:
        keys = Path(work) / "jwks.json"
        keys.write_text(json.dumps({"keys": [{"kty": "RSA", "n": "AQAB", "e": "AQAB"}]}))
        auth = Auth(jwks_file=str(keys), issuer=ISSUER, audiences=(AUDIENCE,))
        with_jwt = json.loads(
            json.dumps(envoy_config(**common, auth=auth)).replace(str(keys), JWKS)
        )
    return {"envoy.json": envoy_config(**common), "envoy-jwt.json": with_jwt}


def main() -> int:
    for name, config in configurations().items():
        (HERE / name).write_text(json.dumps(config, indent=1) + "\n")
        print(HERE / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
