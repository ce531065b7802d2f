"""The ``otelkit`` command.

Each subcommand lives in the module of its concept, which provides ``add_arguments(parser)``
and ``run(args) -> int``; this module only dispatches.

    otelkit receive --port 4318 --out ./otelkit-traces   # embedded OTLP/HTTP receiver
    otelkit breakdown ./otelkit-traces --group-by KEY     # where the time of each trace goes
    otelkit import ./otelkit-traces --out ./span-store   # JSON lines to Parquet, parsed once
    otelkit gpu-exporter --port 9400                     # NVML GPU metrics for Prometheus
    otelkit gpu record --out gpus.json                   # real NVML readings, for replay
    otelkit study run --triton REPO --model M --sweep concurrency=1,2,4  # what caps throughput
    otelkit report ./otelkit-traces --study study.jsonl  # one HTML page: plots, waterfalls
    otelkit fleet render --etcd http://etcd:2379 --eds-dir /run/eds  # servers behind Envoy
    otelkit config                                       # the settings configure() would use
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from otelkit._config import OPTIONS, resolve
from otelkit._errors import ConfigError
from otelkit._resource import installed_version

__all__ = ["main"]

# subcommand -> (module, one-line help)
_COMMANDS = {
    "receive": ("otelkit.receiver", "run the embedded OTLP/HTTP trace receiver"),
    "breakdown": ("otelkit.analysis._command", "where the time of traced requests goes"),
    "import": ("otelkit.analysis._import", "trace files into the span store's Parquet segments"),
    "gpu": ("otelkit.gpu._cli", "show the GPUs as otelkit samples them, or record them"),
    "gpu-exporter": ("otelkit.gpu._exporter", "serve NVML GPU metrics to Prometheus"),
    "dashboards": ("otelkit.dashboards._cli", "write the Grafana dashboards' JSON"),
    "study": ("otelkit.study._cli", "sweep a deployment, measure each point, name what caps it"),
    "report": ("otelkit.report._cli", "one self-contained HTML page: plots and trace waterfalls"),
    "fleet": ("otelkit.fleet._cli", "servers behind Envoy: register, render, status, Envoy config"),
}


def _config_add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Print the settings configure() would use here (arguments aside)."


def _config_run(args: argparse.Namespace) -> int:
    try:
        settings = resolve({})
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    width = max(len(option.name) for option in OPTIONS)
    for option in OPTIONS:
        value = getattr(settings, option.name)
        if isinstance(value, frozenset):
            value = ",".join(sorted(value)) or "none"
        if option.name == "headers" and value:
            value = {key: "***" for key in value}  # never print credentials
        print(f"{option.name:<{width}}  {value}    ({' > '.join(option.env_vars)})")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="otelkit", description="otelkit: observability for inference as a service"
    )
    parser.add_argument("--version", action="version", version=installed_version("otelkit"))
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in _COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        module = importlib.import_module(module_name)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    config = commands.add_parser("config", help="print the resolved settings")
    _config_add_arguments(config)
    config.set_defaults(run=_config_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``otelkit`` console script."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    status: int = args.run(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
