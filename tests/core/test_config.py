"""Precedence (argument > OTELKIT_* > OTEL_* > default) for every option, and fail-fast errors."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import otelkit
from otelkit import ConfigError, telemetry
from otelkit._config import OPTIONS, resolve

# option: (argument, OTELKIT_* text, its value, OTEL_* text or None, its value)
CASES: dict[str, tuple[Any, str, Any, str | None, Any]] = {
    "service_name": ("arg-svc", "kit-svc", "kit-svc", "otel-svc", "otel-svc"),
    "resource_attributes": (
        {"a": "1"},
        "b=2,c=x%20y",
        {"b": "2", "c": "x y"},
        "d=4",
        {"d": "4"},
    ),
    "traces_exporter": ("none", "jsonl", "jsonl", "otlp", "otlp"),
    "endpoint": ("http://a:4318", "http://b:4318", "http://b:4318", "https://c", "https://c"),
    "traces_endpoint": (
        "http://a/v1/traces",
        "http://b/t",
        "http://b/t",
        "http://c/t",
        "http://c/t",
    ),
    "metrics_endpoint": (
        "http://a/v1/metrics",
        "http://b/m",
        "http://b/m",
        "http://c/m",
        "http://c/m",
    ),
    "protocol": ("grpc", "http/json", "http/json", "grpc", "grpc"),
    "headers": (
        {"x": "1"},
        "authorization=Bearer%20t",
        {"authorization": "Bearer t"},
        "k=v",
        {"k": "v"},
    ),
    "export_timeout_ms": (500, "700", 700.0, "900", 900.0),
    "traces_dir": ("/tmp/a", "/tmp/b", "/tmp/b", None, None),
    "metrics_exporter": (
        ["prometheus"],
        "otlp,prometheus",
        frozenset({"otlp", "prometheus"}),
        "none",
        frozenset(),
    ),
    "prometheus_port": (9000, "9001", 9001, "9002", 9002),
    "prometheus_host": ("127.0.0.1", "127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"),
    "metric_export_interval_ms": (1000, "2000", 2000.0, "3000", 3000.0),
    "sampler": (
        "always_off",
        "traceidratio",
        "traceidratio",
        "parentbased_traceidratio",
        "parentbased_traceidratio",
    ),
    "sampler_arg": (0.25, "0.5", 0.5, "0.75", 0.75),
    "bsp_max_queue_size": (4096, "8192", 8192, "16384", 16384),
    "bsp_max_export_batch_size": (64, "128", 128, "256", 256),
    "bsp_schedule_delay_ms": (100, "200", 200.0, "300", 300.0),
    "bsp_export_timeout_ms": (100, "200", 200.0, "300", 300.0),
    "drop_log_interval_s": (1, "2", 2.0, None, None),
    "gpu": (True, "on", True, None, None),
    "gpu_interval_s": (5, "0.5", 0.5, None, None),
    "gpu_replay": ("/tmp/a.json", "/tmp/b.json", "/tmp/b.json", None, None),
    "gpu_span_attributes": (True, "yes", True, None, None),
    "exit_timeout_s": (2, "3.5", 3.5, None, None),
    "install_signal_handler": (False, "false", False, None, None),
}

DEFAULTS = {
    "resource_attributes": {},
    "traces_exporter": None,
    "endpoint": None,
    "traces_endpoint": None,
    "metrics_endpoint": None,
    "protocol": "http/protobuf",
    "headers": {},
    "export_timeout_ms": 10_000.0,
    "traces_dir": "otelkit-traces",
    "metrics_exporter": None,
    "prometheus_port": None,
    "prometheus_host": "0.0.0.0",
    "metric_export_interval_ms": 15_000.0,
    "sampler": "parentbased_always_on",
    "sampler_arg": 1.0,
    "bsp_max_queue_size": 2048,
    "bsp_max_export_batch_size": 512,
    "bsp_schedule_delay_ms": 5_000.0,
    "bsp_export_timeout_ms": 30_000.0,
    "drop_log_interval_s": 60.0,
    "gpu": False,
    "gpu_interval_s": 1.0,
    "gpu_replay": None,
    "gpu_span_attributes": False,
    "exit_timeout_s": 5.0,
    "install_signal_handler": True,
}


def test_every_option_has_a_precedence_case() -> None:
    assert set(CASES) == {option.name for option in OPTIONS}
    assert set(DEFAULTS) | {"service_name"} == set(CASES)


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.name)
def test_precedence_argument_then_otelkit_then_otel_then_default(option: Any) -> None:
    argument, kit_text, kit_value, otel_text, otel_value = CASES[option.name]
    kit_var = f"OTELKIT_{option.name.upper()}"
    environ = {kit_var: kit_text}
    if otel_text is not None:
        assert option.otel_env, f"{option.name} has an OTEL_* case but no OTEL_* variable"
        environ[option.otel_env[0]] = otel_text
    # batch <= queue must hold whatever the case sets
    extra = {"bsp_max_queue_size": 100_000} if option.name == "bsp_max_export_batch_size" else {}

    def value(arguments: dict[str, Any], env: dict[str, str]) -> Any:
        return getattr(resolve({**extra, **arguments}, environ=env), option.name)

    expected_argument = frozenset(argument) if isinstance(argument, list) else argument
    expected_argument = float(argument) if isinstance(kit_value, float) else expected_argument
    assert value({option.name: argument}, environ) == expected_argument
    assert value({}, environ) == kit_value
    if otel_text is not None:
        del environ[kit_var]
        assert value({}, environ) == otel_value
    if option.name != "service_name":
        assert value({}, {}) == DEFAULTS[option.name]


def test_service_name_defaults_to_resource_attribute_then_program_name() -> None:
    env = {"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-resource,team=trk"}
    assert resolve({}, environ=env).service_name == "from-resource"
    assert resolve({}, environ={}).service_name.startswith("unknown_service:")


def test_settings_compare_equal_when_options_are_equal() -> None:
    a = resolve({"service_name": "x", "headers": {"k": "v"}}, environ={})
    b = resolve({}, environ={"OTEL_SERVICE_NAME": "x", "OTEL_EXPORTER_OTLP_HEADERS": "k=v"})
    assert a == b
    assert dataclasses.replace(a, sampler_arg=0.5) != b


BAD: list[tuple[dict[str, Any], dict[str, str], str, str]] = [
    ({"protocol": "thrift"}, {}, "protocol", "OTEL_EXPORTER_OTLP_PROTOCOL"),
    ({}, {"OTEL_EXPORTER_OTLP_PROTOCOL": "udp"}, "protocol", "OTEL_EXPORTER_OTLP_PROTOCOL"),
    ({"endpoint": "collector:4317"}, {}, "endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://"}, "endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ({}, {"OTELKIT_ENDPOINT": "http://h:99999"}, "endpoint", "OTELKIT_ENDPOINT"),
    ({}, {"OTEL_EXPORTER_OTLP_HEADERS": "novalue"}, "headers", "OTEL_EXPORTER_OTLP_HEADERS"),
    ({}, {"OTEL_EXPORTER_OTLP_HEADERS": "=v"}, "headers", "OTEL_EXPORTER_OTLP_HEADERS"),
    ({"headers": "a=1,b"}, {}, "headers", "OTEL_EXPORTER_OTLP_HEADERS"),
    ({"sampler": "traceidratio", "sampler_arg": 1.5}, {}, "sampler_arg", "OTEL_TRACES_SAMPLER_ARG"),
    ({}, {"OTEL_TRACES_SAMPLER_ARG": "-0.1"}, "sampler_arg", "OTEL_TRACES_SAMPLER_ARG"),
    ({}, {"OTEL_TRACES_SAMPLER_ARG": "half"}, "sampler_arg", "OTEL_TRACES_SAMPLER_ARG"),
    ({}, {"OTEL_TRACES_SAMPLER": "sometimes"}, "sampler", "OTEL_TRACES_SAMPLER"),
    ({"prometheus_port": 70000}, {}, "prometheus_port", "OTEL_EXPORTER_PROMETHEUS_PORT"),
    ({}, {"OTEL_BSP_MAX_QUEUE_SIZE": "0"}, "bsp_max_queue_size", "OTEL_BSP_MAX_QUEUE_SIZE"),
    (
        {"bsp_max_queue_size": 10, "bsp_max_export_batch_size": 20},
        {},
        "bsp_max_export_batch_size",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
    ),
    ({}, {"OTEL_METRICS_EXPORTER": "statsd"}, "metrics_exporter", "OTEL_METRICS_EXPORTER"),
    ({}, {"OTELKIT_INSTALL_SIGNAL_HANDLER": "maybe"}, "install_signal_handler", ""),
]


@pytest.mark.parametrize(("arguments", "environ", "option", "env_var"), BAD)
def test_bad_configuration_fails_fast_naming_option_and_variable(
    arguments: dict[str, Any], environ: dict[str, str], option: str, env_var: str
) -> None:
    with pytest.raises(ValueError) as caught:
        resolve(arguments, environ=environ)
    assert isinstance(caught.value, ConfigError)
    assert caught.value.option == option
    message = str(caught.value)
    assert f"invalid {option}=" in message
    if env_var:
        assert env_var in message
    assert "expected" in message


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sampler_ratio": 0.1}, "unknown option 'sampler_ratio'; did you mean 'sampler_arg'?"),
        (
            {"servicename": "x", "gpu": True},
            "unknown option 'servicename'; did you mean 'service_name'?",
        ),
        ({"colour": "red"}, "unknown option 'colour'; the options are service_name, "),
    ],
)
def test_an_unknown_option_names_the_closest_one(options: dict[str, Any], message: str) -> None:
    """A name built at run time (``**options``) escapes mypy; configure() says what to write."""
    with pytest.raises(ConfigError) as caught:
        otelkit.configure(**options)
    assert caught.value.option == next(iter(options))
    assert str(caught.value).startswith(f"otelkit: {message}")
    assert telemetry.current() is None  # nothing was built
