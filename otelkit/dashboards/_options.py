"""What a deployment may change in the generated dashboards: datasource uids and the title prefix.

>>> DashboardOptions(prometheus_uid="prom-prod").jaeger_uid
'jaeger'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DashboardOptions"]

_NOT_SLUG = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True)
class DashboardOptions:
    """Datasource uids the dashboards point at, and the prefix of their titles and uids.

    The defaults match the provisioned datasources of the reference deployment
    (``examples/gnn_tracking/deploy/grafana``): Prometheus ``prometheus``, Jaeger ``jaeger``.
    """

    prometheus_uid: str = "prometheus"
    jaeger_uid: str = "jaeger"
    title_prefix: str = "otelkit"

    def __post_init__(self) -> None:
        for name in ("prometheus_uid", "jaeger_uid"):
            if not getattr(self, name).strip():
                raise ValueError(f"DashboardOptions.{name} must not be empty")

    @property
    def slug(self) -> str:
        """The title prefix as a uid and tag part: ``"My Lab"`` -> ``"my-lab"``."""
        return _NOT_SLUG.sub("-", self.title_prefix.lower()).strip("-") or "otelkit"

    def uid(self, name: str) -> str:
        """A dashboard's uid: ``<slug>-<name>``, within Grafana's 40 characters."""
        return f"{self.slug[: 39 - len(name)].rstrip('-')}-{name}"

    def title(self, title: str) -> str:
        """A dashboard's title with the prefix: ``"otelkit / GPU"``."""
        return f"{self.title_prefix} / {title}" if self.title_prefix else title
