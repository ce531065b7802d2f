"""The receiver's segments at the cost of its JSON lines (``StagedSegmentWriter``)."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

from otelkit.analysis._fast_import import import_files
from otelkit.analysis._store import StoreError

__all__ = ["StagedSegmentWriter"]

_log = logging.getLogger("otelkit.analysis")

#: a staging file's name: one no reader of a folder takes for a trace file
_STAGING = ".staging-{:05d}.jsonl.part"


class StagedSegmentWriter:
    """Segments from OTLP JSON lines as they arrive, at the cost of writing the lines: each
    line is appended to a staging file in the folder (named as no reader's trace file), and
    that file becomes a segment by ``otelkit import``'s fast path (DuckDB parses, pyarrow
    builds and writes the columns, in a thread of its own) when it holds ``max_spans``, when
    its first span has waited ``max_age_s`` (checked as lines arrive, and at ``rotate``), and
    at ``flush`` and ``close``, which return once every span added is in a segment. What the
    receiver writes: its requests' threads then pay for the lines alone, as for JSON lines.

    A staging file that cannot become a segment is kept and named in an error (``otelkit
    import`` reads it); its spans are counted in ``spans_failed``. Thread-safe."""

    def __init__(
        self, folder: str | Path, *, max_spans: int = 100_000, max_age_s: float = 60.0
    ) -> None:
        missing = [m for m in ("duckdb", "pyarrow") if importlib.util.find_spec(m) is None]
        if missing:
            raise StoreError(f"segments need {' and '.join(missing)}: pip install 'otelkit[store]'")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_spans, self.max_age_s = max_spans, max_age_s
        self.spans_written = self.segments_written = self.spans_failed = 0
        self._lock = threading.Lock()  # the staging file
        self._file: Any = None
        self._path = Path()
        self._held = 0
        self._since = 0.0
        self._staged = 0  # staging files named so far
        self._closed = False
        self._queue: queue.Queue[tuple[Path, int] | None] = queue.Queue()
        self._done = threading.Condition()
        self._waiting = 0  # staging files handed over, not yet segments
        self._worker = threading.Thread(
            target=self._convert_all, name="otelkit-segments", daemon=True
        )
        self._worker.start()

    def add_line(self, line: bytes, spans: int) -> None:
        """Stage one OTLP JSON document, encoded (one line, no newline), of ``spans`` spans."""
        with self._lock:
            if self._closed:
                raise ValueError(f"{self.folder}: the segment writer is closed")
            if self._file is None:
                self._path = self.folder / _STAGING.format(self._staged)
                while self._path.exists():  # one of an earlier writer's, kept
                    self._staged += 1
                    self._path = self.folder / _STAGING.format(self._staged)
                self._staged += 1
                self._file = self._path.open("ab")
                self._since = time.monotonic()
            self._file.write(line + b"\n")
            self._held += spans
            if self._held >= self.max_spans or time.monotonic() - self._since >= self.max_age_s:
                self._hand_over()

    def rotate(self) -> int:
        """Hand the staging file over if its first span has waited ``max_age_s``; its spans."""
        with self._lock:
            if self._file is not None and time.monotonic() - self._since >= self.max_age_s:
                return self._hand_over()
            return 0

    def flush(self) -> int:
        """Every span added so far into a segment; the spans of the staging file handed over."""
        with self._lock:
            held = self._hand_over()
        with self._done:
            self._done.wait_for(lambda: self._waiting == 0)
        return held

    def close(self) -> None:
        with self._lock:
            self._hand_over()
            self._closed = True
        self._queue.put(None)
        self._worker.join()

    def _hand_over(self) -> int:
        """The staging file to the converting thread (the lock held); its spans."""
        if self._file is None:
            return 0
        self._file.close()
        held, self._file, self._held = self._held, None, 0
        with self._done:
            self._waiting += 1
        self._queue.put((self._path, held))
        return held

    def _convert_all(self) -> None:
        # the conversion yields the cores to the requests and to the work beside it (Linux
        # schedules a thread by its own niceness, and the threads it starts inherit it)
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while (staged := self._queue.get()) is not None:
            path, spans = staged
            try:
                self._convert(path, spans)
            finally:
                with self._done:
                    self._waiting -= 1
                    self._done.notify_all()

    def _convert(self, path: Path, spans: int) -> None:
        try:
            # one of DuckDB's threads: the requests' threads go on beside it
            found = import_files([path], self.folder, max(spans, self.max_spans, 1), threads=1)
            path.unlink()
        except Exception as error:  # a full disk, a lost folder: the spans stay staged
            self.spans_failed += spans
            _log.error(
                "otelkit: %s: %d spans not made a segment (kept; otelkit import reads it): %s",
                path,
                spans,
                error,
            )
            return
        self.spans_written += found.spans
        self.segments_written += len(found.segments)
