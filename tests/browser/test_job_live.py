"""Submitting the demo workload from the console: the job page's log fills live, and the cluster page's
bandwidth chart gains the training's own all-reduce samples (source "job") — neither page reloads.

The cluster is real (Ray on two demo local hosts, provisioned by the stack's worker); the stack runs no
beat, so the test sends the job poller's task to the worker every second, as beat would.
"""

from __future__ import annotations

import json
import re
import time

import pytest
from playwright.sync_api import expect

from tests.browser.live_api import JobPoller, alice_token, cluster_status, request_cluster, terminate

pytestmark = pytest.mark.browser
READY_TIMEOUT_S = 600


def test_demo_job_from_the_console_streams_logs_and_job_bandwidth_live(login, screenshot, live_stack, orm):
    cluster_id = request_cluster(live_stack, orm(alice_token), name="jobs-browser")
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while (status := orm(cluster_status, cluster_id))[0] not in ("ready", "failed"):
            assert time.monotonic() < deadline, f"cluster still {status[0]} after {READY_TIMEOUT_S} s"
            time.sleep(2)
        assert status[0] == "ready", status[1]

        page = login("alice")
        page.goto(f"/clusters/{cluster_id}/")
        expect(page.locator("#no-jobs")).to_be_visible()
        page.locator("#submit-job").click()
        expect(page.locator("#job-form")).to_be_visible()
        page.fill("#id_steps", "60")
        page.fill("#id_step_sleep", "0.3")
        page.fill("#id_checkpoint_every", "10")
        with JobPoller(live_stack):
            page.locator("#job-submit").click()
            expect(page.locator("#job-connection")).to_have_text("live", timeout=15_000)
            page.evaluate("window.__notReloaded = true")

            # The cluster page, open beside it while the job trains: its chart gains job samples.
            cluster_page = page.context.new_page()
            cluster_page.goto(f"/clusters/{cluster_id}/")
            expect(cluster_page.locator("#live-connection")).to_have_text("live", timeout=15_000)
            cluster_page.evaluate("window.__notReloaded = true")
            chart = cluster_page.locator("#busbw-chart")
            before = int(chart.get_attribute("data-job-points") or 0)

            # The log as people read it: "step 1  loss 2.7726", not VOLT_EVENT JSON.
            expect(page.locator("#job-log")).to_contain_text("  loss ", timeout=240_000)
            expect(page.locator("#job-status")).to_have_text("Running", timeout=30_000)
            expect(cluster_page.locator("#jobs-table .job-status").first).to_have_text(
                "Running", timeout=30_000
            )
            # (No wait_for_function: the console's CSP forbids evaluating strings.)
            deadline = time.monotonic() + 120
            while int(chart.get_attribute("data-job-points") or 0) <= before:
                assert time.monotonic() < deadline, "the cluster page's chart gained no job sample"
                cluster_page.wait_for_timeout(500)
            names = cluster_page.evaluate("document.getElementById('busbw-chart').data.map((t) => t.name)")
            assert "job busbw (training all-reduce)" in names, names
            screenshot(cluster_page, "cluster-job-bandwidth")

            expect(page.locator("#job-status")).to_have_text("Succeeded", timeout=300_000)
            expect(page.locator("#checkpoints-table tbody")).to_contain_text("yes", timeout=30_000)
            expect(page.locator("#job-log")).to_contain_text("checkpoint step 10 saved (2 shards, ")
            assert "VOLT_EVENT" not in page.locator("#job-log").text_content()
            assert page.evaluate("window.__notReloaded === true")
            assert cluster_page.evaluate("window.__notReloaded === true")
            screenshot(page, "job-live")
    finally:
        orm(terminate, cluster_id)


def _job_with_a_long_log(lines: list[str]) -> tuple[int, int]:
    from django.contrib.auth import get_user_model

    from clusters.models import Cluster
    from jobs import services
    from jobs.models import Job
    from voltweb.models import Team

    alice = get_user_model().objects.get(username="alice")
    cluster = Cluster.objects.create(
        team=Team.objects.get(slug="demo-lab"), created_by=alice, name="long-log", status="terminated",
        spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]},
    )  # fmt: skip
    job = Job.objects.create(cluster=cluster, team=cluster.team, created_by=alice, entrypoint="python t.py",
                             status="succeeded", name="long-log")  # fmt: skip
    for start in range(0, len(lines), 2000):  # stored as polls store it, a piece at a time
        services.store_log(job, "".join(lines[start : start + 2000]).encode(), final=True)
    return cluster.pk, job.pk


def test_a_long_log_opens_at_its_end_and_earlier_lines_load_on_demand(login, screenshot, orm, tmp_path):
    """A job page loaded a 16 MB log from its first line, 256 KB at a time, before showing its end (12.7 s
    for 12 MB on the demo): the lines a user opens a finished or failed job for came last. Now the page
    opens at the end; earlier lines prepend on demand, and the whole log downloads as a file."""
    lines = [f"step {i:06d} loss={1 / (i + 1):.6f} données ✓ 🚀 {'x' * 40}\n" for i in range(12_000)]  # ~1 MB
    whole = "".join(lines)
    cluster_id, job_id = orm(_job_with_a_long_log, lines)
    page = login("alice")
    page.goto(f"/clusters/{cluster_id}/jobs/{job_id}/")
    log = page.locator("#job-log")
    expect(log).to_contain_text("step 011999", timeout=15_000)
    expect(page.locator("#job-log-earlier")).to_be_visible()
    expect(page.locator("#job-log-hidden")).to_contain_text("KB")
    shown = log.text_content()
    assert "step 000000 " not in shown and whole.endswith(shown) and shown.startswith("step ")
    screenshot(page, "job-long-log")

    for _ in range(10):  # ~1 MB in 256 KB pages
        if not page.locator("#job-log-earlier").is_visible():
            break
        before = len(log.text_content())
        page.locator("#job-log-more").click()
        deadline = time.monotonic() + 15
        while len(log.text_content()) == before:
            assert time.monotonic() < deadline, "no earlier lines came"
            page.wait_for_timeout(100)
    expect(page.locator("#job-log-earlier")).to_be_hidden()
    assert log.text_content() == whole  # every line once, in order: offsets counted in characters

    page.goto(f"/clusters/{cluster_id}/jobs/{job_id}/")
    expect(page.locator("#job-log-earlier")).to_be_visible(timeout=15_000)
    with page.expect_download() as download:
        page.locator("#job-log-earlier a[download]").click()
    saved = tmp_path / "job.log"
    download.value.save_as(saved)
    assert saved.read_text(encoding="utf-8") == whole


def test_the_job_log_reads_as_steps_losses_and_checkpoints_without_colour_codes(login, screenshot, orm):
    """The job page showed Ray's colour codes as control glyphs and progress only as `VOLT_EVENT {...}`
    JSON. It shows the API's readable text: colours stripped, events as sentences."""
    from jobs.workloads import volt_ckpt

    lines = [
        "\x1b[36m(TrainRank pid=4242, ip=127.0.0.2)\x1b[0m \x1b[1;33mrank 0 of 2 starts\x1b[0m\n",
        volt_ckpt.event_line("step", step=1, loss=2.302585, time=1.7e9) + "\n",
        volt_ckpt.event_line("busbw", **volt_ckpt.busbw_fields(2, 1_600_000, 0.004, 2)) + "\n",
        volt_ckpt.event_line("checkpoint", step=10, path="/s/step-00000010", shards=2, bytes=1_677_722)
        + "\n",
        volt_ckpt.event_line("done", step=10, params_sha256="9f2c") + "\n",
    ]
    cluster_id, job_id = orm(_job_with_a_long_log, lines)
    page = login("alice")
    page.goto(f"/clusters/{cluster_id}/jobs/{job_id}/")
    log = page.locator("#job-log")
    expect(log).to_contain_text("done at step 10", timeout=15_000)
    assert log.text_content().splitlines() == [
        "(TrainRank pid=4242, ip=127.0.0.2) rank 0 of 2 starts",
        "step 1  loss 2.3026",
        "step 2  all-reduce busbw 0.400 GB/s (algbw 0.400 GB/s, 2 ranks)",
        "checkpoint step 10 saved (2 shards, 1.6 MB)",
        "done at step 10  params sha256 9f2c",
    ]
    screenshot(page, "job-log-readable")


def _push(redis_url: str, group: str, event: dict) -> None:
    """Send `event` to a websocket group of the stack's web server (its Redis database, its prefix)."""
    import asyncio

    from channels_redis.pubsub import RedisPubSubChannelLayer

    from voltweb import namespace

    async def send() -> None:
        layer = RedisPubSubChannelLayer(hosts=[redis_url], prefix=namespace.channel_prefix(redis_url))
        try:
            await layer.group_send(group, {"type": "volt.event", "event": event, "text": json.dumps(event)})
        finally:
            await layer.flush()

    asyncio.run(send())


def test_times_a_page_draws_live_read_as_the_servers_do(login, screenshot, orm, live_stack):
    """The job page wrote live times in the browser's locale ("2:30:15 PM") beside the server's
    "14:30:15": every time, drawn by the server or live, is now "14:30:15 UTC" (the date first in a
    timeline)."""
    cluster_id, job_id = orm(_job_with_a_long_log, ["one line\n"])
    at = "2025-06-01T14:30:15+00:00"
    page = login("alice")
    page.goto(f"/clusters/{cluster_id}/jobs/{job_id}/")
    expect(page.locator("#job-connection")).to_have_text("connected; the job has ended", timeout=15_000)
    group = f"cluster-{cluster_id}"
    job = {"id": job_id, "status": "failed", "status_reason": "a test", "last_step": 10, "first_step_at": at}
    orm(_push, live_stack.redis_url, group, {"kind": "job", "job": job})
    checkpoint = {"step": 10, "path": "/x/step-00000010", "size_bytes": 2048, "synchronized": True,
                  "reason": "", "created": at}  # fmt: skip
    orm(
        _push,
        live_stack.redis_url,
        group,
        {"kind": "job_checkpoints", "job": job_id, "checkpoints": [checkpoint]},
    )
    expect(page.locator("#job-first-step")).to_have_text("14:30:15 UTC")
    expect(page.locator("#checkpoints-table tbody td:nth-child(5)")).to_have_text("14:30:15 UTC")
    expect(page.locator("#job-timeline li time").last).to_have_text(
        re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$")
    )
    screenshot(page, "job-live-times")

    page.goto(f"/clusters/{cluster_id}/")
    expect(page.locator("#live-connection")).to_have_text("live", timeout=15_000)
    node = {"host": "iad1-h100-01", "is_head": True, "rank": 0, "verdict": "ok", "rule": "", "readings": {},
            "checked_at": at}  # fmt: skip
    orm(_push, live_stack.redis_url, group, {"kind": "health", "ts": at, "nodes": [node]})
    expect(page.locator("#health-table tbody td:nth-child(8)")).to_have_text("14:30:15 UTC")
