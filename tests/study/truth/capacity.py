"""The throughput each deployment of the study's truth table allows by construction, and how far
a measurement of it may stray.

A Triton model's limit is read from its ``config.pbtxt``, parsed into Triton's own
``ModelConfig`` message: the ``stages`` parameter (tests/study/truth/stages.py), the
``instance_group`` count, an ensemble's steps. The Python server, the Ray replica and the busy
client state the CPU a request costs them as a constant beside the code that spends it. A limit
is the least of:

- a model's instances: m / (its stages' time a request), an instance serving one at a time;
- the lock every instance shares: 1 / (the time a request holds it);
- a pool of k tokens a model's instances share: k / (the time a request holds one);
- the host's cores: cores / (the CPU a request spins);
- one Python process's GIL: 1 / (the CPU its Python spends a request).

Where sleeps, a lock and instances set the limit, the host does not: a plateau is at most the
limit and at least what it gives with Triton's own cost a request added. Where CPU sets it (the
cores, a GIL), the limit is what the constructed demand allows with the CPU to itself: an upper
bound, and the floor a stated share of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tests.study.truth.stages import parse, pool_size

MODELS = Path(__file__).parent / "models"

# Triton's own time a request on a Python-backend instance, beside the model's stages: the
# request's way into the model's stub process and back, the stages' spans, a sleep's overshoot.
# The plateaus of "saturated" and "step_slow" put it at 0.4-0.9 ms on a quiet 2-core host
# (docs/study.md), 1-1.5 ms with other test runs keeping 3 to 13 tasks runnable on its cores;
# 2 ms bounds it, and still fails a 10 ms instance that serves a fifth less than 100/s.
TRITON_OVERHEAD_S = 0.002

# The lock's time between holders: the holder's sleep overshooting, its unlock waking the next
# instance's process. The 6 ms hold cycles in 6.3-6.4 ms on a host with a core to spare for the
# woken process; 1 ms bounds it, and still fails a lock held over "prep" as well (1 / 8 ms,
# 125/s). With 13 tasks runnable on the 2 cores the woken waits for one: 7.7 ms once.
HANDOFF_S = 0.001

# What CPU allows is known only within what the host gives: the deployment's other CPU a
# request (Triton's, the client's, a proxy's) and other processes on a shared host take from
# it, to 0.83-0.88 of the limit on a quiet 2-core host (docs/study.md). The floor stays above
# half, which the constructed demand counted twice, or one core of two, would give; a host
# whose other processes keep more than a core busy gives less (the GIL server 0.58 of its
# limit with 13 tasks runnable on the 2 cores).
SHARED_HOST = 0.6

# A prediction's demand is measured at least the constructed one, so it predicts at most the
# limit, but CPU times come in /proc's 10 ms ticks: two of a lowest point's second or more of
# busy CPU are 2 %.
TICKS = 0.02


@dataclass(frozen=True)
class Capacity:
    """A deployment's limit by construction and the bounds a plateau of it must meet."""

    per_s: float  # the limit, requests a second
    why: str  # how the limit follows from the deployment
    least_per_s: float  # the least a plateau, measured or predicted, may be
    least_why: str  # where that floor comes from
    # the most requests in service at the limit at once (None: as many as are sent), which an
    # open loop's window may count beyond it
    partway: int | None
    request_s: float  # the least time one request takes alone (Little's law: the sweep's reach)


@dataclass(frozen=True)
class Model:
    """A truth-table model as its config.pbtxt makes it."""

    name: str
    instances: int
    stages: tuple[tuple[str, str, float], ...]  # (name, kind, seconds), in order
    steps: tuple[str, ...]  # an ensemble's models, in order
    per_execution: bool
    max_queue_delay_s: float  # the dynamic batcher's, 0 without one
    max_batch_size: int = 0


def model(name: str) -> Model:
    """``name``'s config.pbtxt under tests/study/truth/models."""
    config = text_format.Parse(
        (MODELS / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    return Model(
        name,
        sum(group.count for group in config.instance_group),
        tuple(parse(parameters.get("stages", ""))),
        tuple(step.model_name for step in config.ensemble_scheduling.step),
        parameters.get("per_execution") == "true",
        config.dynamic_batching.max_queue_delay_microseconds / 1e6,
        config.max_batch_size,
    )


def host_cores() -> int:
    """The cores this process (and the servers it starts) may run on."""
    return len(os.sched_getaffinity(0))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:g} ms"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _by_cpu(per_s: float, why: str, partway: int | None, request_s: float) -> Capacity:
    least_why = (
        f"{SHARED_HOST:g} of it: the limit is the CPU's, which the deployment's other work "
        "and the host's other processes share (SHARED_HOST)"
    )
    return Capacity(per_s, why, SHARED_HOST * per_s, least_why, partway, request_s)


def triton(name: str, rows: int = 1) -> Capacity:
    """The limit of Triton model ``name`` (an ensemble: the least of its steps'), its requests
    ``rows`` rows each, on this host's cores."""
    found = model(name)
    if found.per_execution:
        raise ValueError(f"{name}'s stages run once a batch: its limit is the batches formed")
    path = [model(step) for step in found.steps] if found.steps else [found]
    timed = [
        (m, [(stage, kind, s * rows if kind == "rows" else s) for stage, kind, s in m.stages])
        for m in path
    ]
    request_s = sum(s for _, stages in timed for _, _, s in stages)
    limits = []
    for m, stages in timed:
        busy = sum(s for _, _, s in stages)
        why = (
            f"{m.name}'s {_plural(m.instances, 'instance')}, {_ms(busy)} a request: "
            f"{m.instances} / {_ms(busy)}"
        )
        per_s = m.instances / busy
        if any(kind == "spin" for _, kind, _ in stages):
            limits.append(_by_cpu(per_s, why, m.instances, request_s))
            continue
        least_why = f"{m.instances} / ({_ms(busy)} + Triton's {_ms(TRITON_OVERHEAD_S)})"
        limits.append(
            Capacity(
                per_s,
                why,
                m.instances / (busy + TRITON_OVERHEAD_S),
                f"{least_why} (TRITON_OVERHEAD_S)",
                m.instances,
                request_s,
            )
        )
    held = [(m, stage, s) for m, stages in timed for stage, kind, s in stages if kind == "lock"]
    if held:
        hold = sum(s for _, _, s in held)
        holders = " and ".join(f"{stage} ({_ms(s)})" for _, stage, s in held)
        every = sum(m.instances for m, _ in timed)
        why = f"{holders} under a lock all {every} instances share: 1 / {_ms(hold)}"
        least_why = f"1 / ({_ms(hold)} + {_ms(HANDOFF_S)} passing it on) (HANDOFF_S)"
        limits.append(Capacity(1 / hold, why, 1 / (hold + HANDOFF_S), least_why, 1, request_s))
    for m, stages in timed:
        for stage, kind, s in stages:
            k = pool_size(kind)
            if k is None:
                continue
            why = f"{stage} ({_ms(s)}) holding one of {m.name}'s {k} tokens: {k} / {_ms(s)}"
            least_why = f"{k} / ({_ms(s)} + {_ms(HANDOFF_S)} passing a token on) (HANDOFF_S)"
            limits.append(Capacity(k / s, why, k / (s + HANDOFF_S), least_why, k, request_s))
    cpu_s = sum(s for _, stages in timed for _, kind, s in stages if kind == "spin")
    if cpu_s:
        cores = host_cores()
        why = f"{_ms(cpu_s)} of CPU a request on the host's {cores} cores: {cores} / {_ms(cpu_s)}"
        spinning = sum(m.instances for m, stages in timed if any(k == "spin" for _, k, _ in stages))
        limits.append(_by_cpu(cores / cpu_s, why, spinning, request_s))
    return min(limits, key=lambda limit: limit.per_s)


def batches(name: str) -> Capacity:
    """The limit of Triton model ``name`` whose stages run once an execution (a batch of up to
    its ``max_batch_size`` requests, one row each): m x batch / (its stages' time)."""
    found = model(name)
    if not found.per_execution or found.max_batch_size < 2:
        raise ValueError(f"{name}'s stages run once a request: triton({name!r}) is its limit")
    busy = sum(s for _, _, s in found.stages)
    full = found.instances * found.max_batch_size
    why = (
        f"{_plural(found.instances, 'instance')} executing batches of up to "
        f"{found.max_batch_size} in {_ms(busy)}: {full} / {_ms(busy)}"
    )
    # an execution holds its instance for its stages and for each of its requests' way into
    # the stub and back: Triton's own time a request, times the batch
    size = found.max_batch_size
    least_why = (
        f"{full} / ({_ms(busy)} + {size} x Triton's {_ms(TRITON_OVERHEAD_S)}) "
        "(TRITON_OVERHEAD_S, for each request of a full batch)"
    )
    least = full / (busy + size * TRITON_OVERHEAD_S)
    return Capacity(full / busy, why, least, least_why, full, busy)


def python_process(cpu_s: float, whose: str, request_s: float | None = None) -> Capacity:
    """The limit of one Python process that spends ``cpu_s`` of CPU a request under its GIL;
    ``request_s`` is a request's least time alone where it is more than that CPU."""
    why = f"{whose} Python, {_ms(cpu_s)} of CPU a request under one GIL: 1 / {_ms(cpu_s)}"
    return _by_cpu(1 / cpu_s, why, None, request_s or cpu_s)


def replicas(count: int, cpu_s: float, whose: str) -> Capacity:
    """The limit of ``count`` replicas, each a Python process spending ``cpu_s`` of CPU a
    request, one request at a time."""
    why = (
        f"{whose}'s {_plural(count, 'replica')}, {_ms(cpu_s)} of CPU a request each: "
        f"{count} / {_ms(cpu_s)}"
    )
    return _by_cpu(count / cpu_s, why, count, cpu_s)
