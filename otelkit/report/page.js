// otelkit report: draws the charts (vega-embed, inlined beside this script) and the trace
// waterfall from the JSON data block. Nothing is fetched: the page works from file://.
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("otelkit-data").textContent);
  const SVG = "http://www.w3.org/2000/svg";

  function el(tag, attrs, text) {
    const node = tag.startsWith("svg:")
      ? document.createElementNS(SVG, tag.slice(4))
      : document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function fmtUs(us) {
    return us >= 1000 ? (us / 1000).toFixed(us >= 100000 ? 0 : 2) + " ms" : us.toFixed(1) + " µs";
  }

  // Charts: one vega-embed per placeholder, SVG so that what is drawn can be inspected; one
  // after another, each after the browser had a turn, so the page shows and answers at once
  // while a study's twenty plots are still being drawn below.
  (async function drawCharts() {
    for (const chart of data.charts) {
      const target = document.getElementById(chart.id);
      try {
        await vegaEmbed(target, chart.spec, { actions: false, renderer: "svg" });
      } catch (error) {
        target.textContent = "chart failed: " + error;
        console.error(error);
      }
      await new Promise(function (resolve) { setTimeout(resolve, 0); });
    }
  })();

  // Waterfall: rows in tree order; a bar per span at its offset, events as marks on it.
  const ROW = 22, LABEL = 330, WIDTH = 1100, PAD = 6;
  const panel = document.getElementById("wf-attributes");
  const message = document.getElementById("wf-message");

  function showAttributes(span) {
    panel.replaceChildren();
    panel.appendChild(el("h4", {}, span.s ? span.s + ": " + span.n : span.n));
    const table = el("table", { class: "attrs" });
    const rows = [["span id", span.i], ["parent", span.p || "(root)"], ["kind", span.k],
      ["start", "+" + fmtUs(span.t)], ["duration", fmtUs(span.d)]];
    if (span.x) rows.push(["status", span.x]);
    for (const [k, v] of Object.entries(span.a)) rows.push([k, String(v)]);
    for (const [name, at] of span.e) rows.push(["event " + name, "+" + fmtUs(at)]);
    for (const [k, v] of rows) {
      const tr = el("tr");
      tr.appendChild(el("th", {}, k));
      tr.appendChild(el("td", {}, v));
      table.appendChild(tr);
    }
    panel.appendChild(table);
  }

  function drawTrace(trace) {
    const box = document.getElementById("waterfall");
    const spans = trace.spans;
    const scale = (WIDTH - LABEL - 2 * PAD) / Math.max(trace.d, 1);
    const svg = el("svg:svg", { width: WIDTH, height: (spans.length + 1) * ROW + PAD,
      class: "wf", "data-trace-id": trace.id });
    for (let tick = 0; tick <= 4; tick++) {
      const x = LABEL + PAD + (tick / 4) * trace.d * scale;
      svg.appendChild(el("svg:line", { x1: x, x2: x, y1: ROW - 4, y2: (spans.length + 1) * ROW,
        class: "wf-tick" }));
      svg.appendChild(el("svg:text", { x: x, y: ROW - 8, class: "wf-tick-label",
        "text-anchor": tick === 4 ? "end" : "middle" }, fmtUs((tick / 4) * trace.d)));
    }
    spans.forEach(function (span, n) {
      const y = (n + 1) * ROW;
      const row = el("svg:g", { class: "wf-row", "data-span-id": span.i, "data-name": span.n,
        "data-depth": span.l, "data-offset-us": span.t, "data-duration-us": span.d });
      row.appendChild(el("svg:text", { x: 4 + 14 * span.l, y: y + 15, class: "wf-label" },
        (span.s ? span.s + ": " : "") + span.n));
      const x = LABEL + PAD + span.t * scale;
      const bar = el("svg:rect", { x: x, y: y + 4, height: ROW - 8,
        width: Math.max(1, span.d * scale), class: "wf-bar wf-" + span.k + (span.x ? " wf-error" : "") });
      bar.appendChild(el("svg:title", {}, span.n + " " + fmtUs(span.d)));
      row.appendChild(bar);
      for (const [name, at] of span.e) {
        const mark = el("svg:line", { x1: LABEL + PAD + at * scale, x2: LABEL + PAD + at * scale,
          y1: y + 2, y2: y + ROW - 2, class: "wf-event", "data-event": name });
        mark.appendChild(el("svg:title", {}, name + " +" + fmtUs(at)));
        row.appendChild(mark);
      }
      const end = x + Math.max(1, span.d * scale);
      // the duration after its bar, or inside it where the bar reaches the right edge
      const inside = end + 64 > WIDTH;
      row.appendChild(el("svg:text", { x: inside ? end - 4 : end + 4, y: y + 15,
        "text-anchor": inside ? "end" : "start", class: "wf-duration" + (inside ? " wf-inside" : "") },
        fmtUs(span.d)));
      row.addEventListener("click", function () { showAttributes(span); });
      svg.appendChild(row);
    });
    box.replaceChildren(svg);
    if (views[trace.g]) {
      groupSelect.value = trace.g;
      nameP99();
    }
    document.getElementById("wf-title").textContent = "trace " + trace.id + " (" + trace.g +
      "), " + fmtUs(trace.d) + ", " + spans.length + " spans, started " +
      new Date(trace.start_us / 1000).toISOString();
    panel.replaceChildren(el("p", { class: "hint" }, "Click a span for its attributes and events."));
  }

  function openTrace(id) {
    const wanted = (id || "").trim().toLowerCase();
    const trace = data.traces[wanted];
    if (!trace) {
      message.textContent = "trace " + wanted + " is not in this report (it carries " +
        Object.keys(data.traces).length + " of the " + data.facts.traces + " traces read)";
      return false;
    }
    message.textContent = "";
    drawTrace(trace);
    return true;
  }

  const groupSelect = document.getElementById("wf-group");
  const views = data.views;
  for (const label of Object.keys(views)) groupSelect.appendChild(el("option", { value: label }, label));
  // the p99 view is the trace nearest the p99 among the group's sampled candidates: say how many
  const p99Button = document.querySelector("button[data-view='p99']");
  function nameP99() {
    const sampled = data.sampled[groupSelect.value];
    p99Button.textContent = sampled ? "p99 (nearest of " + sampled + " sampled)" : "p99";
  }
  nameP99();
  function openView(view) {
    const chosen = views[groupSelect.value];
    if (chosen) openTrace(chosen[view]);
  }
  for (const button of document.querySelectorAll("button[data-view]")) {
    button.addEventListener("click", function () { openView(button.dataset.view); });
  }
  groupSelect.addEventListener("change", function () { nameP99(); openView("median"); });
  const idBox = document.getElementById("trace-id");
  document.getElementById("open-trace").addEventListener("click", function () { openTrace(idBox.value); });
  idBox.addEventListener("keydown", function (event) { if (event.key === "Enter") openTrace(idBox.value); });
  // #trace=<id> opens a trace: a link from an exemplar lands on its waterfall.
  function traceInHash() {
    const found = /trace=([0-9a-fA-F]+)/.exec(location.hash);
    return found ? found[1] : null;
  }
  window.addEventListener("hashchange", function () {
    if (traceInHash()) openTrace(traceInHash());
  });
  if (!(traceInHash() && openTrace(traceInHash())) && Object.keys(views).length) openView("median");
  else if (!Object.keys(views).length && Object.keys(data.traces).length) openTrace(Object.keys(data.traces)[0]);
  window.otelkitReport = { openTrace: openTrace, data: data };
})();
