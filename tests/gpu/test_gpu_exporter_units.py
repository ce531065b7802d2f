"""The GPU exporter's service files (exporters/), checked without systemd, Slurm or a cluster.

The systemd unit goes through ``systemd-analyze verify`` and ``security`` (with a stand-in for
the otelkit binary); the Slurm launcher runs for real with stand-ins for ``srun`` and
``scontrol`` that log what they were asked; the DaemonSet and its Service are read as YAML; the
README's Prometheus configuration goes through ``promtool`` with a target file the launcher
wrote.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest
import yaml

from otelkit.testing import wait_until
from tests.paths import ROOT
from tests.support import require_binary

EXPORTERS = ROOT / "exporters"
UNIT = EXPORTERS / "systemd" / "otelkit-gpu-exporter.service"
STEP = EXPORTERS / "slurm" / "gpu-exporter-step.sh"
DAEMONSET = EXPORTERS / "kubernetes" / "gpu-exporter-daemonset.yaml"
README = EXPORTERS / "README.md"

PORT = 9400
BINARY = "/opt/otelkit/bin/otelkit"
# Character device groups NVIDIA's driver registers in /proc/devices, across driver versions.
NVIDIA_DEVICE_GROUPS = ["nvidia-frontend", "nvidia", "nvidiactl", "nvidia-uvm", "nvidia-caps"]
NO = {"no", "false", "0", "off"}


# -- systemd/otelkit-gpu-exporter.service ------------------------------------------------------


def unit_settings(text: str) -> dict[str, dict[str, list[str]]]:
    """Each section's settings, every value of a repeated key in order."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line and not line.endswith("\\"), raw
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def service() -> dict[str, list[str]]:
    return unit_settings(UNIT.read_text())["Service"]


def _executable(path: Path, text: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + text)
    path.chmod(0o755)


@pytest.fixture
def checkable_unit(tmp_path: Path) -> Path:
    """A copy of the unit whose ExecStart runs a stand-in for otelkit, which is not installed
    at /opt/otelkit here (systemd-analyze checks that the binary exists)."""
    binary = tmp_path / "opt" / "otelkit" / "bin" / "otelkit"
    binary.parent.mkdir(parents=True)
    _executable(binary, "exit 0\n")
    text = UNIT.read_text()
    assert text.count(BINARY) == 1
    copy = tmp_path / UNIT.name
    copy.write_text(text.replace(BINARY, str(binary)))
    return copy


def systemd_analyze(*args: str) -> subprocess.CompletedProcess[str]:
    command = [require_binary("systemd-analyze"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_systemd_analyze_verifies_the_unit_without_a_warning(
    checkable_unit: Path, tmp_path: Path
) -> None:
    result = systemd_analyze("verify", "--man=no", str(checkable_unit))
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
    # verify exits 0 on unknown keys and bad values too, and says so: the check above sees it.
    misspelled = tmp_path / "misspelled" / UNIT.name
    misspelled.parent.mkdir()
    misspelled.write_text(checkable_unit.read_text().replace("Restart=", "Restarts="))
    result = systemd_analyze("verify", "--man=no", str(misspelled))
    assert "Unknown key 'Restarts'" in result.stdout + result.stderr


def test_systemd_analyze_rates_the_unit_well_sandboxed(checkable_unit: Path) -> None:
    # Exposure on systemd's 0-100 scale (shown as 0.0-10.0); the unit is at about 17.
    result = systemd_analyze("security", "--offline=yes", "--threshold=25", str(checkable_unit))
    assert result.returncode == 0, result.stdout + result.stderr


def test_unit_runs_the_exporter_on_port_9400_and_restarts_it_on_failure() -> None:
    settings = unit_settings(UNIT.read_text())
    keys = ("ExecStart", "EnvironmentFile", "Restart", "DynamicUser", "PrivateDevices")
    assert {key: settings["Service"].get(key) for key in keys} == {
        "ExecStart": [f"{BINARY} gpu-exporter --port {PORT} $OTELKIT_GPU_EXPORTER_ARGS"],
        "EnvironmentFile": ["-/etc/default/otelkit-gpu-exporter"],
        "Restart": ["on-failure"],
        "DynamicUser": ["yes"],
        "PrivateDevices": ["no"],
    }
    argv = shlex.split(settings["Service"]["ExecStart"][0])
    assert argv[:4] == [BINARY, "gpu-exporter", "--port", str(PORT)]
    assert settings["Install"] == {"WantedBy": ["multi-user.target"]}


def test_unit_sandbox_leaves_nvml_its_devices_and_other_processes_names() -> None:
    settings = service()
    assert settings.get("PrivateDevices", ["no"])[-1] in NO  # it would hide /dev/nvidia*
    assert settings.get("ProtectProc", ["default"]) == ["default"]  # hidepid would hide /proc/PID
    assert settings.get("ProcSubset", ["all"]) == ["all"]
    assert settings["DevicePolicy"] == ["closed"]
    # NVML opens the device nodes read-write for its ioctls; systemd globs the group names.
    allowed = [spec.split() for spec in settings["DeviceAllow"]]
    nvidia = [group for group, access in allowed if group.startswith("char-nvidia")]
    assert all(access == "rw" for group, access in allowed if group in nvidia)
    assert [
        name
        for name in NVIDIA_DEVICE_GROUPS
        if any(fnmatchcase(f"char-{name}", pattern) for pattern in nvidia)
    ] == NVIDIA_DEVICE_GROUPS
    assert {"AF_INET", "AF_INET6", "AF_UNIX"} <= set(settings["RestrictAddressFamilies"][0].split())


# -- slurm/gpu-exporter-step.sh ----------------------------------------------------------------

NODELIST = "gpu[01-03]"
NODES = ["gpu01", "gpu02", "gpu03"]
JOB_ID = "4242"


def test_step_script_parses() -> None:
    subprocess.run(["bash", "-n", str(STEP)], check=True)


@pytest.fixture
def slurm(tmp_path: Path) -> dict[str, Any]:
    """Stand-ins for srun, scontrol and otelkit on PATH, and a job's environment.

    The srun stand-in writes its argv to log/srun.PID.argv, then log/srun.PID.started, and
    runs until SIGTERM, which it records in log/srun.PID.signals.
    """
    bin_dir = tmp_path / "bin"
    log = tmp_path / "log"
    bin_dir.mkdir()
    log.mkdir()
    _executable(
        bin_dir / "srun",
        f"log={log}/srun.$$\n"
        "trap 'echo TERM >>\"$log.signals\"; exit 0' TERM\n"
        'printf "%s\\n" "$@" >"$log.argv"\n'
        'touch "$log.started"\n'
        "while :; do sleep 0.05; done\n",  # short sleeps: a SIGKILL leaves nothing behind
    )
    _executable(
        bin_dir / "scontrol",
        f'echo "$*" >>{log}/scontrol\n'
        f'[[ $* == "show hostnames {NODELIST}" ]] || {{ echo "unexpected: $*" >&2; exit 1; }}\n'
        f"printf '%s\\n' {' '.join(NODES)}\n",
    )
    _executable(bin_dir / "otelkit", "exit 0\n")
    sd_file = tmp_path / "file_sd" / "otelkit-gpu" / f"{JOB_ID}.json"
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "SLURM_JOB_ID": JOB_ID,
        "SLURM_JOB_NODELIST": NODELIST,
        "SLURM_JOB_NUM_NODES": str(len(NODES)),
        "SLURM_NTASKS": "12",  # srun would read it: the step must say --ntasks itself
        "OTELKIT_GPU_EXPORTER_SD_FILE": str(sd_file),
    }
    return {"env": env, "log": log, "sd_file": sd_file, "tmp": tmp_path}


def srun_calls(log: Path) -> dict[int, list[str]]:
    """The stand-in srun's argv, by its pid."""
    return {
        int(path.name.split(".")[1]): path.read_text().splitlines()
        for path in log.glob("srun.*.argv")
    }


def batch_job(
    slurm: dict[str, Any], options: str, **extra: str
) -> subprocess.CompletedProcess[str]:
    """A batch script that sources the launcher, waits for its step to start, keeps a copy of
    the file_sd file, checks its shell options are untouched, and exits 0."""
    script = slurm["tmp"] / "job.sh"
    script.write_text(
        f"{options}\n"
        "trap 'echo the job EXIT trap' EXIT\n"
        'before="$-/$(shopt -po pipefail)"\n'
        f"source {STEP}\n"
        "for _ in $(seq 200); do\n"
        f'    compgen -G "{slurm["log"]}/srun.*.started" >/dev/null && break\n'
        "    sleep 0.05\n"
        "done\n"
        f'cp "$OTELKIT_GPU_EXPORTER_SD_FILE" {slurm["tmp"]}/sd-while-running.json\n'
        '[[ "$-/$(shopt -po pipefail)" == "$before" ]] || { echo "options changed" >&2; exit 9; }\n'
    )
    env = {**slurm["env"], **extra}
    return subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("options", "extra", "target"),
    [
        ("set -euo pipefail", {"OTELKIT_GPU_EXPORTER_ARGS": "--interval 5"}, "{node}:9400"),
        (
            "",
            {"OTELKIT_GPU_EXPORTER_PORT": "9500", "OTELKIT_GPU_EXPORTER_DOMAIN": "hpc.example"},
            "{node}.hpc.example:9500",
        ),
    ],
    ids=["strict-shell", "port-and-domain"],
)
def test_sourced_step_runs_one_exporter_per_node_publishes_targets_and_stops_with_the_job(
    slurm: dict[str, Any], options: str, extra: dict[str, str], target: str
) -> None:
    result = batch_job(slurm, options, **extra)
    assert result.returncode == 0, result.stdout + result.stderr
    targets = [target.format(node=node) for node in NODES]
    port = targets[0].rsplit(":", 1)[1]

    calls = srun_calls(slurm["log"])
    assert list(calls.values()) == [
        [
            "--overlap",
            "--job-name=otelkit-gpu-exporter",
            "--nodes=3",
            "--ntasks=3",
            "--ntasks-per-node=1",
            "--cpus-per-task=1",
            "otelkit",
            "gpu-exporter",
            "--port",
            port,
            *extra.get("OTELKIT_GPU_EXPORTER_ARGS", "").split(),
        ]
    ]
    assert (slurm["log"] / "scontrol").read_text() == f"show hostnames {NODELIST}\n"

    header, *lines = result.stdout.splitlines()
    pid = next(iter(calls))
    assert header == (
        f"otelkit gpu-exporter: Slurm job {JOB_ID}, step otelkit-gpu-exporter (srun pid {pid})"
        " on 3 node(s); scrape:"
    )
    assert lines == [
        *(f"  http://{t}/metrics" for t in targets),
        f"  Prometheus file_sd targets: {slurm['sd_file']}",
        "the job EXIT trap",  # the job's own trap still runs, after the launcher's
    ]

    written = json.loads((slurm["tmp"] / "sd-while-running.json").read_text())
    assert written == [{"targets": targets, "labels": {"slurm_job_id": JOB_ID}}]
    assert list(slurm["sd_file"].parent.iterdir()) == []  # removed, no temporary file left
    assert (slurm["log"] / f"srun.{pid}.signals").read_text() == "TERM\n"
    with pytest.raises(ProcessLookupError):  # the step was stopped, not left behind
        os.kill(pid, 0)


@pytest.fixture
def foreground_step(slurm: dict[str, Any]) -> Iterator[subprocess.Popen[str]]:
    step = subprocess.Popen(
        ["bash", str(STEP)],
        env=slurm["env"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield step
    finally:
        if step.poll() is None:
            step.kill()
            step.wait()


def test_step_run_as_a_program_stays_until_scancel_then_stops_the_step(
    slurm: dict[str, Any], foreground_step: subprocess.Popen[str]
) -> None:

    def started() -> list[Path]:
        assert foreground_step.poll() is None, foreground_step.communicate()[0]
        return list(slurm["log"].glob("srun.*.started"))

    wait_until(started, 20, "srun started")
    assert slurm["sd_file"].exists()
    time.sleep(0.2)
    assert foreground_step.poll() is None  # waits on the step

    foreground_step.send_signal(signal.SIGTERM)  # scancel, or sbatch --signal=B:TERM
    assert foreground_step.wait(timeout=30) == 143
    (pid,) = srun_calls(slurm["log"])
    assert (slurm["log"] / f"srun.{pid}.signals").read_text() == "TERM\n"
    assert not slurm["sd_file"].exists()


@pytest.mark.parametrize(
    ("in_slurm", "extra", "message"),
    [
        (
            False,
            {},
            "not inside a Slurm allocation (SLURM_JOB_ID and SLURM_JOB_NODELIST are unset)",
        ),
        (True, {"OTELKIT_BIN": "/nowhere/otelkit"}, "/nowhere/otelkit not found"),
        (True, {"OTELKIT_GPU_EXPORTER_PORT": "http"}, "OTELKIT_GPU_EXPORTER_PORT is not a port"),
    ],
    ids=["outside-slurm", "no-otelkit", "bad-port"],
)
@pytest.mark.parametrize("how", ["run", "source"])
def test_step_fails_clearly_without_starting_anything(
    slurm: dict[str, Any], in_slurm: bool, extra: dict[str, str], message: str, how: str
) -> None:
    env = {**slurm["env"], **extra}
    if not in_slurm:
        env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    command = ["bash", str(STEP)]
    if how == "source":
        command = ["bash", "-c", f"set -euo pipefail; source {STEP}; echo still running"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith(f"gpu-exporter-step: error: {message}")
    assert srun_calls(slurm["log"]) == {}


# -- kubernetes/gpu-exporter-daemonset.yaml ----------------------------------------------------


def manifests() -> dict[str, dict[str, Any]]:
    documents = [doc for doc in yaml.safe_load_all(DAEMONSET.read_text()) if doc]
    by_kind = {doc["kind"]: doc for doc in documents}
    assert sorted(by_kind) == ["DaemonSet", "Service"] and len(documents) == 2
    return by_kind


def _port(container: dict[str, Any], port: int | str) -> int:
    """A container port given by number or by name."""
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    return named[port] if isinstance(port, str) else port


def test_daemonset_runs_on_gpu_nodes_without_taking_a_gpu() -> None:
    daemonset = manifests()["DaemonSet"]
    assert daemonset["apiVersion"] == "apps/v1"
    assert "namespace" not in daemonset["metadata"]
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert (pod["runtimeClassName"], pod["hostPID"]) == ("nvidia", True)
    (container,) = pod["containers"]
    resources = container["resources"]
    assert sorted(resources) == ["limits", "requests"]
    for amounts in resources.values():
        assert sorted(amounts) == ["cpu", "memory"]  # small, and no nvidia.com/gpu
    assert "nvidia.com/gpu" not in json.dumps(resources)
    env = {item["name"]: item["value"] for item in container["env"]}
    assert {k: env.get(k) for k in ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")} == {
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "utility",
    }
    assert container["image"] == "OTELKIT_IMAGE"  # the placeholder the header explains
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_daemonset_serves_and_probes_metrics_on_port_9400() -> None:
    pod = manifests()["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    argv = [*container.get("command", []), *container["args"]]
    assert argv[argv.index("gpu-exporter") :] == [
        "gpu-exporter",
        "--port",
        "9400",
        "--host",
        "0.0.0.0",
    ]
    assert container["ports"] == [{"name": "metrics", "containerPort": PORT, "protocol": "TCP"}]
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert (get["path"], _port(container, get["port"])) == ("/metrics", PORT), probe


def test_service_is_headless_selects_the_daemonset_pods_and_asks_to_be_scraped() -> None:
    kinds = manifests()
    daemonset, svc = kinds["DaemonSet"], kinds["Service"]
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    selector = daemonset["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["clusterIP"] == "None"
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    (port,) = svc["spec"]["ports"]
    assert (port["name"], port["port"], _port(container, port["targetPort"])) == (
        "metrics",
        PORT,
        PORT,
    )
    assert svc["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(PORT),
        "prometheus.io/path": "/metrics",
    }


# -- README.md ---------------------------------------------------------------------------------


def test_readme_links_to_files_that_exist() -> None:
    links = re.findall(r"\]\(([^)#]+)\)", README.read_text())
    assert sorted(links) == sorted(
        str(path.relative_to(EXPORTERS)) for path in (UNIT, STEP, DAEMONSET)
    )
    assert all((EXPORTERS / link).is_file() for link in links)


@pytest.mark.prometheus
def test_readme_scrape_config_accepts_the_target_file_a_slurm_job_writes(
    slurm: dict[str, Any],
) -> None:
    promtool = require_binary("promtool")
    assert batch_job(slurm, "set -euo pipefail").returncode == 0
    sd_dir = slurm["tmp"] / "sd"
    sd_dir.mkdir()
    (slurm["tmp"] / "sd-while-running.json").rename(sd_dir / f"{JOB_ID}.json")

    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), re.DOTALL)
    (config,) = [yaml.safe_load(block) for block in blocks if "scrape_configs:" in block]
    jobs = config["scrape_configs"]
    # Debian's promtool is built without Kubernetes discovery: its job is checked up to there.
    kubernetes = [job for job in jobs if "kubernetes_sd_configs" in job]
    assert [job["job_name"] for job in kubernetes] == ["gpu-kubernetes"]
    (file_sd,) = [job for job in jobs if "file_sd_configs" in job]
    assert file_sd["file_sd_configs"] == [{"files": ["/shared/prometheus/otelkit-gpu/*.json"]}]
    file_sd["file_sd_configs"] = [{"files": [f"{sd_dir}/*.json"]}]
    checked = slurm["tmp"] / "prometheus.yml"
    checked.write_text(yaml.safe_dump({"scrape_configs": [j for j in jobs if j not in kubernetes]}))

    result = subprocess.run(
        [promtool, "check", "config", str(checked)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "FAILED" not in result.stdout + result.stderr, (
        result.stdout + result.stderr
    )
