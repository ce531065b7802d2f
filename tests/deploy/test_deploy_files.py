"""The reference deployment's files (examples/gnn_tracking/deploy), checked without a container
engine, apptainer or Slurm: each file parses, and the files agree with each other and with the
repository (service names, ports, mounted paths, pipeline components, tritonserver flags).

The shell scripts run for real with fakes of what is missing here (``tritonserver``, ``pip``,
``apptainer``, ``curl``); one test runs the entrypoint against the real ``tritonserver`` bundled
in nvidia-pytriton, on the CPU, and checks that its spans reach an OTLP receiver.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from otelkit.testing import ReceiverCapture, answers, wait_until
from tests.paths import ROOT
from tests.support import require_binary

EXAMPLE = ROOT / "examples" / "gnn_tracking"
DEPLOY = EXAMPLE / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
COLLECTOR_CONFIG = DEPLOY / "otelcol.yaml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus.yml"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "datasources.yaml"
ENTRYPOINT = DEPLOY / "triton-entrypoint.sh"
SBATCH = DEPLOY / "slurm" / "triton-gpu.sbatch"
MODEL_REPOSITORY = EXAMPLE / "model_repository"

STAGE_MODELS = ("embed", "build_graph", "filter", "gnn", "label")
ENSEMBLE = "tracking"
COLLECTOR = "otel-collector"
OTLP_HTTP_PORT = 4318
# Collector components defined on purpose but in no pipeline (none today).
INTENTIONALLY_UNUSED: dict[str, set[str]] = {
    "receivers": set(),
    "processors": set(),
    "exporters": set(),
}
# Images are Docker Hub short names with a pinned tag; NVIDIA's comes from TRITON_IMAGE.
PINNED_IMAGE = re.compile(r"^[a-z0-9-]+/[a-z0-9-]+:(?!latest$)[\w.-]+$")
TRITON_IMAGE = re.compile(r"^\$\{TRITON_IMAGE:\?[^}]+\}$")
VARIABLE = re.compile(r"\$\{(\w+)(?::?([-?])([^}]*))?\}")


# -- reading the files ---------------------------------------------------------------------------


def load_yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path}: not a mapping"
    return data


def interpolate(value: Any) -> Any:
    """Compose's ``${VAR:-default}`` as its default, ``${VAR:?error}`` as ``<VAR>``, in depth."""
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name, kind, text = match.groups()
            return text if kind == "-" else f"<{name}>" if kind == "?" else ""

        return VARIABLE.sub(substitute, value)
    if isinstance(value, dict):
        return {key: interpolate(item) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item) for item in value]
    return value


def compose_services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = interpolate(load_yaml(COMPOSE))["services"]
    return services


def _port_range(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def port_mappings(service: dict[str, Any]) -> list[tuple[str, int, int]]:
    """``(host address, host port, container port)`` of each published port, ranges expanded."""
    mappings = []
    for spec in service.get("ports", []):
        parts = str(spec).split("/")[0].split(":")
        container = _port_range(parts[-1])
        host = _port_range(parts[-2]) if len(parts) > 1 else container
        address = parts[-3] if len(parts) > 2 else "0.0.0.0"
        assert len(host) == len(container), f"port range sizes differ: {spec}"
        mappings += [(address, h, c) for h, c in zip(host, container, strict=True)]
    return mappings


def container_ports(service: dict[str, Any]) -> set[int]:
    """Ports the service listens on inside the network: published or exposed."""
    exposed = {port for spec in service.get("expose", []) for port in _port_range(str(spec))}
    return exposed | {container for _, _, container in port_mappings(service)}


def bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """``(host path as written, container path)`` of the service's bind mounts."""
    mounts = []
    for spec in service.get("volumes", []):
        source, target = str(spec).split(":")[:2]
        if source.startswith((".", "/")):
            mounts.append((source, target))
    return mounts


def host_path(service: dict[str, Any], path: str) -> Path:
    """Where a path inside the service's container lies in this repository."""
    for source, target in bind_mounts(service):
        if path == target or path.startswith(target.rstrip("/") + "/"):
            return (DEPLOY / source / path[len(target) :].lstrip("/")).resolve()
    raise AssertionError(f"{path} is in no bind mount of the service")


def address(text: str) -> tuple[str, int]:
    """``(host, port)`` of ``host:port`` or of a URL."""
    split = urlsplit(text if "//" in text else f"//{text}")
    assert split.hostname is not None and split.port is not None, text
    return split.hostname, split.port


def collector_config() -> dict[str, Any]:
    return load_yaml(COLLECTOR_CONFIG)


def scrape_targets() -> dict[str, list[str]]:
    """Each Prometheus job's static targets."""
    jobs = load_yaml(PROMETHEUS_CONFIG)["scrape_configs"]
    return {
        job["job_name"]: [t for static in job["static_configs"] for t in static["targets"]]
        for job in jobs
    }


def shell_function(script: Path, name: str) -> str:
    """The text of one top-level function of a shell script."""
    match = re.search(rf"^{name}\(\) \{{\n.*?^\}}\n", script.read_text(), re.MULTILINE | re.DOTALL)
    assert match, f"{script.name} defines no function {name}"
    return match.group(0)


def model_offsets(repository: Path) -> list[int]:
    """The stage models' metrics_port_offset parameters, read by the sbatch script's own code."""
    program = shell_function(SBATCH, "model_offsets") + 'model_offsets "$1"'
    result = subprocess.run(
        ["bash", "-c", program, "bash", str(repository)],
        capture_output=True,
        text=True,
        check=True,
    )
    return [int(line) for line in result.stdout.split()]


# -- docker-compose.yml ------------------------------------------------------------------------


def test_compose_services_have_pinned_images_one_network_and_known_dependencies() -> None:
    raw = load_yaml(COMPOSE)
    services = compose_services()
    assert set(services) == {
        "triton",
        COLLECTOR,
        "jaeger",
        "prometheus",
        "grafana",
        "gpu-exporter",
    }
    assert list(raw["networks"]) == ["telemetry"]
    for name, service in raw["services"].items():
        image = service.get("image")
        assert image is not None or "build" in service, f"{name}: neither image nor build"
        if image is not None:
            assert PINNED_IMAGE.match(image) or TRITON_IMAGE.match(image), f"{name}: {image}"
        assert service["networks"] == ["telemetry"], name
        assert set(service.get("depends_on", [])) <= set(services), name
        named = [str(v).split(":")[0] for v in service.get("volumes", [])]
        for volume in (v for v in named if not v.startswith((".", "/"))):
            assert volume in raw["volumes"], f"{name}: volume {volume} is not declared"
    # The GPU exporter takes DCGM exporter's port: it starts only when asked for.
    assert raw["services"]["gpu-exporter"]["profiles"] == ["gpu-exporter"]
    assert raw["services"]["gpu-exporter"]["pid"] == "host"  # to name other containers' pids


def test_compose_bind_mounts_exist_in_the_repository() -> None:
    services = compose_services()
    for name, service in services.items():
        for source, _ in bind_mounts(service):
            assert (DEPLOY / source).exists(), f"{name}: {source} does not exist"
    triton = services["triton"]
    assert host_path(triton, "/workspace/otelkit") == ROOT
    assert host_path(triton, triton["command"][-1]) == ENTRYPOINT
    collector = services[COLLECTOR]
    config = collector["command"][0].removeprefix("--config=")
    assert host_path(collector, config) == COLLECTOR_CONFIG
    prometheus = services["prometheus"]
    config = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    assert host_path(prometheus, config.partition("=")[2]) == PROMETHEUS_CONFIG
    provisioning = host_path(services["grafana"], "/etc/grafana/provisioning")
    assert provisioning / "datasources" / "datasources.yaml" == DATASOURCES


def test_compose_published_host_ports_are_unique() -> None:
    published = [
        (name, port)
        for name, service in compose_services().items()
        for _, port, _ in port_mappings(service)
    ]
    ports = [port for _, port in published]
    assert sorted(ports) == sorted(set(ports)), published


def test_triton_and_its_models_send_otlp_to_the_collector() -> None:
    services = compose_services()
    env = services["triton"]["environment"]
    trace_url = urlsplit(env["TRITON_TRACE_URL"])
    models = urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert (trace_url.scheme, trace_url.hostname, trace_url.port, trace_url.path) == (
        "http",
        COLLECTOR,
        OTLP_HTTP_PORT,
        "/v1/traces",
    )
    assert (models.scheme, models.hostname, models.port, models.path) == (
        "http",
        COLLECTOR,
        OTLP_HTTP_PORT,
        "",
    )
    http = collector_config()["receivers"]["otlp"]["protocols"]["http"]
    assert address(http["endpoint"])[1] == OTLP_HTTP_PORT
    assert OTLP_HTTP_PORT in container_ports(services[COLLECTOR])


def test_triton_service_ports_gpu_and_healthcheck() -> None:
    triton = compose_services()["triton"]
    env = triton["environment"]
    ports = {int(env[f"TRITON_{kind}_PORT"]) for kind in ("HTTP", "GRPC", "METRICS")}
    assert ports == {8000, 8001, 8002}
    assert ports <= container_ports(triton)
    assert triton["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
    ]
    probe = " ".join(triton["healthcheck"]["test"])
    assert f"http://localhost:{env['TRITON_HTTP_PORT']}/v2/health/ready" in probe


# -- otelcol.yaml ------------------------------------------------------------------------------


def test_collector_pipelines_use_exactly_the_defined_components() -> None:
    config = collector_config()
    pipelines = config["service"]["pipelines"]
    assert set(pipelines) == {"traces", "metrics"}
    for kind in ("receivers", "processors", "exporters"):
        used = {name for pipeline in pipelines.values() for name in pipeline.get(kind, [])}
        assert used <= set(config[kind]), f"{kind} used but not defined: {used - set(config[kind])}"
        assert set(config[kind]) - used == INTENTIONALLY_UNUSED[kind], f"{kind} defined, unused"
    assert set(config["service"]["extensions"]) == set(config["extensions"])
    for name, pipeline in pipelines.items():  # the order the collector's documentation asks for
        assert pipeline["processors"][0] == "memory_limiter", name
        assert pipeline["processors"][-1] == "batch", name


def test_collector_endpoints_match_the_compose_services() -> None:
    config = collector_config()
    services = compose_services()
    collector = services[COLLECTOR]
    protocols = config["receivers"]["otlp"]["protocols"]
    listening = {
        "grpc": address(protocols["grpc"]["endpoint"]),
        "http": address(protocols["http"]["endpoint"]),
        "prometheus exporter": address(config["exporters"]["prometheus"]["endpoint"]),
        "health_check": address(config["extensions"]["health_check"]["endpoint"]),
    }
    reader = config["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]
    listening["own metrics"] = (reader["prometheus"]["host"], reader["prometheus"]["port"])
    assert listening == {
        "grpc": ("0.0.0.0", 4317),
        "http": ("0.0.0.0", 4318),
        "prometheus exporter": ("0.0.0.0", 8889),
        "health_check": ("0.0.0.0", 13133),
        "own metrics": ("0.0.0.0", 8888),
    }
    assert {port for _, port in listening.values()} == container_ports(collector)
    published = {(container, host) for _, host, container in port_mappings(collector)}
    assert published == {(4317, 4317), (4318, 4318)}  # clients on other nodes send OTLP here
    jaeger = config["exporters"]["otlp/jaeger"]
    host, port = address(jaeger["endpoint"])
    assert host in services and port in container_ports(services[host])
    assert jaeger["tls"] == {"insecure": True}
    assert services["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"


# -- prometheus.yml ----------------------------------------------------------------------------


def test_prometheus_scrapes_defined_services_on_their_ports() -> None:
    services = compose_services()
    jobs = scrape_targets()
    for job, targets in jobs.items():
        for target in targets:
            host, port = address(target)
            service = "prometheus" if host == "localhost" else host
            assert service in services, f"{job}: {target} is no compose service"
            assert port in container_ports(services[service]), f"{job}: {target}: port not open"
    env = services["triton"]["environment"]
    config = collector_config()
    collector_port = config["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]
    assert jobs["triton"] == [f"triton:{env['TRITON_METRICS_PORT']}"]
    assert jobs["otel-collector"] == [f"{COLLECTOR}:{collector_port['prometheus']['port']}"]
    exporter_port = address(config["exporters"]["prometheus"]["endpoint"])[1]
    assert jobs["otlp-metrics"] == [f"{COLLECTOR}:{exporter_port}"]
    assert "--enable-feature=exemplar-storage" in services["prometheus"]["command"]


@pytest.mark.prometheus
def test_promtool_accepts_the_prometheus_config() -> None:
    promtool = require_binary("promtool")
    result = subprocess.run(
        [promtool, "check", "config", str(PROMETHEUS_CONFIG)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- grafana -----------------------------------------------------------------------------------


def test_grafana_datasources_point_at_services_and_exemplars_at_jaeger() -> None:
    services = compose_services()
    datasources = {d["uid"]: d for d in load_yaml(DATASOURCES)["datasources"]}
    for uid, datasource in datasources.items():
        host, port = address(datasource["url"])
        assert host in services and port in container_ports(services[host]), uid
    assert {uid: d["type"] for uid, d in datasources.items()} == {
        "prometheus": "prometheus",
        "jaeger": "jaeger",
    }
    destinations = datasources["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert destinations == [{"name": "trace_id", "datasourceUid": "jaeger"}]


# -- the shell scripts -------------------------------------------------------------------------


@pytest.mark.parametrize("script", [ENTRYPOINT, SBATCH], ids=lambda p: p.name)
def test_shell_scripts_parse_and_stop_on_errors(script: Path) -> None:
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert "\nset -euo pipefail\n" in script.read_text()


def _executable(path: Path, text: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + text)
    path.chmod(0o755)


@pytest.fixture
def fake_repo(tmp_path: Path) -> Path:
    """A repository with the real deploy/ and a small model repository: five stages with
    metrics_port_offset 1..5 (as gnn_tracking.serving.repository writes them) and an ensemble."""
    repo = tmp_path / "repo"
    example = repo / "examples" / "gnn_tracking"
    example.mkdir(parents=True)
    (example / "deploy").symlink_to(DEPLOY)
    for offset, name in enumerate(STAGE_MODELS, start=1):
        line = f'parameters {{ key: "metrics_port_offset" value {{ string_value: "{offset}" }} }}\n'
        (example / "model_repository" / name / "configs").mkdir(parents=True)
        (example / "model_repository" / name / "config.pbtxt").write_text(line)
        (example / "model_repository" / name / "configs" / "gpu.pbtxt").write_text(line)
    (example / "model_repository" / ENSEMBLE).mkdir()
    (example / "model_repository" / ENSEMBLE / "config.pbtxt").write_text('platform: "ensemble"\n')
    return repo


def test_entrypoint_runs_tritonserver_with_tracing_from_the_compose_environment(
    tmp_path: Path, fake_repo: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    argv_file = tmp_path / "argv.json"
    _executable(
        bin_dir / "tritonserver",
        f'python3 -c \'import json, os, sys; json.dump({{"argv": sys.argv[1:], '
        f'"PYTHONPATH": os.environ["PYTHONPATH"]}}, open("{argv_file}", "w"))\' "$@"\n',
    )
    env = {
        **{k: str(v) for k, v in compose_services()["triton"]["environment"].items()},
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "OTELKIT_REPO": str(fake_repo),
        "OTELKIT_PYDEPS": "/opt/pydeps",
        "OTELKIT_SKIP_INSTALL": "1",
    }
    subprocess.run(["bash", str(ENTRYPOINT), "--log-verbose=1"], env=env, check=True)
    repository = fake_repo / "examples" / "gnn_tracking" / "model_repository"
    assert json.loads(argv_file.read_text()) == {
        "argv": [
            f"--model-repository={repository}",
            "--model-config-name=gpu",
            "--http-port=8000",
            "--grpc-port=8001",
            "--metrics-port=8002",
            "--allow-metrics=true",
            "--allow-gpu-metrics=true",
            "--exit-timeout-secs=30",
            "--trace-config",
            "mode=opentelemetry",
            "--trace-config",
            "rate=1",
            "--trace-config",
            "level=TIMESTAMPS",
            "--trace-config",
            f"opentelemetry,url=http://{COLLECTOR}:4318/v1/traces",
            "--trace-config",
            "opentelemetry,resource=service.name=triton",
            "--log-verbose=1",
        ],
        "PYTHONPATH": f"{fake_repo}/examples:/opt/pydeps/otelkit:/opt/pydeps/torch",
    }


def test_entrypoint_refuses_to_start_without_a_collector(fake_repo: Path) -> None:
    env = {"PATH": os.environ["PATH"], "OTELKIT_REPO": str(fake_repo)}
    result = subprocess.run(["bash", str(ENTRYPOINT)], env=env, capture_output=True, text=True)
    assert result.returncode != 0
    assert "TRITON_TRACE_URL" in result.stderr


def test_entrypoint_installs_torch_and_otelkit_once_per_change(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "pip-calls"
    _executable(bin_dir / "python3", f'echo "$*" >>"{calls}"\n')
    pydeps = tmp_path / "pydeps"
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "OTELKIT_REPO": str(ROOT),
        "OTELKIT_PYDEPS": str(pydeps),
        "TORCH_SPEC": "torch==2.5.1",
    }

    def install(**extra: str) -> list[str]:
        calls.write_text("")
        command = ["bash", str(ENTRYPOINT), "--install-only"]
        subprocess.run(command, env={**env, **extra}, check=True, capture_output=True)
        sources = re.compile(r"/\S+\[gpu\]")  # a temporary copy of the package sources
        return [sources.sub("<sources>[gpu]", line) for line in calls.read_text().splitlines()]

    pip = "-m pip install --no-input --disable-pip-version-check --upgrade --target"
    assert install() == [
        f"{pip} {pydeps}/torch torch==2.5.1",
        f"{pip} {pydeps}/otelkit <sources>[gpu]",
    ]
    assert install() == []
    assert install(TORCH_SPEC="torch==2.6.0", TRITON_EXTRA_PIP="scipy") == [
        f"{pip} {pydeps}/torch torch==2.6.0",
        f"{pip} {pydeps}/otelkit <sources>[gpu] scipy",
    ]


# -- slurm/triton-gpu.sbatch -------------------------------------------------------------------


SBATCH_OPTIONS = re.compile(r"^#SBATCH\s+--([\w-]+)(?:=(\S+))?", re.MULTILINE)


def test_sbatch_asks_for_one_gpu_time_and_cpus() -> None:
    options = dict(SBATCH_OPTIONS.findall(SBATCH.read_text()))
    assert options["gres"] == "gpu:1"
    assert re.fullmatch(r"\d+:\d\d:\d\d", options["time"])
    assert int(options["cpus-per-task"]) >= 1
    assert options["signal"] == "B:TERM@120"  # time to stop cleanly before the time limit


@pytest.fixture
def slurm_job(tmp_path: Path, fake_repo: Path) -> Iterator[dict[str, Any]]:
    """The sbatch script started as Slurm would, with fake ``apptainer`` and ``curl``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "apptainer.json"
    _executable(
        bin_dir / "apptainer",
        f'python3 -c \'import json, os, sys; json.dump({{"argv": sys.argv[1:], "pid": os.getppid(),'
        f' "env": {{k: v for k, v in os.environ.items() if k.startswith("APPTAINERENV_")}}}},'
        f' open("{record}.tmp", "w"))\' "$@"\nmv "{record}.tmp" "{record}"\n'
        "exec sleep 600\n",
    )
    _executable(bin_dir / "curl", f'test -f "{record}"\n')  # ready once "Triton" runs
    submit = tmp_path / "submit"
    submit.mkdir()
    sif = tmp_path / "tritonserver.sif"
    sif.write_text("")
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "SLURM_JOB_ID": "4242",
        "SLURM_SUBMIT_DIR": str(submit),
        "SLURMD_NODENAME": "gpu-node-7",
        "TRITON_ADVERTISE_HOST": "gpu-node-7",
        "OTEL_COLLECTOR": "collector-host:4318",
        "TRITON_SIF": str(sif),
        "OTELKIT_REPO": str(fake_repo),
        "PROMETHEUS_SD_DIR": str(tmp_path / "file_sd"),
        "TRITON_READY_POLL": "0.05",
    }
    job = subprocess.Popen(
        ["bash", str(SBATCH)],
        env=env,
        cwd=submit,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield {"job": job, "tmp": tmp_path, "submit": submit, "record": record, "sif": sif}
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def _written(path: Path, job: subprocess.Popen[str]) -> Callable[[], bool]:
    """Whether ``path`` exists; fails at once when the job has exited first."""

    def check() -> bool:
        if job.poll() is not None:
            output = job.stdout.read() if job.stdout else ""
            raise AssertionError(f"the job exited ({job.returncode}) first:\n{output}")
        return path.exists()

    return check


def _env_file(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def test_sbatch_runs_triton_in_apptainer_publishes_its_ports_and_stops_on_scancel(
    slurm_job: dict[str, Any], fake_repo: Path
) -> None:
    job: subprocess.Popen[str] = slurm_job["job"]
    env_file = slurm_job["submit"] / "triton-4242.env"
    sd_file = slurm_job["tmp"] / "file_sd" / "triton-4242.json"
    wait_until(_written(env_file, job), 30, f"{env_file} written")
    wait_until(_written(sd_file, job), 30, f"{sd_file} written")  # right after the env file
    base = 20000 + 10 * (4242 % 4000)  # the job's port block
    assert _env_file(env_file) == {
        "SLURM_JOB_ID": "4242",
        "TRITON_HOST": "gpu-node-7",
        "TRITON_HTTP_PORT": str(base),
        "TRITON_GRPC_PORT": str(base + 1),
        "TRITON_METRICS_PORT": str(base + 2),
        "TRITON_HTTP_URL": f"gpu-node-7:{base}",
        "TRITON_GRPC_URL": f"gpu-node-7:{base + 1}",
        "TRITON_METRICS_URL": f"http://gpu-node-7:{base + 2}/metrics",
        "OTELKIT_STAGE_METRICS_PORTS": ",".join(str(base + 3 + i) for i in range(1, 6)),
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector-host:4318",
    }
    assert json.loads(sd_file.read_text()) == [
        {
            "targets": [f"gpu-node-7:{base + 2}"],
            "labels": {"job": "triton", "slurm_job_id": "4242"},
        },
        {
            "targets": [f"gpu-node-7:{base + 3 + i}" for i in range(1, 6)],
            "labels": {"job": "gnn-tracking-models", "slurm_job_id": "4242"},
        },
    ]
    apptainer = json.loads(slurm_job["record"].read_text())
    assert apptainer["argv"] == [
        "exec",
        "--nv",
        "--cleanenv",
        "--bind",
        f"{fake_repo}:/workspace/otelkit:ro",
        "--bind",
        f"{slurm_job['tmp']}/.cache/otelkit/triton-pydeps:/opt/pydeps",
        str(slurm_job["sif"]),
        "bash",
        "/workspace/otelkit/examples/gnn_tracking/deploy/triton-entrypoint.sh",
    ]
    assert apptainer["env"] == {
        "APPTAINERENV_TRITON_HTTP_PORT": str(base),
        "APPTAINERENV_TRITON_GRPC_PORT": str(base + 1),
        "APPTAINERENV_TRITON_METRICS_PORT": str(base + 2),
        "APPTAINERENV_TRITON_TRACE_URL": "http://collector-host:4318/v1/traces",
        "APPTAINERENV_TRITON_TRACE_RATE": "1",
        "APPTAINERENV_TRITON_TRACE_RESOURCE": "host.name=gpu-node-7,slurm.job.id=4242",
        "APPTAINERENV_OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector-host:4318",
        "APPTAINERENV_OTEL_SERVICE_NAME": "gnn-tracking-models",
        "APPTAINERENV_OTELKIT_METRICS_EXPORTER": "prometheus",
        "APPTAINERENV_OTELKIT_PROMETHEUS_PORT": str(base + 3),
        "APPTAINERENV_TORCH_SPEC": "torch",
        "APPTAINERENV_TRITON_EXTRA_PIP": "",
        "APPTAINERENV_OTELKIT_SKIP_INSTALL": "0",
        "APPTAINERENV_SLURM_JOB_ID": "4242",
        "APPTAINERENV_SLURMD_NODENAME": "gpu-node-7",
    }
    job.send_signal(signal.SIGTERM)  # what scancel sends
    assert job.wait(timeout=30) == 143
    assert not env_file.exists() and not sd_file.exists()
    with pytest.raises(ProcessLookupError):  # the container was stopped, not left behind
        os.kill(apptainer["pid"], 0)


def test_sbatch_fails_when_triton_exits_before_it_is_ready(tmp_path: Path, fake_repo: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "apptainer", "exit 3\n")
    _executable(bin_dir / "curl", "exit 7\n")
    sif = tmp_path / "tritonserver.sif"
    sif.write_text("")
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "SLURM_JOB_ID": "77",
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "OTEL_COLLECTOR": "collector-host:4318",
        "TRITON_SIF": str(sif),
        "OTELKIT_REPO": str(fake_repo),
        "TRITON_READY_POLL": "0.05",
    }
    result = subprocess.run(["bash", str(SBATCH)], env=env, capture_output=True, text=True)
    assert result.returncode == 1
    assert "tritonserver exited (status 3) before it was ready" in result.stderr
    assert not (tmp_path / "triton-77.env").exists()


@pytest.mark.parametrize(
    ("collector", "message"),
    [(None, "set OTEL_COLLECTOR"), ("http://collector-host:4318", "without scheme or path")],
)
def test_sbatch_needs_the_collector_as_host_and_port(
    tmp_path: Path, fake_repo: Path, collector: str | None, message: str
) -> None:
    sif = tmp_path / "tritonserver.sif"
    sif.write_text("")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "SLURM_JOB_ID": "1",
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "TRITON_SIF": str(sif),
        "OTELKIT_REPO": str(fake_repo),
        **({"OTEL_COLLECTOR": collector} if collector else {}),
    }
    result = subprocess.run(["bash", str(SBATCH)], env=env, capture_output=True, text=True)
    assert result.returncode != 0
    assert message in result.stderr


# -- the model repository (written by gnn_tracking.serving.repository) -------------------------


def test_model_repository_holds_the_pipeline_with_gpu_variants() -> None:
    assert MODEL_REPOSITORY.is_dir(), f"{MODEL_REPOSITORY} does not exist"
    for name in STAGE_MODELS:
        model = MODEL_REPOSITORY / name
        assert (model / "config.pbtxt").is_file(), name
        assert (model / "1" / "model.py").is_file(), name
        assert "KIND_GPU" in (model / "configs" / "gpu.pbtxt").read_text(), name
    ensemble = MODEL_REPOSITORY / ENSEMBLE
    assert 'platform: "ensemble"' in (ensemble / "config.pbtxt").read_text()
    assert (ensemble / "1").is_dir()  # Triton wants a version directory, even for an ensemble


def test_prometheus_scrapes_every_stage_model_of_the_repository() -> None:
    offsets = model_offsets(MODEL_REPOSITORY)
    assert len(offsets) == len(STAGE_MODELS), f"stage metrics offsets: {offsets}"
    triton = compose_services()["triton"]
    base = int(triton["environment"]["OTELKIT_PROMETHEUS_PORT"])
    assert scrape_targets()["gnn-tracking-models"] == [f"triton:{base + o}" for o in offsets]
    published = {(host, container) for _, host, container in port_mappings(triton)}
    assert {(base + o, base + o) for o in offsets} <= published


# -- against the real tritonserver (nvidia-pytriton's, on the CPU) ------------------------------


@pytest.mark.triton
def test_entrypoint_starts_a_real_tritonserver_that_exports_its_spans(
    tmp_path: Path, fake_repo: Path, otelkit_receiver: ReceiverCapture
) -> None:
    """The entrypoint's exact flags, against Triton 2.51 (the 24.10 image's version)."""
    httpclient = pytest.importorskip("tritonclient.http")
    import numpy as np

    from otelkit.tritonserver import free_port, triton_install

    install = triton_install()
    repository = fake_repo / "examples" / "gnn_tracking" / "model_repository"
    shutil.rmtree(repository)
    shutil.copytree(ROOT / "tests" / "models" / "identity_fp32", repository / "identity_fp32")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(
        bin_dir / "tritonserver",
        f'exec "{install.binary}" --backend-directory="{install.backend_directory}" "$@"\n',
    )
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    service = f"triton-deploy-test-{os.getpid()}"
    env = install.environ(os.environ)
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env['PATH']}",
        OTELKIT_REPO=str(fake_repo),
        OTELKIT_SKIP_INSTALL="1",
        TRITON_HTTP_PORT=str(http_port),
        TRITON_GRPC_PORT=str(grpc_port),
        TRITON_METRICS_PORT=str(metrics_port),
        TRITON_TRACE_URL=otelkit_receiver.traces_url,
        OTEL_EXPORTER_OTLP_ENDPOINT=otelkit_receiver.endpoint,
        TRITON_SERVICE_NAME=service,
        TRITON_TRACE_RESOURCE="slurm.job.id=4242",
    )
    log = tmp_path / "tritonserver.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            ["bash", str(ENTRYPOINT), "--trace-config", "opentelemetry,bsp_schedule_delay=200"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(
            answers(f"http://127.0.0.1:{http_port}/v2/health/ready", server),
            120,
            "tritonserver ready",
            interval=0.2,
            explain=lambda: log.read_text()[-3000:],
        )
        data = np.arange(4, dtype=np.float32).reshape(1, 4)
        infer_input = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        infer_input.set_data_from_numpy(data)
        with httpclient.InferenceServerClient(f"127.0.0.1:{http_port}") as client:
            client.infer("identity_fp32", [infer_input])
        spans = otelkit_receiver.wait_for_spans(lambda s: s.resource["service.name"] == service, 2)
        assert {s.name for s in spans} >= {"InferRequest", "identity_fp32"}
        assert {(s.resource["service.name"], s.resource["slurm.job.id"]) for s in spans} == {
            (service, "4242")
        }
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
