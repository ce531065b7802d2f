"""Settings: one declarative table, resolved as argument > ``OTELKIT_*`` > ``OTEL_*`` > default.

Every option of ``otelkit.configure()`` is declared once, as a field of ``Settings``: its
``Option`` gives the types it accepts and resolves to, its default, its environment variables
(otelkit's own first, then the standard OpenTelemetry ones), how to read a string from the
environment and how to check a value. ``OPTIONS`` and ``configure()``'s keyword arguments are
derived from the fields, so mypy checks every call. A bad value fails fast with a
``ConfigError`` (a ``ValueError``) that names the option and its environment variables.

>>> resolve({"service_name": "tracker"}, environ={}).service_name
'tracker'
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, ParamSpec, TypeVar, cast, get_args, overload
from urllib.parse import unquote, urlsplit

from otelkit._errors import ConfigError

__all__ = [
    "OPTIONS",
    "MetricExporter",
    "Option",
    "Protocol",
    "Sampler",
    "Settings",
    "TraceExporter",
    "resolve",
    "takes_options",
]

# The choice options' values, as types: mypy rejects configure(protocol="thrift"). The run-time
# checks take their choices from the same types, so the two cannot drift apart.
Protocol = Literal["grpc", "http/protobuf", "http/json"]
TraceExporter = Literal["otlp", "jsonl", "console", "none"]
MetricExporter = Literal["otlp", "prometheus", "none"]
Sampler = Literal[
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
    "ratelimiting",  # at most sampler_arg new traces per second (otelkit's, as Jaeger's)
    "parentbased_ratelimiting",
]
PROTOCOLS: tuple[Protocol, ...] = get_args(Protocol)
TRACE_EXPORTERS: tuple[TraceExporter, ...] = get_args(TraceExporter)
METRIC_EXPORTERS: tuple[MetricExporter, ...] = get_args(MetricExporter)
SAMPLERS: tuple[Sampler, ...] = get_args(Sampler)


class _Invalid(Exception):
    """Raised by a parser or check with what was expected; turned into a ConfigError."""


In = TypeVar("In")
Out = TypeVar("Out")
P = ParamSpec("P")
R = TypeVar("R")


class Option(Generic[In, Out]):
    """One option of ``configure()``: a field of ``Settings`` that accepts an ``In`` (or ``None``:
    not given) and holds the resolved ``Out``, and where else its value may come from.

    It is a descriptor so that one declaration types both sides: mypy takes the parameter type
    of ``Settings(...)``, hence of ``configure(...)``, from ``__set__``, and the attribute type
    from ``__get__``.
    """

    def __init__(
        self,
        default: In | None,
        check: Callable[[Any], Any],
        otel_env: tuple[str, ...] = (),
        from_env: Callable[[str], Any] = str,
        doc: str = "",
    ) -> None:
        self.name = ""
        self.default = default
        self.check = check
        self.otel_env = otel_env
        self.from_env = from_env
        self.doc = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @property
    def env_vars(self) -> tuple[str, ...]:
        return (f"OTELKIT_{self.name.upper()}", *self.otel_env)

    def __repr__(self) -> str:
        return f"Option({self.name!r}, default={self.default!r})"

    @overload
    def __get__(self, settings: None, owner: type) -> Option[In, Out]: ...

    @overload
    def __get__(self, settings: object, owner: type) -> Out: ...

    def __get__(self, settings: object | None, owner: type) -> Option[In, Out] | Out:
        if settings is None:
            return self  # the class's attribute: the dataclass takes it as the field's default
        return cast(Out, settings.__dict__[self.name])

    def __set__(self, settings: object, value: In | None) -> None:
        if isinstance(value, Option):  # the field's default: Settings(...) without this option
            raise TypeError(f"Settings needs {self.name}: resolve() builds Settings")
        settings.__dict__[self.name] = value


# -- parsers (environment strings) and checks (typed values) ---------------------------------


def _one_of(choices: tuple[str, ...]) -> Callable[[Any], str]:
    # case and surrounding blanks are forgiven at run time, for values from the environment
    def check(value: Any) -> str:
        if not isinstance(value, str) or value.strip().lower() not in choices:
            raise _Invalid(f"one of {', '.join(choices)}")
        return value.strip().lower()

    return check


def _set_of(choices: tuple[str, ...]) -> Callable[[Any], frozenset[str]]:
    def check(value: Any) -> frozenset[str]:
        items = value.split(",") if isinstance(value, str) else value
        try:
            chosen = frozenset(str(item).strip().lower() for item in items if str(item).strip())
        except TypeError:
            raise _Invalid(f"a comma-separated list of {', '.join(choices)}") from None
        if not chosen <= set(choices) or ("none" in chosen and len(chosen) > 1):
            raise _Invalid(f"a comma-separated list of {', '.join(choices)}")
        return chosen - {"none"}

    return check


def _int_in(low: int, high: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _Invalid(f"an integer from {low} to {high}")
        return value

    return check


def _number_in(low: float, high: float) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Invalid(f"a number from {low} to {high}")
        if not low <= value <= high:
            raise _Invalid(f"a number from {low} to {high}")
        return float(value)

    return check


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``check``, letting ``None`` (unset) through."""
    return lambda value: None if value is None else check(value)


def _parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise _Invalid("an integer") from None


def _parse_float(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise _Invalid("a number") from None


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise _Invalid("true or false")


def _check_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid("true or false")
    return value


def _check_text(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _Invalid("a non-empty string")
    return value.strip()


def _check_directory(value: Any) -> str | None:
    """A directory name: a string or a path object."""
    return _check_text(os.fspath(value) if isinstance(value, os.PathLike) else value)


def _parse_pairs(text: str) -> dict[str, str]:
    """``key=value,key2=value2`` with percent-encoded values, as the OTEL_* variables use."""
    pairs: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise _Invalid("a list of key=value pairs separated by commas")
        pairs[unquote(key.strip())] = unquote(value.strip())
    return pairs


def _check_pairs(value: Any) -> dict[str, str]:
    if isinstance(value, str):
        return _parse_pairs(value)
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and k for k in value):
        raise _Invalid("a mapping of str to str, or 'key=value,key2=value2'")
    return {k: str(v) for k, v in value.items()}


def _check_endpoint(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _Invalid("a URL such as http://collector:4318")
    parts = urlsplit(value.strip())
    try:
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise _Invalid("a URL with scheme http or https and a host, such as http://collector:4318")
    return value.strip()


def _check_duration_ms(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise _Invalid("a positive number of milliseconds")
    return float(value)


def _check_positive(value: Any) -> int:
    return _int_in(1, 10_000_000)(value)


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The resolved value of every option, and the one place the options are declared.

    Each field is an ``Option``: ``Option[accepted, resolved]`` types ``configure()``'s keyword
    argument and this attribute. ``resolve()`` builds it; ``otelkit config`` prints it.
    """

    service_name: Option[str, str] = Option(
        None,
        _check_text,
        ("OTEL_SERVICE_NAME",),
        doc="service.name of every span and metric; default unknown_service:<program>",
    )
    resource_attributes: Option[Mapping[str, str] | str, dict[str, str]] = Option(
        {},
        _check_pairs,
        ("OTEL_RESOURCE_ATTRIBUTES",),
        _parse_pairs,
        doc="extra resource attributes; detected host, process, Slurm and Kubernetes ones kept",
    )
    traces_exporter: Option[TraceExporter, TraceExporter | None] = Option(
        None,
        _optional(_one_of(TRACE_EXPORTERS)),
        ("OTEL_TRACES_EXPORTER",),
        doc="otlp, jsonl, console or none; default: otlp when an endpoint is set, else jsonl",
    )
    endpoint: Option[str, str | None] = Option(
        None,
        _check_endpoint,
        ("OTEL_EXPORTER_OTLP_ENDPOINT",),
        doc="OTLP base URL; /v1/traces and /v1/metrics are appended for HTTP",
    )
    traces_endpoint: Option[str, str | None] = Option(
        None,
        _check_endpoint,
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",),
        doc="full OTLP traces URL, overrides endpoint for traces",
    )
    metrics_endpoint: Option[str, str | None] = Option(
        None,
        _check_endpoint,
        ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",),
        doc="full OTLP metrics URL, overrides endpoint for metrics",
    )
    protocol: Option[Protocol, Protocol] = Option(
        "http/protobuf",
        _one_of(PROTOCOLS),
        ("OTEL_EXPORTER_OTLP_PROTOCOL",),
        doc="grpc, http/protobuf or http/json",
    )
    headers: Option[Mapping[str, str] | str, dict[str, str]] = Option(
        {},
        _check_pairs,
        ("OTEL_EXPORTER_OTLP_HEADERS",),
        _parse_pairs,
        doc="headers sent with every OTLP export, e.g. authorization=Bearer%20TOKEN",
    )
    export_timeout_ms: Option[float, float] = Option(
        10_000.0,
        _check_duration_ms,
        ("OTEL_EXPORTER_OTLP_TIMEOUT",),
        _parse_float,
        doc="timeout of one OTLP export in milliseconds",
    )
    traces_dir: Option[str | os.PathLike[str], str] = Option(
        "otelkit-traces",
        _check_directory,
        (),
        doc="directory of the OTLP-JSON-lines files of the jsonl exporter",
    )
    metrics_exporter: Option[
        MetricExporter | Iterable[MetricExporter], frozenset[MetricExporter] | None
    ] = Option(
        None,
        _optional(_set_of(METRIC_EXPORTERS)),
        ("OTEL_METRICS_EXPORTER",),
        doc="otlp and/or prometheus, or none; default: otlp with an endpoint, prometheus "
        "with a port",
    )
    prometheus_port: Option[int, int | None] = Option(
        None,
        _optional(_int_in(0, 65535)),
        ("OTEL_EXPORTER_PROMETHEUS_PORT",),
        _parse_int,
        doc="port of the Prometheus scrape endpoint (OpenMetrics, with exemplars); 0 = any",
    )
    prometheus_host: Option[str, str] = Option(
        "0.0.0.0",
        _check_text,
        ("OTEL_EXPORTER_PROMETHEUS_HOST",),
        doc="address the Prometheus endpoint listens on",
    )
    metric_export_interval_ms: Option[float, float] = Option(
        15_000.0,
        _check_duration_ms,
        ("OTEL_METRIC_EXPORT_INTERVAL",),
        _parse_float,
        doc="OTLP metric push interval in milliseconds (15 s: a common scrape interval)",
    )
    sampler: Option[Sampler, Sampler] = Option(
        "parentbased_always_on",
        _one_of(SAMPLERS),
        ("OTEL_TRACES_SAMPLER",),
        doc="head sampler, as OTEL_TRACES_SAMPLER",
    )
    sampler_arg: Option[float, float] = Option(
        1.0,
        _number_in(0.0, 1e9),
        ("OTEL_TRACES_SAMPLER_ARG",),
        _parse_float,
        doc="the traceidratio samplers' ratio, 0 to 1; the ratelimiting samplers' new traces "
        "per second, above 0",
    )
    bsp_max_queue_size: Option[int, int] = Option(
        2048,
        _check_positive,
        ("OTEL_BSP_MAX_QUEUE_SIZE",),
        _parse_int,
        doc="spans held for export; beyond it spans are dropped and counted",
    )
    bsp_max_export_batch_size: Option[int, int] = Option(
        512,
        _check_positive,
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE",),
        _parse_int,
        doc="spans per export request",
    )
    bsp_schedule_delay_ms: Option[float, float] = Option(
        5_000.0,
        _check_duration_ms,
        ("OTEL_BSP_SCHEDULE_DELAY",),
        _parse_float,
        doc="longest wait before a partial batch is exported",
    )
    bsp_export_timeout_ms: Option[float, float] = Option(
        30_000.0,
        _check_duration_ms,
        ("OTEL_BSP_EXPORT_TIMEOUT",),
        _parse_float,
        doc="longest a flush waits for the exporter",
    )
    drop_log_interval_s: Option[float, float] = Option(
        60.0,
        _number_in(0.0, 86_400.0),
        (),
        _parse_float,
        doc="dropped telemetry is logged at most once per this many seconds",
    )
    gpu: Option[bool, bool] = Option(
        False,
        _check_bool,
        (),
        _parse_bool,
        doc="sample this node's GPUs (NVML) and torch's CUDA memory into gauges",
    )
    gpu_interval_s: Option[float, float] = Option(
        1.0,
        _number_in(0.01, 3_600.0),
        (),
        _parse_float,
        doc="seconds between GPU samples",
    )
    gpu_replay: Option[str | os.PathLike[str], str | None] = Option(
        None,
        _check_directory,
        (),
        doc="replay a recording of `otelkit gpu record` instead of NVML (demos, tests)",
    )
    gpu_span_attributes: Option[bool, bool] = Option(
        False,
        _check_bool,
        (),
        _parse_bool,
        doc="server spans carry the last sampled utilisation and memory of this process's GPU"
        " (starts the GPU sampler)",
    )
    exit_timeout_s: Option[float, float] = Option(
        5.0,
        _number_in(0.1, 600.0),
        (),
        _parse_float,
        doc="longest a SIGTERM or interpreter exit waits for telemetry to leave; what is not "
        "sent by then is counted as dropped (Kubernetes kills 30 s after SIGTERM, Slurm after "
        "its KillWait, 30 s by default)",
    )
    install_signal_handler: Option[bool, bool] = Option(
        True,
        _check_bool,
        (),
        _parse_bool,
        doc="flush on SIGTERM (only when SIGTERM has its default action)",
    )


OPTIONS: tuple[Option[Any, Any], ...] = tuple(
    cast(Option[Any, Any], field.default) for field in dataclasses.fields(Settings)
)
_BY_NAME = {option.name: option for option in OPTIONS}


def takes_options(settings: Callable[P, object]) -> Callable[[Callable[..., R]], Callable[P, R]]:
    """``@takes_options(Settings)``: the function takes the options as keyword arguments.

    ``settings`` is there for mypy, which checks each call's names and types against the
    fields of ``Settings``, each optional. At run time the function receives only the options
    given, and ``help()`` shows every one with its default.
    """

    def decorate(function: Callable[..., R]) -> Callable[P, R]:
        keyword = inspect.Parameter.KEYWORD_ONLY
        function.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(option.name, keyword, default=option.default) for option in OPTIONS],
            return_annotation=inspect.signature(function).return_annotation,
        )
        return cast(Callable[P, R], function)

    return decorate


def _resolve_one(
    option: Option[Any, Any], arguments: Mapping[str, Any], environ: Mapping[str, str]
) -> Any:
    if option.name in arguments and arguments[option.name] is not None:
        source, raw = "argument", arguments[option.name]
        parse: Callable[[Any], Any] = option.check
    else:
        for var in option.env_vars:
            if environ.get(var, "").strip():
                source, raw = var, environ[var]
                break
        else:
            return option.check(option.default)

        def parse(text: Any) -> Any:
            return option.check(option.from_env(text))

    try:
        return parse(raw)
    except _Invalid as invalid:
        env_vars = option.env_vars if source == "argument" else (source,)
        raise ConfigError(option.name, env_vars, raw, str(invalid)) from None


def _unknown_option(name: str, value: object) -> ConfigError:
    """mypy catches a misspelt option in a literal call; this, one in a ``**options`` dict."""
    close = difflib.get_close_matches(name, _BY_NAME, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"the options are {', '.join(_BY_NAME)}"
    return ConfigError(name, (), value, "", message=f"otelkit: unknown option {name!r}; {hint}")


def _check_sampler_arg(sampler: str, arg: float) -> None:
    option = _BY_NAME["sampler_arg"]
    if sampler.endswith("traceidratio") and arg > 1.0:
        raise ConfigError(option.name, option.env_vars, arg, f"a ratio from 0 to 1 for {sampler}")
    if sampler.endswith("ratelimiting") and arg <= 0.0:
        raise ConfigError(
            option.name, option.env_vars, arg, f"traces per second, above 0, for {sampler}"
        )


def resolve(arguments: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve every option; raise ``ConfigError`` on an unknown option or a bad value."""
    unknown = sorted(set(arguments) - set(_BY_NAME))
    if unknown:
        raise _unknown_option(unknown[0], arguments[unknown[0]])
    env = os.environ if environ is None else environ
    values = {option.name: _resolve_one(option, arguments, env) for option in OPTIONS}
    if values["bsp_max_export_batch_size"] > values["bsp_max_queue_size"]:
        option = _BY_NAME["bsp_max_export_batch_size"]
        raise ConfigError(
            option.name,
            option.env_vars,
            values[option.name],
            f"at most bsp_max_queue_size ({values['bsp_max_queue_size']})",
        )
    _check_sampler_arg(values["sampler"], values["sampler_arg"])
    if values["service_name"] is None:
        program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        values["service_name"] = values["resource_attributes"].get(
            "service.name", f"unknown_service:{program}"
        )
    return Settings(**values)
