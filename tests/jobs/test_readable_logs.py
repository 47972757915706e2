"""`GET /api/v1/jobs/{id}/logs/?readable=1`: the log for people, a page at a time, with the stored text's
offsets (so the page, the CLI and a follower page through it as through the raw text); raw stays the
default and what the download gives."""

from __future__ import annotations

import pytest

from clusters.models import Cluster
from jobs import services
from jobs.logtext import readable
from jobs.models import Job
from jobs.workloads import volt_ckpt

pytestmark = pytest.mark.django_db

LINES = [
    "\x1b[36m(TrainRank pid=7, ip=127.0.0.2)\x1b[0m rank 0 starts\n",
    volt_ckpt.event_line("step", step=1, loss=2.302585, time=1.7e9) + "\n",
    volt_ckpt.event_line("checkpoint", step=10, path="/x/step-00000010", shards=2, bytes=1_677_722) + "\n",
    "données ✓ 🚀 plain line\n",
    volt_ckpt.event_line("done", step=10, params_sha256="ab12") + "\n",
]
RAW = "".join(LINES)


@pytest.fixture
def job(team_a, alice):
    cluster = Cluster.objects.create(
        team=team_a, created_by=alice, name="a1", status="terminated",
        spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]},
    )  # fmt: skip
    job = Job.objects.create(cluster=cluster, team=team_a, created_by=alice, entrypoint="python t.py")
    services.store_log(job, RAW[:100].encode(), final=True)  # two chunks, the first ending inside a line
    services.store_log(job, RAW[100:].encode(), final=True)
    Job.objects.filter(pk=job.pk).update(status="succeeded")
    job.refresh_from_db()
    return job


def logs(client, job, **params) -> dict:
    response = client.get(f"/api/v1/jobs/{job.pk}/logs/", params)
    assert response.status_code == 200, response.content
    return response.json()


def test_readable_logs_show_events_as_sentences_and_no_colour_codes(job, alice, client_for, client):
    page = logs(client_for(alice), job, readable=1)
    assert page["text"].splitlines() == [
        "(TrainRank pid=7, ip=127.0.0.2) rank 0 starts",
        "step 1  loss 2.3026",
        "checkpoint step 10 saved (2 shards, 1.6 MB)",
        "données ✓ 🚀 plain line",
        "done at step 10  params sha256 ab12",
    ]
    assert page["offset"] == 0 and page["next_offset"] == page["size"] == len(RAW) and page["complete"]
    # Raw stays the default, and the download is the stored text as the job printed it.
    assert logs(client_for(alice), job)["text"] == RAW
    client.force_login(alice)
    download = client.get(f"/clusters/{job.cluster_id}/jobs/{job.pk}/log.txt")
    assert b"".join(download.streaming_content).decode() == RAW


def test_readable_pages_start_and_end_on_whole_lines_at_the_stored_texts_offsets(job, alice, client_for):
    client = client_for(alice)
    second = len(LINES[0])
    inside = logs(client, job, readable=1, offset=5, limit=second + len(LINES[1]) + 10)
    assert inside["offset"] == second  # the line it started in is left out
    assert inside["next_offset"] == second + len(LINES[1])  # so is the line it stopped in
    assert inside["text"] == "step 1  loss 2.3026\n"
    # Following next_offset a line or two at a time renders exactly the whole log, each line once.
    shown, offset = "", 0
    while True:
        page = logs(client, job, readable=1, offset=offset, limit=120)
        assert page["offset"] == offset
        shown += page["text"]
        offset = page["next_offset"]
        if page["complete"]:
            break
    assert shown == readable(RAW)


def test_a_line_longer_than_a_page_comes_in_pieces_and_the_end_of_a_running_log_waits_for_its_line(
    job, alice, client_for
):
    long = "x" * 250 + "\n"
    services.store_log(job, (long + "next\nhalf").encode(), final=True)
    Job.objects.filter(pk=job.pk).update(status="running")
    client, offset, pieces = client_for(alice), len(RAW), []
    for _ in range(4):
        page = logs(client, job, readable=1, offset=offset, limit=100)
        assert page["offset"] == offset  # never skips into the rest of the long line
        pieces.append(page["text"])
        offset = page["next_offset"]
    assert pieces == ["x" * 100, "x" * 100, "x" * 50 + "\nnext\n", ""]  # "half" is not a line yet
    assert offset == len(RAW) + len(long) + len("next\n") and not page["complete"]


def test_a_bad_readable_value_is_a_400(job, alice, client_for):
    response = client_for(alice).get(f"/api/v1/jobs/{job.pk}/logs/?readable=maybe")
    assert response.status_code == 400 and "readable" in response.json()["error"]["fields"]


def test_the_schema_documents_the_readable_option(client):
    schema = client.get("/api/schema/?format=json").json()
    parameters = schema["paths"]["/api/v1/jobs/{id}/logs/"]["get"]["parameters"]
    readable_option = next(p for p in parameters if p["name"] == "readable")
    assert readable_option["schema"]["type"] == "boolean" and "VOLT_EVENT" in readable_option["description"]
