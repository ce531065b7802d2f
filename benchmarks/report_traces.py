"""Trace files of any size in the reference deployment's shape, for ``bench_report.py``.

The template is ``tests/report/data/demo-traces.jsonl``: 24 real traces of ``make demo`` (the
median and the slowest of each of its 12 groups: five service options on Triton, the FastAPI
twin, the in-process pipeline, at 1 and 8 threads), as the embedded receiver wrote them — the
client's, Triton's and the stage models' spans, Triton's events and all attributes. Copy ``k``
of the template gets fresh trace and span ids (the parent links mapped alike); its traces start
2 ms apart, ``k × spacing`` after the first copy's, and its documents come together, in the
order the exporters sent them.

    python benchmarks/report_traces.py 1000000 /tmp/traces-1m.jsonl
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TEMPLATE = Path(__file__).resolve().parents[1] / "tests" / "report" / "data" / "demo-traces.jsonl"
_MASK = (1 << 64) - 1


def _template() -> tuple[list[dict[str, Any]], int, dict[str, int]]:
    """The template's documents, its span count and each trace's shift: the demo ran its
    groups one after another; a copy of the template runs them side by side, 2 ms apart."""
    docs = [json.loads(line) for line in TEMPLATE.read_text().splitlines() if line.strip()]
    spans = [
        s for d in docs for rs in d["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]
    ]
    starts: dict[str, int] = {}
    for s in spans:
        start = int(s["startTimeUnixNano"])
        starts[s["traceId"]] = min(start, starts.get(s["traceId"], start))
    base = min(starts.values())
    order = sorted(starts, key=starts.__getitem__)
    return docs, len(spans), {t: base - starts[t] + n * 2_000_000 for n, t in enumerate(order)}


def _copy(doc: dict[str, Any], k: int, shifts: dict[str, int], offset: int) -> dict[str, Any]:
    salt = (k * 0x9E3779B97F4A7C15) & _MASK

    def span_id(value: str) -> str:
        return f"{int(value, 16) ^ salt:016x}"

    out_rs = []
    for rs in doc["resourceSpans"]:
        scopes = []
        for ss in rs["scopeSpans"]:
            spans = []
            for s in ss["spans"]:
                shift = offset + shifts[s["traceId"]]
                copy = dict(s)
                copy["traceId"] = f"{k:08x}{s['traceId'][8:]}"
                copy["spanId"] = span_id(s["spanId"])
                if s.get("parentSpanId"):
                    copy["parentSpanId"] = span_id(s["parentSpanId"])
                copy["startTimeUnixNano"] = str(int(s["startTimeUnixNano"]) + shift)
                copy["endTimeUnixNano"] = str(int(s["endTimeUnixNano"]) + shift)
                if "events" in s:
                    copy["events"] = [
                        {**e, "timeUnixNano": str(int(e["timeUnixNano"]) + shift)}
                        for e in s["events"]
                    ]
                spans.append(copy)
            scopes.append({**ss, "spans": spans})
        out_rs.append({**rs, "scopeSpans": scopes})
    return {"resourceSpans": out_rs}


def lines(spans: int, spacing_s: float = 0.05) -> Iterator[str]:
    """OTLP JSON lines holding at least ``spans`` spans (whole copies of the template)."""
    docs, per_copy, shifts = _template()
    copies = -(-spans // per_copy)
    for k in range(copies):
        offset = int(k * spacing_s * 1e9)
        for doc in docs:
            yield json.dumps(_copy(doc, k + 1, shifts, offset), separators=(",", ":"))


def write(spans: int, path: Path) -> int:
    """Write the file (unless one of that size is already there); returns its span count."""
    _, per_copy, _ = _template()
    total = -(-spans // per_copy) * per_copy
    marker = path.with_suffix(path.suffix + f".{total}.done")
    if not (path.exists() and marker.exists()):
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as out:
            for line in lines(spans):
                out.write(line + "\n")
        marker.touch()
    return total


if __name__ == "__main__":
    print(write(int(sys.argv[1]), Path(sys.argv[2])), "spans written")
