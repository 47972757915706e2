"""The goodput ledger (issue 28.4): a job's and a cluster's time and GPU-hours split by what they went to,
from the recorded timeline, adding up to the wall-clock time exactly.

The history below is written as Volt records it (status events, the first step per attempt, checkpoints
with their save time, the recovery's row, the GPUs' allocation rows) at known times, so each figure is
checked against the arithmetic a person would do on the timeline.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from clusters.models import Allocation, Cluster, ClusterEvent, ClusterNode, Recovery, RecoveryJob
from jobs import goodput
from jobs.models import Checkpoint, Job, JobEvent
from voltweb import cli
from voltweb import services as accounts

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 12, 1, 23, 0, tzinfo=UTC)  # the history crosses midnight: two days


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def history(team_a, alice, northwind_ib, make_host):
    """One 2 x 8-GPU cluster and a job with one recovery:

    cluster: created 0, queued 0-100, provisioning 100-400, verifying 400-460, READY 460-3000, degraded
    3000-3030, recovering 3030-3200, READY 3200-5000, terminating 5000-5060, terminated 5060.
    job: created 500, running 520 (first step 600), checkpoints at 1000 (save 4 s) and 2000 (save 5 s),
    interrupted 3010, resubmitted (attempt 2) 3220, running 3240, stepped again 3300 (resumed from the
    step-2000 checkpoint), checkpoint at 4000 (save 6 s), succeeded 4800.
    """
    block = northwind_ib.blocks.first()
    hosts = [make_host(block, gpus=8) for _ in range(2)]
    cluster = Cluster.objects.create(
        team=team_a, created_by=alice, name="ledger", status="terminated", created_at=at(0),
        spec={"nodes": 2, "gpus_per_node": 8, "gpu_models": ["H100"]}, ended_at=at(5060),
    )  # fmt: skip
    for when, frm, to in [
        (0, "pending", "queued"), (100, "queued", "provisioning"), (400, "provisioning", "verifying"),
        (460, "verifying", "ready"), (3000, "ready", "degraded"), (3030, "degraded", "recovering"),
        (3200, "recovering", "ready"), (5000, "ready", "terminating"), (5060, "terminating", "terminated"),
    ]:  # fmt: skip
        ClusterEvent.objects.create(cluster=cluster, at=at(when), from_status=frm, to_status=to)
    ClusterEvent.objects.create(cluster=cluster, at=at(1500), message="ssh key downloaded")  # no status
    for rank, host in enumerate(hosts):
        node = ClusterNode.objects.create(cluster=cluster, host=host, rank=rank, is_head=rank == 0)
        for gpu in host.gpus.all():
            Allocation.objects.create(
                cluster=cluster, node=node, gpu=gpu, active=False, allocated_at=at(100), released_at=at(5060)
            )
    job = Job.objects.create(
        cluster=cluster, team=team_a, name="train", entrypoint="python train.py", status="succeeded",
        created_at=at(500), started_at=at(520), finished_at=at(4800), first_step_at=at(600), attempt=2,
    )  # fmt: skip
    for when, frm, to in [
        (520, "pending", "running"), (3010, "running", "interrupted"), (3220, "interrupted", "pending"),
        (3240, "pending", "running"), (4800, "running", "succeeded"),
    ]:  # fmt: skip
        JobEvent.objects.create(job=job, at=at(when), from_status=frm, to_status=to)
    JobEvent.objects.create(job=job, at=at(3300), message="resumed from step 2000")  # no status
    for step, when, save_s in [(1000, 1000, 4.0), (2000, 2000, 5.0), (4000, 4000, 6.0)]:
        Checkpoint.objects.create(
            job=job, step=step, path=f"/s/step-{step:08d}", synchronized=True, created=at(when), save_s=save_s
        )
    recovery = Recovery.objects.create(cluster=cluster, cause="node-1 failed", detected_at=at(3000))
    RecoveryJob.objects.create(
        recovery=recovery, job_id=job.pk, attempt=2, checkpoint_step=2000, checkpoint_path="/s/step-00002000",
        resubmitted_at=at(3220), training_resumed_at=at(3300), gpus=16,
    )  # fmt: skip
    return cluster, job


def test_a_jobs_ledger_with_a_recovery_adds_up_to_its_wall_clock_time_exactly(history):
    _, job = history
    ledger = goodput.job_ledger(job)
    seconds = ledger["seconds"]
    assert ledger["wall_s"] == 4300.0  # created 500 -> succeeded 4800
    assert sum(seconds.values()) == pytest.approx(4300.0, abs=1e-6)
    assert sum(s.us for s in goodput.job_segments(job)) == 4300 * 1_000_000  # exactly, in microseconds
    assert seconds["queued"] == 20.0  # pending until Ray ran it
    assert seconds["provisioning"] == 80.0  # running 520, first step 600
    assert seconds["checkpoint_save"] == 15.0  # 4 + 5 + 6
    # The checkpoint resumed from was written at 2000: training from then to the interruption was redone.
    assert seconds["lost_work"] == 1010.0
    # Interrupted 3010 -> pending 3220 -> running 3240 -> stepped again 3300.
    assert seconds["recovery"] == 290.0
    assert seconds["productive"] == 4300.0 - 20 - 80 - 15 - 1010 - 290
    assert seconds["idle"] == seconds["teardown"] == seconds["verification"] == 0
    # GPU-hours: the cluster's 16 GPUs over each part.
    assert ledger["gpu_hours"]["lost_work"] == pytest.approx(16 * 1010 / 3600, abs=1e-6)
    assert sum(ledger["gpu_hours"].values()) == pytest.approx(16 * 4300 / 3600, abs=1e-5)


def test_a_clusters_ledger_splits_its_life_and_lays_its_jobs_over_its_ready_time(history):
    cluster, job = history
    ledger = goodput.cluster_ledger(cluster)
    seconds = ledger["seconds"]
    assert ledger["wall_s"] == 5060.0
    assert sum(s.us for s in goodput.cluster_segments(cluster)) == 5060 * 1_000_000
    assert seconds["queued"] == 100.0
    assert seconds["provisioning"] == 300.0 + 80.0  # hosts, then the job's start-up on the READY cluster
    assert seconds["verification"] == 60.0
    assert seconds["teardown"] == 60.0
    # The cluster's own degraded + recovering time (3000-3200), then the job's until it stepped (3200-3300).
    assert seconds["recovery"] == 300.0
    assert seconds["lost_work"] == 1000.0  # 2000 -> 3000: the job's lost time while the cluster was READY
    assert seconds["checkpoint_save"] == 15.0
    # READY with no job stepping: 460-600 (the job pending 500-520, starting up 520-600 is provisioning),
    # then the job's end 4800 -> terminating 5000.
    assert seconds["idle"] == 60.0 + 200.0
    job_productive = goodput.job_ledger(job)["seconds"]["productive"]
    assert seconds["productive"] == job_productive
    # Queued: no GPUs held (the allocations start at provisioning).
    assert ledger["gpu_hours"]["queued"] == 0
    assert sum(ledger["gpu_hours"].values()) == pytest.approx(16 * 4960 / 3600, abs=1e-5)


def test_figures_by_day_split_at_utc_midnight_per_team_and_provider(history, team_a):
    cluster, _ = history
    report = goodput.by_day(Cluster.objects.all(), since=at(-3600), until=at(86400))
    (team,) = report["teams"]
    assert team["team"] == team_a.slug
    first, second = team["days"]
    assert (first["day"], second["day"]) == ("2026-12-01", "2026-12-02")
    assert sum(first["seconds"].values()) == 3600.0  # 23:00 -> midnight
    assert sum(second["seconds"].values()) == 5060.0 - 3600.0
    (provider,) = report["providers"]
    assert provider["provider"] == "Northwind"
    assert sum(provider["totals"]["gpu_hours"].values()) == pytest.approx(16 * 4960 / 3600, abs=1e-5)
    assert team["totals"]["gpu_hours"] == provider["totals"]["gpu_hours"]


def test_a_running_cluster_is_counted_to_now_and_a_window_clips_it(history):
    cluster, _ = history
    Cluster.objects.filter(pk=cluster.pk).update(ended_at=None, status="ready")
    ClusterEvent.objects.filter(cluster=cluster, to_status__in=["terminating", "terminated"]).delete()
    Allocation.objects.filter(cluster=cluster).update(active=True, released_at=None)
    cluster.refresh_from_db()
    now = at(6000)
    ledger = goodput.cluster_ledger(cluster, now=now)
    assert ledger["wall_s"] == 6000.0
    assert ledger["seconds"]["idle"] == 60.0 + 1200.0  # job ended 4800, READY to now
    window = goodput.by_day(Cluster.objects.all(), since=at(5000), until=at(7000), now=now)
    (team,) = window["teams"]
    assert sum(team["totals"]["seconds"].values()) == 1000.0  # 5000 -> now


def test_the_api_reports_a_teams_days_and_exports_csv_and_hides_other_teams(history, alice, bob, client_for):
    cluster, job = history
    url = "/api/v1/goodput/?since=2026-12-01&until=2026-12-03"
    body = client_for(alice).get(url).json()
    assert [t["team"] for t in body["teams"]] == [cluster.team.slug]
    assert body["categories"][0] == "productive"
    assert client_for(bob).get(url).json()["teams"] == []  # another team's clusters are not counted
    response = client_for(alice).get(url + "&format=csv")
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert {row["day"] for row in rows} == {"2026-12-01", "2026-12-02"}
    assert {row["provider"] for row in rows} == {"Northwind"}
    total = sum(float(row["gpu_hours"]) for row in rows)
    assert total == pytest.approx(16 * 4960 / 3600, abs=1e-4)
    one = client_for(alice).get(f"/api/v1/jobs/{job.pk}/goodput/").json()
    assert one["wall_s"] == 4300.0 and one["seconds"]["lost_work"] == 1010.0
    assert client_for(bob).get(f"/api/v1/jobs/{job.pk}/goodput/").status_code == 404
    assert client_for(alice).get(f"/api/v1/goodput/clusters/{cluster.pk}/").json()["wall_s"] == 5060.0
    assert client_for(bob).get(f"/api/v1/goodput/clusters/{cluster.pk}/").status_code == 404


@pytest.mark.parametrize(
    "query, field",
    [("since=yesterday", "since"), ("since=2026-12-05&until=2026-12-01", "until"),
     ("since=2025-01-01&until=2026-12-01", "until"), ("since=2026-13-01T00:00", "since"),
     ("until=2026-02-30", "until"), ("since=0001-01-01T00:00:00%2B01:00&until=0001-01-03", "since"), ("team=nobody", "team")],
)  # fmt: skip
def test_bad_windows_and_unknown_teams_are_refused_with_what_to_do(history, alice, client_for, query, field):
    response = client_for(alice).get(f"/api/v1/goodput/?{query}")
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]


def test_the_cluster_and_job_pages_show_where_the_time_went(history, alice, client):
    cluster, job = history
    client.force_login(alice)
    page = client.get(f"/clusters/{cluster.pk}/").content.decode()
    assert 'id="cluster-goodput-table"' in page
    assert '<tr data-category="lost_work"><td>Lost work</td><td class="num">1000.0 s</td>' in page
    assert 'id="cluster-useful"' in page
    page = client.get(f"/clusters/{cluster.pk}/jobs/{job.pk}/").content.decode()
    assert '<tr data-category="recovery"><td>Recovery</td><td class="num">290.0 s</td>' in page
    assert "plotly.min.js" in page  # the job page loads Plotly for its bar


def test_the_teams_page_shows_goodput_by_day_with_a_csv_link(history, alice, client):
    cluster, _ = history
    recent = timezone.now() - timedelta(hours=2)
    shift = recent - T0
    for model, field in ((Cluster, "created_at"), (Cluster, "ended_at")):
        model.objects.filter(pk=cluster.pk).update(**{field: getattr(cluster, field) + shift})
    for event in cluster.events.all():
        ClusterEvent.objects.filter(pk=event.pk).update(at=event.at + shift)
    for a in Allocation.objects.filter(cluster=cluster):
        Allocation.objects.filter(pk=a.pk).update(
            allocated_at=a.allocated_at + shift, released_at=a.released_at + shift
        )
    client.force_login(alice)
    page = client.get("/teams/").content.decode()
    assert f'id="chart-goodput-days-{cluster.team.slug}"' in page
    assert f"/api/v1/goodput/?team={cluster.team.slug}&amp;format=csv" in page
    assert "22.0 GPU-hours held" in page  # 16 GPUs x 4960 s


@pytest.mark.django_db(transaction=True)
def test_volt_goodput_prints_the_teams_table_the_csv_and_one_jobs_ledger(history, alice, live_server, capsys):
    _, job = history
    env = {"VOLT_URL": live_server.url, "VOLT_TOKEN": accounts.create_api_token(alice, "ci").secret}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        window = ["--since", "2026-12-01", "--until", "2026-12-03"]
        assert cli.main(["goodput", *window]) == 0
        out = capsys.readouterr().out
        assert "1 clusters" in out and "lost_work" in out
        assert "  total                 1.41       22.04" in out  # 5060 s; 16 GPUs x 4960 s
        assert cli.main(["goodput", *window, "--csv"]) == 0
        rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
        assert {row["category"] for row in rows} >= {"productive", "lost_work", "recovery"}
        assert cli.main(["goodput", "--job", str(job.pk), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["seconds"]["recovery"] == 290.0
        assert cli.main(["goodput", "--since", "soon"]) == 1
        assert "since: Give a date" in capsys.readouterr().err


def test_two_clusters_holding_gpus_add_up_by_day_and_a_stale_note_changes_no_status(
    history, team_a, alice, make_host
):
    """Two clusters with GPUs in one window crashed the roll-up (a loop variable shadowed the allocations);
    a note that repeats a stale status turned teardown into idle."""
    cluster, _ = history
    ClusterEvent.objects.create(
        cluster=cluster, at=at(5030), from_status="ready", to_status="ready", message="late"
    )
    host = make_host(cluster.nodes.first().host.block, gpus=8)
    other = Cluster.objects.create(
        team=team_a, created_by=alice, name="other", status="terminated", created_at=at(0),
        spec={"nodes": 1, "gpus_per_node": 8, "gpu_models": ["H100"]}, ended_at=at(3600),
    )  # fmt: skip
    ClusterEvent.objects.create(cluster=other, at=at(0), from_status="pending", to_status="provisioning")
    ClusterEvent.objects.create(
        cluster=other, at=at(3600), from_status="provisioning", to_status="terminated"
    )
    node = ClusterNode.objects.create(cluster=other, host=host, rank=0, is_head=True)
    for gpu in host.gpus.all():
        Allocation.objects.create(
            cluster=other, node=node, gpu=gpu, active=False, allocated_at=at(0), released_at=at(3600)
        )
    report = goodput.by_day(Cluster.objects.all(), since=at(-3600), until=at(86400))
    (team,) = report["teams"]
    assert sum(team["totals"]["gpu_hours"].values()) == pytest.approx(16 * 4960 / 3600 + 8.0, abs=1e-5)
    assert goodput.cluster_ledger(cluster)["seconds"]["teardown"] == 60.0


def test_a_checkpoint_that_claims_an_absurd_save_time_is_not_believed(history):
    _, job = history
    Checkpoint.objects.filter(job=job, step=1000).update(save_s=1e12)  # the manifest is the job's to write
    assert goodput.job_ledger(job)["seconds"]["checkpoint_save"] == 11.0  # 5 + 6: the absurd one left out
