"""Issue 23's drill in Chromium on the demo-style stack: a cross-block cluster (the four iad1 H100 hosts: three
in block r01, one in r02) runs the demo job; `link_degraded:25` on the r02 host, then "Probe bandwidth now".
The page must then give one answer: the headline figure is the size table's best busbw and the API's
`measured_busbw_gbps`, the alert names the host the per-host tests blame, and that host's node health
warns of its link. Needs the emulated fabric (root: CI), like the integration tests of the fabric.

Runs after test_cluster_live.py (file order) and terminates its cluster and the job on it.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request

import pytest
from playwright.sync_api import expect

from tests.browser.live_api import (
    JobPoller,
    admin_token,
    alice_token,
    cluster_status,
    faults,
    sweep,
    terminate,
)
from tests.browser.test_cluster_live import READY_TIMEOUT_S

pytestmark = pytest.mark.browser
DEGRADED_HOST = "iad1-h100-04"  # demo block r02: every link of it crosses the fabric's spine


def _post(stack, token: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        f"{stack.url}{path}", json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def _cluster_row(cluster_id: int) -> dict:
    from clusters.models import Cluster

    cluster = Cluster.objects.get(pk=cluster_id)
    return {
        "measured": cluster.measured_busbw_gbps,
        "table": [r["busbw_gbps"] for r in (cluster.probe_result or {}).get("results", [])],
        "level": (cluster.plan or {}).get("spanned_level"),
        "flagged": cluster.bandwidth_flagged,
    }


def _host_id(name: str) -> int:
    from inventory.models import Host

    return Host.objects.get(name=name).pk


def _job_status(job_id: int) -> str:
    from jobs.models import Job

    return Job.objects.get(pk=job_id).status


def _emulation_reason() -> str | None:
    from inventory import services as inventory

    return inventory.unavailable_reason()


def test_a_link_drill_on_a_cross_block_cluster_gives_one_figure_the_alert_and_the_blamed_host(
    login, screenshot, live_stack, orm
):
    reason = orm(_emulation_reason)
    assert reason is None, f"this drill needs emulated links: {reason}"
    token = orm(alice_token)
    body = {"name": "drill", "nodes": 4, "gpus_per_node": 1, "gpu_models": ["H100"], "team": "demo-lab"}
    cluster_id = _post(live_stack, token, "/api/v1/clusters/", body)["id"]
    admin, degraded = orm(admin_token), orm(_host_id, DEGRADED_HOST)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while (status := orm(cluster_status, cluster_id))[0] not in ("ready", "failed"):
            assert time.monotonic() < deadline, f"cluster still {status[0]} after {READY_TIMEOUT_S} s"
            time.sleep(2)
        assert status[0] == "ready", status[1]
        before = orm(_cluster_row, cluster_id)
        assert before["level"] == "fabric" and not before["flagged"], before

        with JobPoller(live_stack):  # the stack has no beat: the job's polls, as beat sends them
            job = _post(live_stack, token, "/api/v1/jobs/", {"cluster": cluster_id, "demo": True, "steps": 400,
                                                             "checkpoint_every": 50, "step_sleep": 0.2})  # fmt: skip
            deadline = time.monotonic() + 180
            while orm(_job_status, job["id"]) == "pending":
                assert time.monotonic() < deadline, "the demo job did not start within 180 s"
                time.sleep(2)

            page = login("alice")
            page.goto(f"/clusters/{cluster_id}/")
            expect(page.locator("#live-connection")).to_have_text("live", timeout=15_000)
            faults(live_stack, admin, degraded, "POST", {"fault": "link_degraded", "value": "25"})
            try:
                page.get_by_role("button", name="Probe bandwidth now").click()
                expect(page.locator("#busbw-chart")).to_have_attribute(
                    "data-points", re.compile("[2-9]"), timeout=300_000
                )
                expect(page.locator("#bandwidth-alert")).to_be_visible(timeout=30_000)
                expect(page.locator("#bandwidth-alert")).to_contain_text(f"slowest host: {DEGRADED_HOST}")
                sweep(live_stack, cluster_id)
                row = page.locator(f'#health-table tr[data-host="{DEGRADED_HOST}"]')
                expect(row.locator(".verdict")).to_have_text("warning", timeout=30_000)
                expect(row.locator(".rule")).to_contain_text("the bandwidth probe blames this host")
            finally:
                faults(live_stack, admin, degraded, "DELETE", {"fault": "link_degraded"})

        after = orm(_cluster_row, cluster_id)
        assert after["flagged"] and after["measured"] == max(after["table"]), after  # one answer per probe
        page.reload()
        headline = page.locator("#probe-headline")
        expect(headline).to_contain_text(f"max busbw {_gbps(after['measured'])} GB/s")
        best_row = max(
            float(t) for t in page.locator("#probe-table tbody tr td:nth-child(4)").all_inner_texts()
        )
        assert _gbps(best_row) == _gbps(after["measured"])
        expect(page.locator("#bandwidth-alert")).to_contain_text(DEGRADED_HOST)
        expect(page.locator("#probe-hosts")).to_contain_text("slowest")
        screenshot(page, "cluster-link-drill")
    finally:
        orm(terminate, cluster_id)


def _gbps(value: float) -> str:
    from clusters.placement.bandwidth import format_gbps

    return format_gbps(value, 2)
