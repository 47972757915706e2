"""A READY cluster's page in Chromium, live: a sweep fills the health table and a fault turns a node failed,
a probe from the console adds a point to the bandwidth chart and raises the alert — all without a reload.
Where the stack's local links are emulated (root: CI), a first probe matches the prediction and shows no
alert; then `link_degraded:25` is injected on the worker's host through the faults API, as an operator
would, and the next probe raises the alert. Without the emulation (no root) the fault cannot act, and
the alert comes from the demo fabric's prediction, which plain loopback cannot reach.

The cluster is real (Ray on two demo local hosts, provisioned by the stack's worker). Sweeps are sent to
the worker as beat would send them. Runs after test_console_clusters.py and terminates its cluster.
"""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from tests.browser.live_api import (
    admin_token,
    alice_token,
    cluster_status,
    faults,
    request_cluster,
    sweep,
    terminate,
    worker_host_id,
    worker_node_sandbox,
)

pytestmark = pytest.mark.browser
READY_TIMEOUT_S = 600  # provisioning on a loaded shared 2-core box (the probe included)


def test_cluster_page_updates_live_from_sweeps_and_an_on_demand_probe(login, screenshot, live_stack, orm):
    from inventory.drivers.local import clear_fault, set_fault

    cluster_id = request_cluster(live_stack, orm(alice_token))
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while (status := orm(cluster_status, cluster_id))[0] not in ("ready", "failed"):
            assert time.monotonic() < deadline, f"cluster still {status[0]} after {READY_TIMEOUT_S} s"
            time.sleep(2)
        assert status[0] == "ready", status[1]

        page = login("alice")
        page.goto(f"/clusters/{cluster_id}/")
        expect(page.locator("#live-connection")).to_have_text("live", timeout=15_000)
        # The Ray token (64 hex characters) wraps inside its own cell of the "Ready - connect" card at
        # desktop width (it once ran past the cell and the card: wrapping was set for phones only).
        spill = page.evaluate(
            """() => { const token = document.querySelector('#cluster-ray-token');
                       return token.getBoundingClientRect().right - token.parentElement.getBoundingClientRect().right; }"""
        )
        assert spill <= 0.5, f"the Ray token runs {spill:.0f} px past its cell"
        page.evaluate("window.__notReloaded = true")
        expect(page.locator("#busbw-chart")).to_have_attribute("data-points", "1")  # verification's probe

        sweep(live_stack, cluster_id)
        expect(page.locator("#health-table .verdict")).to_have_text(["ok", "ok"], timeout=30_000)

        admin, worker_host = orm(admin_token), orm(worker_host_id, cluster_id)
        emulated = faults(live_stack, admin, worker_host, "GET")["links_emulated"]
        probe_button = page.get_by_role("button", name="Probe bandwidth now")
        probe_button.click()
        expect(page.locator("#probe-state")).to_contain_text("probe", timeout=10_000)
        expect(page.locator("#busbw-chart")).to_have_attribute("data-points", "2", timeout=240_000)
        if emulated:
            # The drill: emulated links run at the prediction (no alert), until link_degraded takes the
            # worker's to a quarter; the next probe from the console sees it and the alert appears.
            expect(page.locator("#probe-state")).to_contain_text("max busbw", timeout=30_000)
            expect(page.locator("#bandwidth-alert")).to_be_hidden()
            faults(live_stack, admin, worker_host, "POST", {"fault": "link_degraded", "value": "25"})
            try:
                probe_button.click()
                expect(page.locator("#busbw-chart")).to_have_attribute("data-points", "3", timeout=240_000)
            finally:
                faults(live_stack, admin, worker_host, "DELETE", {"fault": "link_degraded"})
        # Below half the prediction (link_degraded:25, or plain loopback against InfiniBand): the alert.
        expect(page.locator("#bandwidth-alert")).to_be_visible(timeout=10_000)
        expect(page.locator("#bandwidth-alert")).to_contain_text("of the predicted")
        screenshot(page, "cluster-live-probed")

        folder, host_name = orm(worker_node_sandbox, cluster_id)
        sandbox = live_stack.data_dir / "hosts" / folder
        set_fault(sandbox, "ecc_uncorrectable", "0")
        try:
            sweep(live_stack, cluster_id)
            row = page.locator(f'#health-table tr[data-host="{host_name}"]')
            expect(row.locator(".verdict")).to_have_text("failed", timeout=30_000)
            expect(row.locator(".rule")).to_contain_text("uncorrectable ECC")
            expect(page.locator("#cluster-status")).to_have_text("Degraded", timeout=15_000)
            expect(page.locator("#cluster-timeline")).to_contain_text(f"{host_name} failed")
        finally:
            clear_fault(sandbox, "ecc_uncorrectable")
        assert page.evaluate("window.__notReloaded === true")
        screenshot(page, "cluster-live-degraded")
    finally:
        orm(terminate, cluster_id)
