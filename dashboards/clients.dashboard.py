"""The *Clients* dashboard, built by otelkit.dashboards.clients.

`generate-dashboards clients.dashboard.py` writes clients.json beside this file, the same text
as `otelkit dashboards --out dashboards`.
"""

from otelkit.dashboards import DashboardOptions, clients

dashboard = clients.build(DashboardOptions())
