"""The points of a sweep, and the check that each makes sense before anything runs.

A sweep is either a mapping of parameters to their values, whose product gives the points
(the first parameter changes slowest: put ``instances`` first so the server restarts least),
or an explicit list of points (strong scaling: concurrency and instances side by side).

Parameters a study knows: ``concurrency``, ``rate`` (the load), ``batch_size`` (the inputs),
``instances`` (the server) and ``server`` (a label among the study's servers). Any other one
(``option``, say) must be taken by the user's request factory or the server's reconfigure hook.
Each point is checked up front; a bad value is an error that names the point.

>>> [point_label(p) for p in expand({"instances": [1, 2], "concurrency": [1, 4]})][:3]
['instances=1 concurrency=1', 'instances=1 concurrency=4', 'instances=2 concurrency=1']
>>> check([{"concurrency": 0}], Load(), takers={})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
otelkit.errors.StudyError: otelkit study: point concurrency=0: concurrency is the number ...
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from otelkit.errors import StudyError
from otelkit.study.load import Load
from otelkit.study.point import point_label

__all__ = ["LOAD_PARAMS", "SweepSpec", "check", "expand"]

SweepSpec = Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]]
LOAD_PARAMS = ("concurrency", "rate")
MAX_INSTANCES = 256


def expand(sweep: SweepSpec | None) -> list[dict[str, Any]]:
    """The points of ``sweep``, in order (one empty point for no sweep)."""
    if not sweep:
        return [{}]
    if isinstance(sweep, Mapping):
        for name, values in sweep.items():
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
                raise StudyError(f"sweep parameter {name!r} needs a list of values, not {values!r}")
        names = list(sweep)
        return [
            dict(zip(names, combo, strict=True)) for combo in itertools.product(*sweep.values())
        ]
    points = [dict(point) for point in sweep]
    if not all(isinstance(point, dict) for point in points):
        raise StudyError("a sweep is a mapping of parameters to values, or a list of points")
    return points


def _whole(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def check(
    points: Sequence[Mapping[str, Any]],
    load: Load,
    *,
    takers: Mapping[str, str],
    servers: Collection[str] = (),
) -> None:
    """Raise ``StudyError`` naming the first point with a parameter that nothing takes or a
    value that makes no sense. ``takers`` maps each parameter the study's parts take to the
    part (``"*"`` for a request factory that takes any)."""
    for params in points:
        label = point_label(params)
        for name in params:
            if name in LOAD_PARAMS or name == "server":
                continue
            if name not in takers and "*" not in takers:
                known = ", ".join(sorted({*LOAD_PARAMS, *takers, *(["server"] if servers else [])}))
                raise StudyError(
                    f"nothing in this study takes the parameter {name!r} (it takes: {known})",
                    point=label,
                )
        problems = load.at(dict(params)).problems()
        if problems:
            raise StudyError(problems[0], point=label)
        if "concurrency" in params and "rate" in params:
            raise StudyError(
                "a point has a concurrency (closed loop) or a rate (open loop), not both",
                point=label,
            )
        if "batch_size" in params and not _whole(params["batch_size"], 1, 1 << 20):
            raise StudyError(
                "batch_size is a whole number of inferences, 1 or more, "
                f"not {params['batch_size']!r}",
                point=label,
            )
        if "instances" in params and not _whole(params["instances"], 1, MAX_INSTANCES):
            raise StudyError(
                f"instances is a whole number of model instances, 1 to {MAX_INSTANCES}, "
                f"not {params['instances']!r}",
                point=label,
            )
        if "server" in params and params["server"] not in servers:
            names = ", ".join(sorted(servers)) or "none: pass servers={label: server}"
            raise StudyError(
                f"no server labelled {params['server']!r} (servers: {names})", point=label
            )
