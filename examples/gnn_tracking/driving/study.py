"""``make study``: the seeds' performance studies, reproduced on the reference deployment.

    python -m gnn_tracking.driving.study [--out study-output] [--seconds 2] [--quick]

Four sweeps with ``otelkit.study``, each into its own results file in ``--out``:

- ``options.jsonl``: the five service options at two concurrencies: the offload overhead per
  step of each (ExaTrkX);
- ``batch.jsonl``: the embedding model with 1 to 64 events' hits in one request: T = N/ℓ (SONIC);
- ``servers.jsonl``: the whole pipeline on Triton against the FastAPI twin;
- ``scaling.jsonl``: the whole pipeline (option 4) at 1 and 2 instances × 1 to 8 events in
  flight, on Triton (the ensemble, instances of every stage model) and on Ray Serve (replicas
  of one deployment running the pipeline): ε = (Tᵢ/i)/T₁ and strong scaling (AthenaTriton),
  and throughput against instances for the two servers side by side (NERSC).

One Triton serves them all, restarted once (for 2 instances); Ray Serve comes last
(``--no-ray`` leaves it out). Then one HTML page, ``report.html``, shows every sweep's plots,
verdicts and traces (``otelkit report``).

Every point's events are traced at most ``--traces-per-s`` a second into one receiver process
(``traces/``), so each point carries the breakdown of its sampled events; the verdicts of each
sweep are printed and are in its file. ``--quick`` shortens every sweep (the test suite's run).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch

from gnn_tracking.driving.client import event_pool
from gnn_tracking.driving.options import OPTIONS, Remote, reconstruct
from gnn_tracking.physics.models import Models, load_models
from gnn_tracking.serving.repository import REPOSITORY
from gnn_tracking.serving.stages import FEATURES, STAGE_ORDER, STAGES
from gnn_tracking.serving.twin import twin_process
from otelkit import semconv
from otelkit.receiver import ReceiverProcess
from otelkit.report import Report
from otelkit.study import (
    Endpoint,
    Load,
    RayServe,
    Server,
    Study,
    StudyError,
    StudyResults,
    Tracing,
    Triton,
)
from otelkit.study import Remote as StudyRemote

__all__ = ["SWEEPS", "Plan", "main"]

SWEEPS = ("options", "batch", "servers", "scaling")
RAY_PIPELINE = "gnn_tracking.serving.ray_app:pipeline_app"  # option 4 as one deployment
REPORT_GROUPS = tuple(
    f"{semconv.STUDY_PARAM}.{name}"
    for name in ("server", "option", "instances", "concurrency", "batch_size")
)
PROTOCOL: Literal["http", "grpc"] = (
    "http"  # gRPC with trace context crashes the bundled tritonserver 2.51 (known-issues)
)
# What the stage models need in Triton: stage spans follow the client's sampling decision. No
# Prometheus port: two instances of a model would both bind it.
MODELS_ENV = {
    "OTEL_SERVICE_NAME": "gnn-tracking-models",
    "OTEL_TRACES_SAMPLER": "parentbased_always_off",
    "OTELKIT_METRICS_EXPORTER": "none",
}


@dataclass(frozen=True)
class Plan:
    """The points of the four sweeps and how long each is measured."""

    seconds: float = 2.0
    warmup_s: float = 0.5
    instances: tuple[int, ...] = (1, 2)
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    option_concurrency: tuple[int, ...] = (1, 4)
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    server_concurrency: tuple[int, ...] = (1, 4)
    sweeps: tuple[str, ...] = SWEEPS
    traces_per_s: float = 20.0
    ray: bool = True  # Ray Serve beside Triton in the scaling sweep

    @classmethod
    def quick(cls) -> Plan:
        """The shortened study the test suite runs: one Triton start (no instance sweep)."""
        return cls(
            seconds=0.6,
            warmup_s=0.3,
            instances=(1,),
            concurrency=(1, 2),
            option_concurrency=(1,),
            batch_sizes=(1, 16),
            server_concurrency=(1, 2),
            ray=False,
        )


class Reconstruction:
    """One event reconstructed under the point's ``option`` (default 4): the request of a
    study. Served stages go through an instrumented tritonclient to the point's server."""

    def __init__(
        self, events: Sequence[torch.Tensor], models: Models, option: int, endpoint: Endpoint
    ) -> None:
        self.events, self.models, self.option = events, models, OPTIONS[option]
        self.remote = Remote(endpoint.url(PROTOCOL), PROTOCOL, timeout_s=30)

    def __call__(self, index: int) -> None:
        features = self.events[index % len(self.events)]
        reconstruct(self.option, features, self.models, self.remote)

    def close(self) -> None:
        self.remote.close()


class EmbedBatch(Reconstruction):
    """``batch_size`` events' hits embedded in one request: the embedding runs hit by hit, so
    the events of a request are a true batch of ``batch_size`` inferences."""

    def __init__(
        self, events: Sequence[torch.Tensor], models: Models, batch_size: int, endpoint: Endpoint
    ) -> None:
        super().__init__(events, models, 4, endpoint)
        count = len(events)
        self.batches = [
            torch.cat([events[(start + k) % count] for k in range(batch_size)])
            for start in range(0, count, max(1, count // 8))
        ]

    def __call__(self, index: int) -> None:
        self.remote.infer(STAGES["embed"], {FEATURES: self.batches[index % len(self.batches)]})


def say(message: str, started: float) -> None:
    print(f"[{time.monotonic() - started:6.1f} s] {message}", flush=True)


def run_sweeps(
    plan: Plan,
    out: Path,
    events: Sequence[torch.Tensor],
    models: Models,
    receiver: ReceiverProcess,
    started: float,
) -> dict[str, StudyResults]:
    """Every sweep of ``plan``, each into ``out/<sweep>.jsonl``; their results by name."""
    tracing = Tracing(
        plan.traces_per_s,
        endpoint=receiver.traces_url,
        directory=str(receiver.out_dir),
        service_name="gnn-tracking-study",
    )
    load = Load(seconds=plan.seconds, warmup_s=plan.warmup_s)

    def reconstruction(params: Mapping[str, Any], endpoint: Endpoint) -> Reconstruction:
        return Reconstruction(events, models, int(params.get("option", 4)), endpoint)

    def embed_batch(params: Mapping[str, Any], endpoint: Endpoint) -> Reconstruction:
        return EmbedBatch(events, models, int(params["batch_size"]), endpoint)

    def study(name: str, unit: str = "event", **options: Any) -> StudyResults:
        say(f"sweep {name}: {out / f'{name}.jsonl'}", started)
        # tritonserver 2.51's tracer crashes now and then even at 20 traced requests a second
        # (upstream issue 7795): a point it cuts short is measured again on a restarted Triton
        results = Study(
            load=load,
            tracing=tracing,
            out=out / f"{name}.jsonl",
            unit=unit,
            tolerance=0.2,
            progress=True,
            restarts=2,
            **options,
        ).run()
        print(results.summary() + "\n", flush=True)
        return results

    done: dict[str, StudyResults] = {}
    # ten stub processes loading torch take minutes on a loaded 2-core host: a long start
    triton = KeptTriton(
        Triton(
            REPOSITORY,
            models=STAGE_ORDER,
            env=MODELS_ENV,
            log_dir=out / "logs",
            startup_timeout=600,
        )
    )
    try:
        if "options" in plan.sweeps:
            sweep: dict[str, list[Any]] = {
                "option": [o.number for o in OPTIONS],
                "concurrency": list(plan.option_concurrency),
            }
            done["options"] = study("options", request=reconstruction, server=triton, sweep=sweep)
        if "batch" in plan.sweeps:
            sweep = {"batch_size": list(plan.batch_sizes)}
            done["batch"] = study(
                "batch", request=embed_batch, server=triton, sweep=sweep, unit="request"
            )  # of batch_size events: T = N/ℓ in events/s
        if "servers" in plan.sweeps:
            with twin_process(receiver.traces_url, out / "logs" / "fastapi.log") as twin_url:
                servers: dict[str, Server] = {"triton": triton, "fastapi": StudyRemote(twin_url)}
                sweep = {"server": list(servers), "concurrency": list(plan.server_concurrency)}
                done["servers"] = study(
                    "servers", request=reconstruction, servers=servers, sweep=sweep
                )
        if "scaling" in plan.sweeps:  # last: Triton restarts once, with 2 instances
            sweep = {"instances": list(plan.instances), "concurrency": list(plan.concurrency)}
            if len(plan.instances) == 1:  # along concurrency alone (strong scaling along it)
                sweep.pop("instances")
            if plan.ray:  # NERSC's figure: the two servers' throughput against instances
                scaling = {"triton": triton, "ray": RayServe(RAY_PIPELINE, num_cpus=2)}
                done["scaling"] = study(
                    "scaling",
                    request=reconstruction,
                    servers=scaling,
                    sweep={"server": list(scaling), **sweep},
                )
            else:
                done["scaling"] = study(
                    "scaling", request=reconstruction, server=triton, sweep=sweep
                )
    finally:
        triton.stop()
    return done


class KeptTriton(Server):
    """The pipeline's Triton, kept running from one sweep to the next (a study stops its
    servers at its end), at 1 instance of each stage model unless a point says otherwise:
    the sweeps share one start, which takes a minute on a loaded 2-core machine."""

    axes = ("instances",)

    def __init__(self, triton: Triton) -> None:
        self.triton = triton

    def prepare(self, params: Mapping[str, Any], traces_url: str | None) -> Endpoint:
        return self.triton.prepare({"instances": params.get("instances", 1)}, traces_url)

    def failure(self) -> str | None:
        return self.triton.failure()

    def describe(self) -> dict[str, Any]:
        return self.triton.describe()

    def stop(self) -> None:
        self.triton.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("study-output"))
    parser.add_argument("--seconds", type=float, default=Plan.seconds, help="measured per point")
    parser.add_argument("--sweeps", nargs="+", choices=SWEEPS, default=list(SWEEPS))
    parser.add_argument("--quick", action="store_true", help="the shortened study of the tests")
    parser.add_argument("--n-particles", type=int, default=40, help="event size (~10 hits each)")
    parser.add_argument("--no-ray", action="store_true", help="Triton alone in the scaling sweep")
    args = parser.parse_args(argv)
    plan = Plan.quick() if args.quick else Plan(seconds=args.seconds)
    plan = replace(plan, sweeps=tuple(args.sweeps), ray=plan.ray and not args.no_ray)
    out: Path = args.out
    started = time.monotonic()
    torch.set_num_threads(1)  # the client's threads are its parallelism, as in the seeds
    stale_files = [out / "report.html", *(out / f"{s}.jsonl" for s in SWEEPS)]
    for stale in [out / "traces", out / "logs", *stale_files]:
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    events, models = event_pool(32, args.n_particles), load_models()
    # in a process of its own: decoding the spans would take the GIL the study's threads need
    receiver = ReceiverProcess(out / "traces", max_concurrent=32).start()
    try:
        done = run_sweeps(plan, out, events, models, receiver, started)
    except StudyError as error:  # a point failed: its sweep's file holds the points done
        print(f"\n{error}", file=sys.stderr)
        return 1
    finally:
        receiver.stop()
    say(
        f"{len(done)} sweeps done; their results: {', '.join(f'{out}/{n}.jsonl' for n in done)}",
        started,
    )
    print("\n=== verdicts ===")
    for name, results in done.items():
        for verdict in results.verdicts:
            print(f"{name} [{verdict.curve or 'all'}] {verdict.kind}: {verdict.sentence}")
    page = Report.build(
        [out / "traces"],
        [out / f"{name}.jsonl" for name in done],
        group_by=REPORT_GROUPS,
        root_name=semconv.STUDY_SPAN,
    )
    page.title = "make study: the reference deployment"
    print(f"\nreport: {page.write_html(out / 'report.html').resolve()} (open it in a browser)")
    failed = [n for n, r in done.items() if r.status != "complete"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
