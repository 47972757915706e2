"""A job's log is read on its head host from where the last read stopped, never whole through Ray's API.

Ray's job API answers the whole log on every call (read, JSON-encoded, sent, decoded): a job printing
gigabytes made every 2 s poll fetch and hold gigabytes. The host driver (a local host here) and Ray's
HTTP client are the outer seams: the driver is real, Ray's client is a fake that says the status and
counts what it was asked for; the log file sits where Ray writes it on the head host.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from clusters.models import Cluster, ClusterNode
from clusters.tenancy import node_temp_dir
from inventory import services as inventory
from inventory.drivers import local as local_driver
from jobs import following, onray, services, transitions
from jobs.models import Job

pytestmark = pytest.mark.django_db
KIB = 1024


class FakeRay:
    """Ray's job API for one submission: the status it reports, and the log as Ray would give it."""

    def __init__(self, log_file: Path):
        self.log_file = log_file
        self.status = "RUNNING"
        self.whole_log_calls = 0

    def get_job_info(self, submission_id):
        return SimpleNamespace(status=self.status, message="" if self.status != "FAILED" else "exit 3")

    def get_job_logs(self, submission_id):
        self.whole_log_calls += 1
        return self.log_file.read_text(encoding="utf-8") if self.log_file.exists() else ""


@pytest.fixture
def head_host(northwind, northwind_ib, add_local_host):
    return add_local_host(northwind, northwind_ib, "logs-head", gpus=2)


@pytest.fixture
def job_on_head(team_a, alice, head_host, monkeypatch):
    """A running job of a READY cluster whose head is `head_host`; (job, its Ray log file, the fake Ray).
    Ray's layout: <temp dir>/session_latest -> session_<...>, logs/job-driver-<submission id>.log."""
    cluster = Cluster.objects.create(
        team=team_a, created_by=alice, name="logs", status="ready", dashboard_url="http://127.0.0.9:1",
        spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]},
    )  # fmt: skip
    head = ClusterNode.objects.create(
        cluster=cluster, host=head_host, rank=0, is_head=True, gpu_indices=[0], slot=3
    )
    job = services.submit_job(cluster, alice, "python train.py")
    sid = services.submission_id(job)
    Job.objects.filter(pk=job.pk).update(status="running", ray_submission_id=sid)
    temp_dir = Path(node_temp_dir(cluster, head))
    session = temp_dir / "session_2026-12-04_03-00-00_000000_1"
    (session / "logs").mkdir(parents=True)
    (temp_dir / "session_latest").symlink_to(session)
    log_file = session / "logs" / f"job-driver-{sid}.log"
    ray = FakeRay(log_file)
    monkeypatch.setattr(onray, "ray_client", lambda cluster: ray)
    yield Job.objects.get(pk=job.pk), log_file, ray
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def host_reads(monkeypatch):
    """Sizes of what each command on a host printed (the host driver, spied on, not replaced)."""
    sizes: list[int] = []
    real = inventory.driver_for

    def spying(host):
        driver = real(host)
        run = driver.run

        def recorded(command, timeout=None):
            result = run(command, timeout)
            sizes.append(len(result.stdout))
            return result

        driver.run = recorded
        return driver

    monkeypatch.setattr(inventory, "driver_for", spying)
    return sizes


def stored_log(job: Job) -> str:
    """The job's whole stored log, page by page as the console and `volt jobs logs` read it."""
    text, offset = "", 0
    while True:
        page = services.read_log(Job.objects.get(pk=job.pk), offset)
        text, offset = text + page["text"], page["next_offset"]
        if offset >= page["size"]:
            return text


def log_lines(first: int, last: int) -> str:
    """Lines of a chatty training log, not all ASCII, with the workload's step events among them."""
    out = []
    for step in range(first, last):
        out.append(f"step {step:05d} loss={1.0 / (step + 1):.6f} — données ünïcode ✓ {'x' * 60}\n")
        if step % 100 == 99:
            out.append(
                f'VOLT_EVENT {{"kind": "step", "step": {step + 1}, "loss": 0.5, "time": 1700000000}}\n'
            )
    return "".join(out)


def test_a_chatty_jobs_log_is_read_where_the_last_read_stopped_in_bounded_pieces(
    job_on_head, host_reads, monkeypatch
):
    monkeypatch.setattr(following, "LOG_READ_MAX", 64 * KIB, raising=False)
    job, log_file, ray = job_on_head
    first = log_lines(0, 4000)  # ~450 KB
    log_file.write_bytes(first.encode() + b"half a lin")

    services.poll_job(job.pk)
    job.refresh_from_db()
    assert stored_log(job) == first  # whole lines only while it runs
    assert job.ray_log_seen == len(first.encode()) and job.last_step == 4000 and job.status == "running"
    pieces = len(host_reads)
    assert pieces >= 7  # ~450 KB in 64 KiB reads
    assert max(host_reads) < 64 * KIB * 4 / 3 + 200  # base64 of one read, and the size line

    rest = "e\n" + log_lines(4000, 5000) + "the last line, no newline"
    with log_file.open("ab") as f:
        f.write(rest.encode())
    ray.status = "SUCCEEDED"
    services.poll_job(job.pk)
    job.refresh_from_db()
    whole = log_file.read_text(encoding="utf-8")
    assert stored_log(job) == whole
    assert job.status == "succeeded" and job.last_step == 5000
    assert job.ray_log_seen == log_file.stat().st_size
    # The second poll read only what was new: the first read started at the half line.
    assert sum(host_reads[pieces:]) < len(rest.encode()) * 4 / 3 + 64 * KIB
    assert ray.whole_log_calls == 0


def test_the_status_follows_once_the_log_is_read(job_on_head, host_reads, monkeypatch):
    """A job that ended with more log than one poll reads stays as it was until its log is stored: the end
    of the log (and its last events) is never dropped for the sake of the status."""
    monkeypatch.setattr(following, "LOG_READ_MAX", 16 * KIB, raising=False)
    monkeypatch.setattr(following, "LOG_POLL_BUDGET_S", 0.0, raising=False)  # one read per poll
    job, log_file, ray = job_on_head
    log_file.write_bytes(log_lines(0, 500).encode())
    ray.status = "FAILED"
    polls = 0
    while Job.objects.get(pk=job.pk).status == "running":
        services.poll_job(job.pk)
        polls += 1
        assert polls < 20
    job.refresh_from_db()
    assert polls >= 3 and job.status == "failed" and job.last_step == 500
    assert stored_log(job) == log_file.read_text(encoding="utf-8")
    assert "exit 3" in job.status_reason and "step 00499" in job.status_reason  # the log's last lines


def test_a_failed_jobs_reason_is_rays_first_line_and_the_logs_last_lines_not_a_dump(job_on_head, monkeypatch):
    """Issue 24's walk: the red box and the timeline showed Ray's whole message, a state dump of
    thousands of characters. The reason keeps Ray's first line and the log's last 5 lines, each bounded."""
    job, log_file, ray = job_on_head
    dump = "{'node_id': 'abc', 'resources': {...}} " * 200
    log_file.write_bytes((log_lines(0, 20) + f"RuntimeError: boom {dump}\n").encode())
    ray.status = "FAILED"
    whole = (
        "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n"
        + log_file.read_text(encoding="utf-8")
    )
    monkeypatch.setattr(ray, "get_job_info", lambda sid: SimpleNamespace(status="FAILED", message=whole))
    while Job.objects.get(pk=job.pk).status == "running":
        services.poll_job(job.pk)
    job.refresh_from_db()
    lines = job.status_reason.splitlines()
    assert lines[0] == "Job entrypoint command failed with exit code 1"
    assert lines[-1].startswith("RuntimeError: boom") and lines[-1].endswith("…")
    assert len(lines) == 6 and all(len(line) <= following.REASON_LINE_MAX for line in lines)
    assert job.events.get(to_status="failed").message == job.status_reason


def test_a_failed_jobs_reason_reads_as_the_readable_log_not_colour_codes_and_carets(job_on_head, monkeypatch):
    """Issue 24's second walk: the red box showed "\x1b[36m(TrainRank pid=10786)\x1b[0m" as control glyphs
    and a traceback's "^^^^^^" marker line. The reason's log lines are the readable log's (jobs/logtext)."""
    job, log_file, ray = job_on_head
    tail = (
        "\x1b[36m(TrainRank pid=10786)\x1b[0m Traceback (most recent call last):\n"
        '\x1b[36m(TrainRank pid=10786)\x1b[0m     raise RuntimeError(f"rank {rank} fails at step {step}")\n'
        "\x1b[36m(TrainRank pid=10786)\x1b[0m     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "\x1b[36m(TrainRank pid=10786)\x1b[0m RuntimeError: demo_train: rank 0 fails at step 51\n"
    )
    log_file.write_bytes((log_lines(0, 20) + tail).encode())
    ray.status = "FAILED"
    monkeypatch.setattr(
        ray,
        "get_job_info",
        lambda sid: SimpleNamespace(status="FAILED", message="Job entrypoint command failed"),
    )
    while Job.objects.get(pk=job.pk).status == "running":
        services.poll_job(job.pk)
    job.refresh_from_db()
    assert "\x1b" not in job.status_reason and "^^^" not in job.status_reason
    assert (
        job.status_reason.splitlines()[-1]
        == "(TrainRank pid=10786) RuntimeError: demo_train: rank 0 fails at step 51"
    )


def test_a_head_host_that_cannot_be_read_falls_back_to_rays_api(job_on_head, head_host):
    job, log_file, ray = job_on_head
    log_file.write_bytes(log_lines(0, 300).encode())
    local_driver.set_fault(inventory.sandbox_path(head_host), "unreachable")
    ray.status = "SUCCEEDED"
    services.poll_job(job.pk)
    job.refresh_from_db()
    assert job.status == "succeeded" and ray.whole_log_calls == 1
    assert stored_log(job) == log_file.read_text(encoding="utf-8")


def test_a_log_not_written_yet_is_no_log_until_ray_starts_the_entrypoint(job_on_head):
    job, log_file, ray = job_on_head
    ray.status = "PENDING"
    services.poll_job(job.pk)
    job.refresh_from_db()
    assert job.ray_log_seen == 0 and stored_log(job) == "" and ray.whole_log_calls == 0
    ray.status = "RUNNING"  # started, yet no file where Ray writes it: ask Ray rather than show nothing
    services.poll_job(job.pk)
    assert ray.whole_log_calls == 1


def test_a_poll_of_the_previous_attempt_never_writes_over_the_resubmitted_one(job_on_head, monkeypatch):
    """Issue 24's walk: after a kill drill, a poll that asked Ray about attempt 1 finished after recovery
    had resubmitted the job as attempt 2, and wrote attempt 1's failure over it: the job page said
    "Failed" beside "Recovery succeeded" (2 of 3 drills). A poll's writes hold only for the submission
    it read: status, log offsets and steps."""
    job, log_file, ray = job_on_head
    log_file.write_bytes(log_lines(0, 300).encode())
    ray.status = "FAILED"
    asked = ray.get_job_info

    def resubmitted_meanwhile(submission_id):
        answer = asked(submission_id)  # Ray answers for attempt 1; recovery resubmits before the poll writes
        current = Job.objects.get(pk=job.pk)
        current = transitions.transition(current, "interrupted", "its cluster went degraded")
        current = services.resubmit_job(current, resume_from=None)
        Job.objects.filter(pk=job.pk).update(ray_submission_id=f"{current.ray_submission_id}volt-attempt-2")
        return answer

    monkeypatch.setattr(ray, "get_job_info", resubmitted_meanwhile)
    services.poll_job(job.pk)

    job.refresh_from_db()
    assert (job.status, job.attempt) == ("pending", 2)
    assert job.ray_log_seen == 0 and job.last_step is None and not job.status_reason
    assert not job.events.filter(to_status="failed").exists()
    assert "[volt: attempt 2]" in stored_log(job)
