"""How the traces read were chosen, where their spans say it, and what that does to the figures.

A breakdown's percentiles stand for the requests traced. Head sampling chooses a trace before
its outcome is known, so the traces stand for the requests; tail sampling keeps a trace for
what happened in it (an error, a long duration), so a store it fed holds the slow and the
failed, and its percentiles run high. The spans say which, where:

- otelkit's processes name their head sampler on their resource (``otelkit.sampler``:
  ``parentbased_ratelimiting 10/s`` and so on); Jaeger's SDKs on the root span
  (``sampler.type``, ``sampler.param``);
- the Collector's tail sampling processor names the policy that kept a trace
  (``tailsampling.policy``, on the instrumentation scope, with the feature gate
  ``processor.tailsamplingprocessor.recordpolicy``; otelkit's reader puts it on each span).

Traces that say nothing are counted as such: the statement never guesses.

>>> sampling = Sampling()
>>> sampling.add(Span("ab" * 16, "cd" * 8, None, "e", SpanKind.SERVER, 0, 1,
...                   attributes={"tailsampling.policy": "slow"}))
>>> sampling.lines()[0].startswith("sampling: the Collector's tail sampling kept 1 of 1")
True
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from otelkit import semconv
from otelkit.analysis._spans import Span, SpanKind
from otelkit.analysis._store import StoreError, check_segment

__all__ = ["Sampling", "SpanKind", "sampling_of_segments"]

_log = logging.getLogger("otelkit.analysis")
_JAEGER_TYPE, _JAEGER_PARAM = "sampler.type", "sampler.param"


@dataclass
class Sampling:
    """The traces (counted at their root spans) each head sampler and tail policy chose."""

    roots: int = 0
    tail: dict[str, int] = field(default_factory=dict)  # policy -> roots it kept
    head: dict[str, set[str]] = field(default_factory=dict)  # sampler -> services using it

    def add(self, span: Span) -> None:
        """Count what ``span`` says of its trace's sampling (roots counted once a trace)."""
        sampler = span.resource.get(semconv.OTELKIT_SAMPLER)
        if sampler is None and _JAEGER_TYPE in span.attributes:
            sampler = f"{span.attributes[_JAEGER_TYPE]} {span.attributes.get(_JAEGER_PARAM, '')}"
        if sampler is not None:
            service = str(span.resource.get(semconv.SERVICE_NAME, "unknown service"))
            self.head.setdefault(str(sampler).strip(), set()).add(service)
        if span.parent_span_id is None:
            self.roots += 1
            policy = span.attributes.get(semconv.TAIL_SAMPLING_POLICY)
            if policy is not None:
                self.tail[str(policy)] = self.tail.get(str(policy), 0) + 1

    def update(self, spans: Iterable[Span]) -> Sampling:
        for span in spans:
            self.add(span)
        return self

    def lines(self) -> list[str]:
        """What the spans say of how their traces were chosen (none: they say nothing)."""
        out = []
        if self.head:
            chosen = "; ".join(
                f"{sampler} ({', '.join(sorted(services))})"
                for sampler, services in sorted(self.head.items())
            )
            out.append(
                f"sampling: head sampling in the services ({chosen}): each trace chosen before "
                "its outcome was known, the traces stand for the requests"
            )
        if self.tail:
            kept = sum(self.tail.values())
            policies = ", ".join(f"{name} {n}" for name, n in sorted(self.tail.items()))
            out.append(
                f"sampling: the Collector's tail sampling kept {kept} of {self.roots} traces "
                f"for their outcome ({policies}): a store it fed holds the slow and the failed, "
                "so its percentiles run high (the metrics count every request)"
            )
        return out


def sampling_of_segments(files: Sequence[str | Path]) -> Sampling:
    """``Sampling`` of the spans in span store segments, by DuckDB (no Python object a span)."""
    import duckdb

    found = Sampling()
    listed = []
    for path in files:  # a segment that cannot be read was named by the breakdown already
        try:
            check_segment(path)
            listed.append(str(path))
        except StoreError:
            continue
    if not listed:
        return found
    con = duckdb.connect()
    try:
        source = "read_parquet($files, union_by_name = true)"
        resource = f"ResourceAttributes['{semconv.OTELKIT_SAMPLER}']"
        jaeger = f"SpanAttributes['{_JAEGER_TYPE}']"
        rows = con.execute(
            f"SELECT DISTINCT coalesce({resource}, {jaeger} || ' ' || "
            f"coalesce(SpanAttributes['{_JAEGER_PARAM}'], '')), ServiceName FROM {source} "
            f"WHERE {resource} IS NOT NULL OR {jaeger} IS NOT NULL",
            {"files": listed},
        ).fetchall()
        for sampler, service in rows:
            found.head.setdefault(str(sampler).strip(), set()).add(service or "unknown service")
        policy = f"SpanAttributes['{semconv.TAIL_SAMPLING_POLICY}']"
        for value, count in con.execute(
            f"SELECT {policy}, count(*) FROM {source} WHERE ParentSpanId = '' GROUP BY ALL",
            {"files": listed},
        ).fetchall():
            found.roots += count
            if value is not None:
                found.tail[str(value)] = count
    except duckdb.Error as error:  # the statement is lost, not the breakdown beside it
        _log.warning("otelkit: the traces' sampling could not be read: %s", error)
        return Sampling()
    finally:
        con.close()
    return found
