"""What a recovery cost, as the API and the cluster page show it (issue 24.2), without Ray.

The third new user's record: GPU-hours lost counted the downtime twice (0.1853 for 20.9 s on 16 GPUs:
the cluster's GPUs x downtime plus the job's figure, which already held it); "Job resumed after" was the
resubmission, the training stepped again 20 s later; "steps lost" came from the last logged step (the
demo logs every 5), so it undercounted and never said so.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from clusters import recovery as cluster_recovery
from clusters.models import Cluster, Recovery
from jobs import checkpoints, services
from jobs.models import Checkpoint, Job

pytestmark = pytest.mark.django_db
GPUS = 16  # 2 nodes x 8
STEP_S = 0.4


@pytest.fixture
def cluster(team_a, alice):
    return Cluster.objects.create(
        team=team_a, created_by=alice, name="c16", status="ready",
        spec={"nodes": 2, "gpus_per_node": 8, "gpu_models": ["H100"]}, dashboard_url="http://127.0.0.9:1",
    )  # fmt: skip


@pytest.fixture(autouse=True)
def _no_storage_scan(monkeypatch):
    """The checkpoints are the rows the test writes (no cluster storage to scan)."""
    monkeypatch.setattr(checkpoints, "rescan_checkpoints", lambda job: list(job.checkpoints.all()))


def steps(numbers, clock) -> list[dict]:
    """Step events as the demo prints them, at `clock(step)` on the workload's own clock."""
    return [{"kind": "step", "step": n, "loss": 1.0, "time": clock(n)} for n in numbers]


def running_job(cluster, alice, events) -> Job:
    job = services.submit_job(cluster, alice, "python train.py")
    Job.objects.filter(pk=job.pk).update(status="running", ray_submission_id="x")
    job.refresh_from_db()
    services.apply_events(job, events)
    return job


def checkpoint(job: Job, step: int) -> None:
    Checkpoint.objects.create(job=job, step=step, path=f"/s/step-{step:08d}", synchronized=True)


def fail_and_recover(cluster, job: Job, detected_at) -> Recovery:
    """The node dies: the job is interrupted, the cluster repaired, the job resubmitted (recovery's own
    bookkeeping; the repair in between is tests/integration/test_recovery.py's)."""
    Job.objects.filter(pk=job.pk).update(status="interrupted")
    record = Recovery.objects.create(cluster=cluster, cause="node-1 failed", detected_at=detected_at)
    cluster_recovery._resume_work(cluster, record)
    cluster_recovery._end(cluster, record, "succeeded", "recovered")
    return record


def api_record(client_for, user, cluster) -> dict:
    body = client_for(user).get(f"/api/v1/clusters/{cluster.pk}/recoveries/").json()
    return body["results"][0]


def figures(shown: dict) -> tuple:
    return shown["checkpoint_step"], shown["steps_lost"], shown["steps_lost_is_lower_bound"]


def test_gpu_hours_count_the_downtime_once_and_run_until_training_steps_again(cluster, alice, client_for):
    detected = timezone.now() - timedelta(seconds=20.9)
    start = detected.timestamp() - 12.0  # step s at start + 0.4 s: step 25 two seconds before the failure
    job = running_job(cluster, alice, steps([1, 5, 10, 15, 20, 25], lambda n: start + STEP_S * n))
    checkpoint(job, 20)
    fail_and_recover(cluster, job, detected)

    shown = api_record(client_for, alice, cluster)
    resubmitted_s = shown["job_resubmitted_s"]
    assert 20.9 <= resubmitted_s < 25  # the resubmission, named as such
    assert shown["training_resumed_at"] is None and shown["training_resumed_s"] is None
    assert (shown["checkpoint_step"], shown["steps_lost"]) == (20, 5)
    lost_steps_s = 5 * STEP_S
    once = GPUS * (resubmitted_s + lost_steps_s) / 3600  # the downtime once, plus the lost steps' time
    assert shown["gpu_hours_lost"] == pytest.approx(once, abs=2e-4)
    assert shown["jobs"][0]["gpu_hours_lost"] == pytest.approx(once, abs=2e-4)
    assert shown["jobs"][0]["step_s"] == pytest.approx(STEP_S)

    # The resubmitted attempt logs its first step 20 s after the resubmission (its own clock).
    job.refresh_from_db()
    assert job.attempt == 2 and job.last_step == 20  # back at the checkpoint's step
    services.apply_events(job, steps([21], lambda n: detected.timestamp() + 40.9))

    shown = api_record(client_for, alice, cluster)
    assert shown["job_resubmitted_s"] == resubmitted_s
    assert shown["training_resumed_s"] == pytest.approx(40.9, abs=1e-3)
    expected = round(GPUS * (40.9 + lost_steps_s) / 3600, 4)  # 0.1907, not 0.0929 + 0.0929 + ...
    assert shown["gpu_hours_lost"] == pytest.approx(expected, abs=1e-4)
    assert shown["jobs"][0]["training_resumed_s"] == pytest.approx(40.9, abs=1e-3)
    job_body = client_for(alice).get(f"/api/v1/jobs/{job.pk}/").json()
    assert job_body["gpu_hours_lost"] == pytest.approx(expected, abs=1e-4)

    page = Client()
    page.force_login(alice)
    html = page.get(f"/clusters/{cluster.pk}/").content.decode()
    assert "Job resubmitted after" in html and "Training stepped again after" in html
    assert "40.9 s" in html

    # The job's own page and API: where it is now (back from the checkpoint) and how far it had come (the
    # walk saw a failed resubmitted job show only its checkpoint's step).
    assert (job_body["last_step"], job_body["step_reached_before"]) == (21, 25)
    html = page.get(f"/clusters/{cluster.pk}/jobs/{job.pk}/").content.decode()
    assert "(resumed; an earlier attempt reached 25)" in html


def test_steps_lost_is_a_lower_bound_when_the_job_logs_every_few_steps(cluster, alice, client_for):
    detected = timezone.now() - timedelta(seconds=10)
    job = running_job(cluster, alice, steps([1, 5, 10, 15, 20, 25], lambda n: 1_700_000_000 + n))
    checkpoint(job, 20)
    fail_and_recover(cluster, job, detected)

    shown = api_record(client_for, alice, cluster)
    assert shown["steps_lost"] == 5 and shown["steps_lost_is_lower_bound"] is True
    assert shown["jobs"][0]["steps_lost_is_lower_bound"] is True
    page = Client()
    page.force_login(alice)
    assert "≥ 5" in page.get(f"/clusters/{cluster.pk}/").content.decode()
    assert "at least 5 step(s) lost" in job.events.order_by("-at", "-id").first().message


def test_a_checkpoint_at_the_last_logged_step_never_reads_at_least_zero(cluster, alice, client_for):
    """The walk saw "at least 0 step(s) lost" and "≥ 0": the job logged nothing past its checkpoint."""
    detected = timezone.now() - timedelta(seconds=10)
    job = running_job(cluster, alice, steps([1, 5, 10, 15, 20], lambda n: 1_700_000_000 + n))
    checkpoint(job, 20)
    fail_and_recover(cluster, job, detected)

    shown = api_record(client_for, alice, cluster)
    assert shown["steps_lost"] == 0 and shown["steps_lost_is_lower_bound"] is True
    page = Client()
    page.force_login(alice)
    html = page.get(f"/clusters/{cluster.pk}/").content.decode()
    assert "≥ 0" not in html and "0 logged" in html
    message = job.events.order_by("-at", "-id").first().message
    assert "at least 0" not in message
    assert "no step logged past it" in message


def test_steps_lost_is_exact_when_the_job_logged_every_step(cluster, alice, client_for):
    detected = timezone.now() - timedelta(seconds=10)
    job = running_job(cluster, alice, steps(range(1, 24), lambda n: 1_700_000_000 + n))
    checkpoint(job, 20)
    fail_and_recover(cluster, job, detected)

    shown = api_record(client_for, alice, cluster)
    assert shown["steps_lost"] == 3 and shown["steps_lost_is_lower_bound"] is False


def test_steps_lost_counts_from_the_checkpoint_event_past_the_last_step_event(cluster, alice, client_for):
    """Steps logged every 5 up to 25, then the checkpoint of step 28 announced: the job reached 28."""
    detected = timezone.now() - timedelta(seconds=10)
    events = steps([1, 5, 10, 15, 20, 25], lambda n: 1_700_000_000 + n)
    events.append({"kind": "checkpoint", "step": 28, "path": "/s/step-00000028"})
    job = running_job(cluster, alice, events)
    checkpoint(job, 20)  # step 28's checkpoint lost a shard since: not synchronized, not resumed from
    Checkpoint.objects.create(job=job, step=28, path="/s/step-00000028", synchronized=False, reason="x")
    fail_and_recover(cluster, job, detected)

    shown = api_record(client_for, alice, cluster)
    assert figures(shown) == (20, 8, True)


def test_a_second_failure_counts_the_steps_of_the_attempt_that_failed(cluster, alice, client_for):
    """Attempt 1 reached 35 (checkpoint 30); attempt 2 failed at its first logged step, 31: 1 step lost
    the second time, not 35 - 30 from the first attempt's figure."""
    job = running_job(cluster, alice, steps([1, 5, 10, 15, 20, 25, 30, 35], lambda n: 1_700_000_000 + n))
    checkpoint(job, 30)
    fail_and_recover(cluster, job, timezone.now() - timedelta(seconds=60))
    job.refresh_from_db()
    services.apply_events(job, steps([31], lambda n: timezone.now().timestamp() - 30))
    fail_and_recover(cluster, job, timezone.now() - timedelta(seconds=10))

    shown = api_record(client_for, alice, cluster)  # newest first
    assert figures(shown) == (30, 1, True)


def test_a_poll_of_the_interrupted_attempt_does_not_write_over_the_resubmitted_one(cluster, alice):
    """A poll that loaded attempt 1 before recovery resubmitted the job, and applies attempt 1's last
    events after: attempt 2's last step and step marks (when it stepped again) stay as the resubmission
    set them."""
    job = running_job(cluster, alice, steps([1, 5, 10, 15, 20, 25], lambda n: 1_700_000_000 + n))
    checkpoint(job, 20)
    stale = Job.objects.get(pk=job.pk)  # what the poll loaded
    fail_and_recover(cluster, job, timezone.now() - timedelta(seconds=10))

    services.apply_events(stale, steps([26, 27], lambda n: 1_700_000_000 + n))

    job.refresh_from_db()
    assert (job.attempt, job.last_step, job.attempt_steps) == (2, 20, {})
