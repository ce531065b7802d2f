"""The page's sections as HTML fragments: breakdown with its checks, studies, waterfall, facts.

Every text that comes from the data (span names, attribute values, verdicts) is escaped.

>>> "<table" in facts_section(Facts(spans=3, traces=1), [], late_spans=0)
True
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Sequence
from typing import Any

from otelkit.analysis._breakdown import TOTAL, Breakdown
from otelkit.report._charts import Chart
from otelkit.report._collect import Facts

__all__ = [
    "breakdown_section",
    "chart_blocks",
    "facts_section",
    "heading_section",
    "study_section",
    "waterfall_section",
]

_e = html.escape


def chart_blocks(charts: Iterable[tuple[str, Chart]]) -> str:
    """One block per (element id, chart): its title, where vega-embed draws, its note."""
    blocks = []
    for element_id, chart in charts:
        note = f'<p class="note">{_e(chart.note)}</p>' if chart.note else ""
        blocks.append(
            f'<div class="chart" data-chart="{_e(chart.name)}"><h3>{_e(chart.title)}'
            f'</h3><div id="{element_id}" class="vega"></div>{note}</div>'
        )
    return f'<div class="charts">{"".join(blocks)}</div>'


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def breakdown_section(
    groups: Sequence[tuple[str, Breakdown]],
    charts: str,
    late_spans: int,
    closed_early: int,
    sampling: Sequence[str] = (),
) -> str:
    """The stacked bars, then the checks per group: traces, left out, nesting problems; and
    how the traces were chosen (``sampling``), where their spans say it."""
    rows = []
    for label, group in groups:
        problems = (
            f'<span class="problem">{len(group.problems)} nesting problems: '
            f"{_e('; '.join(group.problems[:3]))}</span>"
            if group.problems
            else '<span class="ok">nesting consistent</span>'
        )
        left_out = (
            f'<span class="problem">{group.incomplete} left out (server spans missing)</span>'
            if group.incomplete
            else "none left out"
        )
        slowest = group.slowest_stage()
        limit = (
            f"{_e(slowest.name)} ({_ms(slowest.seconds)} ms, {100 * slowest.share:.0f} %)"
            if slowest
            else "-"
        )
        rows.append(
            f"<tr><td>{_e(label)}</td><td class='num'>{group.traces}</td>"
            f"<td class='num'>{_ms(group.mean(TOTAL))}</td>"
            f"<td class='num'>{_ms(group.median_total())}</td><td>{limit}</td>"
            f"<td>{left_out}; {problems}</td></tr>"
        )
    stream = []
    if late_spans:
        stream.append(
            f"{late_spans} spans arrived after their trace was closed (files out of "
            "time order?): left out"
        )
    if closed_early:
        stream.append(f"{closed_early} traces closed early to bound memory")
    notes = "".join(f'<p class="problem">{_e(s)}</p>' for s in stream)
    notes += "".join(f'<p class="sampling">{_e(line)}</p>' for line in sampling)
    table = (
        "<table id='checks'><tr><th>group</th><th>traces</th><th>mean ms</th>"
        "<th>median ms</th><th>slowest server stage</th><th>checks</th></tr>"
        + "".join(rows)
        + "</table>"
    )
    if not groups:
        return '<h2 id="breakdown">Breakdown</h2><p>No complete traces with a root span.</p>'
    return f'<h2 id="breakdown">Breakdown</h2>{charts}<h3>Checks</h3>{table}{notes}'


def heading_section(title: str, studies: Sequence[str]) -> str:
    """The page's title and its navigation: a title and study names come from outside (a
    command line, a results file's name) and are escaped as everything else on the page.

    >>> heading_section("<b>x</b>", ["a&b"]).split("<nav>")[0]
    '<h1>&lt;b&gt;x&lt;/b&gt;</h1>'
    """
    links = "".join(f'<a href="#study-{_e(name)}">study {_e(name)}</a>' for name in studies)
    return (
        f"<h1>{_e(title)}</h1>"
        '<nav><a href="#breakdown">breakdown</a><a href="#traces">trace waterfall</a>'
        f'{links}<a href="#facts">the run</a></nav>'
    )


def study_section(
    title: str,
    header: dict[str, Any],
    verdicts: Sequence[str],
    charts: str,
    points: Sequence[tuple[str, str | None]] = (),
) -> str:
    """A study's plots, its verdicts in words and its points, each linked to the waterfall of
    one of its traces (``points``: label and trace id, None where no trace was read); a study
    run untraced says so once instead of a column of points without traces."""
    said = {
        "model": header.get("model"),
        "server": server_words(header.get("server")) if header.get("server") else None,
        "unit": header.get("unit"),
        "otelkit": header.get("otelkit_version"),
    }
    facts = ", ".join(f"{k}: {_e(str(v))}" for k, v in said.items() if v)
    words = "".join(f'<li class="verdict">{_e(v)}</li>' for v in verdicts)
    table = ""
    if "tracing" in header and header["tracing"] is None:
        table = (
            '<p class="hint untraced">This study ran untraced (<code>--no-traces</code>, or '
            "<code>tracing=None</code>): its points have no waterfall. Run it traced (the "
            "default; <code>Tracing(per_second=...)</code> in Python) to link each point to one "
            "of its traces.</p>"
        )
    elif points:
        rows = "".join(
            f"<tr><td>{_e(label)}</td><td>{_point_link(trace)}</td></tr>" for label, trace in points
        )
        table = f'<table class="points"><tr><th>point</th><th>a trace of it</th></tr>{rows}</table>'
    return (
        f'<h2 id="study-{_e(title)}">Study: {_e(title)}</h2><p class="facts-line">{facts}</p>'
        f"<ul>{words}</ul>{table}{charts}"
    )


def server_words(server: Any) -> str:
    """The server a study's results file records, in words.

    >>> server_words({"kind": "remote", "url": "gpu-node:8000", "metrics_url": None})
    'a server at gpu-node:8000 (not launched by the study)'
    >>> server_words({"kind": "triton", "repository": "tests/models", "models": ["a", "b"]})
    'a tritonserver the study launched (repository tests/models; models a, b)'
    >>> server_words({"kind": "ray_serve", "application": "tracking"})
    'Ray Serve, application tracking, deployed by the study'
    """
    if not isinstance(server, dict):
        return str(server)
    kind = server.get("kind")
    if kind == "remote":
        metrics = server.get("metrics_url")
        scraped = f"; its metrics at {metrics}" if metrics else ""
        return f"a server at {server.get('url')} (not launched by the study{scraped})"
    if kind == "triton":
        models = ", ".join(map(str, server.get("models") or []))
        listed = f"; models {models}" if models else ""
        return f"a tritonserver the study launched (repository {server.get('repository')}{listed})"
    if kind == "fleet":
        return (
            f"a fleet the study launched: tritonservers (repository {server.get('repository')}) "
            f"registered in {server.get('registry')}, behind {server.get('balancer')} with "
            f"{server.get('balancer_workers')} workers"
        )
    if kind == "ray_serve":
        return f"Ray Serve, application {server.get('application')}, deployed by the study"
    rest = ", ".join(f"{k} {v}" for k, v in server.items() if k != "kind" and v is not None)
    return f"{kind} ({rest})" if rest else str(kind)


def _point_link(trace: str | None) -> str:
    if trace is None:
        return "no trace read"
    return f'<a class="point-trace" href="#trace={_e(trace)}">its waterfall</a>'


def p99_label(sampled: int) -> str:
    """The p99 view's button: the trace nearest the p99 among ``sampled`` candidates.

    >>> p99_label(33)
    'p99 (nearest of 33 sampled)'
    """
    return f"p99 (nearest of {sampled} sampled)" if sampled else "p99"


def waterfall_section(carried: int, read: int, sampled: int = 0) -> str:
    """The waterfall's controls: a group, its median, p99 or slowest trace, or any trace id;
    ``sampled``: the first group's candidates for its median and p99 (the page's script names
    each group's as it is chosen)."""
    return f"""<h2 id="traces">Trace waterfall</h2><div id="wf-section">
<div class="wf-controls">group <select id="wf-group"></select>
<button data-view="median">median</button><button data-view="p99">{p99_label(sampled)}</button>
<button data-view="slowest">slowest</button>
<span>trace id <input id="trace-id" placeholder="32 hex digits, e.g. from an exemplar">
<button id="open-trace">open</button></span><span id="wf-message"></span></div>
<p class="hint">This file carries {carried} of the {read} traces read: per group the median,
p99 and slowest, and as many others as its span budget holds (<code>--max-spans</code>). The
median and p99 are the traces nearest them among a random sample of up to 32 of the group's
traces, its slowest and those carried (the p99 button says how many); the slowest is exact.
A link to <code>report.html#trace=ID</code> opens a trace.</p>
<p id="wf-title"></p><div id="waterfall"></div><div id="wf-attributes"></div></div>"""


def _when(ns: int | None) -> str:
    if ns is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ns / 1e9))


def _versions(service: str, resource: dict[str, Any]) -> str:
    """``triton: SDK cpp 1.13.0``: what emitted a service's spans, from its resource.

    >>> _versions("client", {"telemetry.distro.name": "otelkit", "telemetry.distro.version": "0.1"})
    'client: otelkit 0.1'
    """
    parts = []
    if "service.version" in resource:
        parts.append(f"version {resource['service.version']}")
    if "telemetry.distro.name" in resource:
        parts.append(
            f"{resource['telemetry.distro.name']} {resource.get('telemetry.distro.version', '')}"
        )
    if "telemetry.sdk.version" in resource:
        language = resource.get("telemetry.sdk.language", "")
        parts.append(f"OpenTelemetry SDK {language} {resource['telemetry.sdk.version']}")
    return f"{service}: {', '.join(parts) or 'no version in its resource'}"


def facts_section(
    facts: Facts, studies: Sequence[tuple[str, dict[str, Any]]], late_spans: int
) -> str:
    """Versions, hosts, each service's resource attributes, when, how many spans and traces."""
    scopes = ", ".join(f"{k} ({n} spans)" for k, n in sorted(facts.scopes.items()))
    lines = [
        ("traces", str(facts.traces)),
        ("spans", str(facts.spans)),
        ("first span", _when(facts.first_ns)),
        ("last span end", _when(facts.last_ns or None)),
        ("hosts", ", ".join(sorted(facts.hosts)) or "-"),
        ("instrumentation scopes", scopes),
        ("sampling", " ".join(facts.sampling.lines()) or "not said by the spans"),
    ]
    lines.insert(
        2,
        (
            "versions",
            "; ".join(
                _versions(name, resource) for name, resource in sorted(facts.services.items())
            ),
        ),
    )
    if late_spans:
        lines.append(("late spans (left out)", str(late_spans)))
    for name, header in studies:
        keep = {k: v for k, v in header.items() if isinstance(v, str | int | float)}
        lines.append((f"study {name}", "; ".join(f"{k}={v}" for k, v in keep.items())))
    table = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in lines)
    services = []
    for service, resource in sorted(facts.services.items()):
        attrs = "<br>".join(f"{_e(k)} = {_e(str(v))}" for k, v in sorted(resource.items()))
        services.append(f"<tr><th>{_e(service)}</th><td>{attrs}</td></tr>")
    return (
        f'<h2 id="facts">The run</h2><table id="facts-table">{table}</table>'
        "<h3>Services and their resources</h3>"
        f'<table id="services">{"".join(services)}</table>'
    )
