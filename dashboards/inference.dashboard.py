"""The *Inference service* dashboard, built by otelkit.dashboards.grafanalib_dashboard.

`generate-dashboards inference.dashboard.py` writes inference.json beside this file, the same text
as `otelkit dashboards --out dashboards`.
"""

from otelkit.dashboards import grafanalib_dashboard

dashboard = grafanalib_dashboard("inference")
