"""The *Fleet* dashboard, built by otelkit.dashboards.fleet.

`generate-dashboards fleet.dashboard.py` writes fleet.json beside this file, the same text
as `otelkit dashboards --out dashboards`.
"""

from otelkit.dashboards import DashboardOptions, fleet

dashboard = fleet.build(DashboardOptions())
