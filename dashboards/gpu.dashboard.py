"""The *GPU* dashboard, built by otelkit.dashboards.gpu.

`generate-dashboards gpu.dashboard.py` writes gpu.json beside this file, the same text
as `otelkit dashboards --out dashboards`.
"""

from otelkit.dashboards import DashboardOptions, gpu

dashboard = gpu.build(DashboardOptions())
