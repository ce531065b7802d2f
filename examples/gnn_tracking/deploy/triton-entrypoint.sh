#!/usr/bin/env bash
# Starts tritonserver on the GNN tracking model repository with Triton's OpenTelemetry tracing
# and Prometheus metrics on, inside NVIDIA NGC's nvidia/tritonserver:24.10-py3 image (or newer):
# docker-compose.yml runs it as the triton service, slurm/triton-gpu.sbatch through apptainer.
#
#   triton-entrypoint.sh [extra tritonserver arguments...]
#   triton-entrypoint.sh --install-only      # install torch and otelkit, then exit
#
# The image has Python and pip but neither torch nor otelkit: both are installed with pip into
# $OTELKIT_PYDEPS (a volume, or a directory bound from the cluster file system) and reused while
# their inputs are unchanged. On a cluster whose GPU nodes cannot reach the package index, run
# it once with --install-only on a login node (see README.md). OTELKIT_SKIP_INSTALL=1 skips it.
#
# Environment (the defaults suit the compose file):
#   TRITON_TRACE_URL             Triton's own spans, OTLP/HTTP: http://<collector>:4318/v1/traces
#   OTEL_EXPORTER_OTLP_ENDPOINT  the models' otelkit spans:     http://<collector>:4318
#   OTEL_SERVICE_NAME, OTELKIT_METRICS_EXPORTER, OTELKIT_PROMETHEUS_PORT: read by otelkit in
#                                the models (each stage serves /metrics on PORT + its offset)
#   TRITON_HTTP_PORT 8000, TRITON_GRPC_PORT 8001, TRITON_METRICS_PORT 8002
#   TRITON_TRACE_RATE 1 (every request), TRITON_SERVICE_NAME triton,
#   TRITON_TRACE_RESOURCE        extra resource attributes of Triton's spans: k=v,k2=v2
#   OTELKIT_REPO /workspace/otelkit (this repository), OTELKIT_PYDEPS /opt/pydeps
#   TORCH_SPEC torch (the CUDA build, right on a GPU node), TRITON_EXTRA_PIP (more packages)
set -euo pipefail

REPO=${OTELKIT_REPO:-/workspace/otelkit}
PYDEPS=${OTELKIT_PYDEPS:-/opt/pydeps}
TORCH_SPEC=${TORCH_SPEC:-torch}
MODEL_REPOSITORY=$REPO/examples/gnn_tracking/model_repository

log() { echo "[triton-entrypoint] $*" >&2; }

# install_once NAME KEY PIP-ARGS...: pip-installs into $PYDEPS/NAME unless NAME.stamp holds KEY
# (same inputs, installed already). flock: jobs sharing $PYDEPS install one at a time.
install_once() {
    local name=$1 key=$2
    shift 2
    local target=$PYDEPS/$name stamp=$PYDEPS/$name.stamp
    if [[ -f $stamp && $(<"$stamp") == "$key" ]]; then
        return 0
    fi
    mkdir -p "$PYDEPS"
    (
        flock 9
        if [[ -f $stamp && $(<"$stamp") == "$key" ]]; then
            exit 0  # another job installed it while we waited
        fi
        log "installing $* into $target"
        rm -f "$stamp"
        python3 -m pip install --no-input --disable-pip-version-check --upgrade \
            --target "$target" "$@"
        printf '%s' "$key" >"$stamp"
    ) 9>"$PYDEPS/.install.lock"
}

install_dependencies() {
    export PIP_CACHE_DIR=${PIP_CACHE_DIR:-$PYDEPS/pip-cache}
    install_once torch "$TORCH_SPEC" "$TORCH_SPEC"
    # pip would build inside a local source tree (build/, *.egg-info): the repository is bound
    # read-only, so the package sources are copied out first.
    local sources key
    sources=$(mktemp -d)
    cp -rL "$REPO/pyproject.toml" "$REPO/README.md" "$REPO/otelkit" "$sources/"
    key=$(cd "$sources" && find . -type f -not -path '*/__pycache__/*' -print0 | sort -z \
        | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
    # shellcheck disable=SC2086  # TRITON_EXTRA_PIP is a list of requirements
    install_once otelkit "$key ${TRITON_EXTRA_PIP:-}" "$sources[gpu]" ${TRITON_EXTRA_PIP:-}
    rm -rf "$sources"
}

if [[ ${1:-} == --install-only ]]; then
    install_dependencies
    log "installed into $PYDEPS"
    exit 0
fi

: "${TRITON_TRACE_URL:?set TRITON_TRACE_URL to the collector, http://HOST:4318/v1/traces}"
: "${OTEL_EXPORTER_OTLP_ENDPOINT:?set OTEL_EXPORTER_OTLP_ENDPOINT to the collector, http://HOST:4318}"
if [[ ! -d $MODEL_REPOSITORY ]]; then
    log "no model repository at $MODEL_REPOSITORY: bind this repository at $REPO (OTELKIT_REPO)"
    exit 2
fi

if [[ ${OTELKIT_SKIP_INSTALL:-0} != 1 ]]; then
    install_dependencies
fi
# The Python-backend stubs inherit this environment: examples/ holds the gnn_tracking package.
export PYTHONPATH=$REPO/examples:$PYDEPS/otelkit:$PYDEPS/torch${PYTHONPATH:+:$PYTHONPATH}

resource=("service.name=${TRITON_SERVICE_NAME:-triton}")
if [[ -n ${TRITON_TRACE_RESOURCE:-} ]]; then
    IFS=, read -r -a more <<<"$TRITON_TRACE_RESOURCE"
    resource+=("${more[@]}")
fi
trace_resource=()
for attribute in "${resource[@]}"; do
    trace_resource+=(--trace-config "opentelemetry,resource=$attribute")
done

log "tritonserver: traces to $TRITON_TRACE_URL, models' spans to $OTEL_EXPORTER_OTLP_ENDPOINT"
exec tritonserver \
    --model-repository="$MODEL_REPOSITORY" \
    --model-config-name=gpu \
    --http-port="${TRITON_HTTP_PORT:-8000}" \
    --grpc-port="${TRITON_GRPC_PORT:-8001}" \
    --metrics-port="${TRITON_METRICS_PORT:-8002}" \
    --allow-metrics=true \
    --allow-gpu-metrics=true \
    --exit-timeout-secs=30 \
    --trace-config mode=opentelemetry \
    --trace-config "rate=${TRITON_TRACE_RATE:-1}" \
    --trace-config level=TIMESTAMPS \
    --trace-config "opentelemetry,url=$TRITON_TRACE_URL" \
    "${trace_resource[@]}" \
    "$@"
