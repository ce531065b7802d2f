"""The *Telemetry health* dashboard, built by otelkit.dashboards.health.

`generate-dashboards health.dashboard.py` writes health.json beside this file, the same text
as `otelkit dashboards --out dashboards`.
"""

from otelkit.dashboards import DashboardOptions, health

dashboard = health.build(DashboardOptions())
