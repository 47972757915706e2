"""Console slips of issue 24 (item 5), checked in Chromium against the real stack: the job form's workload
radios and the fieldset that only the custom workload uses; the cluster request page's preview before its
button on a phone. Clusters made here are rows in the TERMINATED state: nothing is provisioned."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser

NARROW = {"width": 375, "height": 740}


@pytest.fixture(scope="module")
def form_cluster(orm):
    """A terminated cluster of Demo Lab (alice's team): its job form renders (with a not-ready note)."""

    def make():
        from clusters.models import Cluster
        from voltweb.models import Team

        spec = {"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"], "parallelism": "data_parallel"}
        cluster, _ = Cluster.objects.get_or_create(
            name="slips-form",
            defaults={"team": Team.objects.get(slug="demo-lab"), "status": "terminated", "spec": spec,
                      "gpu_model": "H100"},
        )  # fmt: skip
        return cluster.pk

    return orm(make)


# The radio's box and its label text's box (a Range over the text: the <label> also wraps the radio).
RADIO_AND_TEXT = """(radio) => {
  const label = radio.closest('label');
  const text = [...label.childNodes].find((n) => n.nodeType === Node.TEXT_NODE && n.textContent.trim());
  const range = document.createRange();
  range.selectNodeContents(text);
  const box = (r) => ({left: r.left, right: r.right, middle: (r.top + r.bottom) / 2});
  return {radio: box(radio.getBoundingClientRect()), text: box(range.getBoundingClientRect())};
}"""


def test_each_workload_radio_sits_on_its_labels_line_before_it(login, form_cluster, screenshot):
    page = login("alice")
    page.goto(f"/clusters/{form_cluster}/jobs/new/")
    for value in ("demo", "custom"):
        boxes = page.locator(f"input[name=kind][value={value}]").evaluate(RADIO_AND_TEXT)
        radio, text = boxes["radio"], boxes["text"]
        assert abs(radio["middle"] - text["middle"]) < 6, (
            f"{value}: radio and label text on different lines {boxes}"
        )
        assert radio["right"] <= text["left"], f"{value}: the radio is not before its label {boxes}"
    screenshot(page, "slips-job-form-demo")


def test_entrypoint_fieldset_shows_only_for_the_custom_workload(login, form_cluster, screenshot):
    page = login("alice")
    page.goto(f"/clusters/{form_cluster}/jobs/new/")
    custom = page.locator("#custom-fields")
    expect(page.locator("input[name=kind][value=demo]")).to_be_checked()
    expect(custom).to_be_hidden()
    expect(page.locator("#demo-fields")).to_be_visible()

    page.check("input[name=kind][value=custom]")
    expect(custom).to_be_visible()
    expect(page.locator("#id_entrypoint")).to_be_editable()
    expect(page.locator("#demo-fields")).to_be_hidden()  # the walk saw "Demo workload" beside an entrypoint
    screenshot(page, "slips-job-form-custom")

    page.check("input[name=kind][value=demo]")
    expect(custom).to_be_hidden()
    expect(page.locator("#demo-fields")).to_be_visible()


def test_narrow_cluster_request_shows_the_preview_before_the_request_button(browser, live_stack, screenshot):
    context = browser.new_context(base_url=live_stack.url, viewport=NARROW)
    context.set_default_timeout(20_000)
    try:
        page = context.new_page()
        page.goto("/login/")
        page.fill("#id_username", "alice")
        page.fill("#id_password", "volt-demo")
        page.click("button[type=submit]")
        page.goto("/clusters/new/")
        # The preview loads with the form (2 x 8 H100 by default): a placement, with its facts.
        expect(page.locator("#preview .facts")).to_be_visible(timeout=15_000)
        preview = page.locator(".preview-panel").bounding_box()
        button = page.get_by_role("button", name="Request cluster").bounding_box()
        assert preview["y"] + preview["height"] <= button["y"], f"preview {preview}, button {button}"
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page scrolls sideways by {overflow} px"
        screenshot(page, "slips-cluster-request-narrow")
    finally:
        context.close()


def test_wide_cluster_request_keeps_the_preview_beside_the_form(login, screenshot):
    page = login("alice")
    page.goto("/clusters/new/")
    expect(page.locator("#preview .facts")).to_be_visible(timeout=15_000)
    form = page.locator("#cluster-form").bounding_box()
    preview = page.locator(".preview-panel").bounding_box()
    button = page.get_by_role("button", name="Request cluster").bounding_box()
    assert preview["x"] >= form["x"] + form["width"], f"form {form}, preview {preview}"
    assert abs(preview["y"] - form["y"]) < 2, f"form {form}, preview {preview}"
    assert button["x"] < preview["x"], f"the button left the form's column: {button}"
    screenshot(page, "slips-cluster-request-wide")


def _job_with_a_checkpoint_on_local_storage() -> tuple[int, int, dict]:
    """A finished job of alice's team with one checkpoint row as a local-host scan records it, and the live
    event's payload for it."""
    from django.contrib.auth import get_user_model

    from clusters.models import Cluster
    from clusters.tenancy import shared_storage_dir
    from jobs import services
    from jobs.models import Checkpoint, Job
    from voltweb.models import Team

    alice = get_user_model().objects.get(username="alice")
    cluster = Cluster.objects.create(
        team=Team.objects.get(slug="demo-lab"), created_by=alice, name="slips-ckpt", status="terminated",
        spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]},
    )  # fmt: skip
    job = Job.objects.create(cluster=cluster, team=cluster.team, created_by=alice, entrypoint="python t.py",
                             status="succeeded", name="slips-ckpt")  # fmt: skip
    path = shared_storage_dir(cluster) / "jobs" / str(job.pk) / "checkpoints" / "step-00000010"
    Checkpoint.objects.create(job=job, step=10, path=str(path), synchronized=True, size_bytes=2048)
    return cluster.pk, job.pk, services.checkpoint_payload(job.checkpoints.get())


def test_live_checkpoint_rows_keep_the_location_the_page_drew(login, orm, live_stack, screenshot):
    """The job page's checkpoint table, redrawn from the cluster's websocket, names the place as the page
    (and the cluster's connect box) does: under ~/volt/clusters/…/storage, not this machine's folder."""
    from tests.browser.test_job_live import _push

    cluster_id, job_id, checkpoint = orm(_job_with_a_checkpoint_on_local_storage)
    page = login("alice")
    page.goto(f"/clusters/{cluster_id}/jobs/{job_id}/")
    cell = page.locator("#checkpoints-table tbody td:nth-child(6)")
    expect(cell).to_have_text(checkpoint["location"])
    # An ended job's page does not say "Live: live" (the walk's slip): it is connected, and says the job ended.
    expect(page.locator("#job-connection")).to_have_text("connected; the job has ended", timeout=15_000)
    event = {"kind": "job_checkpoints", "job": job_id, "checkpoints": [{**checkpoint, "size_bytes": 4096}]}
    orm(_push, live_stack.redis_url, f"cluster-{cluster_id}", event)
    expect(page.locator("#checkpoints-table tbody td:nth-child(4)")).to_have_text("4.0\xa0KB")
    # Sizes drawn live read as the server draws them on a reload (the walk saw "4724.5 KB" then "4.6 MB").
    event["checkpoints"] = [{**checkpoint, "size_bytes": 4_837_888}]
    orm(_push, live_stack.redis_url, f"cluster-{cluster_id}", event)
    expect(page.locator("#checkpoints-table tbody td:nth-child(4)")).to_have_text("4.6\xa0MB")
    expect(cell).to_have_text(checkpoint["location"])
    assert (
        checkpoint["location"].startswith("~/volt/clusters/") and checkpoint["path"] != checkpoint["location"]
    )
    screenshot(page, "slips-job-checkpoints")
