"""Thread-safe appending of JSON documents to a file, one compact line each, with rotation.

The embedded receiver writes ``traces.jsonl`` through it and the JSON-lines span exporter its
per-process files; each line is encoded by ``otelkit.export._otlp_json.dumps``, or comes encoded
(``otlp_json.spans_to_bytes``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from otelkit.export._otlp_json import dumps

__all__ = ["JsonLinesWriter"]


class JsonLinesWriter:
    """Append JSON documents to a file, one compact line each, safely from many threads.

    Each line is flushed to the operating system as it is written, so a killed process loses
    nothing already written. With ``max_bytes`` the file is renamed to ``<stem>.<n><suffix>``
    before it would grow past that size, and a new one is started.

    >>> import tempfile; path = Path(tempfile.mkdtemp()) / "traces.jsonl"
    >>> with JsonLinesWriter(path) as writer:
    ...     writer.write({"resourceSpans": []})
    21
    """

    def __init__(self, path: str | Path, *, max_bytes: int | None = None) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._file = open(self.path, "ab")  # noqa: SIM115 - lives as long as the writer
        self._size = self._file.tell()

    def write(self, doc: Mapping[str, Any]) -> int:
        """Append ``doc`` as one line; returns the bytes written. ``ValueError`` once closed."""
        return self.write_line(dumps(doc))

    def write_line(self, encoded: bytes) -> int:
        """Append a document already encoded (compact, one line, no newline) as ``write``
        would; returns the bytes written."""
        line = encoded + b"\n"
        with self._lock:
            if self._file.closed:
                raise ValueError(f"{self.path}: the writer is closed")
            if self.max_bytes and self._size and self._size + len(line) > self.max_bytes:
                self._rotate()
            self._file.write(line)
            self._file.flush()
            self._size += len(line)
        return len(line)

    def _rotate(self) -> None:
        self._file.close()
        n = 1
        while (target := self.path.with_name(f"{self.path.stem}.{n}{self.path.suffix}")).exists():
            n += 1
        self.path.rename(target)
        self._file = open(self.path, "ab")  # noqa: SIM115
        self._size = 0

    def close(self) -> None:
        """Flush and close the file; later writes raise ``ValueError``."""
        with self._lock:
            self._file.close()

    def __enter__(self) -> JsonLinesWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
