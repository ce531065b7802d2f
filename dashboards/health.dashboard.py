"""The *Telemetry health* dashboard, built by otelkit.dashboards.grafanalib_dashboard.

`generate-dashboards health.dashboard.py` writes health.json beside this file, the same text
as `otelkit dashboards --out dashboards`.
"""

from otelkit.dashboards import grafanalib_dashboard

dashboard = grafanalib_dashboard("health")
