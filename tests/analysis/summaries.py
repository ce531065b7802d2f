"""A breakdown's groups in a form that does not depend on the traces' order: a store answers
them in another order than the file that it was filled from holds them."""

from __future__ import annotations

from typing import Any

from otelkit.analysis._breakdown import Breakdown


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
