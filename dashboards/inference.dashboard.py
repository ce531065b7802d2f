"""The *Inference service* dashboard, built by otelkit.dashboards.inference.

`generate-dashboards inference.dashboard.py` writes inference.json beside this file, the same text
as `otelkit dashboards --out dashboards`.
"""

from otelkit.dashboards import DashboardOptions, inference

dashboard = inference.build(DashboardOptions())
