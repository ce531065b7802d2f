"""``otelkit study``: sweep a deployment, measure every point, and name what caps throughput.

>>> from otelkit.study import Load, Study, Tracing, Triton
>>> results = Study(
...     model="sleep_fp32",                                  # or request=factory(params, endpoint)
...     server=Triton("tests/models"),                       # or Remote("host:8000"), "host:8000"
...     load=Load(seconds=5, warmup_s=1),                    # closed loop; Load(rate=...) open
...     sweep={"instances": [1, 2], "concurrency": [1, 2, 4]},
...     tracing=Tracing(per_second=20),                      # the sampled share; None: no traces
...     out="study.jsonl",
... ).run()  # doctest: +SKIP
>>> print(results.summary())  # doctest: +SKIP
>>> results.figure("efficiency"), results.verdicts  # doctest: +SKIP
>>> differences, _ = compare(read_results("before.jsonl"), results)  # doctest: +SKIP

Every point records client throughput, latency percentiles, errors by kind and CPU; Triton's
queue and compute per request and execution, batch size and saturation; and the trace
breakdown of its sampled requests. Across points: ε, strong scaling, T = N/ℓ, offload per step,
knees, and one verdict per curve. The command: ``otelkit study run|show|predict|compare|merge``.

The package reads in its flow; its modules are private (import from ``otelkit.study``).
``runner`` expands the sweep and runs it point by point;
``drive`` loads the server (threads or asyncio tasks, closed or open loop) through a
``workload`` on one of the ``servers`` (or a ``fleet`` of them behind Envoy); ``measure`` opens
and closes the window around it, reading ``counters`` (the hosts' CPU, Triton's metrics, the
GPU exporter) and ``traces``; the result is a ``point``. Across points, ``derived`` computes
the figures of merit, ``capacity`` the operational model of each point, ``verdicts`` what caps
each curve and ``predict`` what a change would give; ``results`` writes and reads the file,
and compares two. ``parts`` merges points driven by several client processes, ``repeats`` a
point measured in several passes over the sweep; ``cli`` is the command.
"""

from __future__ import annotations

from otelkit._errors import StudyError
from otelkit.study._drive import Load
from otelkit.study._fleet import Fleet
from otelkit.study._point import Point, merge_parts
from otelkit.study._results import StudyResults, compare, format_comparison, read_results
from otelkit.study._runner import Study, Tracing, run
from otelkit.study._servers import Endpoint, RayServe, Remote, Server, Triton
from otelkit.study._workload import FunctionCalls, ModelCalls, Workload

__all__ = [
    "Endpoint",
    "Fleet",
    "FunctionCalls",
    "Load",
    "ModelCalls",
    "Point",
    "RayServe",
    "Remote",
    "Server",
    "Study",
    "StudyError",
    "StudyResults",
    "Tracing",
    "Triton",
    "Workload",
    "compare",
    "format_comparison",
    "merge_parts",
    "read_results",
    "run",
]
