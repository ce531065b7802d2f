"""The fleet telemetry stack (collector/): Prometheus rules, their unit tests, and the files of the
Collectors, Jaeger, Grafana and Compose, checked against each other and against otelkit.

``promtool`` checks the Prometheus configuration and rules and runs the rules' unit tests, and a
real Prometheus loads the configuration. No Collector, Jaeger or container engine runs here, so
their files are checked for what they say: every pipeline component defined and every defined
one used (also with the options marked ``#+`` switched on), well-formed ``${env:...}``
references, addresses that meet the service and port at the other end, and metric names that
otelkit (``semconv``) or Triton emit.
"""

from __future__ import annotations

import http.server
import json
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from otelkit import semconv
from otelkit.analysis import load_spans
from otelkit.testing import wait_until
from otelkit.tritonserver import free_port
from tests.paths import ROOT
from tests.support import require_binary

STACK = ROOT / "collector"
PROMETHEUS_DIR = STACK / "prometheus"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
RULES = PROMETHEUS_DIR / "rules" / "otelkit.rules.yml"
RULE_TESTS = PROMETHEUS_DIR / "tests" / "otelkit.rules.test.yml"
COMPOSE = STACK / "docker-compose.yml"
PROVISIONING = STACK / "grafana" / "provisioning"
DATASOURCES = PROVISIONING / "datasources" / "datasources.yaml"
DASHBOARD_PROVIDERS = PROVISIONING / "dashboards" / "dashboards.yaml"
README = STACK / "README.md"

AGENT, LB, SAMPLER = "otelcol-agent", "otelcol-gateway-lb", "otelcol-gateway"
COLLECTORS = (AGENT, LB, SAMPLER)  # service name == config file stem
JAEGER_CONFIGS = ("jaeger", "jaeger-opensearch")
SERVICES = {*COLLECTORS, "jaeger", "prometheus", "grafana"}
PUBLISHED = {  # (host port, container port) of each service: README.md's table
    AGENT: {(4317, 4317), (4318, 4318)},
    LB: {(14317, 4317)},
    SAMPLER: set(),
    "jaeger": {(16686, 16686)},
    "prometheus": {(9090, 9090)},
    "grafana": {(3000, 3000)},
}
# The node endpoints both the agent and Prometheus' direct jobs scrape, with their ports.
NODE_JOBS = {"triton": 8002, "otelkit": 9464, "gpu-exporter": 9400}
OPTION_MARK = re.compile(r"^(\s*)#\+ ", re.MULTILINE)  # "#+ " lines: an option, uncomment it
ENV_REFERENCE = re.compile(r"\$\{env:([A-Z][A-Z0-9_]*)(?::-([^}]*))?\}")
COMPOSE_VARIABLE = re.compile(r"\$\{(\w+)(?::?([-?])([^}]*))?\}")
PINNED_IMAGE = re.compile(r"^[a-z0-9-]+/[a-z0-9-]+:(?!latest$)[\w.-]+$")


# -- reading the files ---------------------------------------------------------------------------


def load_yaml(path: Path, text: str | None = None) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text() if text is None else text)
    assert isinstance(data, dict), f"{path}: not a mapping"
    return data


def with_options(path: Path) -> str:
    """The file's text with the ``#+`` option lines uncommented."""
    return OPTION_MARK.sub(r"\1", path.read_text())


def resolve_env(value: Any, env: dict[str, str] | None = None) -> Any:
    """A Collector config's ``${env:NAME:-default}`` resolved (from ``env``, else its default),
    in depth; a whole-value reference is typed as YAML, the way the Collector reads it."""
    env = env or {}
    if isinstance(value, str):
        whole = ENV_REFERENCE.fullmatch(value)
        text = ENV_REFERENCE.sub(lambda m: env.get(m[1], m[2] or ""), value).replace("$$", "$")
        return yaml.safe_load(text) if whole and text else text
    if isinstance(value, dict):
        return {key: resolve_env(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [resolve_env(item, env) for item in value]
    return value


def interpolate(value: Any) -> Any:
    """Compose's ``${VAR:-default}`` as its default, ``${VAR:?error}`` as ``<VAR>``, in depth."""
    if isinstance(value, str):
        return COMPOSE_VARIABLE.sub(
            lambda m: m[3] if m[2] == "-" else f"<{m[1]}>" if m[2] == "?" else "", value
        )
    if isinstance(value, dict):
        return {key: interpolate(item) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item) for item in value]
    return value


def config_path(name: str) -> Path:
    return STACK / f"{name}.yaml"


def collector_config(name: str) -> dict[str, Any]:
    """A Collector or Jaeger config with every ``${env:...}`` at its default."""
    config: dict[str, Any] = resolve_env(load_yaml(config_path(name)))
    return config


def compose_services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = interpolate(load_yaml(COMPOSE))["services"]
    return services


def address(text: str) -> tuple[str, int]:
    """``(host, port)`` of ``host:port`` or of a URL."""
    split = urlsplit(text if "//" in text else f"//{text}")
    assert split.hostname is not None and split.port is not None, text
    return split.hostname, split.port


def _port_range(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def published_ports(service: dict[str, Any]) -> set[tuple[int, int]]:
    """``(host port, container port)`` of each published port."""
    mappings = set()
    for spec in service.get("ports", []):
        parts = str(spec).split("/")[0].split(":")
        container = _port_range(parts[-1])
        host = _port_range(parts[-2]) if len(parts) > 1 else container
        mappings |= set(zip(host, container, strict=True))
    return mappings


def container_ports(service: dict[str, Any]) -> set[int]:
    """Ports the service listens on inside the network: published or exposed."""
    exposed = {port for spec in service.get("expose", []) for port in _port_range(str(spec))}
    return exposed | {container for _, container in published_ports(service)}


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> the repository path bound there."""
    mounts = {}
    for spec in service.get("volumes", []):
        source, target = str(spec).split(":")[:2]
        if source.startswith((".", "/")):
            mounts[target] = (STACK / source).resolve()
    return mounts


def host_path(service: dict[str, Any], path: str) -> Path:
    """Where a path inside the service's container lies in this repository."""
    for target, source in bind_mounts(service).items():
        if path == target or path.startswith(target.rstrip("/") + "/"):
            return source / path[len(target) :].lstrip("/")
    raise AssertionError(f"{path} is in no bind mount of the service")


def config_flag(service: dict[str, Any], flag: str) -> str:
    arguments: list[str] = service["command"]
    [value] = [arg.partition("=")[2] for arg in arguments if arg.startswith(f"{flag}=")]
    return value


# -- PromQL: the names an expression reads ------------------------------------------------------

_PROMQL_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_PROMQL_GROUPING = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", re.IGNORECASE
)
# the whole identifier (no backtracking into "rat" of "rate("), not followed by "("
_PROMQL_IDENTIFIER = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()")
_PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "start", "end"}


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """``(metric names, grouping labels)`` of a PromQL expression: identifiers that are not
    functions (followed by ``(``), keywords, label matchers, strings, durations or numbers."""
    text = _PROMQL_STRING.sub('""', expr)
    labels = {
        label.strip()
        for group in _PROMQL_GROUPING.findall(text)
        for label in group.split(",")
        if label.strip()
    }
    text = _PROMQL_GROUPING.sub(" ", text)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)  # matchers, ranges, subqueries
    names = {
        name for name in _PROMQL_IDENTIFIER.findall(text) if name.lower() not in _PROMQL_KEYWORDS
    }
    return names, labels


def emitted_names() -> set[str]:
    """Every sample name otelkit and Triton put on a Prometheus endpoint, and ``up``."""
    names = {*semconv.TRITON_METRICS, *semconv.ENVOY_METRICS, "up"}
    for spec in (*semconv.METRICS, *semconv.FLEET_METRICS):
        base = semconv.prometheus_name(spec)
        suffixes = ("_bucket", "_sum", "_count") if spec.kind == "histogram" else ("",)
        names.update(f"{base}{suffix}" for suffix in suffixes)
    return names


def rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(RULES)["groups"] for rule in group["rules"]]


def rule_tests() -> list[dict[str, Any]]:
    tests: list[dict[str, Any]] = load_yaml(RULE_TESTS)["tests"]
    return tests


@pytest.mark.parametrize(
    ("expr", "names", "labels"),
    [
        (
            'histogram_quantile(0.95, sum by (le, model) (rate(a_bucket{job="x",le!="1"}[5m])))',
            {"a_bucket"},
            {"le", "model"},
        ),
        (
            "sum(rate(b[5m] offset 1h)) by (stage) / clamp_min(c:d:rate5m, 1e-9) / 1e6 > bool 0",
            {"b", "c:d:rate5m"},
            {"stage"},
        ),
        (
            'x or on(model) y * 0 unless z{m=~"rate(q)"} and max_over_time(w[10m:1m])',
            {"x", "y", "z", "w"},
            {"model"},
        ),
    ],
)
def test_promql_names_finds_metrics_and_grouping_labels(
    expr: str, names: set[str], labels: set[str]
) -> None:
    assert promql_names(expr) == (names, labels)


# -- (a, b, c) promtool ---------------------------------------------------------------------------


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    binary = require_binary("promtool")
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True, cwd=ROOT)


@pytest.mark.prometheus
def test_promtool_accepts_the_prometheus_config_and_finds_the_rules() -> None:
    result = promtool("check", "config", PROMETHEUS_CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout  # rule_files resolve to the rules
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


@pytest.mark.prometheus
def test_promtool_accepts_the_rules() -> None:
    result = promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.prometheus
def test_promtool_passes_the_rules_unit_tests() -> None:
    result = promtool("test", "rules", RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.prometheus
@pytest.mark.parametrize(
    ("original", "changed"),
    [
        ("per_execution_5m > 50", "per_execution_5m > 100"),  # an alert's threshold
        (
            "histogram_quantile(0.95, sum by (le, model)",
            "histogram_quantile(0.9, sum by (le, model)",
        ),
        ('summary: "Triton model {{ $labels.model }} is saturated"', 'summary: "saturated"'),
    ],
)
def test_the_unit_tests_notice_a_changed_rule(tmp_path: Path, original: str, changed: str) -> None:
    text = RULES.read_text()
    assert text.count(original) == 1, original
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "rules" / RULES.name).write_text(text.replace(original, changed))
    shutil.copy(RULE_TESTS, tmp_path / "tests" / RULE_TESTS.name)
    result = promtool("test", "rules", tmp_path / "tests" / RULE_TESTS.name)
    assert result.returncode == 1, result.stdout + result.stderr


# -- (d) every rule has unit tests, (e) every name exists ------------------------------------------


def test_every_recording_rule_and_alert_is_unit_tested() -> None:
    records = {rule["record"] for rule in rules() if "record" in rule}
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    tested_records: set[str] = set()
    fired: set[str] = set()
    quiet: set[str] = set()
    for test in rule_tests():
        for case in test.get("promql_expr_test", []):
            tested_records |= promql_names(case["expr"])[0] & records
        for case in test.get("alert_rule_test", []):
            assert case["alertname"] in alerts, f"a test of an unknown alert: {case['alertname']}"
            (fired if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert records - tested_records == set(), "recording rules without a test"
    assert alerts - fired == set(), "alerts never tested firing"
    assert alerts - quiet == set(), "alerts never tested not firing"


def test_every_alert_has_a_severity_and_names_what_it_is_about() -> None:
    for rule in (r for r in rules() if "alert" in r):
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description"}, rule["alert"]
        summary = rule["annotations"]["summary"]
        about = r"\$labels\.(model|instance|gpu|envoy_cluster_name|envoy_endpoint_hostname)\b"
        assert re.search(about, summary) or summary.startswith("The fleet "), rule["alert"]


def test_rules_read_only_metrics_that_otelkit_or_triton_emit() -> None:
    records = {rule["record"] for rule in rules() if "record" in rule}
    known = emitted_names() | records
    grouping = {
        "le",
        semconv.M_MODEL,
        semconv.M_STAGE,
        semconv.TRITON_MODEL,
        semconv.FLEET_SERVER_LABEL,
        semconv.ENVOY_CLUSTER,
        semconv.ENVOY_HOSTNAME,
    }
    for rule in rules():
        names, labels = promql_names(rule["expr"])
        name = rule.get("record") or rule["alert"]
        assert names, f"{name}: no metric found in {rule['expr']}"
        assert names <= known, f"{name} reads unknown metrics: {sorted(names - known)}"
        assert labels <= grouping, f"{name} groups by unknown labels: {sorted(labels - grouping)}"


def test_recording_rules_are_named_level_metric_operations() -> None:
    for rule in (r for r in rules() if "record" in r):
        level, metric, operations = rule["record"].split(":")
        labels = promql_names(rule["expr"])[1] - {"le"}
        # the labels it keeps, joined by "_"; "fleet" when summed over every server
        assert level == ("_".join(sorted(labels)) or "fleet"), rule["record"]
        assert re.fullmatch(r"(nv|otelkit)_[a-z_]+", metric), rule["record"]
        assert re.fullmatch(r"(p\d\d_|ratio_rate|rate|mean_|per_execution_)5m", operations)


# -- (f) the Collectors and Jaeger ----------------------------------------------------------------

STACK_CONFIGS = (*COLLECTORS, *JAEGER_CONFIGS)


def components_check(config: dict[str, Any]) -> None:
    service = config["service"]
    pipelines = service["pipelines"]
    for kind in ("receivers", "processors", "exporters"):
        used = {name for pipeline in pipelines.values() for name in pipeline.get(kind, [])}
        defined = set(config.get(kind) or {})
        assert used <= defined, f"{kind} used but not defined: {used - defined}"
        assert defined <= used, f"{kind} defined but in no pipeline: {defined - used}"
    extensions = set(config.get("extensions") or {})
    assert set(service.get("extensions", [])) == extensions, "extensions defined != enabled"
    text = json.dumps(config)
    for authenticator in re.findall(r'"authenticator": "([^"]+)"', text):
        assert authenticator in extensions, f"authenticator {authenticator} is not an extension"


@pytest.mark.parametrize("name", STACK_CONFIGS)
@pytest.mark.parametrize("options", [False, True], ids=["as-written", "options-on"])
def test_pipelines_use_exactly_the_defined_components(name: str, options: bool) -> None:
    path = config_path(name)
    text = with_options(path) if options else path.read_text()
    components_check(load_yaml(path, text))


@pytest.mark.parametrize("name", STACK_CONFIGS)
def test_environment_references_are_well_formed(name: str) -> None:
    text = with_options(config_path(name))
    for line_number, line in enumerate(text.splitlines(), 1):
        rest = ENV_REFERENCE.sub("", line).replace("$$", "")
        assert "$" not in rest, f"{name}.yaml:{line_number}: a stray $ (write $$): {line}"
        for _, default in ENV_REFERENCE.findall(line):
            assert "{" not in default and "$" not in default, f"{name}.yaml:{line_number}"


@pytest.mark.parametrize("name", COLLECTORS)
def test_memory_limiter_comes_first_and_batch_last(name: str) -> None:
    for pipeline, steps in collector_config(name)["service"]["pipelines"].items():
        assert steps["processors"][0] == "memory_limiter", f"{name} {pipeline}"
        assert steps["processors"][-1] == "batch", f"{name} {pipeline}"


def test_collector_pipelines() -> None:
    """What flows where, in the order the processors run."""
    pipelines = {name: collector_config(name)["service"]["pipelines"] for name in COLLECTORS}
    first, last = "memory_limiter", "batch"
    assert pipelines == {
        AGENT: {
            "traces": {
                "receivers": ["otlp"],
                "processors": [first, "resourcedetection", last],
                "exporters": ["otlp/gateway"],
            },
            "metrics": {
                "receivers": ["otlp", "prometheus"],
                "processors": [first, "resourcedetection", last],
                "exporters": ["otlp/gateway"],
            },
        },
        LB: {
            "traces": {
                "receivers": ["otlp"],
                "processors": [first, last],
                "exporters": ["loadbalancing"],
            },
            "metrics": {
                "receivers": ["otlp"],
                "processors": [first, "resource/drop-process", last],
                "exporters": ["prometheus"],
            },
        },
        SAMPLER: {
            "traces": {
                "receivers": ["otlp"],
                "processors": [first, "tail_sampling", last],
                "exporters": ["otlp/jaeger", "file/traces"],
            },
            "metrics": {
                "receivers": ["otlp"],
                "processors": [first, "resource/drop-process", last],
                "exporters": ["prometheus"],
            },
        },
    }


def test_sampler_writes_rotated_otlp_json_that_otelkit_reads(tmp_path: Path) -> None:
    """The gateway's file exporter: OTLP JSON lines, rotated, where ``otelkit report`` and
    ``otelkit breakdown`` read them (a directory of ``*.jsonl``, backups sorting first)."""
    raw = load_yaml(config_path(SAMPLER))["exporters"]["file/traces"]
    exporter = resolve_env(raw)
    assert exporter == {
        "path": "/var/lib/otelcol/traces/traces.jsonl",
        "format": "json",
        "rotation": {"max_megabytes": 256, "max_backups": 20, "max_days": 7, "localtime": False},
    }
    changed = resolve_env(
        raw,
        {"OTELKIT_TRACES_FILE": "/data/t.jsonl", "OTELKIT_TRACES_FILE_MB": "64"},
    )
    assert (changed["path"], changed["rotation"]["max_megabytes"]) == ("/data/t.jsonl", 64)
    # as the exporter names a rotated file (lumberjack: <name>-<UTC time>.<ext>) and the current
    span = {
        "traceId": "ab" * 16,
        "spanId": "cd" * 8,
        "name": "infer",
        "kind": 3,
        "startTimeUnixNano": "1",
        "endTimeUnixNano": "2",
    }
    for name, span_id in (
        ("traces-2026-11-26T05-00-00.000.jsonl", "01" * 8),
        ("traces.jsonl", "02" * 8),
    ):
        doc = {"resourceSpans": [{"scopeSpans": [{"spans": [{**span, "spanId": span_id}]}]}]}
        (tmp_path / name).write_text(json.dumps(doc) + "\n")
    assert [s.span_id for s in load_spans(tmp_path)] == ["01" * 8, "02" * 8]


def test_agent_scrapes_the_node_endpoints_named_in_its_environment() -> None:
    raw = load_yaml(config_path(AGENT))["receivers"]["prometheus"]["config"]["scrape_configs"]
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in raw}
    assert targets == {
        "triton": ["${env:TRITON_METRICS_TARGET:-localhost:8002}"],
        "otelkit": ["${env:OTELKIT_METRICS_TARGET:-localhost:9464}"],
        "gpu-exporter": ["${env:OTELKIT_GPU_EXPORTER_TARGET:-localhost:9400}"],
    }
    defaults = {job: address(resolve_env(t[0]))[1] for job, t in targets.items()}
    assert defaults == NODE_JOBS
    detection = collector_config(AGENT)["processors"]["resourcedetection"]
    assert (detection["detectors"], detection["override"]) == (["env", "system"], False)


@pytest.mark.parametrize("tls_on", [False, True])
def test_agent_sends_to_the_load_balancer_with_tls_from_its_environment(tls_on: bool) -> None:
    env = {"OTELKIT_GATEWAY_INSECURE": "false", "OTELKIT_GATEWAY_CA_FILE": "/ca.pem"}
    config = resolve_env(load_yaml(config_path(AGENT)), env if tls_on else {})
    exporter = config["exporters"]["otlp/gateway"]
    assert address(exporter["endpoint"]) == (LB, 4317)
    expected = {"insecure": not tls_on, "ca_file": "/ca.pem" if tls_on else ""}
    assert exporter["tls"] == {**expected, "cert_file": "", "key_file": ""}
    services = compose_services()
    assert 4317 in container_ports(services[LB])
    assert services[AGENT]["environment"]["OTELKIT_GATEWAY_ENDPOINT"] == exporter["endpoint"]


def test_load_balancer_routes_spans_by_trace_id_to_every_sampler() -> None:
    exporter = collector_config(LB)["exporters"]["loadbalancing"]
    assert exporter["routing_key"] == "traceID"
    assert list(exporter["resolver"]) == ["dns"]  # one resolver only
    dns = exporter["resolver"]["dns"]
    sampler_grpc = collector_config(SAMPLER)["receivers"]["otlp"]["protocols"]["grpc"]
    assert (dns["hostname"], int(dns["port"])) == (SAMPLER, address(sampler_grpc["endpoint"])[1])
    services = compose_services()
    assert services[LB]["environment"]["OTELKIT_SAMPLER_HOSTNAME"] == SAMPLER
    assert int(services[SAMPLER]["deploy"]["replicas"]) >= 2  # the routing matters


def test_tail_sampling_keeps_errors_slow_traces_and_a_share_of_the_rest() -> None:
    raw = load_yaml(config_path(SAMPLER))["processors"]["tail_sampling"]
    assert resolve_env(raw) == {
        "decision_wait": "10s",
        "num_traces": 100000,
        "expected_new_traces_per_sec": 1000,
        "policies": [
            {"name": "errors", "type": "status_code", "status_code": {"status_codes": ["ERROR"]}},
            {"name": "slow", "type": "latency", "latency": {"threshold_ms": 500}},
            {
                "name": "baseline",
                "type": "probabilistic",
                "probabilistic": {"sampling_percentage": 10},
            },
        ],
    }
    # Compose passes the same knobs through, with the same defaults.
    compose_env = compose_services()[SAMPLER]["environment"]
    for name, default in ENV_REFERENCE.findall(json.dumps(raw)):
        assert compose_env[name] == default, name


def test_gateways_export_metrics_with_exemplars_and_resource_labels() -> None:
    for name in (LB, SAMPLER):
        exporter = collector_config(name)["exporters"]["prometheus"]
        assert exporter["enable_open_metrics"] is True, name
        assert exporter["resource_to_telemetry_conversion"] == {"enabled": True}, name
        assert address(exporter["endpoint"]) == ("0.0.0.0", 8889), name


def test_sampler_sends_traces_to_jaeger_over_otlp() -> None:
    exporter = collector_config(SAMPLER)["exporters"]["otlp/jaeger"]
    host, port = address(exporter["endpoint"])
    jaeger = collector_config("jaeger")["receivers"]["otlp"]["protocols"]["grpc"]
    assert (host, port) == ("jaeger", address(jaeger["endpoint"])[1])
    assert exporter["tls"] == {"insecure": True, "ca_file": ""}
    assert compose_services()[SAMPLER]["environment"]["OTELKIT_JAEGER_ENDPOINT"] == "jaeger:4317"


@pytest.mark.parametrize(
    ("name", "backend"), [("jaeger", "memory"), ("jaeger-opensearch", "opensearch")]
)
def test_jaeger_stores_and_queries_one_backend(name: str, backend: str) -> None:
    config = collector_config(name)
    extensions = config["extensions"]
    [(store, settings)] = extensions["jaeger_storage"]["backends"].items()
    assert list(settings) == [backend]
    assert extensions["jaeger_query"]["storage"] == {"traces": store}
    assert config["exporters"]["jaeger_storage_exporter"]["trace_storage"] == store
    assert address(extensions["jaeger_query"]["http"]["endpoint"]) == ("0.0.0.0", 16686)


# -- prometheus.yml ------------------------------------------------------------------------------


def scrape_jobs() -> dict[str, dict[str, Any]]:
    return {job["job_name"]: job for job in load_yaml(PROMETHEUS_CONFIG)["scrape_configs"]}


def listening_ports(name: str) -> set[int]:
    """Every port a Collector or Jaeger config listens on (``0.0.0.0:<port>`` endpoints)."""
    config = collector_config(name)
    reader = config["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]
    ports = {reader["prometheus"]["port"]}
    for section in ("receivers", "exporters", "extensions"):
        for component in (config.get(section) or {}).values():
            nested = [v for v in (component or {}).values() if isinstance(v, dict)]
            protocols = list(((component or {}).get("protocols") or {}).values())
            for settings in [component or {}, *nested, *protocols]:
                endpoint = (settings or {}).get("endpoint")
                if isinstance(endpoint, str) and endpoint.startswith("0.0.0.0:"):
                    ports.add(address(endpoint)[1])
    return ports


def test_prometheus_scrapes_services_on_ports_they_listen_on() -> None:
    services = compose_services()
    for job_name, job in scrape_jobs().items():
        addresses = [t for static in job.get("static_configs", []) for t in static["targets"]]
        addresses += [
            f"{n}:{dns['port']}" for dns in job.get("dns_sd_configs", []) for n in dns["names"]
        ]
        for target in addresses:
            host, port = address(target)
            service = "prometheus" if host == "localhost" else host
            assert service in services, f"{job_name}: {target} is no compose service"
            assert port in container_ports(services[service]), f"{job_name}: {target}"
            if service in COLLECTORS or service == "jaeger":
                assert port in listening_ports(service), f"{job_name}: {target}"


def relabeled(rule: dict[str, Any], value: str) -> str:
    """What a ``replace`` relabel rule makes of one value (Prometheus anchors the regex)."""
    found = re.fullmatch(rule["regex"], value)
    return found.expand(rule["replacement"].replace("$", "\\")) if found else value


def test_prometheus_reads_forwarded_metrics_with_their_labels_and_triton_names() -> None:
    jobs = scrape_jobs()
    for name in (LB, SAMPLER):
        assert jobs[name]["honor_labels"] is True
        [rename] = jobs[name]["metric_relabel_configs"]
        assert (rename["source_labels"], rename["target_label"]) == (["__name__"], "__name__")

        renamed = [relabeled(rename, f"{m}_total") for m in semconv.TRITON_METRICS]
        assert renamed == list(semconv.TRITON_METRICS)
        assert relabeled(rename, "otelkit_client_errors_total") == "otelkit_client_errors_total"


def test_direct_jobs_match_the_agent_jobs_and_default_their_ports() -> None:
    jobs = scrape_jobs()
    for name, port in NODE_JOBS.items():
        [files] = jobs[name]["file_sd_configs"]
        assert files["files"] == [f"targets/{name}-*.json"]
        [relabel] = jobs[name]["relabel_configs"]
        assert (relabel["source_labels"], relabel["target_label"]) == (
            ["__address__"],
            "__address__",
        )
        assert relabeled(relabel, "gpu01") == f"gpu01:{port}"
        assert relabeled(relabel, "gpu02:8012") == "gpu02:8012"
    assert (PROMETHEUS_DIR / "targets").is_dir()


# -- (g) Grafana ---------------------------------------------------------------------------------


def datasources() -> dict[str, dict[str, Any]]:
    return {d["uid"]: d for d in load_yaml(DATASOURCES)["datasources"]}


def grafana_env(value: str) -> str:
    """Grafana's ``$NAME``/``${NAME}`` from the grafana service's environment; ``$$`` is ``$``."""
    env = compose_services()["grafana"]["environment"]
    return re.sub(
        r"\$\$|\$\{(\w+)\}|\$(\w+)", lambda m: env[m[1] or m[2]] if m[0] != "$$" else "$", value
    )


def test_grafana_datasources_point_at_the_services() -> None:
    services = compose_services()
    found = datasources()
    assert {uid: d["type"] for uid, d in found.items()} == {
        "prometheus": "prometheus",
        "jaeger": "jaeger",
    }
    for uid, datasource in found.items():
        host, port = address(grafana_env(datasource["url"]))
        assert host in services and port in container_ports(services[host]), uid


def test_exemplars_open_traces_in_jaeger_and_spans_open_metrics() -> None:
    found = datasources()
    destinations = found["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert destinations == [{"name": "trace_id", "datasourceUid": "jaeger"}]
    assert found[destinations[0]["datasourceUid"]]["type"] == "jaeger"
    jaeger = found["jaeger"]["jsonData"]
    assert "tracesToLogsV2" not in jaeger and "tracesToLogs" not in jaeger
    to_metrics = jaeger["tracesToMetrics"]
    assert found[to_metrics["datasourceUid"]]["type"] == "prometheus"
    assert to_metrics["tags"] == [
        {"key": semconv.MODEL_NAME, "value": semconv.M_MODEL},
        {"key": semconv.STAGE_NAME, "value": semconv.M_STAGE},
    ]
    read = set()
    for query in to_metrics["queries"]:
        assert "{$$__tags}" in query["query"], query  # $$: Grafana would expand a single $
        read |= promql_names(grafana_env(query["query"]).replace("{$__tags}", ""))[0]
    stage = semconv.prometheus_name(semconv.STAGE_DURATION)
    client = semconv.prometheus_name(semconv.CLIENT_DURATION)
    assert read == {f"{stage}_bucket", f"{stage}_count", f"{client}_bucket"}


def test_grafana_loads_the_repository_dashboards() -> None:
    [provider] = load_yaml(DASHBOARD_PROVIDERS)["providers"]
    assert provider["type"] == "file"
    grafana = compose_services()["grafana"]
    path = provider["options"]["path"]
    assert host_path(grafana, path) == ROOT / "dashboards"
    assert host_path(grafana, "/etc/grafana/provisioning") == PROVISIONING


# -- (h) docker-compose.yml ----------------------------------------------------------------------


def test_compose_services_have_pinned_images_and_one_network() -> None:
    raw = load_yaml(COMPOSE)
    assert set(raw["services"]) == SERVICES
    assert list(raw["networks"]) == ["telemetry"]
    for name, service in raw["services"].items():
        assert PINNED_IMAGE.match(service["image"]), f"{name}: {service['image']}"
        assert service["networks"] == ["telemetry"], name
        named = [str(v).split(":")[0] for v in service.get("volumes", [])]
        for volume in (v for v in named if not v.startswith((".", "/"))):
            assert volume in raw["volumes"], f"{name}: volume {volume} is not declared"
    assert "jaegertracing/jaeger:2." in raw["services"]["jaeger"]["image"]


def test_compose_mounts_exist_and_hold_each_service_config() -> None:
    services = compose_services()
    for name, service in services.items():
        for target, source in bind_mounts(service).items():
            assert source.exists(), f"{name}: {source} (for {target}) does not exist"
    for name in COLLECTORS:
        assert host_path(services[name], config_flag(services[name], "--config")) == (
            config_path(name)
        )
    jaeger = services["jaeger"]
    assert host_path(jaeger, config_flag(jaeger, "--config")) == config_path("jaeger")
    assert {host_path(jaeger, f"/etc/jaeger/{n}.yaml") for n in JAEGER_CONFIGS} == {
        config_path(n) for n in JAEGER_CONFIGS
    }
    prometheus = services["prometheus"]
    config = config_flag(prometheus, "--config.file")
    assert host_path(prometheus, config) == PROMETHEUS_CONFIG
    assert "--enable-feature=exemplar-storage" in prometheus["command"]


def test_compose_ports_are_the_documented_ones() -> None:
    services = compose_services()
    assert {name: published_ports(s) for name, s in services.items()} == PUBLISHED
    documented = {int(p) for p in re.findall(r"^\| (\d+) \|", README.read_text(), re.MULTILINE)}
    assert documented == {host for ports in PUBLISHED.values() for host, _ in ports}
    for name in (*COLLECTORS, "jaeger"):
        assert container_ports(services[name]) == listening_ports(name), name


def test_compose_passes_only_variables_the_configs_read() -> None:
    services = compose_services()
    for name in (*COLLECTORS, "jaeger"):
        files = [config_path(n) for n in (JAEGER_CONFIGS if name == "jaeger" else [name])]
        read = {m[0] for f in files for m in ENV_REFERENCE.findall(with_options(f))}
        passed = set(services[name].get("environment", {})) - {"OTEL_RESOURCE_ATTRIBUTES"}
        assert passed <= read, f"{name}: {sorted(passed - read)} are read by no config"


# -- a real Prometheus with this configuration ----------------------------------------------------

# What the gateways' prometheus exporter serves (OpenMetrics): resource attributes as labels,
# a Triton counter with the _total the exporter adds, an otelkit histogram with an exemplar.
FORWARDED = """\
# TYPE nv_inference_request_success counter
nv_inference_request_success_total{host_name="gpu01",instance="localhost:8002",job="triton",model="resnet",version="1"} 54.0
# TYPE otelkit_client_errors counter
otelkit_client_errors_total{error_type="timeout",instance="c1",job="tracking-client",model="resnet"} 2.0
# TYPE otelkit_client_duration_seconds histogram
otelkit_client_duration_seconds_bucket{instance="c1",job="tracking-client",model="resnet",le="0.1"} 3 # {trace_id="4bf92f3577b34da6a3ce929d0e0e4736",span_id="00f067aa0ba902b7"} 0.05
otelkit_client_duration_seconds_bucket{instance="c1",job="tracking-client",model="resnet",le="+Inf"} 4
otelkit_client_duration_seconds_sum{instance="c1",job="tracking-client",model="resnet"} 0.3
otelkit_client_duration_seconds_count{instance="c1",job="tracking-client",model="resnet"} 4
# EOF
"""  # noqa: E501


@pytest.fixture
def forwarded_metrics() -> Iterator[str]:
    """An HTTP endpoint serving ``FORWARDED`` as the gateway's exporter would; its address."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = FORWARDED.encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/openmetrics-text; version=1.0.0")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _api(port: int, path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)["data"]


def _answer(port: int, path: str, **params: str) -> Callable[[], Any]:
    """What ``_api`` reads, ``None`` while Prometheus is not listening yet."""

    def read() -> Any:
        try:
            return _api(port, path, **params)
        except OSError:
            return None

    return read


@pytest.mark.prometheus
def test_a_real_prometheus_runs_this_config(tmp_path: Path, forwarded_metrics: str) -> None:
    """The stack's own prometheus.yml and rules, with the gateway's address pointed at a local
    endpoint and a 1 s interval: rules load, direct targets get their jobs' default ports,
    forwarded Triton counters get their names back and exemplars are stored."""
    binary = require_binary("prometheus")
    shutil.copytree(PROMETHEUS_DIR, tmp_path / "prometheus")
    config = load_yaml(PROMETHEUS_CONFIG)
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    for job in config["scrape_configs"]:
        if job["job_name"] == LB:
            job["static_configs"] = [{"targets": [forwarded_metrics]}]
    (tmp_path / "prometheus" / "prometheus.yml").write_text(yaml.safe_dump(config))
    nodes = [{"targets": ["gpu01", "gpu02:8012"]}]
    for job in NODE_JOBS:
        (tmp_path / "prometheus" / "targets" / f"{job}-nodes.json").write_text(json.dumps(nodes))
    port = free_port()
    log = tmp_path / "prometheus.log"
    command = [
        binary,
        f"--config.file={tmp_path / 'prometheus' / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--enable-feature=exemplar-storage",
        "--log.level=error",
    ]
    with log.open("wb") as out, subprocess.Popen(command, stdout=out, stderr=out) as process:
        try:
            _check_running_prometheus(port, log)
        finally:
            process.terminate()
            process.wait(10)


def _check_running_prometheus(port: int, log: Path) -> None:
    def tail() -> str:
        return log.read_text()[-3000:] if log.exists() else ""

    rules_answer = _answer(port, "rules")
    loaded = wait_until(
        lambda: (rules_answer() or {}).get("groups"), 20, "rules loaded", interval=0.2, explain=tail
    )
    assert {r["name"] for g in loaded for r in g["rules"]} == {
        rule.get("record") or rule["alert"] for rule in rules()
    }
    expected = {(job, f"gpu01:{p}") for job, p in NODE_JOBS.items()} | {
        (job, "gpu02:8012") for job in NODE_JOBS
    }

    targets_answer = _answer(port, "targets", state="active")

    def direct_targets() -> set[tuple[str, str]]:
        targets = (targets_answer() or {}).get("activeTargets", [])
        return {
            (t["labels"]["job"], t["labels"]["instance"])
            for t in targets
            if t["labels"]["job"] in NODE_JOBS
        }

    wait_until(
        lambda: direct_targets() == expected, 20, "the direct targets", interval=0.2, explain=tail
    )
    query = 'nv_inference_request_success{model="resnet"}'
    query_answer = _answer(port, "query", query=query)
    [series] = wait_until(
        lambda: (query_answer() or {}).get("result"), 20, query, interval=0.2, explain=tail
    )
    assert series["metric"] == {
        "__name__": "nv_inference_request_success",
        "host_name": "gpu01",
        "instance": "localhost:8002",
        "job": "triton",
        "model": "resnet",
        "version": "1",
    }
    assert _api(port, "query", query="nv_inference_request_success_total")["result"] == []
    assert _api(port, "query", query="otelkit_client_errors_total")["result"]
    now = time.time()
    exemplars = _api(
        port,
        "query_exemplars",
        query="otelkit_client_duration_seconds_bucket",
        start=str(now - 60),
        end=str(now + 60),
    )
    stored = {e["labels"]["trace_id"] for s in exemplars for e in s["exemplars"]}
    assert stored == {"4bf92f3577b34da6a3ce929d0e0e4736"}
