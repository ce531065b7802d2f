"""Scaling a fleet on Slurm with the signal KEDA scales SuperSONIC on: queue time per execution.

A ``Scaler`` steps at each poll (``otelkit fleet scale``, every ``--interval`` seconds):

- it reads the fleet's **saturation** from Prometheus (by default queue milliseconds per
  execution over the last minute, summed over every Triton it scrapes), and the **servers** of
  the site from the registry (their names end with their Slurm job id: ``triton-<jobid>``);
- saturation held above ``high_ms`` for ``up_after_s`` asks for one more server (``sbatch``),
  and held below ``low_ms`` for ``down_after_s`` lets the newest one go (``scancel <jobid>``,
  which the job turns into a drain: ``otelkit fleet serve``); between the two thresholds
  nothing changes (hysteresis);
- never below ``min_servers`` or above ``max_servers``, counting jobs asked for that have not
  registered yet (for ``pending_s``), and never twice within ``cooldown_s``;
- each decision is a log line and counted (``Scaler.submitted``, ``Scaler.cancelled``); a
  Prometheus or registry that cannot be read changes nothing and is logged once an outage.

KEDA's defaults for SuperSONIC are the model: polling 30 s, cooldown 120 s, one pod at a time.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from otelkit._errors import FleetError

__all__ = ["SATURATION_QUERY", "Decision", "ScalePolicy", "Scaler", "prometheus_value", "slurm"]

_log = logging.getLogger("otelkit.fleet")

#: queue ms per execution over the last minute, every Triton summed (SuperSONIC's signal)
SATURATION_QUERY = (
    "sum(rate(nv_inference_queue_duration_us[1m])) / "
    "(sum(rate(nv_inference_exec_count[1m])) > 0) / 1e3"
)


@dataclass(frozen=True)
class ScalePolicy:
    """When to ask for a server and when to let one go (see the module's text)."""

    high_ms: float = 100.0
    low_ms: float = 10.0
    min_servers: int = 1
    max_servers: int = 4
    up_after_s: float = 60.0
    down_after_s: float = 600.0
    cooldown_s: float = 120.0
    pending_s: float = 900.0  # how long a job asked for counts before it registers

    def problems(self) -> list[str]:
        found = []
        if not 0 <= self.low_ms < self.high_ms:
            found.append(f"low_ms {self.low_ms}: 0 or more and below high_ms {self.high_ms}")
        if not 0 <= self.min_servers <= self.max_servers:
            found.append(f"min {self.min_servers} and max {self.max_servers} servers")
        if min(self.up_after_s, self.down_after_s, self.cooldown_s, self.pending_s) < 0:
            found.append("times are seconds, 0 or more")
        return found


@dataclass(frozen=True)
class Decision:
    """One step: what it read and what it did (``action``: up, down or none) and why."""

    saturation_ms: float | None
    servers: int
    pending: int
    action: str
    reason: str
    job: str | None = None


@dataclass
class Scaler:
    """Steps ``policy`` over readings; ``submit()`` returns the new job's id, ``cancel(job)``
    ends one; ``servers()`` are the site's registered server names."""

    policy: ScalePolicy
    saturation: Callable[[], float | None]
    servers: Callable[[], Sequence[str]]
    submit: Callable[[], str]
    cancel: Callable[[str], None]
    name_prefix: str = "triton-"
    clock: Callable[[], float] = time.monotonic
    submitted: int = 0
    cancelled: int = 0
    _above_since: float | None = None
    _below_since: float | None = None
    _last_action: float | None = None
    _pending: dict[str, float] = field(default_factory=dict)  # job -> asked at
    _failing: bool = False

    def __post_init__(self) -> None:
        problems = self.policy.problems()
        if problems:
            raise FleetError(f"scale policy: {'; '.join(problems)}")

    def _jobs(self, names: Sequence[str]) -> list[str]:
        pattern = re.compile(rf"^{re.escape(self.name_prefix)}(\d+)$")
        return [m.group(1) for n in names if (m := pattern.match(n))]

    def step(self) -> Decision:
        now = self.clock()
        try:
            saturation = self.saturation()
            jobs = self._jobs(self.servers())
        except FleetError as error:
            if not self._failing:
                _log.warning("fleet scale: cannot read the fleet, changing nothing: %s", error)
            self._failing = True
            return Decision(None, 0, len(self._pending), "none", f"unreadable: {error}")
        self._failing = False
        for job in list(self._pending):  # registered, or given up on
            if job in jobs or now - self._pending[job] > self.policy.pending_s:
                del self._pending[job]
        size = len(jobs) + len(self._pending)
        policy = self.policy
        cooling = self._last_action is not None and now - self._last_action < policy.cooldown_s
        if size < policy.min_servers and not cooling:  # a fleet with no server has no reading
            return self._up(saturation, jobs, f"{size} servers, fewer than {policy.min_servers}")
        if saturation is None:
            self._above_since = self._below_since = None
            return self._decide(saturation, jobs, "none", "no saturation reading")
        above, below = saturation > policy.high_ms, saturation < policy.low_ms
        if not above:
            self._above_since = None
        elif self._above_since is None:
            self._above_since = now
        if not below:
            self._below_since = None
        elif self._below_since is None:
            self._below_since = now
        if self._above_since is not None and now - self._above_since >= policy.up_after_s:
            if size >= policy.max_servers:
                return self._decide(saturation, jobs, "none", f"at the most, {size} servers")
            if cooling:
                return self._decide(saturation, jobs, "none", "cooling down")
            reason = f"saturation {saturation:.0f} ms above {policy.high_ms:g}"
            return self._up(saturation, jobs, reason)
        if self._below_since is not None and now - self._below_since >= policy.down_after_s:
            if size <= policy.min_servers or not jobs:
                return self._decide(saturation, jobs, "none", f"at the least, {size} servers")
            if cooling:
                return self._decide(saturation, jobs, "none", "cooling down")
            job = max(jobs, key=int)  # the newest
            try:
                self.cancel(job)
            except FleetError as error:
                _log.warning("fleet scale: could not cancel job %s: %s", job, error)
                return self._decide(saturation, jobs, "none", f"cancel failed: {error}")
            self.cancelled += 1
            self._last_action, self._below_since = now, None
            reason = f"saturation {saturation:.1f} ms below {policy.low_ms:g}"
            return self._decide(saturation, jobs, "down", reason, job)
        return self._decide(saturation, jobs, "none", "within bounds")

    def _up(self, saturation: float | None, jobs: list[str], reason: str) -> Decision:
        try:
            job = self.submit()
        except FleetError as error:
            _log.warning("fleet scale: could not ask for a server: %s", error)
            return self._decide(saturation, jobs, "none", f"submit failed: {error}")
        self.submitted += 1
        now = self.clock()
        self._pending[job] = now
        self._last_action, self._above_since = now, None
        return self._decide(saturation, jobs, "up", reason, job)

    def _decide(
        self,
        saturation: float | None,
        jobs: list[str],
        action: str,
        reason: str,
        job: str | None = None,
    ) -> Decision:
        decision = Decision(saturation, len(jobs), len(self._pending), action, reason, job)
        if action != "none":
            _log.info(
                "fleet scale: %s (job %s): %s; %d servers, %d pending",
                action,
                job,
                reason,
                decision.servers,
                decision.pending,
            )
        return decision


def prometheus_value(url: str, query: str, timeout_s: float = 5.0) -> float | None:
    """The value of an instant ``query`` at Prometheus ``url``: ``None`` when it has no sample
    (no execution in the window: an idle fleet), ``FleetError`` when it cannot be read."""
    address = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    try:
        with urllib.request.urlopen(address, timeout=timeout_s) as page:
            answer = json.load(page)
    except (OSError, ValueError) as error:
        raise FleetError(f"Prometheus at {url}: {error}") from None
    if answer.get("status") != "success":
        raise FleetError(f"Prometheus at {url}: {answer.get('error', answer)}")
    result = answer.get("data", {}).get("result", [])
    if not result:
        return None
    try:
        return float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError) as error:
        raise FleetError(f"Prometheus at {url}: an answer without a value: {error}") from None


def slurm(submit: str, cancel: str) -> tuple[Callable[[], str], Callable[[str], None]]:
    """``submit`` (``sbatch --parsable job.sbatch``, which prints the job id) and ``cancel``
    (``scancel {job}``) as the scaler's actions; ``FleetError`` naming a command that fails."""

    def run(words: list[str]) -> str:
        try:
            done = subprocess.run(words, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise FleetError(f"{words[0]}: {error}") from None
        if done.returncode != 0:
            raise FleetError(f"{' '.join(words)} exited {done.returncode}: {done.stderr[-300:]}")
        return done.stdout

    def submitted() -> str:
        out = run(shlex.split(submit)).strip()
        job = out.split(";", 1)[0].split()[-1] if out else ""  # --parsable: "id" or "id;cluster"
        if not job.isdigit():
            raise FleetError(f"{submit}: no job id in {out[:200]!r}")
        return job

    def cancelled(job: str) -> None:
        run([word.replace("{job}", job) for word in shlex.split(cancel)])

    return submitted, cancelled
