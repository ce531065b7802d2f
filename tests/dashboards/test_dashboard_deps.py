"""The dashboards without grafanalib's private encoder (``otelkit._core.deps.grafanalib``), as
a grafanalib that moved ``grafanalib._gen.DashboardEncoder`` would leave them: the same JSON,
and one log line."""

from __future__ import annotations

import json
import logging

import pytest

from otelkit._core import deps
from otelkit.dashboards import dumps, render
from tests.paths import ROOT
from tests.support import otelkit_lines

grafanalib = pytest.importorskip("grafanalib")


def test_without_grafanalibs_encoder_the_dashboards_are_the_committed_json(
    fresh_warnings: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from grafanalib import _gen

    monkeypatch.delattr(_gen, "DashboardEncoder")
    with caplog.at_level(logging.WARNING, logger="otelkit"):
        rendered = render()
    for name, dashboard in rendered.items():
        assert dumps(dashboard) == (ROOT / "dashboards" / f"{name}.json").read_text(), name
    lines = otelkit_lines(caplog)
    assert lines == [
        f"otelkit: grafanalib {deps.version_of('grafanalib')} has no "
        "grafanalib._gen.DashboardEncoder; otelkit writes dashboards with its own encoder of "
        "to_json_data() (the same JSON)"
    ]


def test_the_own_encoder_refuses_what_has_no_json_data() -> None:
    from otelkit._core.deps.grafanalib import ToJsonDataEncoder

    with pytest.raises(TypeError, match="not JSON serializable"):
        json.dumps(object(), cls=ToJsonDataEncoder)
