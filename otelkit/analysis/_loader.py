"""Load OTLP JSON trace files into ``Span`` records and assemble them into trees.

Reads what otelkit's receiver and JSON-lines exporter write and what the OpenTelemetry
Collector's file exporter writes: one OTLP JSON document per line, plain or gzipped, or its
length-prefixed proto or JSON messages, zstd-compressed or not (``_collector``); and the
zstd Parquet segments of otelkit's span store (``otelkit import``, ``_store``). Lines
holding metrics or logs are skipped, ids are hex whatever the input used, and a line that
cannot be read (the last one of a killed writer, say) is skipped with a warning
(``otelkit.analysis._decode``; the records are ``otelkit.analysis._spans``'s).

>>> traces = build_traces(load_spans("otelkit-traces"))  # doctest: +SKIP
>>> for depth, span in traces[trace_id].walk():  # doctest: +SKIP
...     print("  " * depth + span.name, span.duration_ns)
"""

from __future__ import annotations

import gzip
import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from otelkit.analysis._collector import framed_spans, framing
from otelkit.analysis._decode import spans_of_line
from otelkit.analysis._spans import Span, SpanEvent, SpanKind, SpanLink, StatusCode
from otelkit.analysis._store import SUFFIX, StoreError, read_segment

__all__ = [
    "Span",
    "SpanEvent",
    "SpanKind",
    "SpanLink",
    "StatusCode",
    "Trace",
    "build_traces",
    "iter_spans",
    "load_spans",
    "trace_files",
]

_log = logging.getLogger("otelkit.analysis")


def load_spans(*paths: str | Path) -> list[Span]:
    """Read spans from OTLP JSON-lines files, or folders holding ``*.jsonl``/``*.jsonl.gz``
    files at any depth (a study's ``study-files``, the demo's output folder as they are given).
    A folder holding none is logged as a warning naming it.

    >>> spans = load_spans("otelkit-traces", "collector/traces.jsonl.gz")  # doctest: +SKIP
    """
    return list(iter_spans(*paths))


def iter_spans(*paths: str | Path) -> Iterator[Span]:
    """The spans of ``load_spans``, one at a time in file order: for readers that stream.

    >>> next(iter_spans("otelkit-traces")).trace_id  # doctest: +SKIP
    '4bf92f3577b34da6a3ce929d0e0e4736'
    """
    for path in _files(paths):
        if path.name.endswith(SUFFIX):
            yield from _segment(path)
            continue
        if framing(path) != "lines":  # the Collector's proto or zstd framings
            yield from _framed(path)
            continue
        with _open(path) as lines:
            for number, line in enumerate(lines, 1):
                yield from spans_of_line(line, f"{path}:{number}")


def _segment(path: Path) -> Iterator[Span]:
    """A Parquet segment's spans; one that cannot be read is logged, named, and left out
    (as a malformed line of a JSON file is), the rows read before the fault kept."""
    try:
        yield from read_segment(path)
    except StoreError as error:
        _log.warning("otelkit: %s; its spans from there on are left out", error)


def _framed(path: Path) -> Iterator[Span]:
    try:
        yield from framed_spans(path)
    except StoreError as error:
        _log.warning("otelkit: %s: left out: %s", path, error)


def trace_files(*paths: str | Path) -> list[Path]:
    """The files ``load_spans`` reads from ``paths``, in order; a folder holding none is
    logged as a warning that names it, a path that does not exist raises FileNotFoundError.

    >>> trace_files("study-files")  # doctest: +SKIP
    [PosixPath('study-files/traces/traces.jsonl')]
    """
    return list(_files(paths))


def _files(paths: Iterable[str | Path]) -> Iterator[Path]:
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(
                f
                for pattern in ("*.jsonl", "*.jsonl.gz", f"*{SUFFIX}")
                for f in path.rglob(pattern)
                if f.is_file()
            )
            if not found:
                _log.warning(
                    "%s: no trace file (*.jsonl, *.jsonl.gz or *%s) in this folder", path, SUFFIX
                )
            yield from found
        elif path.is_file():
            yield path
        else:
            raise FileNotFoundError(f"no trace file or directory at {path}")


def _open(path: Path) -> TextIO:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


@dataclass(frozen=True, eq=False)
class Trace:
    """The spans of one trace as a tree: roots and each span's children, in start order.

    A span whose parent is not in the data is a root too, and an orphan: its parent was not
    exported, or not yet, or went to another backend.
    """

    trace_id: str
    spans: dict[str, Span]
    roots: tuple[Span, ...]
    orphans: frozenset[str]
    _children: dict[str, tuple[Span, ...]]

    def children(self, span: Span | str) -> tuple[Span, ...]:
        """The spans whose parent is ``span`` (a Span or a span id), in start order."""
        return self._children.get(span if isinstance(span, str) else span.span_id, ())

    def is_orphan(self, span: Span | str) -> bool:
        """True for a root that has a parent id, naming a span missing from the data."""
        return (span if isinstance(span, str) else span.span_id) in self.orphans

    def walk(self) -> Iterator[tuple[int, Span]]:
        """Every span, depth first from each root, with its depth (roots are at 0)."""
        stack = [(0, root) for root in reversed(self.roots)]
        while stack:
            depth, span = stack.pop()
            yield depth, span
            stack.extend((depth + 1, child) for child in reversed(self.children(span)))


def build_traces(spans: Iterable[Span]) -> dict[str, Trace]:
    """Group spans by trace id and link each to its parent; the first of duplicate ids wins.

    >>> build_traces([Span("ab" * 16, "cd" * 8, None, "infer", SpanKind.CLIENT, 0, 9)])[
    ...     "ab" * 16].roots[0].name
    'infer'
    """
    by_trace: dict[str, dict[str, Span]] = defaultdict(dict)
    for span in spans:
        by_trace[span.trace_id].setdefault(span.span_id, span)
    return {trace_id: _tree(trace_id, by_id) for trace_id, by_id in by_trace.items()}


def _tree(trace_id: str, by_id: dict[str, Span]) -> Trace:
    ordered = sorted(by_id.values(), key=lambda s: (s.start_ns, s.end_ns))
    children: dict[str, list[Span]] = defaultdict(list)
    roots: list[Span] = []
    orphans: set[str] = set()
    for span in ordered:
        parent = span.parent_span_id
        if parent is not None and parent in by_id and parent != span.span_id:
            children[parent].append(span)
        else:
            roots.append(span)
            if parent is not None:
                orphans.add(span.span_id)
    reached = _reachable(roots, children)
    for span in ordered:  # a parent cycle (corrupt data) reaches no root: cut it at its start
        if span.span_id not in reached:
            children[span.parent_span_id or ""].remove(span)
            roots.append(span)
            orphans.add(span.span_id)
            reached |= _reachable([span], children)
    roots.sort(key=lambda s: (s.start_ns, s.end_ns))
    frozen = {span_id: tuple(kids) for span_id, kids in children.items() if kids}
    return Trace(
        trace_id, {s.span_id: s for s in ordered}, tuple(roots), frozenset(orphans), frozen
    )


def _reachable(roots: list[Span], children: dict[str, list[Span]]) -> set[str]:
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        span = stack.pop()
        if span.span_id not in seen:
            seen.add(span.span_id)
            stack.extend(children.get(span.span_id, ()))
    return seen
