"""One point measured several times, the sweep's passes interleaved: the merge of its repeats.

A state of the client or the host can last a whole point: the client's interpreter handing its
GIL over between threads, or not, for seconds (docs/study.md: 2,913 and 5,280 requests/s at one
point of one deployment, in two runs a minute apart). A point's windows, parts of one stretch of
time, cannot see such a state, and a verdict read from them may name a limit that the next run
does not. ``Load(repeats=R)`` measures every point ``R`` times, each pass over the whole sweep
before the next, so that each point's repeats lie minutes apart; ``merge_repeats`` makes one
point of them.

The merged point's figures are its repeats' together: requests, seconds and the client's CPU
add up, percentiles come from the merged histograms, Triton's and the host's figures are the
repeats', weighted by requests and by seconds. Its **windows are its repeats**, one each, with
the figures read over the whole repeat: every interval the verdicts use (a throughput's noise,
the separation of two resources' utilisations, paired repeat by repeat) then comes from the
spread between repeats, the one that holds a state lasting a point. With three repeats that
agree the intervals stay narrow; with repeats in different states they widen, and a verdict
says it cannot separate what the repeats disagree on, run after run. Two repeats give one
degree of freedom (Student's t of 12.7): give three or more.

>>> a = Point(0, {"concurrency": 2}, requests=300, seconds=1.0)
>>> b = Point(0, {"concurrency": 2}, requests=500, seconds=1.0)
>>> both = merge_repeats([a, b])
>>> both.throughput, both.repeats, [w.throughput for w in both.windows]
(400.0, 2, [300.0, 500.0])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from otelkit.study._counters import HostUsage, ModelFigures
from otelkit.study._point import Point, Window, judge_merged, merged_outcomes

__all__ = ["merge_repeats"]

#: ModelFigures' times, each a mean over the model's requests
_PER_REQUEST = ("queue_ms", "compute_input_ms", "compute_infer_ms", "compute_output_ms")
#: HostUsage's rates, each a mean over the window's seconds
_RATES = ("busy_cores", "server_cores", "python_cores", "idle_cores", "balancer_cores")


def merge_repeats(repeats: Sequence[Point], max_error_share: float = 0.01) -> Point:
    """One point from ``repeats`` of it, measured one after another (see the module).

    A failed repeat fails the point (its error); the error share is the repeats' together.
    The traces are the last repeat's: the study reads them once, for every repeat's sampled
    requests, after the last (``Study``)."""
    if not repeats:
        raise ValueError("no repeats to merge")
    first, last = repeats[0], repeats[-1]
    if len(repeats) == 1:
        return first
    seconds = [r.seconds for r in repeats]
    merged = Point(
        first.index,
        dict(first.params),
        requests=sum(r.requests for r in repeats),
        seconds=sum(seconds),
        batch_size=first.batch_size,
        windows=[_window(r) for r in repeats],
        cpu_s=sum(r.cpu_s for r in repeats),
        triton=_models([r.triton for r in repeats]),
        gpus=last.gpus,  # gauges read at a window's end: the last
        gpu_instances=last.gpu_instances,
        traces=last.traces,
        sampled=sum(r.sampled for r in repeats),
        parts=first.parts,
        started_at=first.started_at,
        restarts=[why for r in repeats for why in r.restarts],
        host=_host([r.host for r in repeats]),
        parallelism=dict(last.parallelism),
        process_cores=_weighted([r.process_cores for r in repeats], seconds),
        payload_bytes=first.payload_bytes,
        link_gbps=first.link_gbps,
        repeats=len(repeats),
        **merged_outcomes(repeats),
    )
    judge_merged(merged, repeats, max_error_share)
    return merged


def _window(repeat: Point) -> Window:
    """A repeat as one window of the merged point: its throughput and percentiles, and what
    was read over it where its own windows were read at their edges (else none, as a window
    of a point measured to a count of requests has none)."""
    window = Window(repeat.throughput, repeat.latency_ms(0.5), repeat.latency_ms(0.99))
    parts = repeat.windows
    if not parts or any(w.requests is None or w.seconds is None for w in parts):
        return window
    cpu = [w.cpu_s for w in parts]
    return replace(
        window,
        requests=sum(w.requests or 0 for w in parts),
        seconds=sum(w.seconds or 0.0 for w in parts),
        cpu_s=None if any(c is None for c in cpu) else sum(c or 0.0 for c in cpu),
        busy_cores=_rate(parts, lambda w: w.busy_cores),
        python_cores=_rate(parts, lambda w: w.python_cores),
        balancer_cores=_rate(parts, lambda w: w.balancer_cores),
        process_cores=_weighted([w.process_cores for w in parts], [w.seconds for w in parts]),
        triton=_models([w.triton for w in parts]) if all(w.triton for w in parts) else {},
    )


def _rate(parts: Sequence[Window], read: Callable[[Window], float | None]) -> float | None:
    """A rate over the parts, weighted by their lengths; none where a part has none."""
    values = [read(w) for w in parts]
    if any(v is None for v in values):
        return None
    total = sum(w.seconds or 0.0 for w in parts)
    if not total:
        return None
    return sum((v or 0.0) * (w.seconds or 0.0) for v, w in zip(values, parts, strict=True)) / total


def _weighted(
    maps: Sequence[Mapping[str, float]], weights: Sequence[float | None]
) -> dict[str, float]:
    """Each key's mean over the maps, weighted; only the keys every map holds."""
    if not maps:
        return {}
    keys = set(maps[0]).intersection(*maps[1:])
    total = sum(w or 0.0 for w in weights)
    if not total:
        return {}
    return {
        k: sum(m[k] * (w or 0.0) for m, w in zip(maps, weights, strict=True)) / total
        for k in sorted(keys)
    }


def _models(runs: Sequence[Mapping[str, ModelFigures]]) -> dict[str, ModelFigures]:
    """Triton's figures per model over consecutive stretches: counts add up, times per request
    are weighted by each stretch's requests; the configuration, and what was pending, is the
    last stretch's. Only the models every stretch has."""
    if not runs:
        return {}
    merged = {}
    for model in set(runs[0]).intersection(*runs[1:]):
        each = [r[model] for r in runs]
        requests = sum(f.requests for f in each)
        times = {
            name: sum(getattr(f, name) * f.requests for f in each) / requests if requests else 0.0
            for name in (*_PER_REQUEST, "request_ms")
        }
        end = each[-1]
        merged[model] = ModelFigures(
            requests=requests,
            failures=sum(f.failures for f in each),
            inferences=sum(f.inferences for f in each),
            executions=sum(f.executions for f in each),
            pending=end.pending,
            instances=end.instances,
            ensemble=end.ensemble,
            max_batch_size=end.max_batch_size,
            batch_delay_ms=end.batch_delay_ms,
            **times,
        )
    return merged


def _host(usages: Sequence[HostUsage | None]) -> HostUsage | None:
    """The host's use over consecutive windows: each rate weighted by the windows' seconds."""
    if not usages or any(u is None for u in usages):
        return None
    each = [u for u in usages if u is not None]
    seconds = [u.seconds for u in each]
    total = sum(seconds)
    rates: dict[str, float | None] = {}
    for name in _RATES:
        values = [getattr(u, name) for u in each]
        rates[name] = (
            None
            if any(v is None for v in values) or not total
            else sum(v * s for v, s in zip(values, seconds, strict=True)) / total
        )
    end = each[-1]
    return HostUsage(
        cores=end.cores,
        seconds=total,
        python_processes=end.python_processes,
        balancer_workers=end.balancer_workers,
        **rates,
    )
