// Console behaviour that must not be inline (Content-Security-Policy: scripts need a nonce or this origin).
// <button data-confirm="Question?"> asks before its form is submitted.
document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-confirm]");
  if (button && !window.confirm(button.dataset.confirm)) {
    event.preventDefault();
  }
});
