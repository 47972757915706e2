"""Jobs on a real 2-node local Ray cluster, through the API, the `volt` CLI and a real Celery worker + beat.

One cluster serves every step (bringing one up is the slow part): the demo workload runs to completion
with its logs readable while it runs, synchronized checkpoints and job bandwidth samples recorded;
damaged checkpoints are recorded as not synchronized; `volt jobs submit --wait` exits 0, and non-zero for a
failing entrypoint; a stopped job leaves no process on any host, the cluster stays READY and takes the
next job; terminating the cluster stops the job still running on it.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from clusters import provision, services
from clusters.models import Cluster, MetricSample
from clusters.provision import ray_cluster_id
from clusters.provisioning import ray_nodes
from inventory import services as inventory
from jobs import services as jobs
from jobs.models import Job
from tests.clusters.live_helpers import start_cluster_ids_at, worker_and_beat
from tests.integration import checkpoint_files
from voltweb import cli, object_store
from voltweb import services as accounts

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
POLL_S = 1.0


@pytest.fixture(autouse=True)
def job_settings(settings):
    settings.VOLT_PROBE_MAX_MB = 4
    settings.VOLT_PROBE_ITERS = 2
    settings.VOLT_NODE_JOIN_TIMEOUT_S = 150  # a loaded shared machine starts heads slowly
    settings.VOLT_SLOW_HOST_REPLACEMENTS = 0
    settings.VOLT_JOB_POLL_S = POLL_S


@pytest.fixture
def local_hosts(northwind, northwind_ib, add_local_host):
    return [add_local_host(northwind, northwind_ib, f"j{i}", gpus=2, price=f"2.{i}0") for i in range(2)]


@pytest.fixture
def cluster(team_a, alice, local_hosts):
    """A READY 2-node cluster (provisioned in this thread before the worker starts); terminated after, and
    no process of it left on any host."""
    start_cluster_ids_at(random.randrange(100_000, 900_000))
    made = services.request_cluster(team_a, alice, {"name": "jobs", "nodes": 2, "gpus_per_node": 2,
                                                    "gpu_models": ["H100"]})  # fmt: skip
    services.place_cluster(made.pk)
    ready = provision.provision_cluster(made.pk)
    assert ready.status == "ready", ready.failure_message
    yield ready
    ready.refresh_from_db()
    if ready.status not in ("terminated", "failed"):
        services.terminate_cluster(ready, wait=True)
    for host in local_hosts:
        with inventory.driver_for(host) as driver:
            assert ray_nodes.node_processes(driver, ray_cluster_id(ready)) == [], host


@pytest.fixture
def volt(live_server, alice, monkeypatch, capsys):
    """`volt(*argv)` runs the CLI in-process against the live server, as alice's pipeline would."""
    monkeypatch.setenv("VOLT_URL", live_server.url)
    monkeypatch.setenv("VOLT_TOKEN", accounts.create_api_token(alice, "ci").secret)
    monkeypatch.setenv("VOLT_POLL_INTERVAL", "0.5")

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s:g} s")


def job_row(job_id: int) -> Job:
    return Job.objects.get(pk=job_id)


def test_jobs_run_stream_checkpoint_stop_and_end_with_their_cluster(
    alice, cluster, client_for, volt, tmp_path, local_hosts
):
    api = client_for(alice)
    with worker_and_beat(tmp_path, POLL_S, entries=("poll-jobs",)):
        # --- the demo workload, through the API -------------------------------------------------------
        response = api.post("/api/v1/jobs/", {"cluster": cluster.pk, "demo": True, "steps": 40,
                                              "checkpoint_every": 8, "seed": 1, "step_sleep": 0.2})  # fmt: skip
        assert response.status_code == 202, response.json()
        job_id = response.json()["id"]

        def running_log():
            page = api.get(f"/api/v1/jobs/{job_id}/logs/").json()
            return page if page["status"] == "running" and "VOLT_EVENT" in page["text"] else None

        page = wait_for(running_log, 240, "the demo's log through the API while it runs")
        assert not page["complete"] and page["size"] == page["next_offset"] > 0
        wait_for(lambda: job_row(job_id).status in ("succeeded", "failed"), 300, "the demo ends")
        job = job_row(job_id)
        logs = jobs.read_log(job)["text"]
        assert job.status == "succeeded", (job.status_reason, logs[-3000:])
        assert job.first_step_at is not None and job.last_step == 40 and job.result.get("params_sha256")
        checkpoints = api.get(f"/api/v1/jobs/{job_id}/checkpoints/").json()["results"]
        synchronized = [c for c in checkpoints if c["synchronized"]]
        assert len(synchronized) >= 3, checkpoints
        assert MetricSample.objects.filter(cluster=cluster, series="busbw", source="job").count() >= 1
        assert {e["to_status"] for e in api.get(f"/api/v1/jobs/{job_id}/events/").json()["results"]} >= {
            "pending", "running", "succeeded"}  # fmt: skip

        # --- damaged checkpoints (written by the real workload) are recorded as not synchronized ------
        newest, second = (c["path"] for c in sorted(synchronized, key=lambda c: -c["step"])[:2])
        if os.environ.get("VOLT_STORE_ENDPOINT"):  # local hosts reach the store: checkpoints go there
            assert all(c["path"].startswith("s3://") for c in checkpoints)
            assert {c["path"].split("/")[4] for c in checkpoints} == {ray_cluster_id(cluster)}
        checkpoint_files.remove_manifest(job, newest)
        checkpoint_files.truncate_shard(job, second, checkpoint_files.shard_names(job, second)[0])
        latest = jobs.latest_synchronized_checkpoint(job)
        rows = {c.path: c for c in job.checkpoints.all()}
        assert not rows[newest].synchronized and "manifest" in rows[newest].reason
        assert not rows[second].synchronized and "truncated" in rows[second].reason
        assert latest is not None and latest.step < rows[second].step and latest.synchronized

        # --- the CLI: --wait exits 0 for a succeeding entrypoint, non-zero for a failing one ----------
        workdir = tmp_path / "wd"
        workdir.mkdir()
        (workdir / "train.py").write_text(
            "import os, volt_ckpt\nprint('hello from', os.environ['VOLT_JOB_ID'], volt_ckpt.__name__)\n"
        )
        code, out, err = volt("jobs", "submit", "--cluster", str(cluster.pk), "--wait", "--workdir", str(workdir),
                              "--env", "GREETING=hi", "--", "python", "train.py")  # fmt: skip
        assert code == 0, err
        assert "hello from" in err and '"status": "succeeded"' in out
        code, out, err = volt("jobs", "submit", "--cluster", str(cluster.pk), "--wait", "--",
                              "python", "-c", "import sys; print('failing on purpose'); sys.exit(3)")  # fmt: skip
        assert code == cli.EXIT_FAILED, err
        assert "failing on purpose" in err

        # --- stop: no process of the job is left on any host; the cluster takes the next job ----------
        long_job = jobs.submit_job(cluster, alice, jobs.demo_entrypoint(2000, 50, 0, 0.3),
                                   working_dir=jobs.WORKLOADS_DIR, checkpoint_every=50, is_demo=True)  # fmt: skip
        wait_for(lambda: (job_row(long_job.pk).last_step or 0) >= 2, 180, "the long job steps")
        before = jobs.job_processes_by_host(long_job)
        assert len(before) == 2 and all(before.values()), before  # one rank (at least) on every host
        code, out, err = volt("jobs", "stop", str(long_job.pk), "--wait", "--timeout", "120")
        assert code == 0, err
        assert job_row(long_job.pk).status == "stopped"
        assert jobs.job_processes_by_host(long_job) == {h: [] for h in before}
        cluster.refresh_from_db()
        assert cluster.status == "ready"
        code, out, err = volt("jobs", "submit", "--cluster", str(cluster.pk), "--wait", "--",
                              "python", "-c", "print('next job')")  # fmt: skip
        assert code == 0 and "next job" in err, err
        code, out, _ = volt("jobs", "list", "--cluster", str(cluster.pk))
        assert code == 0 and out.count('"id"') == 5

        # --- terminating the cluster stops the job still running on it first --------------------------
        last = jobs.submit_job(cluster, alice, "python -c 'import time; time.sleep(600)'")
        wait_for(lambda: job_row(last.pk).status == "running", 120, "the last job runs")
    key = Cluster.objects.get(pk=cluster.pk).store_access_key
    services.terminate_cluster(Cluster.objects.get(pk=cluster.pk), wait=True)
    last = job_row(last.pk)
    assert last.status == "stopped" and "was terminated" in last.status_reason
    if os.environ.get(
        "VOLT_STORE_ENDPOINT"
    ):  # the cluster's key in the store went with it; its checkpoints stay
        ended = Cluster.objects.get(pk=cluster.pk)
        assert key and ended.store_access_key == key and ended.store_secret_key_encrypted == ""
        assert ray_cluster_id(cluster) not in object_store.from_settings().identities()
