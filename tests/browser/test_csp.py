"""Issue 9 point 15: the console works under its Content-Security-Policy — Plotly draws, htmx swaps, the
host page's websocket and the confirm dialogs run — and the browser reports no violation."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser

RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`);
});
"""


def violations(page) -> list[str]:
    return page.evaluate("window.__cspViolations || []")


def test_console_pages_run_under_the_content_security_policy(page, login):
    page.add_init_script(RECORD_VIOLATIONS)
    console_errors = []
    page.on("console", lambda msg: console_errors.append(msg.text) if msg.type == "error" else None)
    login("alice")
    response = page.goto("/inventory/")
    assert "nonce-" in response.headers["content-security-policy"]
    expect(page.locator("#offers-chart .main-svg").first).to_be_attached()  # Plotly drew the chart
    assert violations(page) == []

    page.goto("/clusters/new/")
    expect(page.locator("#preview-busbw")).not_to_be_empty(timeout=15_000)  # htmx loaded the preview
    assert violations(page) == []

    page.get_by_role("button", name="Sign out").click()
    login("priya")
    page.goto("/inventory/hosts/")
    page.locator("#hosts-table tbody tr td:first-child a").first.click()
    expect(page.locator("#host-status")).to_be_visible()
    page.wait_for_timeout(1000)  # the inline (nonce) script opens the websocket
    dialogs = []
    page.once("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    retire = page.get_by_role("button", name="Retire")
    if retire.count():
        retire.click()  # dismissed: data-confirm (static/volt/volt.js) asked, nothing retired
        assert dialogs and "Retire" in dialogs[0]
        expect(page.locator("#host-status")).to_be_visible()
    assert violations(page) == []
    assert not [e for e in console_errors if "Content Security Policy" in e], console_errors
