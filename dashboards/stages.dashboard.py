"""The *Pipeline stages* dashboard, built by otelkit.dashboards.grafanalib_dashboard.

`generate-dashboards stages.dashboard.py` writes stages.json beside this file, the same text
as `otelkit dashboards --out dashboards`.
"""

from otelkit.dashboards import grafanalib_dashboard

dashboard = grafanalib_dashboard("stages")
