#!/usr/bin/env bash
# otelkit's GPU exporter on every node of a Slurm allocation: one background job step with one
# task per node, serving Prometheus metrics on OTELKIT_GPU_EXPORTER_PORT (9400), stopped when
# the job's shell exits. Each exporter sees the GPUs the job was given on its node.
#
# In an sbatch script (or an salloc shell), with otelkit[gpu] installed on the nodes:
#   source /path/to/otelkit/exporters/slurm/gpu-exporter-step.sh
#   srun python train.py          # your own steps, their GPUs now watched
# or, to keep it in the foreground until the job ends or Ctrl-C:
#   bash /path/to/otelkit/exporters/slurm/gpu-exporter-step.sh
# It prints the URLs to scrape. Port 9400 is dcgm-exporter's too: on nodes that run it, choose
# another port.
#
# Environment:
#   OTELKIT_GPU_EXPORTER_PORT     port on each node (default 9400)
#   OTELKIT_GPU_EXPORTER_ARGS     more options for `otelkit gpu-exporter`, e.g. "--interval 5"
#   OTELKIT_GPU_EXPORTER_SD_FILE  if set, a Prometheus file_sd target file kept there while the
#                                 job runs, e.g. /shared/prometheus/gpu/$SLURM_JOB_ID.json
#   OTELKIT_GPU_EXPORTER_DOMAIN   appended to node names in the targets, e.g. cluster.example
#   OTELKIT_BIN                   the otelkit command (default: otelkit on PATH)
#
# Works under the caller's `set -euo pipefail` and without it; when sourced it leaves the
# shell's options as they were, and its EXIT trap runs before the one already set.

_otelkit_gpu_exporter_error() {
    echo "gpu-exporter-step: error: $*" >&2
}

# Starts the step; sets OTELKIT_GPU_EXPORTER_PID (its srun) and prints where to scrape.
otelkit_gpu_exporter_start() {
    local -
    set -uo pipefail
    local port=${OTELKIT_GPU_EXPORTER_PORT:-9400}
    local bin=${OTELKIT_BIN:-otelkit}
    local sd_file=${OTELKIT_GPU_EXPORTER_SD_FILE:-}
    local names node targets tmp
    local -a nodes extra
    if [[ -n ${OTELKIT_GPU_EXPORTER_PID:-} ]] && kill -0 "$OTELKIT_GPU_EXPORTER_PID" 2>/dev/null; then
        echo "gpu-exporter-step: already running (srun pid $OTELKIT_GPU_EXPORTER_PID)"
        return 0
    fi
    if [[ -z ${SLURM_JOB_ID:-} || -z ${SLURM_JOB_NODELIST:-} ]]; then
        _otelkit_gpu_exporter_error "not inside a Slurm allocation (SLURM_JOB_ID and" \
            "SLURM_JOB_NODELIST are unset): source or run this in an sbatch script or salloc shell"
        return 1
    fi
    [[ $port =~ ^[0-9]+$ ]] ||
        { _otelkit_gpu_exporter_error "OTELKIT_GPU_EXPORTER_PORT is not a port: $port"; return 1; }
    command -v srun >/dev/null && command -v scontrol >/dev/null ||
        { _otelkit_gpu_exporter_error "srun or scontrol is not on PATH"; return 1; }
    command -v "$bin" >/dev/null || {
        _otelkit_gpu_exporter_error "$bin not found: activate the environment with" \
            "otelkit[gpu] or set OTELKIT_BIN"
        return 1
    }
    names=$(scontrol show hostnames "$SLURM_JOB_NODELIST") && [[ -n $names ]] || {
        _otelkit_gpu_exporter_error "scontrol cannot expand SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST"
        return 1
    }
    mapfile -t nodes <<<"$names"
    read -r -a extra <<<"${OTELKIT_GPU_EXPORTER_ARGS:-}"

    # --overlap: the step shares the job's CPUs, memory and GPUs with the job's own steps
    # instead of waiting for them. --ntasks is explicit because srun would otherwise take the
    # job's SLURM_NTASKS. stdin from /dev/null: a background srun in an interactive salloc shell
    # would otherwise stop on reading the terminal.
    srun --overlap --job-name=otelkit-gpu-exporter --nodes="${#nodes[@]}" \
        --ntasks="${#nodes[@]}" --ntasks-per-node=1 --cpus-per-task=1 \
        "$bin" gpu-exporter --port "$port" "${extra[@]}" </dev/null &
    OTELKIT_GPU_EXPORTER_PID=$!
    _otelkit_gpu_exporter_trap

    targets=()
    echo "otelkit gpu-exporter: Slurm job $SLURM_JOB_ID, step otelkit-gpu-exporter" \
        "(srun pid $OTELKIT_GPU_EXPORTER_PID) on ${#nodes[@]} node(s); scrape:"
    for node in "${nodes[@]}"; do
        node=$node${OTELKIT_GPU_EXPORTER_DOMAIN:+.$OTELKIT_GPU_EXPORTER_DOMAIN}
        echo "  http://$node:$port/metrics"
        targets+=("\"$node:$port\"")
    done
    if [[ -n $sd_file ]]; then
        # Written whole, then renamed: Prometheus never reads half a file.
        mkdir -p "$(dirname "$sd_file")" && tmp=$(mktemp "$sd_file.XXXXXX") || {
            _otelkit_gpu_exporter_error "cannot write OTELKIT_GPU_EXPORTER_SD_FILE=$sd_file"
            return 1
        }
        printf '[{"targets": [%s], "labels": {"slurm_job_id": "%s"}}]\n' \
            "$(IFS=,; echo "${targets[*]}")" "$SLURM_JOB_ID" >"$tmp"
        chmod 644 "$tmp"
        mv "$tmp" "$sd_file"
        _OTELKIT_GPU_EXPORTER_SD_FILE=$sd_file
        echo "  Prometheus file_sd targets: $sd_file"
    fi
}

# Stops the step (srun passes SIGTERM on to the exporters, which exit 0) and removes the
# file_sd file, so Prometheus stops scraping the nodes with the job.
otelkit_gpu_exporter_stop() {
    local pid=${OTELKIT_GPU_EXPORTER_PID:-} tries
    if [[ -n ${_OTELKIT_GPU_EXPORTER_SD_FILE:-} ]]; then
        rm -f "$_OTELKIT_GPU_EXPORTER_SD_FILE"
        _OTELKIT_GPU_EXPORTER_SD_FILE=""
    fi
    OTELKIT_GPU_EXPORTER_PID=""
    if [[ -z $pid ]] || ! kill -0 "$pid" 2>/dev/null; then
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    for ((tries = 0; tries < 100; tries++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# Puts the stop before the shell's own EXIT trap, once. Without a TERM trap, a shell killed
# by SIGTERM (scancel, sbatch --signal=B:TERM) would skip its EXIT trap: exit instead.
_otelkit_gpu_exporter_trap() {
    local -a words
    eval "words=($(trap -p EXIT))"  # trap -- 'COMMAND' EXIT
    local previous=${words[2]:-}
    if [[ $previous != *otelkit_gpu_exporter_stop* ]]; then
        trap -- "otelkit_gpu_exporter_stop${previous:+; $previous}" EXIT
    fi
    if [[ -z $(trap -p TERM) ]]; then
        trap 'exit 143' TERM
    fi
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    # Run as a program: in the foreground until the job ends, scancel or Ctrl-C.
    set -euo pipefail
    trap 'exit 130' INT
    otelkit_gpu_exporter_start
    status=0
    wait "$OTELKIT_GPU_EXPORTER_PID" || status=$?
    OTELKIT_GPU_EXPORTER_PID=""
    echo "gpu-exporter-step: the exporter step ended (status $status)" >&2
    exit "$status"
fi
otelkit_gpu_exporter_start
