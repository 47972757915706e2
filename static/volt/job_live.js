// A job's page, live: its log, status and checkpoints arrive through the cluster's websocket (events
// `job`, `job_log`, `job_checkpoints` of this job). The log is shown as people read it: every piece comes
// from the API's readable text (`readable=1`: colour codes stripped, VOLT_EVENT lines as steps, losses
// and checkpoints; rendered on the server, jobs/logtext.py), fetched whenever an event says the stored log
// grew past where the page is. A long log opens at its end (from the first whole line of the last
// data-log-tail characters); "Show earlier lines" prepends the page before what is shown, and the whole
// (raw) log downloads as a file. Offsets are the stored text's, as the API answers them: the page never
// counts characters of what it shows.
(function () {
  "use strict";
  const root = document.getElementById("job-live");
  if (!root) return;
  const jobId = Number(root.dataset.job);
  const $ = (id) => document.getElementById(id);
  const tail = Number(root.dataset.logTail) || 262144;
  const start = Math.max(0, (Number(root.dataset.logSize) || 0) - tail);
  // offset: where the next text goes on; first: the offset of the first line shown (null: none yet).
  const state = {offset: start, first: null, fetching: false, again: false, retry: 0, status: null, lines: 0};
  const esc = (s) => String(s == null ? "" : s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  // Sizes as the server's pages print them (Django's filesizeformat, a no-break space): "512 bytes", "4.6 MB".
  const size = (n) => {
    if (n < 1024) return n + (n === 1 ? "\u00a0byte" : "\u00a0bytes");
    const units = ["KB", "MB", "GB", "TB"];
    let value = n / 1024, unit = 0;
    while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit++; }
    return value.toFixed(1) + "\u00a0" + units[unit];
  };
  const ENDED = ["succeeded", "failed", "stopped"];
  const readable = (offset, limit) => root.dataset.logs + "?readable=1&offset=" + offset + (limit ? "&limit=" + limit : "");

  function append(text) {
    const log = $("job-log");
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 20;
    log.appendChild(document.createTextNode(text));
    state.lines += (text.match(/\n/g) || []).length;
    log.dataset.lines = String(state.lines);
    if (atBottom) log.scrollTop = log.scrollHeight;
  }

  function showEarlierBar() {
    const bar = $("job-log-earlier");
    if (!bar) return;
    bar.hidden = !(state.first > 0);
    $("job-log-hidden").textContent = size(state.first);
  }

  function earlier() {
    if (!(state.first > 0) || state.loadingEarlier) return;
    state.loadingEarlier = true;
    const from = Math.max(0, state.first - tail);
    fetch(readable(from, state.first - from), {headers: {Accept: "application/json"}})
      .then((r) => r.json()).then((page) => {
        state.loadingEarlier = false;
        if (!page.text || page.offset >= state.first) return;
        const log = $("job-log");
        const below = log.scrollHeight - log.scrollTop;  // keep what the reader looks at in place
        log.insertBefore(document.createTextNode(page.text), log.firstChild);
        state.lines += (page.text.match(/\n/g) || []).length;
        log.dataset.lines = String(state.lines);
        log.scrollTop = log.scrollHeight - below;
        state.first = page.offset;
        showEarlierBar();
      }).catch(() => { state.loadingEarlier = false; });
  }
  const more = $("job-log-more");
  if (more) more.addEventListener("click", earlier);

  // One fetch at a time; what arrives meanwhile is fetched right after (never appended twice). The first
  // answer may start later than asked (at a whole line): what is shown starts there.
  function catchUp() {
    if (state.fetching) { state.again = true; return; }
    state.fetching = true;
    state.again = false;
    const asked = state.offset;
    fetch(readable(asked), {headers: {Accept: "application/json"}})
      .then((r) => r.json()).then((page) => {
        state.fetching = false;
        if (page.text) {
          if (state.first === null) { state.first = page.offset; showEarlierBar(); }
          append(page.text);
        }
        state.offset = page.next_offset;
        // Go on while the answer moved and more is stored (a line still being written waits for an event).
        if (state.again || (page.next_offset > asked && page.next_offset < page.size)) catchUp();
      }).catch(() => { state.fetching = false; });
  }

  function setStatus(job) {
    const badge = $("job-status");
    badge.className = "state state-" + job.status;
    badge.textContent = job.status.charAt(0).toUpperCase() + job.status.slice(1);
    if (job.last_step != null) $("job-step").textContent = job.last_step;
    if (job.first_step_at) $("job-first-step").textContent = voltWhen(job.first_step_at, "time");
    const reason = $("job-reason");
    if (job.status_reason && job.status !== "succeeded") { reason.hidden = false; reason.textContent = job.status_reason; }
    const stop = $("stop-form");
    if (stop && !["pending", "running", "interrupted"].includes(job.status)) stop.hidden = true;
    if (job.ray_submission_id) $("job-submission").textContent = job.ray_submission_id;
    const shown = state.status || root.dataset.status;
    if (shown && shown !== job.status) {
      catchUp();
      const li = document.createElement("li");
      li.innerHTML = `<time>${esc(voltWhen(new Date()))}</time> <strong>${esc(shown)} → ${esc(job.status)}</strong> ${esc(job.status_reason)}`;
      $("job-timeline").appendChild(li);
    }
    state.status = job.status;
    connection();
  }

  // "live" while the job may still change; once it ended, the page says so (it still listens: recovery
  // may resume a failed job of a live cluster).
  function connection() {
    if (!state.connected) return;
    const ended = ENDED.includes(state.status || root.dataset.status);
    $("job-connection").textContent = ended ? "connected; the job has ended" : "live";
  }

  function drawCheckpoints(rows) {
    const body = $("checkpoints-table").querySelector("tbody");
    if (!rows.length) return;
    body.innerHTML = rows.map((c) => `<tr><td class="num">${c.step}</td><td>${c.synchronized ? '<span class="state state-ready">yes</span>' : '<span class="state state-failed">no</span>'}</td>` +
      `<td>${esc(c.reason) || "—"}</td><td class="num">${size(c.size_bytes)}</td>` +
      `<td>${voltWhen(c.created, "time") || "—"}</td><td class="mono small">${esc(c.location || c.path)}` +
      (c.download ? ` <a class="download" href="${esc(c.download)}">download</a>` : "") + "</td></tr>").join("");
    body.dataset.synchronized = String(rows.filter((c) => c.synchronized).length);
  }

  const handlers = {
    snapshot: () => catchUp(),
    job: (e) => { if (e.job && e.job.id === jobId) setStatus(e.job); },
    // The event's own text is the stored (raw) text: the page fetches the readable text from the API.
    job_log: (e) => { if (e.job === jobId && e.next_offset > state.offset) catchUp(); },
    job_checkpoints: (e) => { if (e.job === jobId) drawCheckpoints(e.checkpoints || []); },
  };

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + root.dataset.ws);
    socket.onopen = () => { state.retry = 0; state.connected = true; connection(); };
    socket.onmessage = (m) => { const e = JSON.parse(m.data); (handlers[e.kind] || (() => {}))(e); };
    socket.onclose = (e) => {
      if (e.code === 4404) { $("job-connection").textContent = "not allowed"; return; }
      state.connected = false;
      const delay = Math.min(30000, 500 * 2 ** state.retry++) * (0.5 + Math.random() / 2);
      $("job-connection").textContent = "reconnecting…";
      setTimeout(connect, delay);
    };
  }
  window.voltJobLive = state;
  connect();
})();
