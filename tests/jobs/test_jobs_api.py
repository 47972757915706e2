"""Jobs through the API without Ray: validation (every input error a 400 saying what to do), visibility per
team, logs by offset, stop before submission, the cluster's lifecycle reaching its jobs, events parsing.

Ray is an outer seam here; tests/integration/test_jobs.py runs the same paths on a real local cluster.
"""

from __future__ import annotations

import io
import json
import tarfile
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from clusters import tenancy
from clusters import transitions as cluster_transitions
from clusters.models import Cluster, MetricSample
from jobs import services, transitions, workdirs
from jobs.choices import JobStatus
from jobs.models import Job, JobLogChunk

pytestmark = pytest.mark.django_db


@pytest.fixture
def ready_cluster(team_a, alice):
    return Cluster.objects.create(
        team=team_a, created_by=alice, name="a1", status="ready",
        spec={"nodes": 2, "gpus_per_node": 1, "gpu_models": ["H100"]}, dashboard_url="http://127.0.0.9:1",
    )  # fmt: skip


def submit(client, body, fmt="json"):
    return client.post("/api/v1/jobs/", body, format=fmt)


def tar_gz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def test_demo_submission_is_pending_with_the_contracts_environment(alice, ready_cluster, client_for):
    response = submit(client_for(alice), {"cluster": ready_cluster.pk, "demo": True, "steps": 12, "seed": 3,
                                          "checkpoint_every": 4, "env": {"LR": "0.1"}})  # fmt: skip
    assert response.status_code == 202, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert job.status == "pending" and job.is_demo and job.team_id == ready_cluster.team_id
    assert job.entrypoint == "python demo_train.py --steps 12 --checkpoint-every 4 --seed 3"
    env = services.runtime_env(job)["env_vars"]
    assert env["VOLT_JOB_ID"] == str(job.pk) and env["VOLT_CHECKPOINT_EVERY"] == "4" and env["LR"] == "0.1"
    assert env["VOLT_CHECKPOINT_DIR"].endswith(f"/jobs/{job.pk}/checkpoints")
    assert "VOLT_RESUME_FROM" not in env
    assert (workdirs.workdirs_root() / str(job.pk) / "demo_train.py").exists() or not (
        workdirs.WORKLOADS_DIR / "demo_train.py"
    ).exists()
    assert job.events.first().to_status == "pending"


@pytest.mark.parametrize(
    "body, field, words",
    [
        ({}, "entrypoint", "command to run"),
        ({"demo": True, "entrypoint": "python x.py"}, "entrypoint", "not both"),
        ({"entrypoint": "python t.py", "env": {"VOLT_CHECKPOINT_DIR": "/x"}}, "env", "set by Volt"),
        ({"entrypoint": "python t.py", "env": {"1BAD": "x"}}, "env", "not a variable name"),
        ({"entrypoint": "python t.py", "env": {"A": {"nested": 1}}}, "env", "must be a string"),
        ({"entrypoint": "python t.py", "env": ["A=1"]}, "env", ""),
        ({"entrypoint": "python t.py", "checkpoint_every": 0}, "checkpoint_every", ""),
        ({"entrypoint": 7}, "entrypoint", "string"),
        ({"demo": True, "steps": "many"}, "steps", "integer"),
    ],
)
def test_bad_submissions_are_400s_that_say_what_to_change(
    alice, ready_cluster, client_for, body, field, words
):
    response = submit(client_for(alice), {"cluster": ready_cluster.pk, **body})
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert field in error["fields"] and words in json.dumps(error["fields"]), error
    assert not Job.objects.exists()


def test_another_teams_cluster_is_a_400_like_a_missing_one_and_not_ready_is_409(
    alice, bob, ready_cluster, client_for
):
    other = submit(client_for(bob), {"cluster": ready_cluster.pk, "demo": True})
    missing = submit(client_for(bob), {"cluster": 999999, "demo": True})
    assert other.status_code == missing.status_code == 400
    assert other.json()["error"]["message"].replace(str(ready_cluster.pk), "N") == missing.json()["error"][
        "message"
    ].replace("999999", "N")
    Cluster.objects.filter(pk=ready_cluster.pk).update(status="provisioning")
    response = submit(client_for(alice), {"cluster": ready_cluster.pk, "demo": True})
    assert response.status_code == 409 and response.json()["error"]["code"] == "cluster_not_ready"


def test_uploaded_working_dir_is_unpacked_with_volt_ckpt_beside_the_entrypoint(
    alice, ready_cluster, client_for
):
    archive = SimpleUploadedFile(
        "wd.tar.gz", tar_gz({"train.py": b"print('hi')\n", "pkg/util.py": b"X = 1\n"})
    )
    body = {"cluster": str(ready_cluster.pk), "entrypoint": "python train.py", "env": '{"A": "1"}',
            "working_dir": archive}  # fmt: skip
    response = submit(client_for(alice), body, fmt="multipart")
    assert response.status_code == 202, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    folder = workdirs.workdirs_root() / str(job.pk)
    assert (folder / "train.py").read_text() == "print('hi')\n" and (folder / "pkg" / "util.py").exists()
    assert job.env == {"A": "1"} and job.working_dir == str(folder)
    assert not list((workdirs.workdirs_root() / "uploads").iterdir())  # the staging copy is gone


@pytest.mark.parametrize(
    "name, content, words",
    [
        ("wd.rar", b"xx", ".zip or .tar.gz"),
        ("wd.tar.gz", b"not a tarball", "could not be unpacked"),
        ("wd.tar.gz", tar_gz({"../escape.py": b"x"}), "only plain files"),
        ("wd.zip", None, "outside its folder"),
    ],
)
def test_bad_archives_are_400s(alice, ready_cluster, client_for, name, content, words):
    if content is None:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr("/abs/evil.py", "x")
        content = buffer.getvalue()
    body = {"cluster": str(ready_cluster.pk), "entrypoint": "python t.py",
            "working_dir": SimpleUploadedFile(name, content)}  # fmt: skip
    response = submit(client_for(alice), body, fmt="multipart")
    assert response.status_code == 400 and words in response.json()["error"]["message"], response.json()


def test_working_dir_over_the_size_limit_is_a_clear_400(alice, ready_cluster, client_for, settings):
    settings.VOLT_JOB_UPLOAD_MAX_MB = 1
    settings.VOLT_UPLOAD_MAX_BYTES = 3 * 1024 * 1024
    big = SimpleUploadedFile("wd.zip", b"0" * (1024 * 1024 + 10))
    response = submit(client_for(alice), {"cluster": str(ready_cluster.pk), "entrypoint": "python t.py",
                                          "working_dir": big}, fmt="multipart")  # fmt: skip
    assert response.status_code == 400
    assert "larger than 1 MiB (VOLT_JOB_UPLOAD_MAX_MB)" in response.json()["error"]["message"]
    # Past what the middleware lets through at all: refused before any view, with the same advice.
    huge = SimpleUploadedFile("wd.zip", b"0" * (3 * 1024 * 1024 + 10))
    response = submit(client_for(alice), {"cluster": str(ready_cluster.pk), "entrypoint": "python t.py",
                                          "working_dir": huge}, fmt="multipart")  # fmt: skip
    assert response.status_code == 400 and "VOLT_JOB_UPLOAD_MAX_MB" in response.json()["error"]["message"]


def test_jobs_are_visible_exactly_as_their_clusters(alice, bob, root, ready_cluster, client_for):
    job = services.submit_job(ready_cluster, alice, "python t.py")
    assert client_for(bob).get(f"/api/v1/jobs/{job.pk}/").status_code == 404
    assert client_for(bob).get(f"/api/v1/jobs/{job.pk}/logs/").status_code == 404
    assert client_for(bob).post(f"/api/v1/jobs/{job.pk}/stop/").status_code == 404
    assert client_for(bob).get("/api/v1/jobs/").json()["results"] == []
    assert [
        j["id"] for j in client_for(alice).get(f"/api/v1/jobs/?cluster={ready_cluster.pk}").json()["results"]
    ] == [job.pk]
    assert client_for(alice).get("/api/v1/jobs/?cluster=999999").json()["results"] == []
    assert client_for(root).get(f"/api/v1/jobs/{job.pk}/").status_code == 200


def test_logs_are_read_by_offset_across_chunks(alice, ready_cluster, client_for):
    job = services.submit_job(ready_cluster, alice, "python t.py")
    for offset, text in ((0, "line one\n"), (9, "line two\nline three\n")):
        JobLogChunk.objects.create(job=job, offset=offset, text=text)
    Job.objects.filter(pk=job.pk).update(log_size=29)
    client = client_for(alice)
    whole = client.get(f"/api/v1/jobs/{job.pk}/logs/").json()
    assert whole["text"] == "line one\nline two\nline three\n" and whole["next_offset"] == 29
    part = client.get(f"/api/v1/jobs/{job.pk}/logs/?offset=5&limit=10").json()
    assert part["text"] == "one\nline t" and part["next_offset"] == 15 and not part["complete"]
    assert client.get(f"/api/v1/jobs/{job.pk}/logs/?offset=-1").status_code == 400


def test_stop_before_submission_ends_it_and_a_second_stop_is_409(alice, ready_cluster, client_for):
    job = services.submit_job(ready_cluster, alice, "python t.py")
    client = client_for(alice)
    response = client.post(f"/api/v1/jobs/{job.pk}/stop/")
    assert response.status_code == 202 and response.json()["status"] == "stopped"
    again = client.post(f"/api/v1/jobs/{job.pk}/stop/")
    assert again.status_code == 409 and again.json()["error"]["code"] == "illegal_transition"
    assert services.start_job(job.pk).status == "stopped"  # a late submit task does nothing


def test_a_degraded_cluster_interrupts_its_jobs_with_the_reason(
    alice, ready_cluster, django_capture_on_commit_callbacks
):
    running = services.submit_job(ready_cluster, alice, "python t.py")
    Job.objects.filter(pk=running.pk).update(status="running", ray_submission_id="x")
    ended = services.submit_job(ready_cluster, alice, "python t.py")
    Job.objects.filter(pk=ended.pk).update(status="succeeded")
    with django_capture_on_commit_callbacks(execute=True):
        cluster_transitions.transition(ready_cluster, "degraded", "h1 failed: Ray node process gone")
    running.refresh_from_db()
    assert running.status == JobStatus.INTERRUPTED
    assert "degraded: h1 failed: Ray node process gone" in running.status_reason
    assert Job.objects.get(pk=ended.pk).status == "succeeded"
    assert services.jobs_to_resume(ready_cluster) == [running]

    again = services.resubmit_job(running, resume_from="/storage/jobs/1/checkpoints/step-00000020")
    assert again.status == "pending" and again.attempt == 2 and again.ray_submission_id == ""
    env = services.runtime_env(again)["env_vars"]
    assert env["VOLT_RESUME_FROM"].endswith("step-00000020")
    assert services.submission_id(again).endswith("-a2")
    assert "[volt: attempt 2 from" in services.read_log(again)["text"]


def test_a_resubmission_names_its_checkpoint_as_the_connect_box_names_storage(alice, ready_cluster):
    """The log banner and the timeline say `~/volt/clusters/…/storage/…`, never this machine's folder
    behind a local cluster's storage link (the walk saw `/…/var/shared-storage/…`); Ray still gets the
    path the job can open."""
    job = services.submit_job(ready_cluster, alice, "python t.py")
    Job.objects.filter(pk=job.pk).update(status="interrupted", ray_submission_id="x")
    folder = f"{services.checkpoint_dir(job)}/step-00000020"
    again = services.resubmit_job(Job.objects.get(pk=job.pk), resume_from=folder)
    shown = tenancy.storage_location(ready_cluster, "jobs", job.pk, "checkpoints", "step-00000020")
    assert shown.startswith("~/volt/clusters/")
    assert f"[volt: attempt 2 from {shown}]" in services.read_log(again)["text"]
    assert again.events.filter(message__contains=f"resuming from {shown}").exists()
    assert services.checkpoint_dir(job) not in services.read_log(again)["text"]
    assert not again.events.filter(message__contains=services.checkpoint_dir(job)).exists()
    assert services.runtime_env(again)["env_vars"]["VOLT_RESUME_FROM"] == folder


def test_a_failed_cluster_fails_its_live_jobs(alice, ready_cluster, django_capture_on_commit_callbacks):
    job = services.submit_job(ready_cluster, alice, "python t.py")
    Cluster.objects.filter(pk=ready_cluster.pk).update(status="degraded")
    ready_cluster.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        cluster_transitions.transition(ready_cluster, "failed", "recovery impossible: no host")
    job.refresh_from_db()
    assert job.status == "failed" and "its cluster failed" in job.status_reason


def test_events_set_steps_and_store_job_bandwidth_samples(alice, ready_cluster):
    job = services.submit_job(ready_cluster, alice, "python t.py")
    events = [
        {"kind": "step", "step": 1, "loss": 2.0, "time": 1_700_000_000.0},
        {"kind": "busbw", "step": 2, "bytes": 4096, "seconds": 0.01, "algbw_gbps": 0.4, "busbw_gbps": 0.4,
         "world_size": 2},
        {"kind": "busbw", "step": 3, "busbw_gbps": "not a number"},  # ignored, never a crash
        {"kind": "step", "step": 5, "loss": 1.0, "time": 1_700_000_009.0},
        {"kind": "checkpoint", "step": 5, "path": "/x/step-00000005"},
    ]  # fmt: skip
    assert services.apply_events(job, events) is True
    job.refresh_from_db()
    assert job.last_step == 5 and job.first_step_at.timestamp() == 1_700_000_000.0
    samples = list(MetricSample.objects.filter(cluster=ready_cluster, series="busbw"))
    assert [(s.source, s.value) for s in samples] == [("job", 0.4)]


def test_store_log_keeps_whole_lines_until_the_job_ends(alice, ready_cluster):
    job = services.submit_job(ready_cluster, alice, "python t.py")
    services.store_log(job, b"a\nb\npartial", final=False)
    assert services.read_log(job)["text"] == "a\nb\n" and job.ray_log_seen == 4
    services.store_log(job, b"partial line\nc\n", final=False)
    services.store_log(job, "tail é".encode(), final=True)
    assert services.read_log(job)["text"] == "a\nb\npartial line\nc\ntail é"
    assert Job.objects.get(pk=job.pk).ray_log_seen == len("a\nb\npartial line\nc\ntail é".encode())


def test_a_working_dir_copy_goes_when_nothing_can_submit_the_job_again(
    alice, ready_cluster, django_capture_on_commit_callbacks
):
    """Every submission copied its working dir under VOLT_DATA_DIR/job-workdirs for good: a machine running
    jobs all day filled its disk. The copy serves resubmissions only (recovery), so it goes when the job
    succeeds or is stopped, and a failed or interrupted job keeps it until its cluster ends."""
    folder = lambda job: workdirs.workdirs_root() / str(job.pk)  # noqa: E731
    succeeded, stopped, failed, interrupted = (
        services.submit_job(ready_cluster, alice, "python t.py") for _ in range(4)
    )
    assert all(folder(job).is_dir() for job in (succeeded, stopped, failed, interrupted))
    Job.objects.filter(pk__in=[succeeded.pk, failed.pk, interrupted.pk]).update(status="running")
    with django_capture_on_commit_callbacks(execute=True):
        transitions.transition(Job.objects.get(pk=succeeded.pk), JobStatus.SUCCEEDED)
        transitions.transition(Job.objects.get(pk=failed.pk), JobStatus.FAILED)
        transitions.transition(Job.objects.get(pk=interrupted.pk), JobStatus.INTERRUPTED)
        transitions.transition(Job.objects.get(pk=stopped.pk), JobStatus.STOPPED)
    assert not folder(succeeded).exists() and not folder(stopped).exists()
    assert folder(failed).is_dir() and folder(interrupted).is_dir()  # recovery may submit them again

    with django_capture_on_commit_callbacks(execute=True):
        cluster_transitions.transition(ready_cluster, "terminating", "terminate requested")
        cluster_transitions.transition(Cluster.objects.get(pk=ready_cluster.pk), "terminated", "torn down")
    assert not folder(failed).exists() and not folder(interrupted).exists()
    assert Job.objects.get(pk=interrupted.pk).status == JobStatus.STOPPED
