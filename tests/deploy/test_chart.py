"""The fleet's Helm chart (charts/otelkit-fleet), checked without a Kubernetes cluster: real
``helm lint`` and ``helm template`` for every site's values, every rendered manifest against
the Kubernetes schemas (KEDA's ``ScaledObject`` against KEDA's), and the Envoy configuration the
chart renders through ``envoy --mode validate``. The preStop hook runs against a real server in
tests/fleet/test_prestop.py; the KEDA query returns data from a real Prometheus in
tests/fleet/test_slurm.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.keda.v1alpha1 import ScaledObject

from otelkit.fleet import envoy_binary, write_config
from otelkit.fleet._render import eds_response, write_if_changed
from tests.paths import ROOT
from tests.support import require_binary

CHART = ROOT / "charts" / "otelkit-fleet"
VALUES = sorted(p.name for p in CHART.glob("values*.yaml"))
KUBERNETES = "1.30"  # the oldest release the chart's manifests must fit


def helm() -> str:
    beside = Path(sys.executable).parent / "helm"
    return str(beside) if beside.exists() else require_binary("helm")


def rendered(values: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [helm(), "template", "site", str(CHART), "-f", str(CHART / values)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.mark.parametrize("values", VALUES)
def test_the_chart_lints_for_every_sites_values(values: str) -> None:
    done = subprocess.run(
        [helm(), "lint", str(CHART), "-f", str(CHART / values)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "0 chart(s) failed" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("values", VALUES)
def test_every_rendered_manifest_is_valid_against_its_schema(values: str) -> None:
    documents = rendered(values)
    kinds = sorted({d["kind"] for d in documents})
    assert {"Deployment", "ConfigMap", "Service"} <= set(kinds), kinds
    for document in documents:
        if document["kind"] == "ScaledObject":
            ScaledObject.model_validate(document)
            continue
        kubernetes_validate.validate(document, KUBERNETES, strict=True)


def test_each_sites_choices_reach_the_manifests() -> None:
    small = {d["kind"] + "/" + d["metadata"]["name"]: d for d in rendered("values-small.yaml")}
    large = {d["kind"] + "/" + d["metadata"]["name"]: d for d in rendered("values-large.yaml")}
    assert small["ScaledObject/site-fleet-triton"]["spec"]["maxReplicaCount"] == 2
    trigger = small["ScaledObject/site-fleet-triton"]["spec"]["triggers"][0]["metadata"]
    assert trigger["threshold"] == "20"
    assert "Secret/site-fleet-auth" in small and "Secret/site-fleet-auth" not in large
    assert "StatefulSet/site-fleet-etcd" in small and "StatefulSet/site-fleet-etcd" not in large
    serve = large["Deployment/site-fleet-triton"]["spec"]["template"]["spec"]["containers"][0]
    assert serve["command"][:5] == [
        "otelkit",
        "fleet",
        "serve",
        "--etcd",
        "http://etcd.fleet-registry.svc:2379",
    ]
    assert serve["lifecycle"]["preStop"]["exec"]["command"] == ["/bin/sh", "/etc/otelkit/drain.sh"]
    dashboards = [k for k in large if k.startswith("ConfigMap/site-fleet-dashboard-")]
    assert len(dashboards) == len(list((ROOT / "dashboards").glob("*.json")))


def test_the_charts_files_are_what_otelkit_writes_today() -> None:
    sys.path.insert(0, str(ROOT / "charts"))
    try:
        from render_envoy import configurations
    finally:
        sys.path.remove(str(ROOT / "charts"))
    for name, config in configurations().items():
        assert json.loads((CHART / "files" / name).read_text()) == config, (
            f"files/{name} is stale: python charts/render_envoy.py"
        )
    drain = (CHART / "files" / "drain.sh").read_text()
    assert (CHART / "templates" / "triton.yaml").read_text().count("files/drain.sh") == 1
    assert drain.startswith("#!/bin/sh")


@pytest.mark.parametrize("values", ["values.yaml", "values-small.yaml"])
def test_the_envoy_configuration_the_chart_renders_validates(values: str, tmp_path: Path) -> None:
    documents = {d["kind"] + "/" + d["metadata"]["name"]: d for d in rendered(values)}
    text = documents["ConfigMap/site-fleet-envoy"]["data"]["envoy.json"]
    config = json.loads(text)
    assert "otelkit-agent-host" not in text and "site-fleet-agent" in text
    secret = documents.get("Secret/site-fleet-auth")
    if secret is not None:  # the JWKS the chart mounts, where the configuration reads it
        assert "https://otelkit-issuer.invalid" not in text
        (tmp_path / "jwks.json").write_text(secret["stringData"]["jwks.json"])
    here = json.loads(
        json.dumps(config)
        .replace("/etc/otelkit/eds", str(tmp_path / "eds"))
        .replace("/etc/otelkit/auth/jwks.json", str(tmp_path / "jwks.json"))
    )
    (tmp_path / "eds").mkdir()
    for protocol in ("http", "grpc"):
        response, _ = eds_response(f"otelkit_{protocol}", protocol, {})
        write_if_changed(tmp_path / "eds" / f"otelkit_{protocol}.json", response)
    path = write_config(tmp_path / "envoy.json", here)
    binary = envoy_binary() or require_binary("envoy")
    done = subprocess.run(
        [binary, "--mode", "validate", "-c", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout[-1500:] + done.stderr[-1500:]


@pytest.mark.prometheus
@pytest.mark.parametrize("values", VALUES)
def test_the_keda_query_the_chart_renders_passes_promtool(values: str, tmp_path: Path) -> None:
    (scaled,) = [d for d in rendered(values) if d["kind"] == "ScaledObject"]
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    rules = {"groups": [{"name": "keda", "rules": [{"record": "keda:query", "expr": query}]}]}
    path = tmp_path / "keda.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    promtool = require_binary("promtool")
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
