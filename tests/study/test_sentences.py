"""A verdict's sentence agrees in number with the resource it names, whatever the name: one
thing is busy or waits, several things are busy or wait."""

from __future__ import annotations

import pytest

from otelkit.study._verdicts import Evidence, Kind, Verdict, _at_limit, _Curve, _unexplained
from tests.study.conftest import make_point

LOW = make_point({"concurrency": 1}, 100.0)
HIGH = make_point({"concurrency": 8}, 110.0)
FACTS = _Curve("concurrency", "request", 0.1, LOW, HIGH, HIGH, stopped=True)


def _verdict(
    kind: Kind, top: Evidence | None, sentence: str, change: str = "", **_: object
) -> Verdict:
    return Verdict("", "concurrency", kind, None, sentence, change=change)


def _evidence(kind: str, name: str, growth: float = 1.0) -> Evidence:
    return Evidence("key", kind, name, 1.0, 2.0, 2.0 * growth, 0.99, 110.0)


@pytest.mark.parametrize("kind", ["lock", "cores", "network", "balancer", "client", "gpu"])
@pytest.mark.parametrize(
    ("name", "plural"),
    [
        ("server queue", False),
        ("the host's 2 cores", True),
        ("client threads", True),
        ("network + client wait", False),
        ("gnn", False),
    ],
)
def test_a_limit_agrees_with_its_resource(kind: str, name: str, plural: bool) -> None:
    sentence = _at_limit(FACTS, _evidence(kind, name), _verdict).sentence
    verb = {"lock": ("serves", "serve")}.get(kind, ("is", "are"))
    assert sentence.startswith(f"{name} {verb[plural]} ")


@pytest.mark.parametrize(("name", "verb"), [("server queue", "waits"), ("client threads", "wait")])
def test_a_demand_that_grows_agrees_with_its_resource(name: str, verb: str) -> None:
    grown = _evidence("stage", name, growth=3.0)
    sentence = _unexplained(FACTS, [grown], None, _verdict).sentence
    assert f"because {name} {verb} for a resource" in sentence
