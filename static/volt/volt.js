// Console behaviour that must not be inline (Content-Security-Policy: scripts need a nonce or this origin).
// Loaded in <head> without defer: the live pages' scripts (end of <body>) use voltWhen.

// The one way a page writes a moment, as the server's `when` filter does (voltweb/templatetags/when.py):
// voltWhen(iso) → "2025-06-01 14:30:15 UTC", voltWhen(iso, "time") → "14:30:15 UTC"; 24-hour, in UTC (Volt's
// TIME_ZONE), never the browser's locale ("2:28:34 PM"). Nothing for a missing or unreadable value.
function voltWhen(value, part) {
  const moment = value == null || value === "" ? null : new Date(value);
  if (!moment || Number.isNaN(moment.getTime())) return "";
  const iso = moment.toISOString();
  const time = iso.slice(11, 19) + " UTC";
  return part === "time" ? time : iso.slice(0, 10) + " " + time;
}
window.voltWhen = voltWhen;
// <button data-confirm="Question?"> asks before its form is submitted.
document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-confirm]");
  if (button && !window.confirm(button.dataset.confirm)) {
    event.preventDefault();
  }
});

// A page still changing state carries <span hidden data-refresh-after-ms="N">: reload it after N ms.
// Static, not an inline script: a page that htmx swaps in (hx-target="body") brings a nonce the
// current page's Content-Security-Policy does not know, so its inline scripts would be blocked.
function scheduleRefresh() {
  const marker = document.querySelector("[data-refresh-after-ms]");
  if (marker && !window.voltRefreshTimer) {
    window.voltRefreshTimer = setTimeout(() => location.reload(), Number(marker.dataset.refreshAfterMs));
  }
}
document.addEventListener("DOMContentLoaded", scheduleRefresh);
document.addEventListener("htmx:afterSettle", scheduleRefresh);

// <fieldset data-shown-when="kind=custom"> is shown only while its form's `kind` choice is "custom"; hidden,
// it is disabled too, so what it holds (an upload) is not sent for a choice that ignores it. Without
// JavaScript every fieldset shows and the server ignores what the chosen kind does not use.
function showChosenFieldsets(form) {
  for (const fieldset of form.querySelectorAll("[data-shown-when]")) {
    const [name, value] = fieldset.dataset.shownWhen.split("=");
    const chosen = form.querySelector(`[name="${name}"]:checked`);
    const shown = !chosen || chosen.value === value;
    fieldset.hidden = !shown;
    fieldset.disabled = !shown;
  }
}
document.addEventListener("DOMContentLoaded", () => {
  for (const form of document.querySelectorAll("form")) {
    if (form.querySelector("[data-shown-when]")) showChosenFieldsets(form);
  }
});
document.addEventListener("change", (event) => {
  const form = event.target.form;
  if (form && form.querySelector("[data-shown-when]")) showChosenFieldsets(form);
});

// Goodput charts (jobs/templatetags/goodput.py): every element with data-goodput="<json_script id>" gets
// its Plotly chart, here for the reason above (a swapped-in page's inline script would not run). After a
// swap Plotly's own script may still be loading: look again for a few seconds.
function drawGoodput(tries) {
  const pending = Array.from(document.querySelectorAll("[data-goodput]")).filter((el) => !el.dataset.drawn);
  if (!pending.length) return;
  if (!window.Plotly) {
    if (tries < 50) setTimeout(() => drawGoodput(tries + 1), 100);
    return;
  }
  pending.forEach((el) => {
    const spec = JSON.parse(document.getElementById(el.dataset.goodput).textContent);
    Plotly.newPlot(el, spec.data, spec.layout, {displayModeBar: false, responsive: true});
    el.dataset.drawn = "1";
  });
}
document.addEventListener("DOMContentLoaded", () => drawGoodput(0));
document.addEventListener("htmx:afterSettle", () => drawGoodput(0));
