"""``otelkit import``'s fast path: OTLP JSON lines into the span store's segments by DuckDB.

The Python path (``_decode`` to ``Span`` objects, ``_store._row`` to dicts, pyarrow to Parquet)
costs about 60 µs a span. Here DuckDB's JSON reader parses a file on every core into one row a
span (``_QUERY``), each field whose JSON type matters kept as its JSON text; pyarrow's compute
kernels render the segments' columns from them a record batch at a time (``_Renderer``), and
pyarrow writes the segments (``_Segments``), each stage a thread: the same rows as the Python
path's, in the same order, cut into the same segments, about 15 µs of CPU a span. (DuckDB's
list functions render the columns too, at twice the cost: their lambdas are slow.)

Exactly the same rows, or the Python path's. A file is read here only if every line is one the
Python path reads directly (``_decode._spans`` without ``normalize_json``), and each value is
rendered as ``_row`` renders it: the common forms (plain strings, decimal integers, booleans,
hex ids) by kernels, the others (doubles, by ``repr``; escaped strings, arrays, kvlists,
bytes, resources, scopes) by the Python path's own functions (``_loads``, ``_value``,
``_attributes``, ``_sampling``, ``_texts``, ``_json``) on their JSON text as DuckDB writes it
back, which parses to what the whole line parses to there. What cannot be shown so sends the
whole file through the Python path (``ImportResult.fallback``, with the reason, which
``otelkit import`` prints; a folder may mix both ways):

- the pre-scan of the raw lines (``_PRESCAN``): a null (the Python path tells a null from a
  missing key, DuckDB does not), NaN or Infinity, a trailing comma, a number beyond a double
  (DuckDB's parser takes them, orjson refuses the line); a carriage return inside a line
  (Python's universal newlines split there); a line nested deeper than the Python path's
  parser goes (``_Engine.shallow``, run beside the file's query);
- DuckDB refusing a line: malformed JSON (the Python path warns and skips it), a duplicate key
  in an object (orjson keeps the last), an object or list where another type is expected,
  invalid UTF-8, a byte order mark, a line longer than its reader takes (``_MAX_LINE``);
- the renderer (``_NotCanonical``): ids not 16 or 8 bytes in hex (base64, from protobuf's JSON
  mapping), enum names, times not decimal int64s, a name not a string, an attribute key twice
  in one list, a value the Python path's functions refuse or ``json.dumps`` writes as NaN.

The Collector's proto and zstd framings, a gzip file not named ``.gz`` and a name DuckDB would
read as a pattern go the Python way too. A file refused after its first rows were written
takes back the segments it touched, which are written again from where the first of them
began (``_Segments.rollback``); one refused before, as most are, simply goes the Python way.

Memory is bounded: DuckDB holds at most ``MEMORY_LIMIT`` (spilling to a temporary folder of
its own), and rows stream from it to the segment writer a record batch at a time.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import queue
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otelkit.analysis._collector import GZIP_MAGIC, framing
from otelkit.analysis._decode import _attributes, _loads, _sampling, _value
from otelkit.analysis._decode import _NotCanonical as _Refused
from otelkit.analysis._loader import iter_spans
from otelkit.analysis._store import (
    SUFFIX,
    _arrow,
    _json,
    _Resources,
    _row,
    _schema,
    _texts,
    segment_path,
)

__all__ = ["MEMORY_LIMIT", "ImportResult", "import_files"]

_log = logging.getLogger("otelkit.analysis")

#: what DuckDB may hold in memory before it spills to disk
MEMORY_LIMIT = "1GB"
_ROWS_PER_GROUP = 65_536  # as ``write_segment``: what a reader of a segment holds at once
_BATCH_ROWS = 16_384  # DuckDB's record batches: what waits for the renderer is bounded
#: a line longer than this (bytes) is the Python path's: DuckDB's reader holds a few whole
#: (DuckDB's default; twice that neared the memory limit with a Collector's lines of 1 MB)
_MAX_LINE = 16 << 20
#: a line with this many ``[`` and ``{`` may nest deeper than orjson's 1024 levels or json's
#: recursion limit, where DuckDB's parser has none: the Python path's parser reads it to see
_DEEP = 900
#: what the Python path's exceptions are when it reads a document directly (``spans_of_line``)
_PYTHON_ERRORS = (_Refused, KeyError, TypeError, ValueError, AttributeError, RecursionError)


class _NotCanonical(Exception):
    """A file the fast path cannot show it renders as the Python path does."""


@dataclass
class ImportResult:
    """What an import wrote: ``spans`` in ``segments``, and which files went which way
    (``fallback``: each file the Python path read, with the reason)."""

    spans: int = 0
    segments: list[Path] = field(default_factory=list)
    fast: list[Path] = field(default_factory=list)
    fallback: dict[Path, str] = field(default_factory=dict)


# -- the query ------------------------------------------------------------------------------
#
# Each leaf whose JSON type matters is read as DuckDB's JSON type: its text as DuckDB's parser
# (yyjson) writes it back, compact, so a string keeps its quotes and a number or a literal has
# none. A JSON null and a missing key both read as NULL: the pre-scan refuses nulls.

_VALUE = (
    "STRUCT(stringValue JSON, intValue JSON, doubleValue JSON, boolValue JSON, "
    "arrayValue JSON, kvlistValue JSON, bytesValue JSON)"
)
_KVS = f"STRUCT(key JSON, value {_VALUE})[]"
_SPAN = (
    "STRUCT(traceId JSON, spanId JSON, parentSpanId JSON, name JSON, kind JSON, "
    f"startTimeUnixNano JSON, endTimeUnixNano JSON, attributes {_KVS}, "
    f"events STRUCT(timeUnixNano JSON, name JSON, attributes {_KVS})[], "
    f"links STRUCT(traceId JSON, spanId JSON, attributes {_KVS})[], "
    "status STRUCT(code JSON, message JSON))"
)
#: the resource and each scope whole, as JSON text: their attributes are read by the Python
#: path's own functions, once for each distinct one (the spans of a process share them)
_RESOURCE_SPANS = f"STRUCT(resource JSON, scopeSpans STRUCT(scope JSON, spans {_SPAN}[])[])[]"

#: One row a span, in the order of the files and of their lines: DuckDB keeps the order of
#: insertion through its scans, unnests and projections (``preserve_insertion_order``; the
#: renderer checks the files'). ``res``, ``scope`` and ``file`` are on each scope's first row
#: only (the renderer carries them forward): once, not once a span. A resource without
#: scopes, or a scope without spans, gives a row without a span (``placeholder``): the Python
#: path reads its attributes all the same, and skips the whole line if it cannot.
_QUERY = """
WITH resources AS (
    SELECT filename, unnest(resourceSpans) AS rs
    FROM read_json($files, format = 'newline_delimited', records = true,
        compression = $compression, maximum_object_size = $max_line,
        columns = {resourceSpans: '$resource_spans'}, filename = true)
), scopes AS (
    SELECT filename, rs.resource AS res,
        unnest(CASE WHEN len(rs.scopeSpans) > 0 THEN rs.scopeSpans ELSE [NULL] END) AS ss
    FROM resources
), lists AS (
    SELECT filename, res, ss.scope AS scope,
        CASE WHEN len(ss.spans) > 0 THEN ss.spans ELSE [NULL] END AS spans
    FROM scopes
), spans AS (
    SELECT filename, res, scope, unnest(spans) AS s, unnest(range(len(spans))) AS i
    FROM lists
)
SELECT
    CASE WHEN i = 0 THEN filename END AS file,
    CASE WHEN i = 0 THEN coalesce(res, '{}') END AS res,
    CASE WHEN i = 0 THEN coalesce(scope, '{}') END AS scope,
    s IS NULL AS placeholder,
    s.traceId, s.spanId, s.parentSpanId, s.name, s.kind,
    s.startTimeUnixNano, s.endTimeUnixNano,
    s.status.code AS code, s.status.message AS message,
    s.attributes, s.events, s.links
FROM spans
"""

# The pre-scan. What DuckDB's parser reads unlike the Python path's starts where a value does
# (after a colon, a comma or a bracket, and blanks): a null (read as a missing key), NaN or
# Infinity in any case, a trailing comma (both taken by DuckDB, refused by orjson), a number
# beyond a double (infinite for DuckDB, refused by orjson). The patterns below find each such
# place, and others inside strings ("a: nice day"); each begins with one byte, which RE2 finds
# by memchr, where a pattern tracking strings runs a DFA over every byte (four times the
# cost). A line they find is read by the Python path's own parser (``_loads``), which says.
_VALUE_AT = r"\s*-?(?:[nNiI]|[0-9.]+[eE][-+]?[0-9]{3}|[0-9]{300})"
_SUSPECT = " OR ".join(
    f"regexp_matches(json, '{pattern}')"
    for pattern in (
        ":" + _VALUE_AT,
        r",(?:\s*[\]}]|" + _VALUE_AT + ")",
        r"\[" + _VALUE_AT,
        r"^\s*[^\s{]",  # not an object
    )
)
# Nesting: orjson refuses a line past 1024 levels, json at its recursion limit, DuckDB never.
# A line with fewer than ``_DEEP`` brackets (``[`` and ``{``, in strings too) cannot nest so
# deep; the others' depth is bounded by ``_nests_at_most``, all lines at once.
_OPENERS = (
    "strlen(json) - strlen(replace(json, '[', '')) + strlen(json) - strlen(replace(json, '{', ''))"
)
_LINES = (
    "FROM read_ndjson_objects($files, compression = $compression, "
    "maximum_object_size = $max_line, filename = true)"
)
_PRESCAN = f"""
SELECT
    filename,
    count(*) FILTER (WHERE regexp_matches(json, '\r')) AS carriage_returns,
    count(*) FILTER (WHERE {_SUSPECT}) AS suspect,
    count(*) FILTER (WHERE {_OPENERS} >= $deep) AS deep
{_LINES}
GROUP BY filename
"""
_SUSPECT_LINES = f"SELECT json {_LINES} WHERE {_SUSPECT}"
_DEEP_LINES = f"SELECT json {_LINES} WHERE {_OPENERS} >= $deep"
#: what ``_nests_at_most`` checks for (a JSON-lines trace nests 14 levels at most)
_SHALLOW = 64
_ESCAPE = re.compile(rb"\\.")
_STRING = re.compile(rb'"[^"]*"')
_NOT_STRUCTURE = bytes(range(256)).translate(None, b'"[]{}')


def _nests_at_most(data: bytes, levels: int) -> bool:
    """Whether JSON documents (valid ones, one after another) nest ``levels`` at most: their
    escapes dropped, then all but quotes and brackets, then strings (of brackets, or empty),
    each round drops the innermost pairs of brackets, a level or two. Byte operations in C:
    a quarter of what the Python path's parser costs, with no object made."""
    if b"\\" in data:
        data = _ESCAPE.sub(b"", data)
    # what stays of a string is its quotes around brackets: an adjacent pair of quotes (an
    # empty string, or the end of one and the start of the next) goes without moving a
    # bracket in or out of one
    data = data.translate(None, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in data:
        data = _STRING.sub(b"", data)
    for _ in range(levels):
        if not data:
            return True
        data = data.replace(b"[]", b"").replace(b"{}", b"")
    return not data


def _q(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _compression(path: Path) -> str | None:
    """DuckDB's compression for ``path`` as the Python path opens it (``.gz`` by gzip, any
    other name as text), or None for a file left to the Python path: the Collector's proto and
    zstd framings, a gzip file not named so or a text file named so, a byte order mark, a
    name with a character of a pattern."""
    try:
        if framing(path) != "lines":
            return None
        with path.open("rb") as file:
            head = file.read(3)
    except OSError:
        return None  # the Python path says what is wrong
    if any(char in _name(path) for char in "*?[]{}"):
        return None  # DuckDB reads such a name as a pattern of names
    gzipped = head.startswith(GZIP_MAGIC)
    if path.name.endswith(".gz"):
        return "gzip" if gzipped else None
    return None if gzipped or head.startswith(b"\xef\xbb\xbf") else "none"


class _Engine:
    """DuckDB for one import: bounded memory, a spill folder of its own."""

    def __init__(self, memory_limit: str, threads: int | None) -> None:
        import duckdb

        self.duckdb = duckdb
        self.spill = tempfile.mkdtemp(prefix="otelkit-import-")
        config: dict[str, Any] = {
            "memory_limit": memory_limit,
            "temp_directory": self.spill,
            "preserve_insertion_order": True,  # the spans' order is the segments'
        }
        if threads:
            config["threads"] = threads
        self.con = duckdb.connect(config=config)
        # a connection refuses a second thread's call while one runs (it does not wait): the
        # threads that read beside each other take cursors of their own, one at a time
        self._lock = threading.Lock()

    def cursor(self) -> Any:
        with self._lock:
            return self.con.cursor()

    def close(self) -> None:
        self.con.close()
        shutil.rmtree(self.spill, ignore_errors=True)

    def _sql(self, template: str, files: Sequence[Path], compression: str) -> str:
        """``template`` with its ``$`` names filled in (SQL and regular expressions have too
        many braces for ``str.format``)."""
        for name, value in (
            ("$resource_spans", _RESOURCE_SPANS),
            ("$files", "[" + ", ".join(_q(_name(path)) for path in files) + "]"),
            ("$compression", _q(compression)),
            ("$max_line", str(_MAX_LINE)),
            ("$deep", str(_DEEP)),
        ):
            template = template.replace(name, value)
        return template

    def prescan(self, files: Sequence[Path], compression: str) -> dict[Path, _Verdict]:
        """Each file's verdict from its raw lines, by one query for all (each file alone if
        DuckDB refuses one)."""
        cursor = self.cursor()
        try:
            found = cursor.execute(self._sql(_PRESCAN, files, compression)).fetchall()
        except self.duckdb.Error as error:
            if len(files) == 1:
                return {files[0]: _Verdict(_reason(error))}
            return {path: self.prescan([path], compression)[path] for path in files}
        finally:
            cursor.close()
        counts = {name: (returns, suspect, deep) for name, returns, suspect, deep in found}
        verdicts = {}
        for path in files:  # a file of blank lines gives no row
            returns, suspect, deep = counts.get(_name(path), (0, 0, 0))
            why: str | None = None
            if returns:
                why = f"{returns} lines with a carriage return (Python's newlines split there)"
            elif suspect:
                why = self._read_suspects(path, compression)
            verdicts[path] = _Verdict(why, deep=bool(deep) and why is None)
        return verdicts

    def _read_suspects(self, path: Path, compression: str) -> str | None:
        """Why a line the pre-scan found is the Python path's, read by its parser: one it
        cannot read, or one holding a null or a float that is not finite."""
        cursor = self.cursor()  # closed with its result, read or not
        try:
            result = cursor.execute(self._sql(_SUSPECT_LINES, [path], compression))
            while rows := result.fetchmany(64):
                for (line,) in rows:
                    try:
                        doc = _loads(line)
                    except (ValueError, RecursionError):
                        return "a line the Python path's JSON parser refuses"
                    if not isinstance(doc, dict):
                        return "a line that is not an object"
                    # a line of metrics or logs gives no span either way
                    if "resourceSpans" in doc and not _finite(doc):
                        return "a null, NaN or Infinity"
        except self.duckdb.Error as error:
            return _reason(error)
        finally:
            cursor.close()
        return None

    def shallow(self, files: Sequence[Path], compression: str) -> str | None:
        """Why a line with many brackets is the Python path's: one nesting deeper than
        ``_SHALLOW`` levels (every line of a batch at once) that its parser refuses; None."""
        import pyarrow

        cursor = self.cursor()  # its own: it runs beside the files' query
        try:
            reader = cursor.sql(self._sql(_DEEP_LINES, files, compression)).to_arrow_reader()
            for batch in reader:
                lines = batch.column(0).cast(pyarrow.string())
                _, offsets, values = lines.buffers()
                offsets = pyarrow.Array.from_buffers(
                    pyarrow.int32(), len(lines) + 1, [None, offsets], offset=lines.offset
                )
                start, end = offsets[0].as_py(), offsets[len(lines)].as_py()
                if _nests_at_most(values[start:end].to_pybytes(), _SHALLOW):  # one after another
                    continue
                for line in lines.to_pylist():
                    try:
                        _loads(line)
                    except (ValueError, RecursionError):
                        return "a line nested too deep for the Python path's JSON parser"
        except (self.duckdb.Error, OSError) as error:
            return _reason(error)
        finally:
            cursor.close()
        return None

    def rows(self, files: Sequence[Path], compression: str) -> Iterator[Any]:
        """The query's record batches for ``files``; ``_NotCanonical`` if DuckDB refuses a
        line, which may be after some batches."""
        # a cursor of its own: files given up half read leave no result pending on the
        # connection the next query runs on
        cursor = self.cursor()
        try:
            sql = self._sql(_QUERY, files, compression)
            yield from cursor.sql(sql).to_arrow_reader(_BATCH_ROWS)
        except (self.duckdb.Error, OSError) as error:  # DuckDB's, raised by pyarrow's reader
            raise _NotCanonical(_reason(error)) from error
        finally:
            cursor.close()


@dataclass
class _Verdict:
    """The pre-scan's word on a file: why it is the Python path's (None: it is not), and
    whether it has lines ``_Engine.shallow`` reads (beside the query: it costs as much)."""

    refused: str | None = None
    deep: bool = False


def _name(path: Path) -> str:
    """``path`` as DuckDB is given it and names it back: absolute (DuckDB reads ``~`` as the
    home folder)."""
    return str(path.resolve())


def _finite(value: Any) -> bool:
    """Whether ``value`` (a parsed document) holds no None and no float but finite ones."""
    stack = [value]
    while stack:
        item = stack.pop()
        if item is None or (type(item) is float and not math.isfinite(item)):
            return False
        if type(item) is dict:
            stack.extend(item.values())
        elif type(item) is list:
            stack.extend(item)
    return True


def _reason(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    text = lines[0] if lines else type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."


# -- rendering ------------------------------------------------------------------------------

_HEX32 = r'^"[0-9A-Fa-f]{32}"$'
_HEX16 = r'^"[0-9A-Fa-f]{16}"$'
#: an enum as ``_decode._number`` takes it: an integer (more digits than an int64 are refused)
_INTEGER = r"^-?[0-9]{1,18}$"
#: an intValue whose str(int()) is its digits: no sign but -, no leading zero, no -0
_CANONICAL_INT = r'^"?(?:0|-?[1-9][0-9]{0,17})"?$'
#: a JSON number as DuckDB's parser writes it back (a double's shortest digits)
_NUMBER = r"^-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?$"
_KINDS = ("Unspecified", "Internal", "Server", "Client", "Producer", "Consumer")
_STATUSES = ("Unset", "Ok", "Error")
_VALUE_KEYS = (
    "stringValue",
    "intValue",
    "doubleValue",
    "boolValue",
    "arrayValue",
    "kvlistValue",
    "bytesValue",
)


@dataclass
class _Pairs:
    """Lists of key-values rendered: ``offsets`` (each list's first pair), each pair's key and
    value as ``_texts`` writes them (``keys``, ``values``) and as ``_json`` does
    (``keys_json``, ``values_json``), and each list's JSON (``json``)."""

    pa: Any
    offsets: Any
    keys: Any
    keys_json: Any
    values: Any
    values_json: Any
    json: Any

    def texts(self) -> Any:
        """Each list as ``_texts`` writes it: a map of strings."""
        return self.pa.MapArray.from_arrays(self.offsets, self.keys, self.values)


class _Renderer:
    """The query's record batches as the segments' (``_store._schema``), in order: each value
    as ``_row`` writes it, or ``_NotCanonical``."""

    def __init__(self, pa: Any) -> None:
        import pyarrow.compute

        self.pa, self.pc = pa, pyarrow.compute
        self.schema = _schema(pa)
        self.map_type = self.schema.field("SpanAttributes").type
        #: each distinct resource's text: its service, attribute texts and JSON (``_resource``)
        self.resources: dict[str, tuple[str, list[tuple[str, str]], str]] = {}
        #: each distinct scope's text: its name and tail sampling attributes (``_sampling``)
        self.scopes: dict[str, tuple[str, dict[str, Any]]] = {}
        #: the resource and scope of the rows before a batch's first scope start
        self.carried: dict[str, str | None] = {"res": None, "scope": None}
        #: the files read by the query, by name, in order, and the last one seen
        self.order: dict[str, int] = {}
        self.last = 0

    def start(self, files: Sequence[Path]) -> None:
        """The query's batches of ``files`` come next."""
        self.carried = {"res": None, "scope": None}
        self.order = {_name(path): n for n, path in enumerate(files)}
        self.last = 0

    def safely(self, batch: Any) -> Any:
        """``render``, a kernel's refusal of a value (none seen) a refusal of the file: the
        Python path reads it instead."""
        try:
            return self.render(batch)
        except self.pa.ArrowException as error:
            raise _NotCanonical(f"pyarrow: {error}") from error

    def render(self, batch: Any) -> Any:
        pa, pc = self.pa, self.pc
        self._in_order(batch.column("file"))
        resources, resource_of = self._carry(batch.column("res"), "res")
        scopes, scope_of = self._carry(batch.column("scope"), "scope")
        rendered = [self._resource(text) for text in resources]
        named = [self._scope(text) for text in scopes]
        placeholder = batch.column("placeholder")
        spans = batch
        if placeholder.true_count:  # their resource and scope were read; they hold no span
            keep = pc.invert(placeholder)
            spans = batch.filter(keep)
            resource_of, scope_of = resource_of.filter(keep), scope_of.filter(keep)
        start = self._times(spans.column("startTimeUnixNano"), "startTimeUnixNano")
        end = self._times(spans.column("endTimeUnixNano"), "endTimeUnixNano")
        attributes = self._attributes(spans.column("attributes"))
        attributes_json, attribute_texts = attributes.json, attributes.texts()
        if any(kept for _, kept in named):
            attributes_json, attribute_texts = self._merge(
                attributes, [named[i][1] for i in scope_of.to_pylist()]
            )
        columns = {
            "Timestamp": start.view(self.schema.field("Timestamp").type),
            "TraceId": self._ids(spans.column("traceId"), _HEX32, "traceId"),
            "SpanId": self._ids(spans.column("spanId"), _HEX16, "spanId"),
            "ParentSpanId": self._parents(spans.column("parentSpanId")),
            "SpanName": self._strings(spans.column("name"), "name"),
            "SpanKind": self._enum(spans.column("kind"), _KINDS, "kind"),
            "ServiceName": pc.take(pa.array([r[0] for r in rendered], pa.string()), resource_of),
            "ScopeName": pc.take(pa.array([n[0] for n in named], pa.string()), scope_of),
            "Duration": pc.subtract(end, start),
            "StatusCode": self._enum(spans.column("code"), _STATUSES, "status code"),
            "StatusMessage": self._strings(spans.column("message"), "status message"),
            "SpanAttributes": attribute_texts,
            "ResourceAttributes": pc.take(
                pa.array([r[1] for r in rendered], self.map_type), resource_of
            ),
            "SpanAttributesJson": attributes_json,
            "ResourceAttributesJson": pc.take(
                pa.array([r[2] for r in rendered], pa.string()), resource_of
            ),
            "Events": self._events(spans.column("events")),
            "Links": self._links(spans.column("links")),
        }
        return pa.RecordBatch.from_arrays(
            [columns[name].cast(self.schema.field(name).type) for name in self.schema.names],
            schema=self.schema,
        )

    def _in_order(self, names: Any) -> None:
        """Refuse the files unless their rows come in the order they were given (DuckDB
        keeps it; shown, not assumed: the segments' order is the files')."""
        pa, pc = self.pa, self.pc
        given = pc.drop_null(names)
        if not len(given):
            return
        encoded = pc.dictionary_encode(given)
        try:
            order = [self.order[name] for name in encoded.dictionary.to_pylist()]
        except KeyError as error:
            raise _NotCanonical(f"rows of a file not read: {error}") from error
        where = pc.take(pa.array(order, pa.int64()), encoded.indices)
        after = pa.concat_arrays([pa.array([self.last], pa.int64()), where])
        if not pc.all(pc.less_equal(after.slice(0, len(where)), after.slice(1))).as_py():
            raise _NotCanonical("the files' rows out of order")
        self.last = where[len(where) - 1].as_py()

    # resources and scopes: by the Python path's own functions on their text, once each

    def _carry(self, texts: Any, name: str) -> tuple[list[str], Any]:
        """A column set on each scope's first row and null on the others: its distinct texts,
        and each row's index among them (the latest set at or before it, else the one carried
        from the batch before)."""
        pa, pc = self.pa, self.pc
        starts = pc.is_valid(texts)
        carried = self.carried[name]
        if carried is None and len(texts) and not starts[0].as_py():
            raise _NotCanonical("a span before its scope")  # the query sets the first row
        given = pc.filter(texts, starts)
        encoded = pc.dictionary_encode(given)
        distinct = encoded.dictionary.to_pylist()
        # the runs of rows: each start's, and the carried one's (at the end) for rows before
        runs = pc.subtract(pc.cumulative_sum(pc.cast(starts, pa.int64())), 1)
        run_text = pa.concat_arrays(
            [encoded.indices.cast(pa.int64()), pa.array([len(distinct)], pa.int64())]
        )
        if carried is not None:
            distinct.append(carried)
        if len(given):
            self.carried[name] = given[len(given) - 1].as_py()
        return distinct, pc.take(run_text, pc.if_else(pc.less(runs, 0), len(given), runs))

    def _resource(self, text: str) -> tuple[str, list[tuple[str, str]], str]:
        """A resource's columns, as ``_store._resource`` writes ``_decode._spans``'s."""
        found = self.resources.get(text)
        if found is None:
            try:
                resource = _loads(text)
                attributes = _attributes(resource.get("attributes", ()))
            except _PYTHON_ERRORS as error:
                raise _NotCanonical(f"resource: {error!r}") from error
            if len(self.resources) >= 4096:  # a cache, not a record of every resource
                self.resources.clear()
            found = self.resources[text] = (
                str(attributes.get("service.name", "")),
                _texts(attributes),
                _json(attributes),
            )
        return found

    def _scope(self, text: str) -> tuple[str, dict[str, Any]]:
        """A scope's name and tail sampling attributes, as ``_decode._spans`` reads them."""
        found = self.scopes.get(text)
        if found is None:
            try:
                scope = _loads(text)
                name, kept = scope.get("name", ""), _sampling(scope.get("attributes", ()))
            except _PYTHON_ERRORS as error:
                raise _NotCanonical(f"scope: {error!r}") from error
            if not isinstance(name, str):  # pyarrow refuses it in the Python path's writer
                raise _NotCanonical(f"scope name {name!r}")
            if len(self.scopes) >= 4096:
                self.scopes.clear()
            found = self.scopes[text] = (name, kept)
        return found

    def _merge(self, attributes: _Pairs, kept: list[dict[str, Any]]) -> tuple[Any, Any]:
        """The spans' attributes after their scope's tail sampling ones (``{**kept,
        **attributes}``: a key of both in the scope's place with the span's value), for the
        rows whose scope has some, by Python; the other rows as they are."""
        pa, pc = self.pa, self.pc
        offsets = attributes.offsets.to_pylist()
        keys, keys_json = attributes.keys.to_pylist(), attributes.keys_json.to_pylist()
        values, values_json = attributes.values.to_pylist(), attributes.values_json.to_pylist()
        rows = [row for row, found in enumerate(kept) if found]
        merged_json, pieces, done = [], [], 0
        texts = attributes.texts()
        for row in rows:
            merged = {
                key: (
                    json.dumps(key, ensure_ascii=False),
                    json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str),
                    value if isinstance(value, str) else json.dumps(value, default=str),
                )
                for key, value in kept[row].items()
            }
            for i in range(offsets[row], offsets[row + 1]):
                merged[keys[i]] = (keys_json[i], values_json[i], values[i])
            merged_json.append("{" + ",".join(f"{k}:{v}" for k, v, _ in merged.values()) + "}")
            pieces += [
                texts.slice(done, row - done),
                pa.array([[(k, t) for k, (_, _, t) in merged.items()]], self.map_type),
            ]
            done = row + 1
        pieces.append(texts.slice(done))
        mask = pa.array([bool(found) for found in kept])
        return (
            pc.replace_with_mask(attributes.json, mask, pa.array(merged_json, pa.string())),
            pa.concat_arrays([piece.cast(self.map_type) for piece in pieces]),
        )

    # scalars

    def _require(self, ok: Any, what: str) -> None:
        """Refuse the file unless every value of the boolean array ``ok`` is true."""
        if len(ok) and (ok.null_count or not self.pc.all(ok).as_py()):
            raise _NotCanonical(f"{what} not in the form read directly")

    def _ids(self, texts: Any, pattern: str, what: str) -> Any:
        """Ids as ``_decode._hex`` reads them, lowercase; refused unless hex (base64 is
        ``normalize_json``'s, and almost never hex)."""
        pc = self.pc
        self._require(pc.match_substring_regex(texts, pattern), what)
        return pc.ascii_lower(pc.utf8_slice_codeunits(texts, 1, -1))

    def _parents(self, texts: Any) -> Any:
        """A parent's id, "" for none (missing, or empty: ``_decode._spans``'s falsy)."""
        pc = self.pc
        given = pc.not_equal(texts.fill_null('""'), '""')
        if not pc.any(given).as_py():
            return self.pa.array([""] * len(texts), self.pa.string())
        self._require(pc.match_substring_regex(pc.filter(texts, given), _HEX16), "parentSpanId")
        ids = pc.ascii_lower(pc.utf8_slice_codeunits(texts, 1, -1))
        return pc.if_else(given, ids, "")

    def _times(self, texts: Any, what: str) -> Any:
        """Times as ``_decode._time`` reads them (0 where missing), as int64: ASCII digits, in
        a JSON string or a number (a number's text has no quotes; a string of digits has no
        escapes); more than an int64 holds is refused (pyarrow refuses it there too)."""
        pa, pc = self.pa, self.pc
        digits = pc.utf8_trim(texts.fill_null("0"), '"')
        self._require(pc.ascii_is_decimal(digits), what)
        try:
            return pc.cast(digits, pa.int64())
        except pa.ArrowInvalid as error:
            raise _NotCanonical(f"{what}: {error}") from error

    def _enum(self, texts: Any, names: tuple[str, ...], what: str) -> Any:
        """An enum's name (``_store._KINDS``, ``_STATUSES``): a JSON integer, a value out of
        range the first name (``_decode._enum``), as where missing."""
        pa, pc = self.pa, self.pc
        present = pc.drop_null(texts)
        self._require(pc.match_substring_regex(present, _INTEGER), what)
        index = pc.index_in(texts, value_set=pa.array([str(n) for n in range(len(names))]))
        return pc.take(pa.array(names), index).fill_null(names[0])

    def _strings(self, texts: Any, what: str) -> Any:
        """Strings as ``_decode._text`` reads them: "" where missing, refused unless strings."""
        pc = self.pc
        self._require(pc.starts_with(pc.drop_null(texts), '"'), what)
        return self._unquote(texts).fill_null("")

    def _unquote(self, texts: Any) -> Any:
        """JSON strings' texts as strings: those with escapes decoded by the Python path's
        parser (few), the others without their quotes."""
        pa, pc = self.pa, self.pc
        plain = pc.utf8_slice_codeunits(texts, 1, -1)
        escaped = pc.match_substring(texts, "\\").fill_null(False)
        if not escaped.true_count:
            return plain
        decoded = [_loads(text) for text in pc.filter(texts, escaped).to_pylist()]
        return pc.replace_with_mask(plain, escaped, pa.array(decoded, pa.string()))

    def _quoted(self, texts: Any) -> Any:
        """JSON strings' texts as ``json.dumps(ensure_ascii=False)`` writes them: DuckDB's
        writer does so (every code point checked) but for the hex digits of \\u00XX, which it
        writes in capitals; a text with an escape is written again by json (few)."""
        pa, pc = self.pa, self.pc
        escaped = pc.match_substring(texts, "\\").fill_null(False)
        if not escaped.true_count:
            return texts
        again = [
            json.dumps(_loads(text), ensure_ascii=False)
            for text in pc.filter(texts, escaped).to_pylist()
        ]
        return pc.replace_with_mask(texts, escaped, pa.array(again, pa.string()))

    # attributes, events, links

    def _attributes(self, lists: Any) -> _Pairs:
        """Lists of key-values: each key and value as ``_store._texts`` and ``_json`` write
        them, and each list as ``_json`` does (``SpanAttributesJson``)."""
        pa, pc = self.pa, self.pc
        offsets = self._offsets(lists)
        pairs = pc.list_flatten(lists)
        if not len(pairs):
            none = pa.array([], pa.string())
            return _Pairs(pa, offsets, none, none, none, none, pa.array(["{}"] * len(lists)))
        self._require(pc.is_valid(pairs), "key-value")
        key, value = pairs.flatten()
        self._require(pc.starts_with(key, '"'), "attribute key")
        self._unique(pc.list_parent_indices(lists), key)
        values_json, values = self._values(value)
        keys_json = self._quoted(key)
        pair_json = pc.binary_join_element_wise(keys_json, values_json, ":")
        joined = pc.binary_join(pa.ListArray.from_arrays(offsets, pair_json), ",")
        return _Pairs(
            pa,
            offsets,
            self._unquote(key),
            keys_json,
            values,
            values_json,
            pc.binary_join_element_wise("{", joined, "}", ""),
        )

    def _unique(self, parents: Any, keys: Any) -> None:
        """Refuse a list holding a key twice: a dict keeps the first's place, the last's value.
        Each (list, key) as one int64, counted distinct: a hash of integers, not of strings."""
        pa, pc = self.pa, self.pc
        encoded = pc.dictionary_encode(keys)
        pairs = pc.add(
            pc.multiply(parents.cast(pa.int64()), len(encoded.dictionary)),
            encoded.indices.cast(pa.int64()),
        )
        if pc.count_distinct(pairs).as_py() != len(keys):
            raise _NotCanonical("an attribute key twice in one list")

    def _values(self, value: Any) -> tuple[Any, Any]:
        """AnyValues as ``json.dumps`` writes ``_decode._value``'s result: compact for
        ``_json``, and as ``_texts`` writes them (a string as it is). Plain strings, canonical
        integers and booleans by kernels; any other by the Python path's own functions."""
        pa, pc = self.pa, self.pc
        fields = dict(zip(_VALUE_KEYS, value.flatten(), strict=True))
        text, integer, boolean = fields["stringValue"], fields["intValue"], fields["boolValue"]
        has_text = pc.is_valid(text)
        has_integer = pc.and_(pc.is_valid(integer), pc.invert(has_text))
        earlier = pc.or_(has_text, has_integer)
        has_double = pc.and_(pc.is_valid(fields["doubleValue"]), pc.invert(earlier))
        earlier = pc.or_(earlier, has_double)
        has_boolean = pc.and_(pc.is_valid(boolean), pc.invert(earlier))
        earlier = pc.or_(earlier, has_boolean)
        composite = pc.or_(
            pc.or_(pc.is_valid(fields["arrayValue"]), pc.is_valid(fields["kvlistValue"])),
            pc.is_valid(fields["bytesValue"]),
        )
        has_composite = pc.and_(composite, pc.invert(earlier))
        # the forms kernels render as json.dumps does; the rest goes to Python ("slow")
        plain_text = pc.and_(has_text, pc.invert(pc.match_substring(text, "\\").fill_null(True)))
        plain_text = pc.and_(plain_text, pc.starts_with(text, '"').fill_null(False))
        plain_integer = pc.and_(
            has_integer, pc.match_substring_regex(integer, _CANONICAL_INT).fill_null(False)
        )
        plain_boolean = pc.and_(has_boolean, pc.is_in(boolean, pa.array(["true", "false"])))
        double = fields["doubleValue"]
        plain_double = pc.and_(
            has_double, pc.match_substring_regex(double, _NUMBER).fill_null(False)
        )
        slow = pc.or_(
            pc.or_(
                pc.and_(has_text, pc.invert(plain_text)),
                pc.and_(has_double, pc.invert(plain_double)),
            ),
            pc.or_(
                pc.or_(pc.and_(has_integer, pc.invert(plain_integer)), has_composite),
                pc.and_(has_boolean, pc.invert(plain_boolean)),
            ),
        )
        as_json = pc.if_else(plain_text, text, "null")
        as_json = pc.if_else(plain_integer, pc.utf8_trim(integer, '"'), as_json)
        as_json = pc.if_else(plain_boolean, boolean, as_json)
        if plain_double.true_count:
            # float() of a JSON number, as the Python path's parser reads it (Arrow's parsing is
            # correctly rounded, as orjson's and json's), written by repr (json.dumps's)
            numbers = pc.cast(pc.filter(double, plain_double), pa.float64())
            if not pc.all(pc.is_finite(numbers)).as_py():
                raise _NotCanonical("a doubleValue out of a double's range")
            written = pa.array([repr(x) for x in numbers.to_pylist()], pa.string())
            as_json = pc.replace_with_mask(as_json, plain_double, written)
        as_text = pc.if_else(plain_text, pc.utf8_slice_codeunits(text, 1, -1), as_json)
        if slow.true_count:
            rendered = [
                self._value(row)
                for row in pc.filter(value, slow).to_pylist()  # dicts of the present texts
            ]
            as_json = pc.replace_with_mask(as_json, slow, pa.array([r[0] for r in rendered]))
            as_text = pc.replace_with_mask(as_text, slow, pa.array([r[1] for r in rendered]))
        return as_json, as_text

    @staticmethod
    def _value(texts: dict[str, str | None]) -> tuple[str, str]:
        """One AnyValue by the Python path's functions: ``_attributes``'s choice, then
        ``_json``'s and ``_texts``'s ``json.dumps``."""
        try:
            value = {key: _loads(text) for key, text in texts.items() if text is not None}
            found = value["stringValue"] if "stringValue" in value else _value(value)
            if isinstance(found, float) and not math.isfinite(found):
                raise ValueError("not finite")  # json.dumps writes NaN; never seen, left out
            compact = json.dumps(found, separators=(",", ":"), ensure_ascii=False, default=str)
        except _PYTHON_ERRORS as error:
            raise _NotCanonical(f"an AnyValue: {error!r}") from error
        return compact, found if isinstance(found, str) else json.dumps(found, default=str)

    def _events(self, lists: Any) -> Any:
        return self._nested(
            lists,
            "event",
            ["Timestamp", "Name", "AttributesJson"],
            lambda time, name, attributes: [
                self._times(time, "timeUnixNano"),
                self._strings(name, "event name"),
                self._attributes(attributes).json,
            ],
        )

    def _links(self, lists: Any) -> Any:
        return self._nested(
            lists,
            "link",
            ["TraceId", "SpanId", "AttributesJson"],
            lambda trace, span, attributes: [
                self._ids(trace, _HEX32, "link traceId"),
                self._ids(span, _HEX16, "link spanId"),
                self._attributes(attributes).json,
            ],
        )

    def _nested(
        self, lists: Any, what: str, names: list[str], columns: Callable[..., list[Any]]
    ) -> Any:
        """A span's list of events or links: each item's fields made into ``names``'
        ``columns``, the lists rebuilt over them."""
        pa, pc = self.pa, self.pc
        items = pc.list_flatten(lists)
        self._require(pc.is_valid(items), what)
        records = pa.StructArray.from_arrays(columns(*items.flatten()), names=names)
        return pa.ListArray.from_arrays(self._offsets(lists), records)

    def _offsets(self, lists: Any) -> Any:
        pa, pc = self.pa, self.pc
        lengths = pc.list_value_length(lists).fill_null(0)
        return pa.concat_arrays(
            [pa.array([0], pa.int32()), pc.cumulative_sum(lengths).cast(pa.int32())]
        )


# -- segments -------------------------------------------------------------------------------


def _python_batches(path: Path, schema: Any, pa: Any) -> Iterator[Any]:
    """The Python path's rows of ``path`` (``_decode``, ``_row``), as record batches."""
    spans = iter_spans(path)
    while chunk := list(itertools.islice(spans, _ROWS_PER_GROUP)):
        seen: _Resources = {}
        rows = [_row(span, seen) for span in chunk]
        yield from pa.Table.from_pylist(rows, schema=schema).to_batches()


class _Segments:
    """Record batches into segments of at most ``limit`` spans, each written whole under a
    temporary name and renamed (as ``write_segment``), in row groups of ``_ROWS_PER_GROUP``.

    Remembers where each segment began (``starts``: a source's index and how many of its rows
    came before), so that a segment can be taken back with those after it (``rollback``)."""

    def __init__(self, out: Path, limit: int, schema: Any, pa: Any) -> None:
        self.out, self.limit, self.schema, self.pa = out, limit, schema, pa
        self.first = int(segment_path(out).name[len("spans-") : -len(SUFFIX)])
        self.written: list[Path] = []  # closed segments, in order
        self.starts: list[tuple[int, int]] = []  # each segment's (source, its rows before)
        self.source, self.offset = 0, 0  # where the next row comes from
        self.spans = 0  # rows in the closed segments
        self._writer: Any = None
        self._partial: Path | None = None
        self._held: list[Any] = []  # rows waiting for a whole row group
        self._held_rows = 0
        self._rows = 0  # rows in the open segment

    def begin(self, source: int, skip: int) -> int:
        """The next rows come from source ``source``, its first ``skip`` rows left out; the
        index of the segment they go to, for ``rollback``."""
        self.source, self.offset = source, skip
        return len(self.written)

    def add(self, batch: Any) -> None:
        while batch.num_rows:
            if self._writer is None:
                self._open()
            part = batch.slice(0, self.limit - self._rows)
            self._held.append(part)
            self._held_rows += part.num_rows
            self._rows += part.num_rows
            self.offset += part.num_rows
            batch = batch.slice(part.num_rows)
            if self._rows == self.limit:
                self._close()
            elif self._held_rows >= _ROWS_PER_GROUP:
                self._write(whole_groups=True)

    def _open(self) -> None:
        target = self.out / f"spans-{self.first + len(self.written):05d}{SUFFIX}"
        self.out.mkdir(parents=True, exist_ok=True)
        self._partial = target.with_name(f".{target.name}.partial")
        self._writer = self.pa.parquet.ParquetWriter(self._partial, self.schema, compression="zstd")
        self.starts.append((self.source, self.offset))

    def _write(self, whole_groups: bool = False) -> None:
        """Write the rows held: whole row groups only, unless the segment is closing."""
        table = self.pa.Table.from_batches(self._held, schema=self.schema)
        keep = table.num_rows % _ROWS_PER_GROUP if whole_groups else 0
        if table.num_rows > keep:
            self._writer.write_table(table.slice(0, table.num_rows - keep), _ROWS_PER_GROUP)
        self._held = table.slice(table.num_rows - keep).to_batches() if keep else []
        self._held_rows = keep

    def _close(self) -> None:
        self._write()
        self._writer.close()
        assert self._partial is not None
        target = self._partial.with_name(self._partial.name[1 : -len(".partial")])
        self._partial.replace(target)  # whole, or not there: a reader never sees half
        self.written.append(target)
        self.spans += self._rows
        self._writer, self._partial, self._rows = None, None, 0

    def finish(self) -> None:
        """Close the last segment."""
        if self._writer is not None:
            self._close()

    def discard(self) -> None:
        """Delete the open segment's temporary file (a failed import, or a rollback)."""
        if self._writer is not None:
            self._writer.close()
            assert self._partial is not None
            self._partial.unlink(missing_ok=True)
            self.starts.pop()
        self._writer, self._partial, self._rows = None, None, 0
        self._held, self._held_rows = [], 0

    def rollback(self, segment: int) -> tuple[int, int] | None:
        """Delete segment ``segment`` (``begin``'s) and those after it, the open one too;
        where the first of them began (a source, its rows to skip), or None if it was never
        opened."""
        start = self.starts[segment] if segment < len(self.starts) else None
        self.discard()
        if start is None:
            return None
        for path in self.written[segment:]:
            path.unlink(missing_ok=True)
        self.spans -= self.limit * (len(self.written) - segment)  # closed ones are full
        del self.written[segment:]
        del self.starts[segment:]
        return start


def _coalesced(batches: Iterable[Any], rows: int) -> Iterator[Any]:
    """``batches``, the small ones (under a quarter of ``rows``) joined until they make a
    quarter: DuckDB gives one batch a file at least, and rendering one costs some 7 ms
    whatever its size; a large one passes as it is (joining copies)."""
    import pyarrow

    held: list[Any] = []
    count = 0
    for batch in batches:
        if batch.num_rows >= rows // 4:
            if held:
                yield from _joined(pyarrow, held)
                held, count = [], 0
            yield batch
            continue
        held.append(batch)
        count += batch.num_rows
        if count >= rows // 4:
            yield from _joined(pyarrow, held)
            held, count = [], 0
    if held:
        yield from _joined(pyarrow, held)


def _joined(pa: Any, batches: list[Any]) -> Iterator[Any]:
    if len(batches) == 1:
        yield batches[0]
    else:
        yield from pa.Table.from_batches(batches).combine_chunks().to_batches()


def _skip(batches: Iterable[Any], rows: int) -> Iterator[Any]:
    """``batches`` without their first ``rows`` rows."""
    for batch in batches:
        if rows >= batch.num_rows:
            rows -= batch.num_rows
            continue
        yield batch.slice(rows) if rows else batch
        rows = 0


class _Quiet(logging.Filter):
    """Drops the Python path's warnings while a file already read is read again."""

    def filter(self, record: logging.LogRecord) -> bool:
        return False


def _ahead(batches: Iterator[Any], depth: int = 4) -> Iterator[Any]:
    """``batches``, produced by a thread of their own a few ahead: DuckDB parses the next
    while this one is rendered and written (DuckDB, kernels and the writer release the GIL)."""
    slots: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for batch in batches:
                slots.put(("batch", batch))
                if stop.is_set():
                    return
            slots.put(("end", None))
        except BaseException as error:  # raised again by the consumer
            slots.put(("error", error))
        finally:
            close = getattr(batches, "close", None)
            if close is not None:  # a generator given up: its own clean-up, in this thread
                close()

    thread = threading.Thread(target=produce, name="otelkit-import", daemon=True)
    thread.start()
    try:
        while True:
            kind, item = slots.get()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # make room for a producer waiting to put
            with contextlib.suppress(queue.Empty):
                slots.get(timeout=0.05)
        thread.join()


class _Failed(Exception):
    """Files refused after rows of them were written: their unit, the segment it began in."""

    def __init__(self, index: int, segment: int, reason: str) -> None:
        super().__init__(reason)
        self.index, self.segment, self.reason = index, segment, reason


@dataclass
class _Unit:
    """Files read in one go: by one DuckDB query (``compression``; a query costs some 20 ms
    whatever it reads, and folders of a process's file each are common), or one file by the
    Python path (None). ``deep``: lines of them ``_Engine.shallow`` reads."""

    files: list[Path]
    compression: str | None
    deep: bool = False

    def alone(self) -> list[_Unit]:
        """Each file a unit of its own (after one of them was refused)."""
        return [_Unit([path], self.compression, self.deep) for path in self.files]


#: what one query reads at most: files, and bytes (on disk) of files
_UNIT_FILES = 64
_UNIT_BYTES = 256 << 20


def _plan(engine: _Engine, sources: Sequence[Path], result: ImportResult) -> list[_Unit]:
    """The files as units, in order: those the pre-scan passes grouped for DuckDB, each of
    the others alone for the Python path (in ``result.fallback``, with the reason)."""
    compressions = [_compression(path) for path in sources]
    verdicts: dict[Path, _Verdict] = {}
    for how in {c for c in compressions if c is not None}:
        paths = [p for p, c in zip(sources, compressions, strict=True) if c == how]
        for first in range(0, len(paths), 256):  # a query a few hundred files
            verdicts.update(engine.prescan(paths[first : first + 256], how))
    units: list[_Unit] = []
    size = 0
    for path, compression in zip(sources, compressions, strict=True):
        verdict = verdicts[path] if compression else _Verdict("not JSON lines")
        if compression is None or verdict.refused is not None:
            result.fallback[path] = verdict.refused or "not JSON lines"
            units.append(_Unit([path], None))
            continue
        bytes_ = _size(path)
        last = units[-1] if units else None
        if (
            last is not None
            and last.compression == compression
            and len(last.files) < _UNIT_FILES
            and size + bytes_ <= _UNIT_BYTES
        ):
            last.files.append(path)
            last.deep = last.deep or verdict.deep
            size += bytes_
        else:
            units.append(_Unit([path], compression, verdict.deep))
            size = bytes_
    return units


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def import_files(
    sources: Sequence[Path],
    out: str | Path,
    segment_spans: int,
    *,
    memory_limit: str = MEMORY_LIMIT,
    threads: int | None = None,
) -> ImportResult:
    """Import trace files (``_loader.trace_files``'s, in order) into segments in ``out`` of at
    most ``segment_spans`` spans each, numbered after those there (``segment_path``): each file
    by DuckDB where it can be, else by the Python path, the rows the same either way."""
    pa = _arrow()
    renderer = _Renderer(pa)
    result = ImportResult()
    engine = _Engine(memory_limit, threads)
    sink = _Segments(Path(out), segment_spans, renderer.schema, pa)
    try:
        units = _plan(engine, sources, result)
        index, skip, replayed = 0, 0, 0
        while index < len(units):
            unit = units[index]
            try:
                quiet = index < replayed  # read before: its warnings were given
                why = _import_unit(engine, renderer, sink, units, index, skip, quiet)
            except _Failed as failed:
                # the files are read again, each alone (by the Python path if alone already),
                # and the segments they touched are written again from where the first began
                start = sink.rollback(failed.segment)
                if start is not None and start[0] == index and start[1] and len(unit.files) > 1:
                    start = sink.rollback(0)  # began inside the unit: cannot be cut, all again
                _refuse(units, index, failed.reason, result)
                index, skip = start if start is not None else (index, 0)
                replayed = failed.index
                continue
            if why is not None:  # refused before its first row: each file alone, or Python's
                _refuse(units, index, why, result)
                if len(unit.files) > 1:
                    if skip:  # read again from inside (never seen): cannot be cut, all again
                        start = sink.rollback(0)
                        replayed = index
                        index, skip = start if start is not None else (0, 0)
                    continue  # the same place, now its first file's
            index, skip = index + 1, 0
        sink.finish()
    except BaseException:
        sink.discard()
        raise
    finally:
        engine.close()
    for path, reason in result.fallback.items():
        _log.info("otelkit import: %s read by the Python path: %s", path, reason)
    result.spans, result.segments = sink.spans, list(sink.written)
    result.fast = [path for unit in units if unit.compression for path in unit.files]
    return result


def _refuse(units: list[_Unit], index: int, why: str, result: ImportResult) -> None:
    """Unit ``index`` refused: a group becomes its files, each a unit; a file goes to the
    Python path (if it has not already)."""
    unit = units[index]
    if len(unit.files) > 1:
        units[index : index + 1] = unit.alone()
    elif unit.compression is not None:
        unit.compression = None
        result.fallback[unit.files[0]] = why


def _import_unit(
    engine: _Engine,
    renderer: _Renderer,
    sink: _Segments,
    units: list[_Unit],
    index: int,
    skip: int,
    quiet: bool,
) -> str | None:
    """A unit's rows into ``sink``, its first ``skip`` left out. By DuckDB (a file of it in
    ``deep`` read by ``shallow`` meanwhile), or by the Python path; why DuckDB refused the
    files before their first row was written (a lone file is then read by the Python path
    already), or ``_Failed`` if after."""
    unit = units[index]
    segment = sink.begin(index, skip)
    reason: str | None = None
    if unit.compression is not None:
        compression = unit.compression
        renderer.start(unit.files)
        written = sink.offset
        check = _Beside(engine.shallow, unit.files, compression) if unit.deep else None
        try:
            # three stages, each a thread: DuckDB parses, kernels render, pyarrow writes
            batches = _coalesced(engine.rows(unit.files, compression), _BATCH_ROWS)
            rendered = _ahead(renderer.safely(batch) for batch in _ahead(batches))
            for batch in _skip(rendered, skip):
                sink.add(batch)
            if check is not None:
                if why := check.result():
                    raise _NotCanonical(why)
                unit.deep = False
            return None
        except _NotCanonical as error:
            if sink.offset != written:
                raise _Failed(index, segment, str(error)) from error
            reason = str(error)
            if len(unit.files) > 1:
                return reason  # each file alone next
        finally:
            if check is not None:
                check.result()  # not left running
    hush = _Quiet()
    if quiet:
        _log.addFilter(hush)
    try:
        (path,) = unit.files
        for batch in _skip(_python_batches(path, sink.schema, sink.pa), skip):
            sink.add(batch)
    finally:
        _log.removeFilter(hush)
    return reason


class _Beside:
    """A check (``_Engine.shallow``) run by a thread of its own beside a unit's import."""

    def __init__(
        self, check: Callable[[Sequence[Path], str], str | None], files: list[Path], how: str
    ) -> None:
        self._refused: str | None = None
        self._thread = threading.Thread(
            target=self._run, args=(check, files, how), name="otelkit-check", daemon=True
        )
        self._thread.start()

    def _run(
        self, check: Callable[[Sequence[Path], str], str | None], files: list[Path], how: str
    ) -> None:
        try:
            self._refused = check(files, how)
        except Exception as error:  # said as the reason the files go the Python way
            self._refused = f"the check of their nesting failed: {error!r}"

    def result(self) -> str | None:
        """Why the files are the Python path's; None if they passed."""
        self._thread.join()
        return self._refused
