"""The scaler's decisions over a scripted run of readings and a clock of its own: bounds,
hysteresis, cooldown, jobs pending; the real run is tests/fleet/test_slurm.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from otelkit._errors import FleetError
from otelkit.fleet._scale import ScalePolicy, Scaler, prometheus_value, slurm

POLICY = ScalePolicy(
    high_ms=100,
    low_ms=10,
    min_servers=1,
    max_servers=3,
    up_after_s=60,
    down_after_s=300,
    cooldown_s=120,
    pending_s=600,
)


@dataclass
class Site:
    """What the scaler reads and does, as a list of calls: the registry's servers are the jobs
    that have 'registered'."""

    saturation: float | None = 0.0
    registered: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    now: float = 0.0
    next_job: int = 100

    def submit(self) -> str:
        self.next_job += 1
        self.calls.append(f"sbatch {self.next_job}")
        return str(self.next_job)

    def cancel(self, job: str) -> None:
        self.calls.append(f"scancel {job}")
        self.registered.remove(f"triton-{job}")

    def scaler(self, policy: ScalePolicy = POLICY) -> Scaler:
        return Scaler(
            policy,
            saturation=lambda: self.saturation,
            servers=lambda: list(self.registered),
            submit=self.submit,
            cancel=self.cancel,
            clock=lambda: self.now,
        )


def run(site: Site, scaler: Scaler, seconds: float, every_s: float = 30) -> list[str]:
    actions = []
    end = site.now + seconds
    while site.now < end:
        decision = scaler.step()
        if decision.action != "none":
            actions.append(f"{decision.action} {decision.job} at {site.now:g}")
        site.now += every_s
    return actions


def test_below_the_least_it_asks_at_once_and_counts_the_pending_job() -> None:
    site = Site(registered=[])
    scaler = site.scaler()
    assert run(site, scaler, 600) == ["up 101 at 0"]  # pending: not asked again
    site.registered.append("triton-101")
    assert run(site, scaler, 600) == []


def test_saturation_held_asks_for_one_more_after_up_after_and_never_within_the_cooldown() -> None:
    site = Site(saturation=250.0, registered=["triton-7"])
    scaler = site.scaler()
    actions = run(site, scaler, 400)
    # above 100 ms from 0 s: the first ask at 60 s, the next once the cooldown is over (held
    # again from 90 s)
    assert actions == ["up 101 at 60", "up 102 at 180"]
    assert scaler.submitted == 2
    decision = scaler.step()  # 1 registered + 2 asked for, not yet registered: 3
    assert (decision.action, decision.pending, decision.reason) == (
        "none",
        2,
        "at the most, 3 servers",
    )
    site.registered += ["triton-101", "triton-102"]  # they start and register
    assert run(site, scaler, 900) == []  # 3 registered: still the most


def test_a_short_burst_asks_for_nothing() -> None:
    site = Site(saturation=250.0, registered=["triton-7"])
    scaler = site.scaler()
    assert run(site, scaler, 60) == []  # 0 and 30 s: held 30 s, under up_after
    site.saturation = 50.0  # between the thresholds: the clock for "above" starts again
    assert run(site, scaler, 60) == []
    site.saturation = 250.0
    assert run(site, scaler, 60) == []


def test_idle_lets_the_newest_go_after_down_after_and_never_below_the_least() -> None:
    site = Site(saturation=1.0, registered=["triton-7", "triton-12", "triton-9"])
    scaler = site.scaler()
    actions = run(site, scaler, 1200)
    assert actions == ["down 12 at 300", "down 9 at 630"]
    assert site.registered == ["triton-7"]
    assert run(site, scaler, 1200) == []


def test_between_the_thresholds_nothing_changes_whatever_the_time() -> None:
    site = Site(saturation=50.0, registered=["triton-7", "triton-8"])
    assert run(site, site.scaler(), 3600) == []


def test_no_reading_changes_nothing_and_an_unreadable_fleet_is_no_decision() -> None:
    site = Site(saturation=None, registered=["triton-7", "triton-8"])
    scaler = site.scaler()
    assert run(site, scaler, 3600) == []

    def unreadable() -> list[str]:
        raise FleetError("etcd at http://etcd:2379: kv/range: connection refused")

    scaler.servers = unreadable
    decision = scaler.step()
    assert decision.action == "none" and "unreadable" in decision.reason


def test_a_failing_sbatch_is_logged_and_counted_as_no_action() -> None:
    site = Site(registered=[])

    def failing() -> str:
        raise FleetError("sbatch exited 1: Invalid account")

    scaler = site.scaler()
    scaler.submit = failing
    decision = scaler.step()
    assert decision.action == "none" and "Invalid account" in decision.reason
    assert scaler.submitted == 0


@pytest.mark.parametrize(
    ("policy", "reason"),
    [
        (ScalePolicy(high_ms=10, low_ms=20), "below high_ms"),
        (ScalePolicy(min_servers=3, max_servers=2), "min 3 and max 2"),
        (ScalePolicy(cooldown_s=-1), "seconds"),
    ],
)
def test_a_policy_that_cannot_hold_is_refused(policy: ScalePolicy, reason: str) -> None:
    with pytest.raises(FleetError, match=reason):
        Site().scaler(policy)


def test_slurms_answers_are_read_and_its_failures_named(tmp_path: object) -> None:
    submit, cancel = slurm("echo 4242;perlmutter", "true {job}")
    assert submit() == "4242"
    cancel("4242")
    broken, _ = slurm("echo Submitted batch job", "true")
    with pytest.raises(FleetError, match="no job id"):
        broken()
    _, failing = slurm("echo 1", "false {job}")
    with pytest.raises(FleetError, match="exited 1"):
        failing("1")


def test_an_unreachable_prometheus_is_a_fleet_error() -> None:
    with pytest.raises(FleetError, match=r"Prometheus at http://127\.0\.0\.1:9"):
        prometheus_value("http://127.0.0.1:9", "up", timeout_s=1)
