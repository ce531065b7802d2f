"""The private part of ``grafanalib`` that otelkit's dashboards (``otelkit.dashboards``) use:
``grafanalib._gen.DashboardEncoder``, the JSON encoder that writes a dashboard's objects as
Grafana's JSON model.

A grafanalib that moves it leaves the dashboards written by otelkit's own encoder, which asks
each object for its public ``to_json_data()`` as grafanalib's does: the same JSON, said once.
"""

from __future__ import annotations

import json
from typing import Any

from otelkit._core.deps import degraded

__all__ = ["ToJsonDataEncoder", "dashboard_encoder"]


class ToJsonDataEncoder(json.JSONEncoder):
    """Writes an object that has ``to_json_data()`` (every grafanalib object) as what it
    returns."""

    def default(self, o: Any) -> Any:
        to_json_data = getattr(o, "to_json_data", None)
        if callable(to_json_data):
            return to_json_data()
        return super().default(o)


def dashboard_encoder() -> type[json.JSONEncoder]:
    """grafanalib's ``DashboardEncoder``, or ``ToJsonDataEncoder`` with one log line."""
    try:
        from grafanalib._gen import DashboardEncoder
    except ImportError:
        DashboardEncoder = None
    if isinstance(DashboardEncoder, type) and issubclass(DashboardEncoder, json.JSONEncoder):
        return DashboardEncoder
    degraded(
        "grafanalib",
        "grafanalib._gen.DashboardEncoder",
        "writes dashboards with its own encoder of to_json_data() (the same JSON)",
    )
    return ToJsonDataEncoder
