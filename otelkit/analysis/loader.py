"""Load OTLP JSON trace files into ``Span`` records and assemble them into trees.

Reads what otelkit's receiver and JSON-lines exporter write and what the OpenTelemetry
Collector's file exporter writes: one OTLP JSON document per line, plain or gzipped. Lines
holding metrics or logs are skipped, ids are hex whatever the input used, and a line that
cannot be read (the last one of a killed writer, say) is skipped with a warning.

>>> traces = build_traces(load_spans("otelkit-traces"))  # doctest: +SKIP
>>> for depth, span in traces[trace_id].walk():  # doctest: +SKIP
...     print("  " * depth + span.name, span.duration_ns)
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any, TextIO

from otelkit.export.otlp_json_normalize import normalize_json

_loads: Callable[[str], Any] = json.loads  # without orjson: the same documents, slower
with contextlib.suppress(ImportError):  # orjson (the report extra) parses them faster
    from orjson import loads as _loads

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
]

_log = logging.getLogger("otelkit.analysis")

Attributes = dict[str, Any]


class SpanKind(IntEnum):
    """OTLP's span kinds, with their wire values."""

    UNSPECIFIED = 0
    INTERNAL = 1
    SERVER = 2
    CLIENT = 3
    PRODUCER = 4
    CONSUMER = 5


class StatusCode(IntEnum):
    """OTLP's span status codes, with their wire values."""

    UNSET = 0
    OK = 1
    ERROR = 2


@dataclass(frozen=True, slots=True)
class SpanEvent:
    """A timestamped event on a span, e.g. Triton's ``QUEUE_START``."""

    name: str
    time_ns: int
    attributes: Attributes = field(default_factory=dict, hash=False)


@dataclass(frozen=True, slots=True)
class SpanLink:
    """A link from a span to a span of another (or the same) trace."""

    trace_id: str
    span_id: str
    attributes: Attributes = field(default_factory=dict, hash=False)


@dataclass(frozen=True, slots=True)
class Span:
    """One finished span, ids as lowercase hex; ``parent_span_id`` is None for a root.

    >>> Span("ab" * 16, "cd" * 8, None, "infer", SpanKind.CLIENT, 1_000, 3_500).duration_ns
    2500
    """

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: SpanKind
    start_ns: int
    end_ns: int
    attributes: Attributes = field(default_factory=dict, hash=False)
    resource: Attributes = field(default_factory=dict, hash=False)
    scope: str = ""
    events: tuple[SpanEvent, ...] = field(default=(), hash=False)
    links: tuple[SpanLink, ...] = field(default=(), hash=False)
    status_code: StatusCode = StatusCode.UNSET
    status_message: str = ""

    @property
    def duration_ns(self) -> int:
        """End minus start, in nanoseconds."""
        return self.end_ns - self.start_ns


def load_spans(*paths: str | Path) -> list[Span]:
    """Read spans from OTLP JSON-lines files, or directories of ``*.jsonl``/``*.jsonl.gz``.

    >>> spans = load_spans("otelkit-traces", "collector/traces.jsonl.gz")  # doctest: +SKIP
    """
    return list(iter_spans(*paths))


def iter_spans(*paths: str | Path) -> Iterator[Span]:
    """The spans of ``load_spans``, one at a time in file order: for readers that stream.

    >>> next(iter_spans("otelkit-traces")).trace_id  # doctest: +SKIP
    '4bf92f3577b34da6a3ce929d0e0e4736'
    """
    for path in _files(paths):
        with _open(path) as lines:
            for number, line in enumerate(lines, 1):
                yield from _document(line, f"{path}:{number}")


def _files(paths: Iterable[str | Path]) -> Iterator[Path]:
    for path in map(Path, paths):
        if path.is_dir():
            yield from sorted([*path.glob("*.jsonl"), *path.glob("*.jsonl.gz")])
        elif path.is_file():
            yield path
        else:
            raise FileNotFoundError(f"no trace file or directory at {path}")


def _open(path: Path) -> TextIO:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


class _NotCanonical(Exception):
    """A document not in the form otelkit's receiver writes: validate and normalise it first."""


def _document(line: str, where: str) -> list[Span]:
    """The spans of one line. Most lines are in the form the receiver and the Collector write
    (hex ids, integer enums), read directly; any other goes through ``normalize_json`` first,
    which also rejects garbage. Validating every line would double the cost of reading."""
    if not line.strip():
        return []
    try:
        doc = _loads(line)
        if not isinstance(doc, dict) or "resourceSpans" not in doc:
            return []  # metrics or logs from the Collector's file exporter
        try:
            return list(_spans(doc))
        except (_NotCanonical, KeyError, TypeError, ValueError, AttributeError):
            return list(_spans(normalize_json(doc)))
    except (ValueError, RecursionError, _NotCanonical) as exc:
        _log.warning("%s: skipped, not an OTLP JSON document: %s", where, exc)
        return []


def _hex(value: Any, size: int) -> str:
    if type(value) is not str or len(value) != 2 * size:
        raise _NotCanonical(f"id {value!r}")  # base64 (protobuf's JSON mapping), or garbage
    return value.lower()


def _number(value: Any) -> int:
    if type(value) is not int:
        raise _NotCanonical(f"enum {value!r}")  # a name, such as SPAN_KIND_SERVER
    return value


def _time(value: Any) -> int:
    if type(value) is str and value.isdecimal():
        return int(value)
    if type(value) is int and value >= 0:
        return value
    raise _NotCanonical(f"time {value!r}")


def _text(value: Any) -> str:
    if type(value) is not str:
        raise _NotCanonical(f"name {value!r}")
    return value


def _spans(doc: dict[str, Any]) -> Iterator[Span]:
    for rs in doc.get("resourceSpans", ()):
        resource = _attributes(rs.get("resource", {}).get("attributes", ()))
        for ss in rs.get("scopeSpans", ()):
            scope = ss.get("scope", {}).get("name", "")
            for s in ss.get("spans", ()):
                status = s.get("status", {})
                parent = s.get("parentSpanId")
                yield Span(
                    trace_id=_hex(s["traceId"], 16),
                    span_id=_hex(s["spanId"], 8),
                    parent_span_id=_hex(parent, 8) if parent else None,
                    name=_text(s.get("name", "")),
                    kind=_enum(SpanKind, _number(s.get("kind", 0))),
                    start_ns=_time(s.get("startTimeUnixNano", 0)),
                    end_ns=_time(s.get("endTimeUnixNano", 0)),
                    attributes=_attributes(s.get("attributes", ())),
                    resource=resource,
                    scope=scope,
                    events=tuple(_event(e) for e in s.get("events", ())),
                    links=tuple(_link(link) for link in s.get("links", ())),
                    status_code=_enum(StatusCode, _number(status.get("code", 0))),
                    status_message=status.get("message", ""),
                )


def _event(e: dict[str, Any]) -> SpanEvent:
    attributes = _attributes(e.get("attributes", ()))
    return SpanEvent(_text(e.get("name", "")), _time(e.get("timeUnixNano", 0)), attributes)


def _link(link: dict[str, Any]) -> SpanLink:
    trace_id, span_id = _hex(link["traceId"], 16), _hex(link["spanId"], 8)
    return SpanLink(trace_id, span_id, _attributes(link.get("attributes", ())))


# An enum's constructor costs microseconds a call; a tuple lookup a tenth of that.
_MEMBERS: dict[type[IntEnum], tuple[IntEnum, ...]] = {SpanKind: tuple(SpanKind)}
_MEMBERS[StatusCode] = tuple(StatusCode)


def _enum(kind: type[SpanKind] | type[StatusCode], value: int) -> Any:
    members = _MEMBERS[kind]
    if type(value) is int and 0 <= value < len(members):
        return members[value]
    return kind(0)  # a value newer than this module: keep the span, lose the detail


def _attributes(kvs: Iterable[dict[str, Any]]) -> Attributes:
    out = {}
    for kv in kvs:
        value = kv.get("value", {})
        # most values are strings: read them without a call
        out[kv["key"]] = value["stringValue"] if "stringValue" in value else _value(value)
    return out


def _value(v: dict[str, Any]) -> Any:
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])  # also reads "NaN" and "Infinity"
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", ())]
    if "kvlistValue" in v:
        return _attributes(v["kvlistValue"].get("values", ()))
    if "bytesValue" in v:
        return base64.b64decode(v["bytesValue"])
    return None


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
