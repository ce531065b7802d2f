"""The *Pipeline stages* dashboard, built by otelkit.dashboards.stages.

`generate-dashboards stages.dashboard.py` writes stages.json beside this file, the same text
as `otelkit dashboards --out dashboards`.
"""

from otelkit.dashboards import DashboardOptions, stages

dashboard = stages.build(DashboardOptions())
