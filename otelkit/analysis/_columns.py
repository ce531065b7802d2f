"""The breakdown over the span store's columns, one trace at a time in compiled code.

``breakdown_columns`` gives what ``breakdown(build_traces(load_spans(segments)))`` gives (each
root's components in the same order, the groups, the problems, the incomplete counts, the
server's parts) without a Python object per span: pyarrow reads the columns the breakdown
needs, numpy turns them into integers (ids, times, codes of names), and ``_kernel`` walks each
trace in compiled code (numba). It is the store's fastest engine: the DuckDB queries
(``_sql``) spend more on joins than this spends in all.

The segments are read in order, twice: the trace ids first (where each trace's spans end),
then the rest, one segment at a time; a trace is broken down once the last segment holding
its spans is read, so memory holds the traces still open, not the store. A trace whose shape
the kernel leaves to the Python path (an orphan, a parent cycle, a span its own parent, an
id that is not lowercase hex, a proxy's or Ray Serve's spans, names that would merge with a
fixed component's) is read again at the end and broken down by ``_breakdown``; its answer
lands in its place. ``SqlBreakdown.delegated`` counts those traces.

numba, pyarrow and numpy are imported on first use: ``pip install 'otelkit[store]'``.
"""

from __future__ import annotations

import contextlib
import threading
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otelkit import semconv
from otelkit.analysis import _breakdown as bd
from otelkit.analysis import _server_time as times
from otelkit.analysis._breakdown import Breakdown
from otelkit.analysis._loader import Trace, build_traces
from otelkit.analysis._sampling import _JAEGER_PARAM, _JAEGER_TYPE, Sampling
from otelkit.analysis._spans import Span
from otelkit.analysis._sql import SqlBreakdown
from otelkit.analysis._store import StoreError, _parse, spans_of_table, whole_segments

__all__ = ["ReportMode", "StoreFacts", "breakdown_columns", "report_columns"]


#: the components of fixed names, in the order of ``_kernel``'s codes
FIXED_NAMES = (
    *("client serialize", "client deserialize", bd.CONNECTION, bd.NETWORK, bd.SERVER_QUEUE),
    *(bd.SERVER_OTHER, bd.CLIENT_OTHER, bd.TOTAL, times.RECEIVE, times.FRONTEND),
    *(times.SEND, times.HANDLER, times.ENSEMBLE, times.SCHEDULER, times.COMPUTE_INPUT),
    *(times.COMPUTE_OUTPUT, times.CALLS_OUT, bd.NO_SERVER_SPAN),
)
#: the events the breakdown reads, in the order of ``_kernel``'s codes
EVENTS = (
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "HTTP_RECV_START",
    "HTTP_RECV_END",
    "GRPC_WAITREAD_START",
    "GRPC_WAITREAD_END",
    "HTTP_SEND_START",
    "HTTP_SEND_END",
    "GRPC_SEND_START",
    "GRPC_SEND_END",
    semconv.HTTP_REQUEST_RECEIVED,
    semconv.HTTP_RESPONSE_STARTED,
    semconv.HTTP_RESPONSE_SENT,
)
#: the components named after a string, by ``_kernel``'s family codes
_FAMILIES = {
    1: "server {}",
    2: "server {} hand-off",
    3: "server {} compute",
    4: "client {}",
    5: "server {} (span)",
}
#: attribute values whose text in the exporter's string map is not Python's ``str`` of the
#: typed value (a bool, None, a list, a map, a float that is not finite): read from the JSON
_TYPED = ("true", "false", "null", "NaN", "Infinity", "-Infinity")
_SERVE_HEADS = frozenset([*times._SERVE_SPANS, times._SERVE_REPLICA])
_BATCH_ROWS = 65_536  # what a read holds in Arrow's memory at once: a row group's spans
#: read as dictionaries (few distinct values: a process's resource), never as a string a row
_AS_DICTIONARY = ["ResourceAttributesJson"]
_COLUMNS = [
    "SpanId",
    "ParentSpanId",
    "Timestamp",
    "Duration",
    "SpanName",
    "SpanKind",
    "SpanAttributes",
    "ResourceAttributesJson",
    "Events",
]


def _modules() -> tuple[Any, Any, Any, Any]:
    try:
        import numpy
        import pyarrow
        import pyarrow.compute
        import pyarrow.parquet

        from otelkit.analysis import _kernel
    except ImportError as error:
        raise StoreError(
            "the compiled breakdown needs numba, numpy and pyarrow: pip install 'otelkit[store]'"
        ) from error
    return numpy, pyarrow, pyarrow.compute, _kernel


class _Strings:
    """One dictionary of the run's strings (names, stages, models, attribute values): codes
    stay the same from segment to segment."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.texts: list[str] = []
        self._lock = threading.Lock()

    def code(self, text: str) -> int:
        found = self.codes.get(text)
        if found is None:
            with self._lock:  # the reading thread and the breakdown's both add strings
                found = self.codes.get(text)
                if found is None:
                    found = len(self.texts)
                    self.texts.append(text)
                    self.codes[text] = found
        return found

    def encode(self, np: Any, pc: Any, values: Any) -> Any:
        """Codes of an Arrow array of strings (-1: null)."""
        encoded = pc.dictionary_encode(values)
        mapping = np.array(
            [self.code(text) for text in encoded.dictionary.to_pylist()] + [-1], np.int64
        )
        indices = encoded.indices.to_numpy(zero_copy_only=False)
        if encoded.indices.null_count:
            indices = np.where(
                encoded.indices.is_valid().to_numpy(zero_copy_only=False), indices, -1
            )
        return mapping[indices].astype(np.int32)


def _hex64(np: Any, pa: Any, kernel: Any, values: Any) -> tuple[Any, Any, Any]:
    """Lowercase 16-digit hex ids as integers; whether each row is one, whether it is empty."""
    values = values.cast(pa.string()) if values.type != pa.string() else values
    start = values.offset
    offsets = np.frombuffer(values.buffers()[1], np.int32)[start : start + len(values) + 1]
    data = np.frombuffer(values.buffers()[2] or b"", np.uint8)
    ids, ok, empty = kernel.hex64(offsets, data)
    return ids, ok, empty


def _entries(np: Any, lists: Any) -> tuple[Any, Any]:
    """The items of a list (or map) array's rows, and the row of each: of these rows alone, a
    batch being possibly a slice of a column whose items run on past it."""
    offsets = lists.offsets.to_numpy(zero_copy_only=False)
    start, end = int(offsets[0]), int(offsets[-1])
    items = lists.values.slice(start, end - start)
    return items, np.repeat(np.arange(len(lists)), np.diff(offsets))


def _lookup(np: Any, pc: Any, maps: Any, keys: Sequence[str]) -> dict[str, tuple[Any, Any]]:
    """For each key: the rows of ``maps`` that hold it and its values there (the first)."""
    # the entries of these rows alone: a batch may be a slice of the column, whose keys and
    # items arrays run on past it
    entries, row_of = _entries(np, maps)
    names = pc.dictionary_encode(entries.field(0))
    wanted = {k: i for i, k in enumerate(names.dictionary.to_pylist()) if k in set(keys)}
    codes = names.indices.to_numpy(zero_copy_only=False)
    out = {}
    for key in keys:
        if key not in wanted:
            out[key] = (np.zeros(0, np.int64), None)
            continue
        where = np.nonzero(codes == wanted[key])[0]
        rows = row_of[where]
        first = np.ones(len(rows), np.bool_)
        first[1:] = rows[1:] != rows[:-1]
        out[key] = (rows[first], entries.field(1).take(where[first]))
    return out


def _batch(
    np: Any,
    pa: Any,
    pc: Any,
    kernel: Any,
    table: Any,
    strings: _Strings,
    group_by: Sequence[str],
    sampling: Sampling,
) -> dict[str, Any]:
    """The kernel's columns of one record batch of a segment (its sampling into
    ``sampling``)."""
    n = table.num_rows
    cols: dict[str, Any] = {}
    sid, sid_ok, _ = _hex64(np, pa, kernel, table.column("SpanId"))
    pid, pid_ok, pid_empty = _hex64(np, pa, kernel, table.column("ParentSpanId"))
    cols["sid"], cols["pid"], cols["hasp"] = sid, pid, ~pid_empty
    odd = ~sid_ok | ~(pid_ok | pid_empty)
    st = table.column("Timestamp").cast(pa.int64()).to_numpy()
    cols["st"] = st
    cols["en"] = st + table.column("Duration").to_numpy()
    kind = table.column("SpanKind")
    cols["client"] = pc.equal(kind, "Client").to_numpy(zero_copy_only=False)
    server = pc.equal(kind, "Server").to_numpy(zero_copy_only=False)
    names = table.column("SpanName")
    cols["name"] = strings.encode(np, pc, names)
    head = pc.list_element(pc.split_pattern(names, " ", max_splits=1), 0)
    odd |= pc.is_in(head, pa.array(sorted(_SERVE_HEADS))).to_numpy(zero_copy_only=False)
    odd |= pc.equal(names, semconv.RAY_SERVE_QUEUE_SPAN).to_numpy(zero_copy_only=False)
    keys = [
        semconv.STAGE_NAME,
        semconv.TRITON_SPAN_MODEL_NAME,
        semconv.PROXY_COMPONENT,
        semconv.RAY_SERVE_DEPLOYMENT,
        times._SERVE_DEPLOYMENT,
        semconv.SERIALIZE_S,
        semconv.DESERIALIZE_S,
        semconv.CONNECT_S,
        semconv.MODEL_NAME,
        semconv.SERVER_ADDRESS,
        semconv.SERVER_PORT,
        semconv.TAIL_SAMPLING_POLICY,
        _JAEGER_TYPE,
        _JAEGER_PARAM,
        *[k for k in group_by if k != semconv.ANSWERED_BY],
    ]
    found = _lookup(np, pc, table.column("SpanAttributes"), keys)
    _sampled(np, pc, table, found, pid_empty, sampling)

    def codes(key: str) -> Any:
        rows, values = found[key]
        out = np.full(n, -1, np.int32)
        if len(rows):
            out[rows] = strings.encode(np, pc, values)
        return out

    def number(key: str) -> Any:
        rows, values = found[key]
        out = np.zeros(n, np.float64)
        if len(rows):
            try:
                out[rows] = pc.cast(values, pa.float64()).to_numpy(zero_copy_only=False)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                # a text Arrow's cast refuses (" 0.002", "1_0"): each value as the Python
                # path's float reads it; one it cannot read is the Python path's to handle
                for row, text in zip(rows.tolist(), values.to_pylist(), strict=True):
                    try:
                        out[row] = float(text)
                    except (TypeError, ValueError):
                        odd[row] = True
        return out

    cols["stage"] = codes(semconv.STAGE_NAME)
    tmodel = codes(semconv.TRITON_SPAN_MODEL_NAME)
    tmodel[tmodel == strings.code("")] = -1  # an empty model name is none
    cols["tmodel"] = tmodel
    proxy_rows, proxy_values = found[semconv.PROXY_COMPONENT]
    if len(proxy_rows):
        is_proxy = pc.equal(proxy_values, semconv.PROXY).to_numpy(zero_copy_only=False)
        odd[proxy_rows[is_proxy & server[proxy_rows]]] = True
    for key in (semconv.RAY_SERVE_DEPLOYMENT, times._SERVE_DEPLOYMENT):
        odd[found[key][0]] = True
    cols["ser"] = number(semconv.SERIALIZE_S)
    cols["deser"] = number(semconv.DESERIALIZE_S)
    cols["conn"] = number(semconv.CONNECT_S)
    called = codes(semconv.MODEL_NAME)
    cols["called"] = np.where(called >= 0, called, cols["name"])
    cols["host"] = codes(semconv.SERVER_ADDRESS)
    cols["port"] = codes(semconv.SERVER_PORT)
    groups = [codes(k) if k != semconv.ANSWERED_BY else np.full(n, -1, np.int32) for k in group_by]
    typed = [strings.code(text) for text in _TYPED]
    for values in groups:  # a root's value whose string is not its typed text: Python's
        odd |= np.isin(values, typed) & pid_empty
    cols["groups"] = np.stack(groups, axis=1) if groups else np.zeros((n, 0), np.int32)
    cols["odd"] = odd
    events = table.column("Events")
    flat, row_of = _entries(np, events)
    code = pc.index_in(flat.field("Name"), value_set=pa.array(EVENTS))
    keep = code.is_valid().to_numpy(zero_copy_only=False)
    cols["ev_count"] = np.bincount(row_of[keep], minlength=n).astype(np.int32)
    cols["ev_code"] = code.to_numpy(zero_copy_only=False)[keep].astype(np.int8)
    cols["ev_time"] = flat.field("Timestamp").to_numpy(zero_copy_only=False)[keep]
    return cols


def _sampled(
    np: Any,
    pc: Any,
    table: Any,
    found: dict[str, tuple[Any, Any]],
    roots: Any,
    sampling: Sampling,
) -> None:
    """What a batch's spans say of their sampling, as ``Sampling.add`` reads each span: a
    resource's sampler (read from its JSON once a distinct resource), else Jaeger's on the
    span; the tail sampling policy on each root."""
    resources = table.column("ResourceAttributesJson")
    if not hasattr(resources, "dictionary"):  # a writer's segment without its dictionary
        resources = pc.dictionary_encode(resources)
    indices = resources.indices.to_numpy(zero_copy_only=False)
    samplers, services = [], []
    for text in resources.dictionary.to_pylist():
        attributes = _parse(text) if text else {}
        attributes = attributes if isinstance(attributes, dict) else {}
        sampler = attributes.get(semconv.OTELKIT_SAMPLER)
        samplers.append(None if sampler is None else str(sampler).strip())
        services.append(str(attributes.get(semconv.SERVICE_NAME, "unknown service")))
    for code in np.unique(indices).tolist():
        if samplers[code] is not None:
            sampling.head.setdefault(samplers[code], set()).add(services[code])
    rows, kinds = _values(found[_JAEGER_TYPE])
    if rows:  # Jaeger's sampler where the resource names none
        params = dict(zip(*_values(found[_JAEGER_PARAM]), strict=True))
        for row, kind in zip(rows, kinds, strict=True):
            if samplers[indices[row]] is None:
                sampler = f"{kind} {params.get(row, '')}".strip()
                sampling.head.setdefault(sampler, set()).add(services[indices[row]])
    sampling.roots += int(roots.sum())
    for row, policy in zip(*_values(found[semconv.TAIL_SAMPLING_POLICY]), strict=True):
        if roots[row]:
            sampling.tail[policy] = sampling.tail.get(policy, 0) + 1


def _values(found: tuple[Any, Any]) -> tuple[list[int], list[Any]]:
    rows, values = found
    return (rows.tolist(), values.to_pylist()) if len(rows) else ([], [])


def _take(np: Any, cols: dict[str, Any], rows: Any) -> dict[str, Any]:
    """The rows ``rows`` of ``cols``, their events with them."""
    out = {k: v[rows] for k, v in cols.items() if k not in ("ev_code", "ev_time")}
    starts = np.concatenate([[0], np.cumsum(cols["ev_count"])])[rows]
    counts = cols["ev_count"][rows]
    total = int(counts.sum())
    index = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)])[:-1], counts)
    index += np.arange(total)
    out["ev_code"], out["ev_time"] = cols["ev_code"][index], cols["ev_time"][index]
    return out


def _concat(np: Any, a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    if a is None:
        return b
    return {k: np.concatenate([a[k], b[k]]) for k in b}


def _typed(text: str) -> bool:
    """Whether an attribute value's text in the string map may not be its typed value's."""
    return text in _TYPED or text[:1] in ("[", "{")


class _Group:
    """One group's complete roots as they arrive: their sort keys, a row each of the
    components' seconds (a column a component, grown as needed), where each component was
    first seen, which are the server's parts, the incomplete roots, the problems."""

    def __init__(self, np: Any) -> None:
        self.rows = 0
        self.keys = np.zeros(64, np.int64)
        self.matrix = np.zeros((64, 8))
        self.column: dict[int, int] = {}  # name id -> its column
        self.first: dict[int, int] = {}  # name id -> (root key, place) as one integer
        self.parts: set[int] = set()
        self.incomplete = 0
        self.problems: list[tuple[int, int, str]] = []


class _Groups:
    """The groups as the chunks' roots arrive (in any order of traces), put in the Python
    path's order at the end: by the trace's first arrival, then the root's place in it."""

    def __init__(self, np: Any) -> None:
        self.np = np
        self.ids: dict[tuple[str, ...], int] = {}
        self.names: dict[str, int] = {}
        self.groups: list[_Group] = []

    def gid(self, key: tuple[str, ...]) -> int:
        found = self.ids.get(key)
        if found is None:
            found = self.ids[key] = len(self.ids)
            self.groups.append(_Group(self.np))
        return found

    def name(self, text: str) -> int:
        return self.names.setdefault(text, len(self.names))

    def add(
        self,
        gids: Any,
        keys: Any,
        bad: Any,
        c_root: Any,
        c_name: Any,
        c_val: Any,
        c_part: Any,
    ) -> None:
        """One chunk's roots (group, sort key, incomplete) and components (root row, name id,
        seconds, part), the components of a root together in the order they were added."""
        np = self.np
        for g, count in zip(*np.unique(gids[bad], return_counts=True), strict=True):
            self.groups[int(g)].incomplete += int(count)
        if not len(c_root):
            return
        place = np.arange(len(c_root)) - np.searchsorted(c_root, c_root)
        good = ~bad[c_root]
        order = np.argsort(gids[c_root[good]], kind="stable")
        records = np.nonzero(good)[0][order]  # the complete roots' records, by group
        by_group = gids[c_root[records]]
        cuts = np.nonzero(np.diff(by_group))[0] + 1
        for mine in np.split(records, cuts) if len(records) else []:
            group = self.groups[int(gids[c_root[mine[0]]])]
            roots, rows = np.unique(c_root[mine], return_inverse=True)
            names = c_name[mine]
            for name in np.unique(names).tolist():
                if name not in group.column:
                    group.column[name] = len(group.column)
            columns = np.array(list(group.column.values()), np.int64)
            lookup = np.full(max(group.column) + 1, -1, np.int64)
            lookup[np.array(list(group.column), np.int64)] = columns
            cols = lookup[names]
            start = group.rows
            self._room(group, start + len(roots), len(group.column))
            group.keys[start : start + len(roots)] = keys[roots]
            np.add.at(group.matrix, (start + rows.reshape(-1), cols), c_val[mine])
            group.rows += len(roots)
            seen = keys[c_root[mine]] * _MAX_PLACES + place[mine]
            firsts = np.full(len(group.column), np.iinfo(np.int64).max)
            np.minimum.at(firsts, cols, seen)
            for name, column in group.column.items():
                seen_first = int(firsts[column])
                if seen_first < np.iinfo(np.int64).max:
                    group.first[name] = min(group.first.get(name, seen_first), seen_first)
            group.parts.update(np.unique(names[c_part[mine]]).tolist())

    def _room(self, group: _Group, rows: int, columns: int) -> None:
        """Grow ``group``'s rows and columns to hold ``rows`` and ``columns`` (by a quarter
        more at a time: the matrix is most of what a breakdown holds)."""
        np = self.np
        have_rows, have_columns = group.matrix.shape
        if rows <= have_rows and columns <= have_columns:
            return
        new_rows = max(rows, have_rows + have_rows // 4) if rows > have_rows else have_rows
        new_columns = max(columns, have_columns * 2) if columns > have_columns else have_columns
        matrix = np.zeros((new_rows, new_columns))
        matrix[: group.rows, :have_columns] = group.matrix[: group.rows]
        group.matrix = matrix
        if new_rows > len(group.keys):
            keys = np.zeros(new_rows, np.int64)
            keys[: group.rows] = group.keys[: group.rows]
            group.keys = keys

    def said(self, gid: int, key: int, n: int, text: str) -> None:
        self.groups[gid].problems.append((key, n, text))

    def breakdowns(self) -> dict[tuple[str, ...], Breakdown]:
        np = self.np
        texts = list(self.names)
        out = {}
        for key, g in self.ids.items():
            group = self.groups[g]
            found = Breakdown(key)
            found.incomplete = group.incomplete
            if group.rows:
                order = np.argsort(group.keys[: group.rows], kind="stable")
                for name in sorted(group.first, key=group.first.__getitem__):
                    column = group.matrix[: group.rows, group.column[name]][order]
                    found.components[texts[name]] = array("d", column.tobytes())
                found.parts = {texts[name] for name in group.parts}
            group.matrix = group.keys = np.zeros(0)  # let go of them: the arrays are made
            found.problems = [text for _, _, text in sorted(group.problems)]
            out[key] = found
        return out


_MAX_PLACES = 512  # a root's components at most (``_kernel``): its places below it
_ROOT_KEY = 1 << 24  # a root's sort key: its trace's first arrival, then its place there


def breakdown_columns(
    files: Sequence[str | Path],
    group_by: Sequence[str] = (),
    root_name: str | None = None,
    whole: Callable[[list[str]], Any] | None = None,
) -> SqlBreakdown:
    """``breakdown`` of the spans in the segments ``files`` (in arrival order), compiled.
    ``whole(trace_ids)``: every span of those traces, as an Arrow table of the segments'
    columns in arrival order, for the traces left to the Python path, where the segments hold
    less of a span than that path reads (a store's spans narrowed); else they are read from
    the segments."""
    return _run(files, group_by, root_name, None, whole)


def report_columns(
    files: Sequence[str | Path],
    group_by: Sequence[str],
    root_name: str | None,
    report: ReportMode,
) -> SqlBreakdown:
    """The breakdown a report shows of the segments ``files``: each trace grouped by its
    first root (``report.key``), each trace's first root recorded in ``report.roots`` and
    the run's facts in ``report.facts``."""
    return _run(files, group_by, root_name, report)


def _run(
    files: Sequence[str | Path],
    group_by: Sequence[str],
    root_name: str | None,
    report: ReportMode | None,
    whole: Callable[[list[str]], Any] | None = None,
) -> SqlBreakdown:
    np, pa, pc, kernel = _modules()
    with _system_pool(pa):
        return _breakdown(np, pa, pc, kernel, files, group_by, root_name, report, whole)


@contextlib.contextmanager
def _system_pool(pa: Any) -> Iterator[None]:
    """Arrow's reads in the system allocator's pool: the default one (mimalloc) keeps what a
    read freed for the next, and over a store held a third more memory, for 5 % of the time."""
    pool = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(pool)


def _breakdown(
    np: Any,
    pa: Any,
    pc: Any,
    kernel: Any,
    files: Sequence[str | Path],
    group_by: Sequence[str],
    root_name: str | None,
    report: ReportMode | None,
    whole: Callable[[list[str]], Any] | None = None,
) -> SqlBreakdown:
    import pyarrow.parquet as pq

    names = whole_segments(files)
    if not names:
        if report is not None:
            report.finish(np, [], pa.array([], pa.string()), ([], [], np.zeros(0, np.int32)))
        return SqlBreakdown({}, 0, 0, 0)
    # the trace ids first: each span's trace as a code (the traces in order of first
    # arrival) and the row (over all segments) of each trace's last span
    local, dictionaries = [], []
    for path in names:
        try:
            for batch in pq.ParquetFile(path).iter_batches(_BATCH_ROWS, columns=["TraceId"]):
                encoded = pc.dictionary_encode(batch.column(0))
                local.append(encoded.indices.to_numpy(zero_copy_only=False))
                dictionaries.append(encoded.dictionary)
        except (OSError, pa.ArrowException) as error:
            raise StoreError(f"the span store could not be read: {path}: {error}") from error
    every = pc.dictionary_encode(pa.concat_arrays(dictionaries or [pa.array([], pa.string())]))
    trace_ids = every.dictionary
    codes = every.indices.to_numpy(zero_copy_only=False)
    bounds = np.cumsum([0] + [len(d) for d in dictionaries])
    tcodes = np.concatenate(
        [codes[bounds[i] : bounds[i + 1]][found] for i, found in enumerate(local)]
        or [np.zeros(0, np.int32)]
    ).astype(np.int32)
    del local, dictionaries, every, codes
    last = kernel.last_rows(tcodes, len(trace_ids))
    run = _Run(np, kernel, group_by, root_name, trace_ids, report)
    pending: dict[str, Any] | None = None
    row = 0
    # the next rows are read while the kernel breaks these down (it lets go of Python's
    # lock): the two cores each do one
    sampling = Sampling()
    facts = None if report is None else report.facts
    for cols in _prefetched(np, pa, pc, names, run.strings, run.group_by, sampling, facts):
        count = len(cols["sid"])
        cols["tcode"] = tcodes[row : row + count]
        row += count
        cols = _concat(np, pending, cols)
        done = last[cols["tcode"]] < row
        ready = np.nonzero(done)[0]
        if len(ready):
            run.chunk(cols, ready)
        pending = _take(np, cols, np.nonzero(~done)[0]) if len(ready) < len(done) else None
        del cols
    if row != len(tcodes):
        raise StoreError("the span store changed while it was read")
    odd = np.unique(np.concatenate(run.python)) if run.python else np.zeros(0, np.int64)
    sizes = [pq.ParquetFile(path).metadata.num_rows for path in names]
    if whole is None:
        table = _rows_of(np, names, sizes, tcodes, odd) if len(odd) else None
    else:  # the traces as a store holds them, each span's trace coded as here
        wanted = [trace_ids[code].as_py() for code in odd.tolist()]
        table = whole(wanted) if wanted else None
        if table is not None:
            code_of = dict(zip(wanted, odd.tolist(), strict=True))
            coded = [code_of[t] for t in table.column("TraceId").to_pylist()]
            table = table.append_column("tcode", pa.array(coded, pa.int64()))
    spans = run.spans + _delegate(np, table, run, root_name)
    if report is not None:
        report.finish(np, run.strings.texts, trace_ids, (names, sizes, tcodes))
    return SqlBreakdown(run.groups.breakdowns(), spans, len(trace_ids), len(odd), sampling)


_UNIT_ROWS = 2 * _BATCH_ROWS  # the rows read, prepared and broken down together


def _prefetched(
    np: Any,
    pa: Any,
    pc: Any,
    names: list[str],
    strings: _Strings,
    group_by: Sequence[str],
    sampling: Sampling,
    facts: StoreFacts | None = None,
) -> Iterator[dict[str, Any]]:
    """The segments' rows as the kernel's columns, a unit at a time, in order: one thread
    reads the units, two prepare them, while the caller breaks the one before down (the
    kernel, pyarrow's decoding and most of numpy's work let go of Python's lock)."""
    import pyarrow.parquet as pq

    from otelkit.analysis import _kernel as kernel

    columns = _COLUMNS if facts is None else [*_COLUMNS, "ScopeName"]

    def units() -> Iterator[tuple[str, Any]]:
        for path in names:
            try:
                segment = pq.ParquetFile(path, read_dictionary=_AS_DICTIONARY)
                for batch in segment.iter_batches(_UNIT_ROWS, columns=columns):
                    yield path, batch
            except (OSError, pa.ArrowException) as error:
                raise StoreError(f"the span store could not be read: {path}: {error}") from error

    def prepare(path: str, batch: Any) -> tuple[dict[str, Any], Sampling, StoreFacts | None]:
        said = Sampling()  # this unit's, merged in order
        try:
            cols = _batch(np, pa, pc, kernel, batch, strings, group_by, said)
            return cols, said, None if facts is None else _facts(np, pc, batch, cols)
        except (OSError, pa.ArrowException) as error:
            raise StoreError(f"the span store could not be read: {path}: {error}") from error

    reads = units()
    with ThreadPoolExecutor(1 + _PREPARING, thread_name_prefix="otelkit-read") as pool:
        read: Any = pool.submit(next, reads, None)
        made: deque[Any] = deque()
        while True:
            # the unit to give, and those to prepare while the caller works on it
            while read is not None and len(made) <= _PREPARING:
                unit = read.result()
                read = None if unit is None else pool.submit(next, reads, None)
                if unit is not None:
                    made.append(pool.submit(prepare, *unit))
            if not made:
                return
            cols, said, seen = made.popleft().result()
            _merge(sampling, said)
            if facts is not None and seen is not None:
                facts.merge(seen)
            yield cols


_PREPARING = 1  # units prepared while the kernel works (two: 12 % slower, the GIL)


def _facts(np: Any, pc: Any, batch: Any, cols: dict[str, Any]) -> StoreFacts:
    """A unit's facts: its spans, first start, last end, scopes, each service's first
    resource (read from the resources' JSON, a distinct resource once)."""
    seen = StoreFacts(len(cols["st"]))
    if not seen.spans:
        return seen
    seen.first_ns, seen.last_ns = int(cols["st"].min()), int(cols["en"].max())
    scopes = pc.value_counts(batch.column("ScopeName").fill_null(""))
    for scope, count in zip(scopes.field(0).to_pylist(), scopes.field(1).to_pylist(), strict=True):
        name = str(scope) if scope else "(no scope)"
        seen.scopes[name] = seen.scopes.get(name, 0) + count
    resources = batch.column("ResourceAttributesJson")
    if not hasattr(resources, "dictionary"):
        resources = pc.dictionary_encode(resources)
    indices = resources.indices.to_numpy(zero_copy_only=False)
    codes, firsts = np.unique(indices, return_index=True)
    texts = resources.dictionary.to_pylist()
    for code in codes[np.argsort(firsts)].tolist():
        resource = _parse(texts[code]) if texts[code] else {}
        resource = resource if isinstance(resource, dict) else {}
        seen.resources.setdefault(str(resource.get("service.name", "unknown service")), resource)
    return seen


def _merge(into: Sampling, said: Sampling) -> None:
    into.roots += said.roots
    for policy, count in said.tail.items():
        into.tail[policy] = into.tail.get(policy, 0) + count
    for sampler, services in said.head.items():
        into.head.setdefault(sampler, set()).update(services)


@dataclass
class StoreFacts:
    """The run as a store's columns tell it (a report's facts): spans, their first start and
    last end, each service's first resource, the spans of each instrumentation scope."""

    spans: int = 0
    first_ns: int | None = None
    last_ns: int = 0
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    scopes: dict[str, int] = field(default_factory=dict)

    def merge(self, other: StoreFacts) -> None:
        """``other``'s spans, read after these."""
        self.spans += other.spans
        if other.first_ns is not None:
            first = self.first_ns
            self.first_ns = other.first_ns if first is None else min(first, other.first_ns)
        self.last_ns = max(self.last_ns, other.last_ns)
        for service, resource in other.resources.items():
            self.resources.setdefault(service, resource)
        for scope, count in other.scopes.items():
            self.scopes[scope] = self.scopes.get(scope, 0) + count


class ReportMode:
    """What a report reads beside the breakdown (``report_columns``): each trace groups by
    its first root, its group from ``key`` (the groups' values, the root's study phase, run
    and point, its name) or, for a trace the Python path breaks down, ``python_key``; each
    trace's first root is recorded (``roots``), and the run's facts."""

    EXTRA = (semconv.STUDY_PHASE, semconv.STUDY_RUN, semconv.STUDY_POINT)

    def __init__(
        self,
        key: Callable[[tuple[str, ...]], tuple[str, ...]],
        python_key: Callable[[Trace, Span], tuple[str, ...]],
    ) -> None:
        self.key, self.python_key = key, python_key
        self.facts = StoreFacts()
        self._roots: list[tuple[Any, ...]] = []
        self.roots: dict[str, Any] = {}  # by ``finish``: arrays, a row a trace with a root
        self.strings: list[str] = []  # the texts of the codes in ``roots``' run and point
        self.trace_ids: Any = None  # a trace's id by its code (first arrival order)
        self.spans_of: Any = None  # a trace's spans by its code
        self._where: tuple[list[str], list[int], Any] = ([], [], None)

    def add(self, *columns: Any) -> None:
        """Roots: their trace's code, group, incomplete, duration (ns), run, point (codes)."""
        trace, group, incomplete, duration, run, point = columns
        # as narrow as they go: a row a trace, millions of them beside the groups' values
        self._roots.append(
            (
                trace.astype("int32"),
                group.astype("int32"),
                incomplete.astype("bool"),
                duration.astype("int64"),
                run.astype("int32"),
                point.astype("int32"),
            )
        )

    def finish(
        self, np: Any, strings: list[str], trace_ids: Any, where: tuple[list[str], list[int], Any]
    ) -> None:
        """The run read: ``strings`` (the codes' texts), ``trace_ids`` (by code) and
        ``where`` the traces' rows lie (segments, their sizes, each row's trace code)."""
        names = ("trace", "group", "incomplete", "duration_ns", "run", "point")
        parts = list(zip(*self._roots, strict=True)) or [()] * len(names)
        roots = {
            name: np.concatenate(part) if part else np.zeros(0, np.int64)
            for name, part in zip(names, parts, strict=True)
        }
        order = np.argsort(roots["trace"], kind="stable")
        self.roots = {name: values[order] for name, values in roots.items()}
        self._roots = []
        self.strings, self.trace_ids, self._where = strings, trace_ids, where
        self.spans_of = np.bincount(where[2], minlength=len(trace_ids))

    def traces(self, codes: Iterable[int]) -> dict[int, Trace]:
        """The traces of ``codes`` as Python objects (the few a page draws), by code."""
        import numpy as np
        import pyarrow as pa

        wanted = np.array(sorted(set(codes)), np.int64)
        names, sizes, tcodes = self._where
        with _system_pool(pa):
            table = _rows_of(np, names, sizes, tcodes, wanted)
        if table is None:
            return {}
        first = dict(
            zip(table.column("TraceId").to_pylist(), table.column("tcode").to_pylist(), strict=True)
        )
        built = build_traces(spans_of_table(table.drop(["tcode"])))
        return {first[trace_id]: trace for trace_id, trace in built.items()}


class _Run:
    """What one breakdown keeps from chunk to chunk."""

    def __init__(
        self,
        np: Any,
        kernel: Any,
        group_by: Sequence[str],
        root_name: str | None,
        trace_ids: Any,
        report: ReportMode | None = None,
    ) -> None:
        self.np, self.kernel, self.trace_ids, self.report = np, kernel, trace_ids, report
        # the attributes read of each root: a report's study attributes after the groups'
        self.group_by = [*group_by, *(ReportMode.EXTRA if report is not None else ())]
        self.strings = _Strings()
        self.groups = _Groups(np)
        self.want = -1 if root_name is None else self.strings.code(root_name)
        self.python: list[Any] = []  # the codes of the traces left to the Python path
        self.spans = 0  # the spans of the others

    def key(self, values: tuple[str, ...]) -> tuple[str, ...]:
        """A root's group from its attributes' values (and, for a report, its name last)."""
        return values if self.report is None else self.report.key(values)

    def chunk(self, cols: dict[str, Any], ready: Any) -> None:
        found, kept = _chunk(self, cols, ready)
        self.python.append(found)
        self.spans += kept


def _labels(np: Any, strings: _Strings) -> tuple[Any, set[int]]:
    """Each string's code as the name of a span in a server (``server <it>``: a PyTriton span
    by what it holds), and the stages' strings the Python path would merge with a fixed
    component (a client stage named ``other``)."""
    known = list(strings.codes.items())  # at once: the reading thread adds to it
    label = np.arange(len(strings.texts), dtype=np.int32)
    for text, code in known:
        if text in times._KNOWN_SPANS:
            label[code] = strings.code(times._KNOWN_SPANS[text].removeprefix("server "))
    if len(label) < len(strings.texts):  # the known names' codes added just now
        label = np.concatenate([label, np.arange(len(label), len(strings.texts), dtype=np.int32)])
    return label, {code for text, code in known if f"client {text}" == bd.CLIENT_OTHER}


def _name(strings: _Strings, code: int) -> str:
    if code >= 0:
        return FIXED_NAMES[code]
    family, string = divmod(-code - 1, 1 << 40)
    return _FAMILIES[family].format(strings.texts[string])


def _chunk(run: _Run, cols: dict[str, Any], ready: Any) -> tuple[Any, int]:
    """Break down the complete traces in ``cols`` (the rows ``ready``) into the run's groups:
    the traces left to the Python path (their codes), and how many spans the others hold."""
    np, kernel, strings, groups = run.np, run.kernel, run.strings, run.groups
    group_by, trace_ids = run.group_by, run.trace_ids
    perm = ready[np.argsort(cols["tcode"][ready], kind="stable")]
    tcode = cols["tcode"][perm]
    starts = np.nonzero(np.concatenate([[True], tcode[1:] != tcode[:-1]]))[0]
    toff = np.concatenate([starts, [len(tcode)]]).astype(np.int64)
    traced = tcode[starts].astype(np.int64)
    del tcode
    labels, merged = _labels(np, strings)
    odd = cols["odd"] | np.isin(cols["stage"], list(merged))
    if cols["groups"].shape[1]:
        is_root = ~cols["hasp"]
        for column in cols["groups"].T:
            bad = [c for c in np.unique(column[is_root]).tolist() if c >= 0]
            bad = [c for c in bad if _typed(strings.texts[c])]
            odd |= is_root & np.isin(column, bad)
    ev_off = np.concatenate([[0], np.cumsum(cols["ev_count"])]).astype(np.int64)
    spans = [cols[k] for k in ("sid", "pid", "hasp", "st", "en", "client")]
    coded = [cols[k] for k in ("name", "stage", "tmodel", "called")]
    label = labels[cols["name"]].astype(np.int32)
    numbers = [cols[k] for k in ("ser", "deser", "conn")]
    events = [ev_off, cols["ev_code"], cols["ev_time"]]
    roots, comps, problems, python, held = kernel.breakdown_chunk(
        toff, perm, *spans, odd, *coded, label, *numbers, *events, run.want
    )
    if run.report is not None:  # a report groups a trace by its first root alone
        roots, comps, problems = _first_roots(np, roots, comps, problems)
    r_trace, r_idx, r_span, r_call, r_bad = roots
    kept = int(held[~python].sum())
    keys = traced[r_trace] * _ROOT_KEY + r_idx
    # each root's group: its values' codes (the server that answered: an address's code)
    columns = []
    for place, key in enumerate(group_by):
        if key == semconv.ANSWERED_BY:
            columns.append(_addresses(np, strings, cols, r_call))
        else:
            columns.append(cols["groups"][r_span, place])
    if run.report is not None:
        columns.append(cols["name"][r_span])
    gids = np.zeros(len(r_trace), np.int64)
    if len(r_trace):
        matrix = np.stack(columns, axis=1) if columns else np.zeros((len(r_trace), 0), np.int64)
        combos, inverse = np.unique(matrix, axis=0, return_inverse=True)
        ids = np.array(
            [
                groups.gid(run.key(tuple(strings.texts[c] if c >= 0 else "" for c in combo)))
                for combo in combos.tolist()
            ],
            np.int64,
        )
        gids = ids[inverse.reshape(-1)]
    if run.report is not None:
        extra = len(group_by) - len(ReportMode.EXTRA)
        run.report.add(
            traced[r_trace],
            gids,
            r_bad,
            cols["en"][r_span] - cols["st"][r_span],
            columns[extra + 1],
            columns[extra + 2],
        )
    c_root, c_comp, c_val, c_part = comps
    unique, inverse = np.unique(c_comp, return_inverse=True)
    ids = np.array([groups.name(_name(strings, int(c))) for c in unique], np.int64)
    groups.add(gids, keys, r_bad, c_root, ids[inverse.reshape(-1)], c_val, c_part)
    q_root, q_kind, q_model, _ = problems
    numbering: dict[int, int] = {}
    for row, kind, model in zip(q_root.tolist(), q_kind.tolist(), q_model.tolist(), strict=True):
        if r_bad[row]:
            continue
        what = (
            "server span starts before its client span"
            if kind == 1
            else "stages + queue exceed the server span"
        )
        trace = trace_ids[int(traced[r_trace[row]])].as_py()
        numbering[row] = numbering.get(row, 0) + 1
        text = f"{strings.texts[model]}: {what} ({trace})"
        groups.said(int(gids[row]), int(keys[row]), numbering[row], text)
    return traced[python], kept


def _first_roots(np: Any, roots: Any, comps: Any, problems: Any) -> tuple[Any, Any, Any]:
    """The kernel's answers for each trace's first root alone (a trace's roots come
    together, in the trace's order)."""
    r_trace = roots[0]
    first = np.ones(len(r_trace), np.bool_)
    first[1:] = r_trace[1:] != r_trace[:-1]
    if first.all():
        return roots, comps, problems
    renumber = np.cumsum(first) - 1

    def keep(arrays: Any) -> Any:
        mine = first[arrays[0]]
        return (renumber[arrays[0][mine]], *(a[mine] for a in arrays[1:]))

    return tuple(a[first] for a in roots), keep(comps), keep(problems)


def _addresses(np: Any, strings: _Strings, cols: dict[str, Any], calls: Any) -> Any:
    """The code of the address each root's first call went to ("" without one)."""
    out = np.full(len(calls), strings.code(""), np.int64)
    has = calls >= 0
    pairs = np.stack([cols["host"][calls[has]], cols["port"][calls[has]]], axis=1)
    if not len(pairs):
        return out
    unique, inverse = np.unique(pairs, axis=0, return_inverse=True)
    made = []
    for host, port in unique.tolist():
        host_text = strings.texts[host] if host >= 0 else ""
        port_text = strings.texts[port] if port >= 0 else ""
        if host_text and port_text not in ("", "0"):
            made.append(strings.code(f"{host_text}:{port_text}"))
        else:
            made.append(strings.code(host_text))
    out[has] = np.array(made, np.int64)[inverse.reshape(-1)]
    return out


def _rows_of(np: Any, files: list[str], sizes: list[int], tcodes: Any, wanted: Any) -> Any:
    """The rows of the traces ``wanted`` (codes), every column and a ``tcode`` one, in the
    segments' order (None: no row); only the row groups that hold them are read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    start = 0
    for path, size in zip(files, sizes, strict=True):
        codes = tcodes[start : start + size]
        start += size
        rows = np.nonzero(np.isin(codes, wanted))[0]
        if not len(rows):
            continue
        segment = pq.ParquetFile(path)
        counts = np.array(
            [segment.metadata.row_group(i).num_rows for i in range(segment.num_row_groups)]
        )
        ends = np.cumsum(counts)
        group_of = np.searchsorted(ends, rows, side="right")
        # a row group at a time: the traces a page draws lie all over the store, and reading
        # their row groups together held a whole segment's columns at once
        for group in np.unique(group_of).tolist():
            mine = rows[group_of == group]
            table = segment.read_row_group(group).take(pa.array(mine - (ends - counts)[group]))
            tables.append(table.append_column("tcode", pa.array(codes[mine])))
    return pa.concat_tables(tables) if tables else None


def _delegate(np: Any, table: Any, run: _Run, root_name: str | None) -> int:
    """Break down the traces whose spans ``table`` holds (with their codes, ``tcode``; None:
    none) by the Python path, into the run's groups; the spans they hold."""
    if table is None:
        return 0

    groups, group_by = run.groups, run.group_by
    first = dict(
        zip(table.column("TraceId").to_pylist(), table.column("tcode").to_pylist(), strict=True)
    )
    spans = 0
    report = run.report
    for trace_id, trace in build_traces(spans_of_table(table.drop(["tcode"]))).items():
        spans += len(trace.spans)
        index = 0
        for root in trace.roots:
            if trace.is_orphan(root) or (root_name is not None and root.name != root_name):
                continue
            if report is not None and index:
                break  # a report groups a trace by its first root alone
            index += 1
            key = first[trace_id] * _ROOT_KEY + index
            components, problems, named = bd._components(trace, root)
            bad = bd.NO_SERVER_SPAN in components
            if report is None:
                gid = groups.gid(bd.group_key(trace, root, group_by))
            else:
                gid = groups.gid(report.python_key(trace, root))
                study = [root.attributes.get(k) for k in ReportMode.EXTRA[1:]]
                codes = [-1 if v is None else run.strings.code(str(v)) for v in study]
                report.add(
                    np.array([first[trace_id]]),
                    np.array([gid]),
                    np.array([bad]),
                    np.array([root.duration_ns]),
                    *(np.array([c]) for c in codes),
                )
            ids = np.array([groups.name(n) for n in components], np.int64)
            parts = np.array([n in named for n in components], np.bool_)
            groups.add(
                np.array([gid]),
                np.array([key]),
                np.array([bad]),
                np.zeros(len(ids), np.int64),
                ids,
                np.array(list(components.values()), np.float64),
                parts,
            )
            if not bad:
                for n, text in enumerate(problems, 1):
                    groups.said(gid, key, n, text)
    return spans
