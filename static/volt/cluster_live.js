// The cluster page, live: one websocket (snapshot on connect, then events), no page reloads.
// Reconnects with exponential backoff; every (re)connect starts from a fresh snapshot, so nothing a slow
// or disconnected client missed is lost. Charts are Plotly, extended point by point.
(function () {
  "use strict";
  const root = document.getElementById("cluster-live");
  if (!root) return;
  const $ = (id) => document.getElementById(id);
  const state = { predicted: null, nodes: [], retry: 0, socket: null, live: true };
  const esc = (s) => String(s == null ? "" : s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  const fmt = (v, d) => (v == null ? "—" : Number(v).toFixed(d));
  // Samples carry UTC timestamps and Plotly draws them as given: the axis says so, 24 h like every time.
  const TIME_AXIS = {title: {text: "time (UTC)"}, type: "date", tickformat: "%H:%M:%S"};
  const layout = (title, ytitle) => ({
    title: {text: title, font: {size: 13}}, margin: {l: 50, r: 10, t: 30, b: 40},
    xaxis: {...TIME_AXIS},
    yaxis: {title: ytitle, rangemode: "tozero"}, legend: {orientation: "h"}, showlegend: true,
  });

  // A chart with no points says so (a terminated cluster that recorded none, a cluster not probed yet).
  const empty = (text) => ({annotations: [{text, showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5}],
    xaxis: {...TIME_AXIS, visible: false}, yaxis: {visible: false}});

  // Probe samples and the training job's own all-reduces (source "job") are separate traces.
  const JOB_TRACE = "job busbw (training all-reduce)";
  function drawBandwidth(points) {
    const probe = points.filter((p) => p.source !== "job"), job = points.filter((p) => p.source === "job");
    const x = probe.map((p) => p.ts), y = probe.map((p) => p.value);
    const traces = [{x, y, name: "measured busbw", mode: "lines+markers", type: "scatter"}];
    if (state.predicted) {
      const all = points.map((p) => p.ts);
      const span = all.length ? [all[0], all[all.length - 1]] : [new Date().toISOString(), new Date().toISOString()];
      traces.push({x: span, y: [state.predicted, state.predicted], name: "predicted", mode: "lines", line: {dash: "dash"}});
    }
    if (job.length) traces.push({x: job.map((p) => p.ts), y: job.map((p) => p.value), name: JOB_TRACE, mode: "markers", type: "scatter"});
    const look = layout("All-reduce busbw (GB/s)", "GB/s");
    if (!points.length) Object.assign(look, empty(state.live ? "No bandwidth sample yet: probe the cluster." : "No bandwidth sample was recorded."));
    Plotly.react("busbw-chart", traces, look, {displayModeBar: false, responsive: true});
    const chart = $("busbw-chart");
    chart.dataset.points = String(probe.length);
    chart.dataset.jobPoints = String(job.length);
  }

  function addBandwidth(ts, value, source) {
    const chart = $("busbw-chart");
    if ((chart.layout.annotations || []).length) Plotly.relayout(chart, {annotations: [], "xaxis.visible": true, "yaxis.visible": true});
    if (source === "job") {
      const i = (chart.data || []).findIndex((t) => t.name === JOB_TRACE);
      if (i >= 0) Plotly.extendTraces(chart, {x: [[ts]], y: [[value]]}, [i]);
      else Plotly.addTraces(chart, {x: [ts], y: [value], name: JOB_TRACE, mode: "markers", type: "scatter"});
      chart.dataset.jobPoints = String(Number(chart.dataset.jobPoints || 0) + 1);
    } else {
      Plotly.extendTraces(chart, {x: [[ts]], y: [[value]]}, [0]);
      chart.dataset.points = String(Number(chart.dataset.points || 0) + 1);
    }
    if (state.predicted && chart.data.length > 1 && chart.data[1].name === "predicted") {
      const xs = chart.data[1].x;
      Plotly.restyle(chart, {x: [[xs[0], ts]]}, [1]);
    }
  }

  // The jobs section of the page: a job's row follows its status and step; a new job gets a row.
  function updateJob(job) {
    const table = $("jobs-table");
    if (!table || !job) return;
    let row = table.querySelector(`tr[data-job="${job.id}"]`);
    if (!row) {
      row = document.createElement("tr");
      row.dataset.job = String(job.id);
      row.innerHTML = `<td><a href="${esc(job.url)}">${esc(job.name)}</a> <span class="muted small">#${job.id}</span></td>` +
        `<td><span class="state job-status"></span></td><td class="num job-step"></td><td class="mono small"></td><td></td>`;
      table.querySelector("tbody").prepend(row);
      const none = $("no-jobs");
      if (none) none.hidden = true;
    }
    const badge = row.querySelector(".job-status");
    badge.className = "state job-status state-" + job.status;
    badge.textContent = job.status.charAt(0).toUpperCase() + job.status.slice(1);
    row.querySelector(".job-step").textContent = job.last_step == null ? "—" : job.last_step;
  }

  function drawGpu(gpu) {
    const traces = [];
    const byHost = {};
    (gpu.gpu_temp_c || []).forEach((p) => { (byHost[p.host] = byHost[p.host] || {x: [], y: []}); byHost[p.host].x.push(p.ts); byHost[p.host].y.push(p.value); });
    Object.keys(byHost).sort().forEach((host) => traces.push({x: byHost[host].x, y: byHost[host].y, name: host + " °C", mode: "lines"}));
    const util = {};
    (gpu.gpu_util_pct || []).forEach((p) => { (util[p.host] = util[p.host] || {x: [], y: []}); util[p.host].x.push(p.ts); util[p.host].y.push(p.value); });
    Object.keys(util).sort().forEach((host) => traces.push({x: util[host].x, y: util[host].y, name: host + " util %", mode: "lines", line: {dash: "dot"}}));
    const look = layout("GPU temperature (°C) and utilisation (%) per host", "");
    if (!traces.length) Object.assign(look, empty(state.live ? "No GPU reading yet: the watch sweeps a ready cluster." : "No GPU reading was recorded."));
    Plotly.react("gpu-chart", traces, look, {displayModeBar: false, responsive: true});
  }

  function addGpu(ts, nodes) {
    const chart = $("gpu-chart");
    const names = (chart.data || []).map((t) => t.name);
    const x = [], y = [], idx = [];
    nodes.forEach((n) => {
      [["gpu_temp_c", " °C"], ["gpu_util_pct", " util %"]].forEach(([key, suffix]) => {
        const i = names.indexOf(n.host + suffix);
        const v = n.readings ? n.readings[key] : null;
        if (i >= 0 && v != null) { x.push([ts]); y.push([v]); idx.push(i); }
      });
    });
    if (idx.length) Plotly.extendTraces(chart, {x, y}, idx, 900);
    else if (nodes.some((n) => n.readings && n.readings.gpu_temp_c != null)) {
      // First readings ever: start the traces.
      const gpu = {gpu_temp_c: [], gpu_util_pct: []};
      nodes.forEach((n) => { if (n.readings) { ["gpu_temp_c", "gpu_util_pct"].forEach((k) => { if (n.readings[k] != null) gpu[k].push({ts, host: n.host, value: n.readings[k]}); }); } });
      drawGpu(gpu);
    }
  }

  function drawHealth(nodes) {
    state.nodes = nodes;
    const body = $("health-table").querySelector("tbody");
    if (!nodes.length) return;
    body.innerHTML = nodes.map((n) => {
      const r = n.readings || {};
      const verdict = n.verdict || "not checked";
      const cls = {ok: "ready", warning: "pending", failed: "failed"}[n.verdict] || "terminated";
      return `<tr data-host="${esc(n.host)}"><td>${esc(n.host)}</td><td>${n.is_head ? "head" : "rank " + n.rank}</td>` +
        `<td><span class="state state-${cls} verdict">${esc(verdict)}</span></td><td class="rule">${esc(n.rule) || "—"}</td>` +
        `<td class="num">${fmt(r.gpu_temp_c, 0)}</td><td class="num">${fmt(r.gpu_util_pct, 0)}</td><td class="num">${fmt(r.gpu_power_w, 0)}</td>` +
        `<td class="small muted">${voltWhen(n.checked_at, "time") || "—"}</td></tr>`;
    }).join("");
  }

  function setStatus(status) {
    const badge = $("cluster-status");
    if (!status) return;
    if ($("probe-form")) $("probe-form").hidden = !(status === "ready" || status === "degraded");
    if (!badge) return;
    badge.className = "state state-" + status;
    badge.textContent = status.charAt(0).toUpperCase() + status.slice(1);
  }

  // A status change alters the server-rendered parts (connection details, probe table, errors): fetch the
  // page and swap them in, keeping this live section (and its charts) as it is. No reload.
  function refreshStatic() {
    fetch(location.href, {headers: {"X-Requested-With": "fetch"}}).then((r) => r.text()).then((html) => {
      const fresh = new DOMParser().parseFromString(html, "text/html").querySelector("main.page");
      const main = document.querySelector("main.page");
      if (!fresh || !main) return;
      const parts = Array.from(fresh.children).filter((el) => el.tagName !== "SCRIPT")
        .map((el) => (el.id === "cluster-live" ? root : document.adoptNode(el)));
      main.replaceChildren(...parts);
      if (window.drawGoodput) drawGoodput(0);  // the goodput section came in fresh, chart not drawn (volt.js)
    });
  }

  function addTimeline(at, from, to, message) {
    const list = $("cluster-timeline");
    if (!list) return;
    const li = document.createElement("li");
    // A note records the status it was made in (from = to): no arrow for a change that is none.
    const change = to && to !== from ? `<strong>${esc(from || "new")} → ${esc(to)}</strong> ` : "";
    li.innerHTML = `<time>${esc(voltWhen(at))}</time> ${change}${esc(message)}`;
    list.appendChild(li);
  }

  function setAlert(text) {
    $("bandwidth-alert").hidden = !text;
    $("bandwidth-alert-text").textContent = text || "";
  }

  // Recovery (clusters/recovery.py): the phase now and how long the recovery has run, ticking while open.
  function drawRecovery(r) {
    const box = $("recovery-live");
    if (!box) return;
    const before = state.recovery;
    state.recovery = r;
    // A recovery that ends after the status change (its record closes last): the Recoveries table is the
    // page's, fetched again, or it kept "active" and dashes until a reload (issue 24's walk).
    const wasOpen = before && (before.status === "active" || before.status === "waiting");
    if (wasOpen && r && r.status !== before.status && r.status !== "active" && r.status !== "waiting") refreshStatic();
    if (!r) { box.hidden = true; return; }
    box.hidden = false;
    const open = r.status === "active" || r.status === "waiting";
    const end = r.ended_at ? new Date(r.ended_at) : new Date();
    const secs = Math.max(0, (end - new Date(r.detected_at)) / 1000);
    const failed = (r.failed_hosts || []).map((h) => h.name).join(", ") || "—";
    const repl = (r.replacement_hosts || []).map((h) => h.name).join(", ") || "—";
    box.className = "card " + (open ? "warn-box" : "");
    $("recovery-phase").textContent = r.phase.replace(/_/g, " ");
    $("recovery-status").textContent = r.status;
    $("recovery-elapsed").textContent = secs.toFixed(0) + " s" + (open ? " so far" : "");
    $("recovery-failed").textContent = failed + (r.head_lost ? " (head)" : "");
    $("recovery-replacement").textContent = repl;
    $("recovery-why").textContent = r.waiting_reason || r.replacement_reason || r.message || "";
  }
  setInterval(() => { const r = state.recovery; if (r && (r.status === "active" || r.status === "waiting")) drawRecovery(r); }, 1000);

  function snapshot(s) {
    state.predicted = s.predicted_busbw_gbps;
    state.live = s.live !== false;
    const badge = $("cluster-status");
    // The page was rendered before the socket connected: a change in between is caught up here.
    if (badge && !badge.classList.contains("state-" + s.status)) refreshStatic();
    setStatus(s.status);
    setAlert(s.bandwidth_alert);
    drawBandwidth(s.bandwidth || []);
    drawGpu(s.gpu || {});
    drawHealth(s.nodes || []);
    drawRecovery(s.recovery || null);
    const list = $("cluster-timeline");
    if (list) { list.innerHTML = ""; (s.timeline || []).forEach((e) => addTimeline(e.at, e.from || "new", e.status, e.message)); }
  }

  const handlers = {
    snapshot,
    status: (e) => { setStatus(e.status); refreshStatic(); },
    queue: () => refreshStatic(),  // a queued cluster's start bound or reason moved
    timeline: (e) => addTimeline(e.at, e.status, e.status, e.message),
    health: (e) => { drawHealth(e.nodes); addGpu(e.ts, e.nodes); },
    bandwidth: (e) => { if (e.predicted_busbw_gbps) state.predicted = e.predicted_busbw_gbps; addBandwidth(e.ts, e.busbw_gbps, e.source); },
    job: (e) => updateJob(e.job),
    recovery: (e) => drawRecovery(e.recovery),
    probe: (e) => { if (!$("probe-state")) return; $("probe-state").textContent = e.state === "running" ? "probe running…" : (e.message || ""); if ("alert" in e) setAlert(e.alert); },
  };

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + root.dataset.ws);
    state.socket = socket;
    socket.onopen = () => { state.retry = 0; $("live-connection").textContent = "live"; };
    socket.onmessage = (m) => { const e = JSON.parse(m.data); (handlers[e.kind] || (() => {}))(e); };
    socket.onclose = (e) => {
      if (e.code === 4404) { $("live-connection").textContent = "not allowed"; return; }
      const delay = Math.min(30000, 500 * 2 ** state.retry++) * (0.5 + Math.random() / 2);
      $("live-connection").textContent = "reconnecting…";
      setTimeout(connect, delay);
    };
  }

  const form = $("probe-form");
  if (form) {
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      $("probe-state").textContent = "probe requested…";
      fetch(root.dataset.probeUrl, {method: "POST", body: new FormData(form), headers: {"X-Requested-With": "fetch"}})
        .then((r) => { if (!r.ok) $("probe-state").textContent = "probe refused (" + r.status + ")"; });
    });
  }
  window.voltClusterLive = state;
  connect();
})();
