"""One way to write a moment in the console (issue 24, item 5): 24-hour, with the time zone, from one
template filter (`when`) on the server and one function (`voltWhen`) in the browser. Pages mixed
"2:28:34 PM" (the browser's locale) with "14:30:15" (no zone) before."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from clusters import transitions
from clusters.models import Cluster
from inventory import services as inventory
from jobs import services as jobs
from jobs.models import Checkpoint, Job
from voltweb import services as accounts
from voltweb.templatetags.when import when

STATIC = Path(__file__).resolve().parents[2] / "static" / "volt"
MOMENT = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$")
TIME = re.compile(r"^\d\d:\d\d:\d\d UTC$")


def test_the_filter_writes_24_hour_utc_with_its_zone():
    afternoon = datetime(2025, 6, 1, 14, 30, 15, tzinfo=UTC)
    assert when(afternoon) == "2025-06-01 14:30:15 UTC"
    assert when(afternoon, "time") == "14:30:15 UTC"
    paris = afternoon.astimezone(timezone(timedelta(hours=2)))
    assert when(paris) == "2025-06-01 14:30:15 UTC"  # another zone: the same moment, written in UTC
    assert when("2025-06-01T14:30:15.123456+00:00", "time") == "14:30:15 UTC"  # records keep ISO strings
    assert when(None) == when("") == when("soon") == ""


def test_no_page_script_writes_a_time_in_the_browsers_locale():
    scripts = {path.name: path.read_text() for path in STATIC.glob("*.js")}
    assert "function voltWhen(" in scripts["volt.js"]
    for name, text in scripts.items():
        assert "toLocale" not in text, f"{name} writes a time in the browser's locale: use voltWhen"
        assert not re.search(r"toISOString\(\)\.replace|\.slice\(0, 19\)", text), name
    base = (STATIC.parents[1] / "templates" / "base.html").read_text()
    assert re.search(r"<script src=\"\{% static 'volt/volt.js' %\}\"></script>", base), "volt.js loads first"


@pytest.mark.django_db
def test_job_cluster_host_and_token_pages_write_every_time_one_way(
    client, alice, team_a, priya, northwind_ib, make_host
):
    cluster = Cluster.objects.create(team=team_a, created_by=alice, name="t1", status="ready",
                                     spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]})  # fmt: skip
    transitions.transition(cluster, "terminating", "done with it")
    job = jobs.submit_job(Cluster.objects.create(team=team_a, created_by=alice, name="t2", status="ready",
                          spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]}), alice, "python t.py")  # fmt: skip
    at = datetime(2025, 6, 1, 14, 30, 15, tzinfo=UTC)
    Job.objects.filter(pk=job.pk).update(first_step_at=at)
    Checkpoint.objects.create(job=job, path="/x/step-00000010", step=10, created=at, synchronized=True)
    accounts.create_api_token(alice, "ci")

    client.force_login(alice)
    job_page = client.get(f"/clusters/{job.cluster_id}/jobs/{job.pk}/").content.decode()
    assert re.search(r'id="job-first-step">14:30:15 UTC<', job_page)
    assert "<td>14:30:15 UTC</td>" in job_page  # the checkpoint's time
    pages = {
        "job": (job_page, "job-timeline"),
        "cluster": (client.get(f"/clusters/{cluster.pk}/").content.decode(), "cluster-timeline"),
    }
    for name, (page, timeline) in pages.items():
        times = re.findall(r"<time>(.*?)</time>", page.split(f'id="{timeline}"', 1)[1])
        assert times and all(MOMENT.match(t) for t in times), (name, times)
    tokens = client.get("/account/tokens/").content.decode()
    cells = re.findall(r"<td>(\d{4}-\d\d-\d\d[^<]*)</td>", tokens)
    assert cells and all(MOMENT.match(c) for c in cells), cells
    listing = client.get("/clusters/").content.decode()
    assert re.search(r"<td>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</td></tr>", listing)

    client.force_login(priya)
    host = make_host(northwind_ib.blocks.first())
    inventory.act_on_host(host, "cordon", priya, "time check")
    history = client.get(f"/inventory/hosts/{host.pk}/").content.decode().split('id="host-history"', 1)[1]
    times = re.findall(r"<time>(.*?)</time>", history)
    assert times and all(MOMENT.match(t) for t in times), times
    for page in (job_page, history, tokens, listing):
        assert not re.search(r"\d:\d\d(:\d\d)? ?[AP]M\b", page)
