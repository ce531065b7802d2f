"""A real Prometheus (Debian's binary) for tests: scrape targets, query it, stop it.

    with PrometheusServer(binary, {"otelkit": ["127.0.0.1:9464"]}, tmp_path) as prometheus:
        prometheus.wait_for_targets()
        prometheus.query("up")

Exemplar storage and the lifecycle API are on. Ports are picked free and picked again when
another process takes one first.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from otelkit.dashboards import panel_queries, substitute
from otelkit.tritonserver import free_port

__all__ = ["PrometheusError", "PrometheusServer"]


class PrometheusError(RuntimeError):
    """Prometheus refused a request or could not start; the message holds its own words."""


class PrometheusServer:
    """``prometheus`` as a child process scraping ``targets`` (``{job: ["host:port", ...]}``)."""

    def __init__(
        self,
        binary: str,
        targets: Mapping[str, Sequence[str]] | None = None,
        directory: str | Path | None = None,
        *,
        scrape_interval: str = "1s",
        rule_files: Sequence[str | Path] = (),
        start_timeout: float = 20.0,
        scrape_configs: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self.binary = binary
        self.scrape_targets = dict(targets or {})
        self.scrape_interval = scrape_interval
        self.rule_files = [str(Path(path).resolve()) for path in rule_files]
        self.start_timeout = start_timeout
        self.extra_scrape_configs = [dict(c) for c in scrape_configs]  # file_sd, metrics paths
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if directory is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="prometheus-")
            directory = self._tmp.name
        self.directory = Path(directory)
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._log = self.directory / "prometheus.log"

    # -- life cycle ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        """The configuration Prometheus runs with (JSON is YAML)."""
        return {
            "global": {
                "scrape_interval": self.scrape_interval,
                "evaluation_interval": self.scrape_interval,
            },
            "rule_files": self.rule_files,
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(addresses)}]}
                for job, addresses in self.scrape_targets.items()
            ]
            + self.extra_scrape_configs,
        }

    def start(self, attempts: int = 3) -> PrometheusServer:
        """Start and wait for ``/-/ready``; a port taken meanwhile is picked again."""
        config = self.directory / "prometheus.yml"
        config.write_text(json.dumps(self.config(), indent=2))
        for attempt in range(1, attempts + 1):
            self.port = free_port()
            with self._log.open("wb") as log:
                self._process = subprocess.Popen(
                    [
                        self.binary,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={self.directory / 'data'}",
                        f"--web.listen-address=127.0.0.1:{self.port}",
                        "--enable-feature=exemplar-storage",
                        "--web.enable-lifecycle",
                        "--log.level=warn",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            if self._wait_ready():
                return self
            self.stop()
            log_text = self._log.read_text(errors="replace")
            if "address already in use" not in log_text or attempt == attempts:
                raise PrometheusError(f"prometheus did not become ready:\n{log_text[-3000:]}")
        raise AssertionError("unreachable")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        """Terminate Prometheus (kill it after 5 s); idempotent."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    # -- HTTP API --------------------------------------------------------------------------------

    def api(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """``data`` of a ``/api/v1/<path>`` answer (POSTed form); raises with Prometheus's error."""
        body = urllib.parse.urlencode(params or {}).encode() if params is not None else None
        request = urllib.request.Request(f"{self.url}/api/v1/{path}", data=body)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as error:
            text = error.read().decode(errors="replace")
            try:
                answer = json.loads(text)
            except json.JSONDecodeError:
                raise PrometheusError(f"HTTP {error.code} from /api/v1/{path}: {text}") from None
        if answer.get("status") != "success":
            raise PrometheusError(f"{answer.get('errorType')}: {answer.get('error')}")
        return answer["data"]

    def query(self, expr: str, time_s: float | None = None) -> dict[str, Any]:
        """An instant query: ``{"resultType": ..., "result": [...]}``."""
        params = {"query": expr}
        if time_s is not None:
            params["time"] = str(time_s)
        data: dict[str, Any] = self.api("query", params)
        return data

    def query_range(self, expr: str, start: float, end: float, step: str = "1s") -> dict[str, Any]:
        """A range query between two Unix times."""
        params = {"query": expr, "start": str(start), "end": str(end), "step": step}
        data: dict[str, Any] = self.api("query_range", params)
        return data

    def query_exemplars(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        """Exemplars of the series ``expr`` selects: ``[{"seriesLabels", "exemplars"}, ...]``."""
        data: list[dict[str, Any]] = self.api(
            "query_exemplars", {"query": expr, "start": str(start), "end": str(end)}
        )
        return data

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets with their ``health``, ``lastError`` and ``lastScrape``."""
        found: dict[str, Any] = self.api("targets?state=active")
        active: list[dict[str, Any]] = found["activeTargets"]
        return active

    def wait_for_targets(
        self, timeout: float = 15.0, down_jobs: frozenset[str] = frozenset()
    ) -> list[dict[str, Any]]:
        """The targets once every one of them was scraped: successfully, or, for the jobs in
        ``down_jobs`` (targets meant to be down), not; fails after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            targets = self.targets()
            wanted = ["down" if t["labels"].get("job") in down_jobs else "up" for t in targets]
            if targets and [target["health"] for target in targets] == wanted:
                return targets
            if time.monotonic() > deadline:
                states = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets]
                raise PrometheusError(f"targets not all up after {timeout} s: {states}")
            time.sleep(0.1)


# -- dashboards' queries against a real Prometheus -----------------------------------------

FALLBACK = re.compile(r"\s+or\s+vector\(\s*0\s*\)\s*$")


def evaluated_queries(dashboards: dict[str, dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(dashboard, panel, PromQL) for every query of every panel, as Grafana would send it, and
    each query with an ``or vector(0)`` fallback once more without it."""
    queries = []
    for name, dashboard in sorted(dashboards.items()):
        for query in panel_queries(dashboard):
            expr = substitute(query.expr, {"__rate_interval": "4s", "__range": "1m"})
            queries.append((name, query.panel, expr))
            bare = FALLBACK.sub("", expr)
            if bare != expr:
                queries.append((name, query.panel, bare))
    return queries


def without_data(
    prometheus: PrometheusServer, queries: list[tuple[str, str, str]]
) -> list[tuple[str, str, str]]:
    return [query for query in queries if not prometheus.query(query[2])["result"]]
