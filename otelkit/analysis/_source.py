"""Where spans come from: the one seam that ``otelkit breakdown``, ``otelkit report`` and the
study's trace figures read through.

A source is a trace file, a folder of them (OTLP JSON lines, plain or gzipped, the Collector's
framings, span store segments), or a site's trace store:

- ``clickhouse://user:password@host:8123/database`` (``chdb:///path``: chDB's), the Collector's
  ``otel_traces``;
- ``jaeger://host:16685`` (Jaeger v2's api_v3 over gRPC), ``jaeger+http://host:16686`` (over
  HTTP; ``jaeger+https://``);
- ``tempo://host:3200`` (``tempo+https://host``), Grafana Tempo's search and trace-by-id API.

A store is searched with the selection pushed down to it (a time window, services): whole
traces that have a span in the window come back, parsed once into span store segments in a
cache folder, which the breakdown's DuckDB queries and the report then read as columns. A cache
is kept per store and selection (``source.json`` beside the segments says what it holds) and
reused while its window lies in the past; a window reaching up to now is fetched again, since
spans of it may still arrive. Local files are read whole: a selection is refused for them.

>>> chosen = Selection(services=("sonic",))
>>> source = open_source(["jaeger://jaeger:16685"], chosen)  # doctest: +SKIP
>>> source.files  # doctest: +SKIP
[PosixPath('.../spans-00000.parquet')]
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from otelkit.analysis._loader import iter_spans, trace_files
from otelkit.analysis._remote import Imported
from otelkit.analysis._spans import Span
from otelkit.analysis._store import SUFFIX, StoreError

__all__ = [
    "STORES",
    "Selection",
    "SpanSource",
    "import_store",
    "is_store",
    "open_source",
    "parse_time",
]

_log = logging.getLogger("otelkit.analysis")

#: a trace store's URL scheme, and the reader that searches it
STORES = {
    "clickhouse://": "clickhouse",
    "clickhouses://": "clickhouse",
    "chdb://": "clickhouse",
    "jaeger://": "jaeger",
    "jaeger+http://": "jaeger",
    "jaeger+https://": "jaeger",
    "tempo://": "tempo",
    "tempo+https://": "tempo",
}
#: Jaeger and Tempo search a time window, which they require: without one, the last hour
DEFAULT_WINDOW_S = 3600.0
_MANIFEST = "source.json"
_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@dataclass(frozen=True)
class Selection:
    """What to take from a trace store: traces with a span starting in ``[since_ns,
    until_ns)`` (None: unbounded where the store allows it), and with a span of one of
    ``services`` (none: any)."""

    since_ns: int | None = None
    until_ns: int | None = None
    services: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return self.since_ns is None and self.until_ns is None and not self.services


@dataclass
class SpanSource:
    """Spans from one or more sources, as the files that hold them: span store segments
    (columns, which DuckDB reads) or trace files; ``imported`` says what each store gave."""

    specs: tuple[str, ...]
    files: list[Path]
    imported: dict[str, Imported] = field(default_factory=dict)

    @property
    def segments_only(self) -> bool:
        """Whether every file is a span store segment (the breakdown's DuckDB engine reads
        those alone)."""
        return bool(self.files) and all(path.name.endswith(SUFFIX) for path in self.files)

    def spans(self) -> Iterator[Span]:
        """Every span, in the order the files hold them (for the traces a page draws)."""
        return iter_spans(*self.files)


def is_store(spec: str | Path) -> bool:
    """Whether ``spec`` names a trace store rather than a local file or folder."""
    return isinstance(spec, str) and spec.startswith(tuple(STORES))


def parse_time(text: str, now_s: float | None = None) -> float:
    """A point in time as Unix seconds: Unix seconds themselves, a time ago (``90s``, ``15m``,
    ``2h``, ``1d``), or ISO 8601 (``2026-11-29T10:00:00Z``; without a zone, this host's).

    >>> parse_time("1700000000")
    1700000000.0
    >>> parse_time("2h", now_s=10_000.0)
    2800.0
    >>> parse_time("2026-11-29T10:00:00+00:00")
    1795946400.0
    """
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    if (ago := _AGO.match(text)) is not None:
        now = time.time() if now_s is None else now_s
        return now - float(ago.group(1)) * _UNIT_S[ago.group(2)]
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ValueError(
            f"{text!r}: not a time (Unix seconds, a time ago such as 15m or 2h, or ISO 8601)"
        ) from None


def _windowed(kind: str, selection: Selection, now_ns: int) -> Selection:
    """The selection a store is searched with: Jaeger and Tempo need both ends of a window."""
    if kind == "clickhouse":
        return selection
    until = now_ns if selection.until_ns is None else selection.until_ns
    since = selection.since_ns
    if since is None:
        since = until - int(DEFAULT_WINDOW_S * 1e9)
    if since >= until:
        raise StoreError(f"an empty time window: since {since} ns is not before until {until} ns")
    return Selection(since, until, selection.services)


def import_store(
    url: str,
    out: str | Path,
    selection: Selection = Selection(),
    *,
    segment_spans: int = 1_000_000,
    table: str = "otel_traces",
) -> Imported:
    """The traces of ``selection`` in the store at ``url`` into segments in ``out``."""
    kind = next((name for scheme, name in STORES.items() if url.startswith(scheme)), None)
    if kind is None:
        raise StoreError(f"{url.split('://', 1)[0]}: not a trace store otelkit reads")
    chosen = _windowed(kind, selection, time.time_ns())
    if kind == "clickhouse":
        from otelkit.analysis._clickhouse import import_clickhouse

        spans, segments = import_clickhouse(
            url,
            out,
            table=table,
            since_ns=chosen.since_ns,
            until_ns=chosen.until_ns,
            services=chosen.services,
            segment_spans=segment_spans,
        )
        return Imported(spans, segments, traces=0)
    assert chosen.since_ns is not None and chosen.until_ns is not None
    from otelkit.analysis._jaeger import import_jaeger
    from otelkit.analysis._tempo import import_tempo

    reader: Callable[..., Imported] = import_jaeger if kind == "jaeger" else import_tempo
    return reader(
        url,
        out,
        since_ns=chosen.since_ns,
        until_ns=chosen.until_ns,
        services=chosen.services,
        segment_spans=segment_spans,
    )


def _redacted(url: str) -> str:
    """``url`` without a password, as a cache's manifest and messages show it."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)


def cache_root() -> Path:
    """Where stores' imports are cached: ``$OTELKIT_STORE_CACHE``, else the user's cache."""
    if found := os.environ.get("OTELKIT_STORE_CACHE"):
        return Path(found)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "otelkit" / "stores"


def _cached(
    url: str, selection: Selection, cache: Path, refresh: bool, table: str
) -> tuple[list[Path], Imported]:
    """The segments of ``url``'s ``selection``, imported into ``cache`` or found there."""
    key = {
        "source": _redacted(url),
        "table": table,
        "since_ns": selection.since_ns,
        "until_ns": selection.until_ns,
        "services": sorted(selection.services),
    }
    digest = hashlib.sha256(f"{url}\0{json.dumps(key, sort_keys=True)}".encode()).hexdigest()
    folder = cache / digest[:16]
    manifest = folder / _MANIFEST
    if not refresh and manifest.is_file():
        try:
            held = json.loads(manifest.read_text())
        except (OSError, ValueError):
            held = {}
        # a window that had ended when it was fetched holds all it ever will
        ended = selection.until_ns is not None and selection.until_ns <= held.get("at_ns", 0)
        if held.get("key") == key and ended:
            files = sorted(folder.glob(f"spans-*{SUFFIX}"))
            _log.info("%s: %d segments from the cache %s", key["source"], len(files), folder)
            return files, Imported(*held["imported"])
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    at_ns = time.time_ns()
    imported = import_store(url, folder, selection, table=table)
    manifest.write_text(json.dumps({"key": key, "at_ns": at_ns, "imported": list(imported)}))
    return sorted(folder.glob(f"spans-*{SUFFIX}")), imported


def open_source(
    specs: Sequence[str | Path],
    selection: Selection = Selection(),
    *,
    cache: str | Path | None = None,
    refresh: bool = False,
    table: str = "otel_traces",
) -> SpanSource:
    """The spans of ``specs`` (files, folders, trace stores' URLs), stores searched for
    ``selection`` and cached in ``cache`` (default: ``cache_root()``); ``refresh`` fetches
    again. Raises ``StoreError`` for a store that cannot be read, ``FileNotFoundError`` for a
    path that is not there, ``ValueError`` for a selection given with local files."""
    stores = [str(spec) for spec in specs if is_store(spec)]
    local = [spec for spec in specs if not is_store(spec)]
    if local and not selection.empty:
        raise ValueError(
            "a time window or services select from a trace store; local files are read whole "
            f"({', '.join(map(str, local))})"
        )
    files = trace_files(*local) if local else []
    imported: dict[str, Imported] = {}
    root = cache_root() if cache is None else Path(cache)
    for url in stores:
        found, imported[_redacted(url)] = _cached(url, selection, root, refresh, table)
        files += found
    return SpanSource(tuple(map(str, specs)), files, imported)
