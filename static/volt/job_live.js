// A job's page, live: its log, status and checkpoints arrive through the cluster's websocket (events
// `job`, `job_log`, `job_checkpoints` of this job). The log starts from the API and catches up from it
// whenever an event does not continue exactly where the page is (reconnects, long lines, a slow client).
// A long log opens at its end (the last data-log-tail characters, from its first whole line there);
// "Show earlier lines" prepends the page before what is shown, and the whole log downloads as a file.
// Offsets are the server's characters (code points): JS string lengths count UTF-16 units, so the
// page counts with Array.from where it must turn text into an offset.
(function () {
  "use strict";
  const root = document.getElementById("job-live");
  if (!root) return;
  const jobId = Number(root.dataset.job);
  const $ = (id) => document.getElementById(id);
  const tail = Number(root.dataset.logTail) || 262144;
  const start = Math.max(0, (Number(root.dataset.logSize) || 0) - tail);
  // offset: where the next text goes on; first: the offset of the first character shown (null: none yet).
  const state = {offset: start, first: null, fetching: false, again: false, retry: 0, status: null, lines: 0};
  const chars = (text) => Array.from(text).length;
  const esc = (s) => String(s == null ? "" : s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));

  function append(text) {
    const log = $("job-log");
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 20;
    log.appendChild(document.createTextNode(text));
    state.lines += (text.match(/\n/g) || []).length;
    log.dataset.lines = String(state.lines);
    if (atBottom) log.scrollTop = log.scrollHeight;
  }

  // Text that starts at `offset` > 0 may start inside a line: from the first whole line on.
  function fromWholeLine(text, offset) {
    if (offset === 0) return {text, offset};
    const cut = text.indexOf("\n");
    if (cut < 0) return {text: "", offset: offset + chars(text)};
    return {text: text.slice(cut + 1), offset: offset + chars(text.slice(0, cut + 1))};
  }

  function showEarlierBar() {
    const bar = $("job-log-earlier");
    if (!bar) return;
    bar.hidden = !(state.first > 0);
    const mb = state.first / 1048576;
    $("job-log-hidden").textContent = mb >= 1 ? mb.toFixed(1) + " MB" : Math.ceil(state.first / 1024) + " KB";
  }

  function earlier() {
    if (!(state.first > 0) || state.loadingEarlier) return;
    state.loadingEarlier = true;
    const from = Math.max(0, state.first - tail);
    fetch(root.dataset.logs + "?offset=" + from + "&limit=" + (state.first - from), {headers: {Accept: "application/json"}})
      .then((r) => r.json()).then((page) => {
        state.loadingEarlier = false;
        let whole = fromWholeLine(page.text || "", page.offset);
        if (!whole.text) whole = {text: page.text || "", offset: page.offset};  // one line longer than a page
        const log = $("job-log");
        const below = log.scrollHeight - log.scrollTop;  // keep what the reader looks at in place
        log.insertBefore(document.createTextNode(whole.text), log.firstChild);
        state.lines += (whole.text.match(/\n/g) || []).length;
        log.dataset.lines = String(state.lines);
        log.scrollTop = log.scrollHeight - below;
        state.first = whole.offset;
        showEarlierBar();
      }).catch(() => { state.loadingEarlier = false; });
  }
  const more = $("job-log-more");
  if (more) more.addEventListener("click", earlier);

  // One fetch at a time; what arrives meanwhile is fetched right after (never appended twice).
  function catchUp() {
    if (state.fetching) { state.again = true; return; }
    state.fetching = true;
    state.again = false;
    fetch(root.dataset.logs + "?offset=" + state.offset, {headers: {Accept: "application/json"}})
      .then((r) => r.json()).then((page) => {
        state.fetching = false;
        let text = page.text || "", at = page.offset;
        if (state.first === null && text) {  // the first text shown: from a whole line on
          ({text, offset: at} = fromWholeLine(text, at));
          state.first = state.offset = at;
          showEarlierBar();
        }
        const skip = state.offset - at;
        if (text && skip < chars(text)) { append(Array.from(text).slice(Math.max(0, skip)).join("")); state.offset = page.next_offset; }
        if (state.again || page.next_offset < page.size) catchUp();
      }).catch(() => { state.fetching = false; });
  }

  function setStatus(job) {
    const badge = $("job-status");
    badge.className = "state state-" + job.status;
    badge.textContent = job.status.charAt(0).toUpperCase() + job.status.slice(1);
    if (job.last_step != null) $("job-step").textContent = job.last_step;
    if (job.first_step_at) $("job-first-step").textContent = new Date(job.first_step_at).toLocaleTimeString();
    const reason = $("job-reason");
    if (job.status_reason && job.status !== "succeeded") { reason.hidden = false; reason.textContent = job.status_reason; }
    const stop = $("stop-form");
    if (stop && !["pending", "running", "interrupted"].includes(job.status)) stop.hidden = true;
    if (job.ray_submission_id) $("job-submission").textContent = job.ray_submission_id;
    const shown = state.status || root.dataset.status;
    if (shown && shown !== job.status) {
      catchUp();
      const li = document.createElement("li");
      li.innerHTML = `<time>${esc(new Date().toISOString().replace("T", " ").slice(0, 19))}</time> <strong>${esc(shown)} → ${esc(job.status)}</strong> ${esc(job.status_reason)}`;
      $("job-timeline").appendChild(li);
    }
    state.status = job.status;
  }

  function drawCheckpoints(rows) {
    const body = $("checkpoints-table").querySelector("tbody");
    if (!rows.length) return;
    body.innerHTML = rows.map((c) => `<tr><td class="num">${c.step}</td><td>${c.synchronized ? '<span class="state state-ready">yes</span>' : '<span class="state state-failed">no</span>'}</td>` +
      `<td>${esc(c.reason) || "—"}</td><td class="num">${(c.size_bytes / 1024).toFixed(1)} KB</td>` +
      `<td>${c.created ? new Date(c.created).toLocaleTimeString() : "—"}</td><td class="mono small">${esc(c.path)}</td></tr>`).join("");
    body.dataset.synchronized = String(rows.filter((c) => c.synchronized).length);
  }

  const handlers = {
    snapshot: () => catchUp(),
    job: (e) => { if (e.job && e.job.id === jobId) setStatus(e.job); },
    job_log: (e) => {
      if (e.job !== jobId) return;
      if (state.first === null) { catchUp(); return; }  // the first text comes from the API (whole lines)
      if (state.fetching) { if (e.next_offset > state.offset) state.again = true; return; }
      if (e.offset === state.offset && !e.truncated) { append(e.text); state.offset = e.next_offset; }
      else if (e.next_offset > state.offset) catchUp();
    },
    job_checkpoints: (e) => { if (e.job === jobId) drawCheckpoints(e.checkpoints || []); },
  };

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + root.dataset.ws);
    socket.onopen = () => { state.retry = 0; $("job-connection").textContent = "live"; };
    socket.onmessage = (m) => { const e = JSON.parse(m.data); (handlers[e.kind] || (() => {}))(e); };
    socket.onclose = (e) => {
      if (e.code === 4404) { $("job-connection").textContent = "not allowed"; return; }
      const delay = Math.min(30000, 500 * 2 ** state.retry++) * (0.5 + Math.random() / 2);
      $("job-connection").textContent = "reconnecting…";
      setTimeout(connect, delay);
    };
  }
  window.voltJobLive = state;
  connect();
})();
