"""The *GPU* dashboard, built by otelkit.dashboards.grafanalib_dashboard.

`generate-dashboards gpu.dashboard.py` writes gpu.json beside this file, the same text
as `otelkit dashboards --out dashboards`.
"""

from otelkit.dashboards import grafanalib_dashboard

dashboard = grafanalib_dashboard("gpu")
