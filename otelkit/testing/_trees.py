"""A trace as a test compares it: rows of (depth, name, kind), and where its time went."""

from __future__ import annotations

from collections.abc import Iterable

from otelkit.analysis import Span, Trace, build_traces, trace_components

__all__ = ["components", "tree"]


def tree(spans: Iterable[Span] | Trace) -> list[tuple[int, str, str]]:
    """``(depth, name, kind)`` of every span, depth first from each root, trace after trace in
    the order their first spans started; roots (and spans whose parent has not arrived) are at
    depth 0. A whole tree is one ``==`` in a test.

    >>> from otelkit.analysis import SpanKind
    >>> root = Span("ab" * 16, "01" * 8, None, "POST /infer", SpanKind.SERVER, 0, 9)
    >>> tree([Span("ab" * 16, "02" * 8, "01" * 8, "scale", SpanKind.INTERNAL, 1, 5), root])
    [(0, 'POST /infer', 'SERVER'), (1, 'scale', 'INTERNAL')]
    """
    traces = [spans] if isinstance(spans, Trace) else build_traces(spans).values()
    ordered = sorted(traces, key=lambda t: (t.roots[0].start_ns, t.roots[0].end_ns))
    return [(depth, s.name, s.kind.name) for t in ordered for depth, s in t.walk()]


def components(spans: Iterable[Span]) -> dict[str, float]:
    """Where the time of one trace went, in seconds: ``otelkit.analysis``'s breakdown of its
    root (``client <stage>`` for stages right under it, ``total``...). The spans must hold one
    trace with one root.

    >>> from otelkit.analysis import SpanKind
    >>> root = Span("ab" * 16, "01" * 8, None, "event", SpanKind.INTERNAL, 0, 500_000_000)
    >>> components([root])
    {'client other': 0.5, 'total': 0.5}
    """
    (trace,) = build_traces(spans).values()
    (root,) = trace.roots
    found, problems = trace_components(trace, root)
    assert not problems, problems
    return found
