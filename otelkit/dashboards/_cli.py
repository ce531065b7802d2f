"""``otelkit dashboards``: write the Grafana dashboards' JSON for a deployment.

otelkit dashboards --out dashboards                          # what the repository commits
otelkit dashboards --out /etc/grafana/dashboards --prometheus-uid prom --title-prefix "Lab A"
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from otelkit._errors import MissingExtraError
from otelkit.dashboards import write
from otelkit.dashboards._options import DashboardOptions

__all__ = ["add_arguments", "run"]

_DEFAULTS = DashboardOptions()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--out`` and the options of ``DashboardOptions``."""
    parser.add_argument("--out", type=Path, required=True, help="directory for <name>.json")
    parser.add_argument(
        "--prometheus-uid",
        default=_DEFAULTS.prometheus_uid,
        help=f"uid of the Prometheus datasource ({_DEFAULTS.prometheus_uid})",
    )
    parser.add_argument(
        "--jaeger-uid",
        default=_DEFAULTS.jaeger_uid,
        help=f"uid of the Jaeger datasource ({_DEFAULTS.jaeger_uid})",
    )
    parser.add_argument(
        "--title-prefix",
        default=_DEFAULTS.title_prefix,
        help=f"prefix of the titles, uids and tags ({_DEFAULTS.title_prefix})",
    )


def run(args: argparse.Namespace) -> int:
    """0 when every dashboard was written; 2 without grafanalib or with an empty uid."""
    try:
        options = DashboardOptions(args.prometheus_uid, args.jaeger_uid, args.title_prefix)
        paths = write(args.out, options)
    except (MissingExtraError, ValueError) as error:
        print(error, file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0
