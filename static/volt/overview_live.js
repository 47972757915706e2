// The health overview, live: one websocket (ws/overview/) that sends the whole view on connect and again
// after every change (cluster status, node verdict, host state). Reconnects with backoff; no polling.
(function () {
  "use strict";
  const root = document.getElementById("overview-live");
  if (!root) return;
  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s == null ? "" : s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  let retry = 0;

  function render(view) {
    const c = view.counts || {};
    const set = (id, v) => { const el = $(id); if (el) el.textContent = String(v == null ? 0 : v); };
    set("count-clusters-healthy", c.clusters_healthy);
    set("count-clusters-degraded", c.clusters_degraded);
    set("count-clusters-starting", c.clusters_starting);
    set("count-nodes-failed", c.nodes_failed);
    set("count-nodes-warning", c.nodes_warning);
    set("count-hosts-healthy", c.hosts_healthy);
    set("count-hosts-unhealthy", c.hosts_unhealthy);
    const degraded = $("count-clusters-degraded");
    if (degraded) degraded.className = c.clusters_degraded ? "state state-failed" : "";
    const table = $("host-health");
    if (!table) return;
    table.querySelector("tbody").innerHTML = (view.hosts || []).map((h) =>
      `<tr data-host="${esc(h.host)}"><td><a href="/inventory/hosts/${h.host_id}/">${esc(h.host)}</a></td><td>${esc(h.provider)}</td>` +
      `<td><span class="state state-${esc(h.state)}">${esc(h.state)}</span></td><td class="num">${h.clusters}</td>` +
      `<td class="verdict">${esc(h.verdict || "not watched")}</td><td class="rule">${esc(h.rule) || "—"}</td>` +
      `<td class="num temp">${h.gpu_temp_c == null ? "—" : esc(h.gpu_temp_c)}</td>` +
      `<td class="small muted">${voltWhen(h.checked_at, "time") || "—"}</td></tr>`).join("");
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + root.dataset.ws);
    socket.onopen = () => { retry = 0; $("overview-connection").textContent = "live"; };
    socket.onmessage = (m) => { const e = JSON.parse(m.data); if (e.kind === "overview") render(e); };
    socket.onclose = (e) => {
      if (e.code === 4404) { $("overview-connection").textContent = "not allowed"; return; }
      $("overview-connection").textContent = "reconnecting…";
      setTimeout(connect, Math.min(30000, 500 * 2 ** retry++) * (0.5 + Math.random() / 2));
    };
  }
  connect();
})();
