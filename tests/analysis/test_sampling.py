"""How the traces were chosen, where their spans say it (otelkit.analysis._sampling): the
Collector's tail sampling policy on the scope, otelkit's head sampler on the resource, Jaeger's
on the root; said by ``otelkit breakdown`` (both engines) and by the report."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from otelkit import semconv
from otelkit._config import resolve
from otelkit._resource import make_resource
from otelkit.analysis import load_spans
from otelkit.analysis._sampling import Sampling
from otelkit.cli import main
from tests.analysis.test_store import DEMO


def _tail_sampled(out: Path) -> tuple[int, int]:
    """The demo's traces as a Collector with tail sampling's ``recordpolicy`` gate writes
    them: every other export's scopes name the policy that kept them ("slow"); the roots so
    marked, and all roots."""
    marked = roots = 0
    lines = []
    for n, line in enumerate(DEMO.read_text().splitlines()):
        doc: dict[str, Any] = json.loads(line)
        for rs in doc.get("resourceSpans", ()):
            for ss in rs.get("scopeSpans", ()):
                top = sum(not s.get("parentSpanId") for s in ss.get("spans", ()))
                roots += top
                if n % 2 == 0:
                    policy = {"key": "tailsampling.policy", "value": {"stringValue": "slow"}}
                    ss.setdefault("scope", {})["attributes"] = [policy]
                    marked += top
        lines.append(json.dumps(doc))
    out.write_text("\n".join(lines) + "\n")
    return marked, roots


def test_the_collectors_tail_policy_is_read_from_the_scope_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = tmp_path / "tail.jsonl"
    marked, roots = _tail_sampled(traces)
    assert 0 < marked < roots
    spans = load_spans(traces)
    kept = [s for s in spans if s.attributes.get(semconv.TAIL_SAMPLING_POLICY) == "slow"]
    assert kept and all(s.scope for s in kept)  # on the span, from its scope
    said = Sampling().update(spans).lines()
    assert said == [
        f"sampling: the Collector's tail sampling kept {marked} of {roots} traces for their "
        "outcome (slow "
        f"{marked}): a store it fed holds the slow and the failed, so its percentiles run high "
        "(the metrics count every request)"
    ]
    assert main(["breakdown", str(traces), "--engine", "python"]) == 0
    python = capsys.readouterr().out
    assert python.rstrip().endswith(said[0])
    store = tmp_path / "store"
    assert main(["import", str(traces), "--out", str(store)]) == 0
    capsys.readouterr()
    assert main(["breakdown", str(store), "--engine", "duckdb"]) == 0
    assert capsys.readouterr().out == python  # the same table and the same statement
    page = tmp_path / "report.html"
    assert main(["report", str(traces), "--out", str(page)]) == 0
    html = page.read_text()
    assert f"tail sampling kept {marked} of {roots} traces" in html
    assert '<p class="sampling">sampling: the Collector' in html


def test_head_samplers_are_named_with_the_services_using_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = resolve({"service_name": "sonic", "sampler": "parentbased_ratelimiting"})
    resource = dict(make_resource(settings).attributes)
    rate = settings.sampler_arg
    assert resource[semconv.OTELKIT_SAMPLER] == f"parentbased_ratelimiting {rate:g}/s"
    spans = load_spans(DEMO)  # recorded before the resource named its sampler: says nothing
    assert Sampling().update(spans).lines() == []
    assert main(["breakdown", str(DEMO)]) == 0
    assert "sampling:" not in capsys.readouterr().out
    sampling = Sampling()
    for span in spans:
        sampling.add(
            replace(span, resource={**span.resource, semconv.OTELKIT_SAMPLER: "traceidratio 0.01"})
        )
    jaeger = {"sampler.type": "probabilistic", "sampler.param": 0.001}
    sampling.add(replace(spans[0], attributes=jaeger, resource={"service.name": "legacy"}))
    services = sorted({str(s.resource["service.name"]) for s in spans})
    assert sampling.lines() == [
        "sampling: head sampling in the services (probabilistic 0.001 (legacy); traceidratio "
        f"0.01 ({', '.join(services)})): each trace chosen before its outcome was known, the "
        "traces stand for the requests"
    ]
