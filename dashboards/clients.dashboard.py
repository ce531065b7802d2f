"""The *Clients* dashboard, built by otelkit.dashboards.grafanalib_dashboard.

`generate-dashboards clients.dashboard.py` writes clients.json beside this file, the same text
as `otelkit dashboards --out dashboards`.
"""

from otelkit.dashboards import grafanalib_dashboard

dashboard = grafanalib_dashboard("clients")
