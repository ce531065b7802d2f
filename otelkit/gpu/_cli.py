"""``otelkit gpu``: look at the GPUs as otelkit sees them, and record them for replay.

otelkit gpu show                               # one sample, in the metrics' units
otelkit gpu record --out h100.json --samples 30 --interval 1
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from otelkit.gpu._backend import GpuBackend, GpuUnavailable
from otelkit.gpu._instruments import CLOCKS_EVENT_REASONS, FIELD_METRICS
from otelkit.gpu._replay import RecordingError, ReplayBackend, record
from otelkit.gpu._sampler import GpuSampler

__all__ = ["add_arguments", "run"]

logger = logging.getLogger("otelkit")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``show`` and ``record`` subcommands."""
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = actions.add_parser("show", help="print one sample of every GPU")
    show.add_argument("--replay", type=Path, help="show a recording's first sample instead")
    rec = actions.add_parser("record", help="record real NVML readings to a replay file")
    rec.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    rec.add_argument("--samples", type=int, default=10, help="how many samples (10)")
    rec.add_argument("--interval", type=float, default=1.0, help="seconds between them (1.0)")


def _backend(replay: Path | None) -> GpuBackend | None:
    return ReplayBackend(replay) if replay else None


def _show(replay: Path | None) -> int:
    sampler = GpuSampler(_backend(replay), torch_cuda=False).open()
    sampler.sample()
    sampler.stop()
    if not sampler.available:
        print(f"no GPU: {sampler.unavailable_reason or 'every GPU is lost'}")
        return 1
    for reading in sampler.latest.readings:
        device = reading.device
        mig = f" MIG instance {device.mig_instance}" if device.mig_instance is not None else ""
        print(f"GPU {device.index}{mig}: {device.name} {device.uuid}")
        for field, (spec, factor, extra) in FIELD_METRICS.items():
            if field in reading.values:
                tag = f" {extra}" if extra else ""
                print(f"  {spec.name}{tag} = {reading.values[field] * factor:g} {spec.unit}")
        mask = int(reading.values.get("clocks_event_reasons", 0))
        active = [reason for bit, reason in CLOCKS_EVENT_REASONS.items() if mask & bit]
        if active:
            print(f"  clocks held down by: {', '.join(active)}")
        for process in reading.processes:
            print(f"  pid {process.pid} {process.name} {process.used_bytes} B {process.owner}")
        skipped = sorted(sampler.unsupported.get(device.uuid, ()))
        if skipped:
            print(f"  not supported: {', '.join(skipped)}")
    return 0


def run(args: argparse.Namespace) -> int:
    """0 on success; 1 without a GPU; 2 on bad arguments or a bad recording."""
    try:
        if args.action == "show":
            return _show(args.replay)
        if args.samples < 1 or not args.interval > 0:
            print("--samples must be at least 1 and --interval positive", file=sys.stderr)
            return 2
        from otelkit.gpu._nvml import NvmlBackend

        devices = record(NvmlBackend(), args.out, args.samples, args.interval)
    except RecordingError as error:
        print(f"cannot replay: {error}", file=sys.stderr)
        return 2
    except GpuUnavailable as error:
        print(f"nothing to record: {error}", file=sys.stderr)
        return 1
    print(f"recorded {args.samples} samples of {devices} GPU device(s) to {args.out}")
    return 0
