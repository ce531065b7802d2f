"""A breakdown's groups in a form that does not depend on the traces' order: a store answers
them in another order than the file that it was filled from holds them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from otelkit.analysis._breakdown import Breakdown
from otelkit.analysis._spans import Span
from otelkit.analysis._sql import breakdown_store
from otelkit.analysis._store import write_segment


def summary(groups: dict[tuple[str, ...], Breakdown]) -> dict[tuple[str, ...], Any]:
    """Each group's traces, left-out count, problems and each component's sorted values."""
    return {
        key: (
            group.traces,
            group.incomplete,
            sorted(group.problems),
            {
                name: sorted(round(v, 12) for v in values)
                for name, values in group.components.items()
            },
        )
        for key, group in groups.items()
    }


def assert_breaks_down_as(store: Path, spans: list[Span], scratch: Path) -> None:
    """The segments in ``store`` break down by DuckDB as ``spans`` do from a segment of their
    own (written in ``scratch``): trace for trace, whatever order the store gave them in."""
    write_segment(spans, scratch / "spans-00000.parquet")
    group_by = ("gnn_tracking.option",)
    imported = breakdown_store(sorted(store.glob("*.parquet")), group_by)
    files = breakdown_store(sorted(scratch.glob("*.parquet")), group_by)
    assert imported.groups and summary(imported.groups) == summary(files.groups)
    assert imported.delegated == files.delegated == 0
