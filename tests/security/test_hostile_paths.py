"""A job is hostile code: every path Volt reads on a host that the job can write is read with the job's own
rights, never Volt's (root on local hosts). Each test puts a symbolic link where Volt reads — the job's
driver log, the folder above it, a checkpoint's manifest, the checkpoint folder — pointing at a file only
root may read, and asserts that nothing of that file comes back through what a user sees.

Real local hosts, a real Unix user of the cluster's own (as on a root install), real shell commands through
the host driver; Ray's job client is the one outer seam faked (it says the job runs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from clusters.models import Cluster, ClusterNode
from clusters.provisioning import node_users
from clusters.tenancy import node_temp_dir, shared_storage_dir
from inventory import local_runtime
from inventory import services as inventory
from inventory.drivers.base import DriverError
from jobs import onray, services
from jobs.models import Job

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        os.geteuid() != 0, reason="a Unix user of the cluster's own needs root (CI runs as root)"
    ),
]
SECRET = "root-only-secret-4f1c9a"


class RayStillRunning:
    """Ray's job API: the job runs, and its log as Ray's dashboard (the cluster's user) reads it."""

    def __init__(self):
        self.whole_log_calls = 0

    def get_job_info(self, submission_id):
        return SimpleNamespace(status="RUNNING", message="")

    def get_job_logs(self, submission_id):
        self.whole_log_calls += 1
        return ""


@pytest.fixture
def root_only(tmp_path_factory) -> Path:
    """A folder and a file in it that only root may read: Volt's secrets, /etc/shadow, host keys."""
    folder = Path("/root") / f".volt-test-{os.getpid()}-{tmp_path_factory.getbasetemp().name}"
    folder.mkdir(mode=0o700)
    secret = folder / "secret.json"
    secret.write_text(json.dumps({"format": SECRET, "step": 10, "shards": [], "world_size": 1}) + "\n")
    secret.chmod(0o600)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def hostile_job(team_a, alice, northwind, northwind_ib, add_local_host, monkeypatch, tmp_path):
    """A running job on a READY one-node cluster whose Ray runs as a user of the cluster's own."""
    host = add_local_host(northwind, northwind_ib, "hostile-head", gpus=2)
    cluster = Cluster.objects.create(
        team=team_a, created_by=alice, name="hostile", status="ready", dashboard_url="http://127.0.0.9:1",
        spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]},
    )  # fmt: skip
    head = ClusterNode.objects.create(
        cluster=cluster, host=host, rank=0, is_head=True, gpu_indices=[0], slot=3
    )
    name = node_users.user_name(cluster.pk, str(tmp_path))
    with inventory.driver_for(host) as driver:
        assert node_users.ensure_user(driver, name)
    Cluster.objects.filter(pk=cluster.pk).update(node_user=name)
    cluster.refresh_from_db()
    uid = int(subprocess.run(["id", "-u", name], capture_output=True, text=True, check=True).stdout)
    job = services.submit_job(cluster, alice, "python train.py")
    Job.objects.filter(pk=job.pk).update(status="running", ray_submission_id=services.submission_id(job))
    temp_dir = Path(node_temp_dir(cluster, head))
    temp_dir.mkdir(parents=True)
    os.chown(temp_dir, uid, uid)
    storage = shared_storage_dir(cluster)
    storage.mkdir(parents=True)
    os.chown(storage, uid, uid)
    storage.chmod(0o700)
    monkeypatch.setattr(onray, "ray_client", lambda cluster: RayStillRunning())
    yield Job.objects.get(pk=job.pk), temp_dir, storage, uid
    shutil.rmtree(temp_dir, ignore_errors=True)
    with inventory.driver_for(host) as driver:
        node_users.remove_user(driver, name)
    shutil.rmtree(storage, ignore_errors=True)


def as_job(uid: int, *argv: str) -> None:
    """What the job itself does on its host: a command as the cluster's user."""
    subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv], check=True)


def test_a_job_log_replaced_by_a_link_to_a_root_only_file_is_not_read(hostile_job, root_only):
    job, temp_dir, _, uid = hostile_job
    logs = temp_dir / "session_latest" / "logs"
    as_job(uid, "mkdir", "-p", str(logs))
    as_job(
        uid, "ln", "-s", str(root_only / "secret.json"), str(logs / f"job-driver-{job.ray_submission_id}.log")
    )

    with pytest.raises(DriverError, match="not a regular file the cluster's user can read"):
        services.read_head_log(job, 0, 4096)
    services.poll_job(job.pk)  # the poll falls back to Ray's API (read as the cluster's user there)
    assert SECRET not in services.read_log(Job.objects.get(pk=job.pk))["text"]


def test_a_log_folder_linked_to_a_root_only_folder_is_not_read(hostile_job, root_only):
    """The file itself is regular: only reading with the job's rights stops this one."""
    job, temp_dir, _, uid = hostile_job
    shutil.copy(root_only / "secret.json", root_only / f"job-driver-{job.ray_submission_id}.log")
    as_job(uid, "ln", "-s", str(root_only), str(temp_dir / "session_latest"))  # session_latest/logs -> ...
    (root_only / "logs").symlink_to(root_only)

    piece = services.read_head_log(job, 0, 4096)
    assert piece is None or SECRET.encode() not in piece[0]
    services.poll_job(job.pk)
    assert SECRET not in services.read_log(Job.objects.get(pk=job.pk))["text"]


def test_a_checkpoint_manifest_linked_to_a_root_only_file_is_not_read(hostile_job, root_only):
    job, _, storage, uid = hostile_job
    assert local_runtime.uses_runtime(), "build the local runtime first: python manage.py local_runtime"
    step = Path(services.checkpoint_dir(job)) / "step-00000010"
    as_job(uid, "mkdir", "-p", str(step))
    as_job(uid, "ln", "-s", str(root_only / "secret.json"), str(step / "manifest.json"))

    rows = services.rescan_checkpoints(job)
    assert [(c.step, c.synchronized) for c in rows] == [(10, False)]
    assert SECRET not in json.dumps([services.checkpoint_payload(c) for c in rows])
    assert "manifest unreadable" in rows[0].reason


def test_a_checkpoint_folder_linked_to_a_root_only_folder_is_not_walked(hostile_job, root_only):
    job, _, storage, uid = hostile_job
    assert local_runtime.uses_runtime(), "build the local runtime first: python manage.py local_runtime"
    (root_only / "step-00000020").mkdir()
    shutil.copy(root_only / "secret.json", root_only / "step-00000020" / "manifest.json")
    checkpoints = Path(services.checkpoint_dir(job))
    as_job(uid, "mkdir", "-p", str(checkpoints.parent))
    as_job(uid, "ln", "-s", str(root_only), str(checkpoints))

    assert services.scan_storage(job) == []  # the cluster's user cannot list the folder the link names
    rows = services.rescan_checkpoints(job)
    assert rows == [] and SECRET not in json.dumps([services.checkpoint_payload(c) for c in rows])
