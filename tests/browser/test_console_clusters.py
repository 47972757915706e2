"""A researcher requests a cluster in Chromium: live placement preview, request, placement, terminate.

Runs after test_console.py (file order) and frees every GPU it takes, so the shared demo inventory
is as the other browser tests expect.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser


def test_researcher_previews_requests_and_terminates_a_cluster(login, screenshot):
    page = login("alice")
    page.locator(".mainnav").get_by_role("link", name="Clusters", exact=True).click()
    expect(page.locator(".empty, #clusters-table")).to_be_visible()
    page.get_by_role("link", name="Request a cluster").first.click()

    # The preview loads with the form: 2 x 8 H100, InfiniBand preferred -> one iad1 block at NDR speed.
    page.select_option("#id_interconnect", value="infiniband")
    # NDR's 400 GB/s, or the same at the emulated fabric's scale where local links are shaped (root).
    expect(page.locator("#preview-busbw")).to_have_text(re.compile(r"^(400\.0|0\.1) GB/s$"), timeout=15_000)
    expect(page.locator("#preview .topo-site")).to_contain_text("iad1")
    screenshot(page, "cluster-preview")

    # Asking for more nodes than exist says what to change, live.
    page.fill("#id_nodes", "9")
    page.locator("#id_nodes").dispatch_event("change")
    expect(page.locator("#preview .error-box")).to_contain_text("only 5 hosts in the whole inventory")

    # A price cap below every H100 explains the refusal instead of failing.
    page.fill("#id_nodes", "2")
    page.fill("#id_max_price_per_gpu_hour", "1.00")
    page.locator("#id_max_price_per_gpu_hour").dispatch_event("change")
    expect(page.locator("#preview-refusal")).to_contain_text("the cheapest asks $2.")

    page.fill("#id_max_price_per_gpu_hour", "")
    page.fill("#id_name", "browser-run")
    page.get_by_role("button", name="Request cluster").click()

    expect(page.locator("h1")).to_contain_text("browser-run")
    expect(page.locator("#cluster-status")).to_have_text("Provisioning", timeout=30_000)
    expect(page.locator(".topology .topo-node")).to_have_count(2)
    expect(page.locator("#cluster-timeline")).to_contain_text("placing → provisioning")
    # The goodput bar is drawn on a page the request form swapped in (an inline script would not run).
    expect(page.locator("#cluster-goodput-chart .main-svg").first).to_be_visible(timeout=10_000)
    screenshot(page, "cluster-placed")

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Terminate").click()
    expect(page.locator("#cluster-status")).to_have_text("Terminated", timeout=30_000)
    # The timeline keeps what happened (a flash message may already be gone if the page refreshed).
    expect(page.locator("#cluster-timeline")).to_contain_text("Ray processes stopped and GPUs released")
    # ... and again after the live page swapped its server-rendered parts in for the new status.
    expect(page.locator("#cluster-goodput-chart .main-svg").first).to_be_visible(timeout=10_000)
