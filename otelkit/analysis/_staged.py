"""The receiver's segments, their columns made apart from its requests (``StagedSegmentWriter``)."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from otelkit.analysis._store import StoreError

__all__ = ["StagedSegmentWriter", "staged_messages"]

_log = logging.getLogger("otelkit.analysis")

#: a staging file's name: one no reader of a folder takes for a trace file
_STAGING = ".staging-{:05d}.binpb.part"


def staged_messages(data: bytes, where: str) -> Iterator[bytes]:
    """The messages of a staging file: the Collector file exporter's proto framing, each
    message after its length (4 bytes, big-endian); one cut short raises ``StoreError``."""
    at = 0
    while at < len(data):
        length = int.from_bytes(data[at : at + 4], "big")
        if at + 4 + length > len(data):
            raise StoreError(f"{where}: the message at byte {at} is cut short")
        yield data[at + 4 : at + 4 + length]
        at += 4 + length


class StagedSegmentWriter:
    """Segments of OTLP protobuf requests as they arrive. Each request, as it came, is
    appended to a staging file in the folder, in the Collector file exporter's proto framing
    (named as no reader's trace file; ``otelkit import`` reads it), and a thread of its own,
    at the lowest priority, makes that file a segment, its columns straight from the messages
    (``_from_protobuf``), when it holds ``max_spans``, when its first span has waited
    ``max_age_s`` (checked as messages arrive, and at ``rotate``), and at ``flush`` and
    ``close``, which return once every span added is in a segment. The requests' threads
    pay for a write.

    A staging file that cannot become a segment is kept and named in an error; its spans are
    counted in ``spans_failed``. Thread-safe."""

    def __init__(
        self, folder: str | Path, *, max_spans: int = 100_000, max_age_s: float = 60.0
    ) -> None:
        missing = [m for m in ("pyarrow",) if importlib.util.find_spec(m) is None]
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

    def add_message(self, message: bytes, spans: int) -> None:
        """Stage one ``ExportTraceServiceRequest``, serialized, of ``spans`` spans."""
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
            self._file.write(len(message).to_bytes(4, "big") + message)
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
        # schedules a thread by its own niceness)
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
            written = convert(path, self.folder)
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
        self.spans_written += written
        self.segments_written += 1
        # a message no way reads (its warning logged as its spans were read): counted
        self.spans_failed += max(spans - written, 0)


def convert(path: Path, folder: Path) -> int:
    """Make the staging file ``path`` the next segment of ``folder``; its spans."""
    import pyarrow

    from otelkit.analysis._from_protobuf import segment_table
    from otelkit.analysis._store import write_table

    table = segment_table(staged_messages(path.read_bytes(), str(path)), pyarrow, str(path))
    write_table(table, folder)
    return int(table.num_rows)
