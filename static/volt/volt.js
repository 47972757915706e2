// Console behaviour that must not be inline (Content-Security-Policy: scripts need a nonce or this origin).
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
