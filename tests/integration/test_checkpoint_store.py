"""volt_ckpt through the checkpoint store (issue 27): ranks save to an `s3://` root with their cluster's own
key, as a job on a node does (VOLT_STORE_* in its environment), against the real SeaweedFS of the run.

Ranks are threads here, exchanging their shard entries through a barrier (torch.distributed's part is
covered in tests/jobs/test_volt_ckpt.py); the store, the uploads and the manifests are real.
"""

from __future__ import annotations

import hashlib
import io
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch

from jobs.workloads import volt_ckpt, volt_store


def thread_gather(world: int):
    slots: list = [None] * world
    barrier = threading.Barrier(world)

    def gather(entry):
        slots[entry["rank"]] = entry
        barrier.wait()
        seen = list(slots)
        barrier.wait()  # nobody's next save overwrites a slot before every rank has read them
        return seen

    return gather


def run_ranks(world: int, body) -> None:
    errors: list = []

    def run(rank: int) -> None:
        try:
            body(rank)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append((rank, exc))

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors


def shard_of(rank: int, step: int, mb: float) -> dict:
    generator = torch.Generator().manual_seed(rank * 1000 + step)
    return {"rank": rank, "step": step, "weights": torch.rand(int(mb * 1024 * 1024 / 4), generator=generator)}


@pytest.fixture
def cluster_root(store_admin, monkeypatch, tmp_path):
    """A cluster's identity (confined by the store to its prefix) in the environment, as Volt gives a job, and
    the job's checkpoint root under that prefix."""
    name = f"volt-test-{uuid.uuid4().hex[:8]}"
    credentials = store_admin.grant(name, f"tests/{name}/")
    for var, value in {"ENDPOINT": credentials.endpoint, "REGION": credentials.region,
                       "ACCESS_KEY": credentials.access_key, "SECRET_KEY": credentials.secret_key}.items():  # fmt: skip
        monkeypatch.setenv(f"VOLT_STORE_{var}", value)
    monkeypatch.setenv("VOLT_CHECKPOINT_STAGING_DIR", str(tmp_path / "staging"))
    yield f"s3://{credentials.bucket}/{credentials.prefix}jobs/7/checkpoints"
    store_admin.revoke(name)


def test_ranks_upload_their_shards_and_rank_0_writes_the_manifest_once_all_are_in_the_store(
    cluster_root, tmp_path
):
    world, synchronized = 2, []
    gather = thread_gather(world)

    def body(rank: int) -> None:
        for step in (10, 20):
            # rank 1's 20 MB shard goes up in parts (multipart above 16 MB)
            shard = shard_of(rank, step, 20 if rank == 1 else 0.5)
            returned = volt_ckpt.save(cluster_root, step, shard, rank=rank, world_size=world, gather=gather,
                                      on_synchronized=lambda m, path: synchronized.append((m["step"], path)))  # fmt: skip
            assert returned is None, "in the store the save returns at once; the manifest comes later"
        volt_ckpt.wait_uploads(cluster_root, rank)

    run_ranks(world, body)
    assert synchronized == [(10, f"{cluster_root}/step-00000010"), (20, f"{cluster_root}/step-00000020")]
    found = volt_ckpt.scan(cluster_root)
    assert [(e["step"], e["synchronized"], e["reason"], e["shards_present"]) for e in found] == [
        (10, True, "", 2), (20, True, "", 2)]  # fmt: skip
    for entry in found:
        assert entry["path"].startswith("s3://") and entry["upload_s"] >= 0 and entry["save_s"] >= 0
        assert entry["bytes"] > 20 * 1024 * 1024
    manifest, shards = volt_ckpt.load(found[-1]["path"])
    for rank, shard in enumerate(shards):
        assert torch.equal(shard["weights"], shard_of(rank, 20, 20 if rank == 1 else 0.5)["weights"])
    assert manifest["upload_s"] >= 0 and manifest["save_s"] >= 0
    assert not list((tmp_path / "staging").rglob("*.pt")), (
        "nothing left on the machine once uploaded and loaded"
    )
    assert volt_ckpt.latest_synchronized(cluster_root)["step"] == 20


def test_the_checkpoint_holds_the_state_at_its_save_though_training_changes_it_at_once(
    cluster_root, monkeypatch
):
    gather, real_save = thread_gather(1), torch.save

    def slow_off_the_main_thread(obj, f, *args, **kwargs):  # an upload thread that starts late
        if threading.current_thread() is not threading.main_thread():
            time.sleep(0.3)
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", slow_off_the_main_thread)
    weights = torch.zeros(1024 * 1024)  # 4 MB
    leaf = torch.ones(4, requires_grad=True)
    # However the save takes its copy (serialized in the save, or a deep copy that the upload thread then
    # serializes late), the update right after the save is not in the checkpoint.
    for step, state in ((10, {"weights": weights}), (20, {"weights": weights, "activation": leaf * 2})):
        volt_ckpt.save(cluster_root, step, state, rank=0, world_size=1, gather=gather)
        weights.add_(1.0)  # the next step, while the upload runs
    volt_ckpt.wait_uploads(cluster_root)
    _, (first,) = volt_ckpt.load(volt_ckpt.checkpoint_path(cluster_root, 10))
    _, (second,) = volt_ckpt.load(volt_ckpt.checkpoint_path(cluster_root, 20))
    assert torch.equal(first["weights"], torch.zeros(1024 * 1024))
    assert torch.equal(second["weights"], torch.ones(1024 * 1024))
    assert torch.equal(second["activation"], torch.full((4,), 2.0))


def test_a_shard_that_never_reaches_the_store_leaves_its_checkpoint_without_a_manifest(
    cluster_root, monkeypatch
):
    """A machine lost in the middle of an upload: rank 0 never writes the manifest, the scan says why, and the
    latest synchronized checkpoint is still the one before."""
    world, gather = 2, thread_gather(2)
    release = threading.Event()
    real_upload = volt_store.Store.upload_file

    def upload(self, path, url, sha256, **metadata):
        if url.endswith("step-00000020/shard-00001-of-00002.pt"):
            release.wait(30)  # rank 1's machine is gone: its upload never finishes while rank 0 waits
            raise volt_store.StoreError("connection lost")
        return real_upload(self, path, url, sha256, **metadata)

    monkeypatch.setattr(volt_store.Store, "upload_file", upload)
    monkeypatch.setattr(volt_ckpt, "UPLOAD_TIMEOUT_S", 2.0)

    def body(rank: int) -> None:
        for step in (10, 20):
            volt_ckpt.save(
                cluster_root, step, shard_of(rank, step, 0.25), rank=rank, world_size=world, gather=gather
            )
        if rank == 0:
            volt_ckpt.wait_uploads(cluster_root, 0)
            release.set()
        volt_ckpt.wait_uploads(cluster_root, rank)

    run_ranks(world, body)
    by_step = {e["step"]: e for e in volt_ckpt.scan(cluster_root)}
    assert by_step[10]["synchronized"]
    assert (by_step[20]["synchronized"], by_step[20]["reason"], by_step[20]["shards_present"]) == (
        False, "no manifest", 1)  # fmt: skip
    assert volt_ckpt.latest_synchronized(cluster_root)["step"] == 10
    with pytest.raises(volt_ckpt.CheckpointError, match="no manifest"):
        volt_ckpt.load(by_step[20]["path"])


def test_a_changed_shard_is_caught_by_the_scan_or_by_the_hash_of_what_was_downloaded(cluster_root):
    gather = thread_gather(1)
    volt_ckpt.save(cluster_root, 5, shard_of(0, 5, 0.25), rank=0, world_size=1, gather=gather)
    volt_ckpt.wait_uploads(cluster_root)
    path = f"{cluster_root}/step-00000005"
    store = volt_store.Store.from_env()
    manifest = volt_ckpt.read_manifest(path)
    entry = manifest["shards"][0]
    shard_url = f"{path}/{entry['file']}"
    original = store.get_bytes(shard_url)
    flipped = bytes([original[0] ^ 1]) + original[1:]

    # The bytes changed and the object says so (its recorded checksum is that of the new bytes).
    store.put_bytes(shard_url, flipped, hashlib.sha256(flipped).hexdigest())
    assert volt_ckpt.scan(cluster_root)[0]["reason"] == f"{entry['file']} checksum mismatch"

    # The bytes changed but the object claims the old checksum: the listing cannot tell, the load can.
    store.put_bytes(shard_url, flipped, entry["sha256"])
    assert volt_ckpt.scan(cluster_root)[0]["synchronized"]
    with pytest.raises(volt_ckpt.CheckpointError, match="checksum mismatch"):
        volt_ckpt.load(path)

    store.put_bytes(shard_url, original, entry["sha256"])
    _, shards = volt_ckpt.load(path)
    assert torch.equal(shards[0]["weights"], shard_of(0, 5, 0.25)["weights"])


def test_another_clusters_key_is_refused_by_the_store_itself(cluster_root, store_admin):
    gather = thread_gather(1)
    volt_ckpt.save(cluster_root, 3, {"w": torch.ones(4)}, rank=0, world_size=1, gather=gather)
    volt_ckpt.wait_uploads(cluster_root)
    name = f"volt-test-{uuid.uuid4().hex[:8]}"
    other = store_admin.grant(name, f"tests/{name}/")
    try:
        theirs = volt_store.Store(other.endpoint, other.region, other.access_key, other.secret_key)
        with pytest.raises(volt_store.StoreError, match="AccessDenied"):
            volt_ckpt.scan(cluster_root, store=theirs)
        with pytest.raises(volt_store.StoreError, match="AccessDenied"):
            theirs.get_bytes(f"{cluster_root}/step-00000003/manifest.json")
    finally:
        store_admin.revoke(name)


def test_a_store_root_without_credentials_says_what_is_missing(monkeypatch):
    for var in volt_store.ENV:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(volt_store.StoreError, match="VOLT_STORE_ENDPOINT, VOLT_STORE_ACCESS_KEY"):
        volt_ckpt.scan("s3://volt-checkpoints/x/jobs/1/checkpoints")


# --- Volt's side: the cluster's key, the scan from Volt, retention ----------------------------------------


@pytest.fixture
def store_job(store_admin, settings, team_a, alice, monkeypatch, tmp_path):
    """A job of a cluster that has its identity in the store (as provisioning grants it), its environment (what
    Ray gives the job) in this process's, and its checkpoint root."""
    from clusters import checkpoint_store
    from clusters.models import Cluster
    from jobs import onray
    from jobs.models import Job

    settings.VOLT_STORE_ENDPOINT, settings.VOLT_STORE_BUCKET = store_admin.endpoint, store_admin.bucket
    settings.VOLT_STORE_ACCESS_KEY, settings.VOLT_STORE_SECRET_KEY = (
        store_admin.access_key, store_admin.secret_key)  # fmt: skip
    settings.VOLT_CHECKPOINT_KEEP = 2
    cluster = Cluster.objects.create(team=team_a, created_by=alice, name="kept", status="ready",
                                     spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]})  # fmt: skip
    granted = store_admin.grant(checkpoint_store.identity_name(cluster), checkpoint_store.prefix(cluster))
    from voltweb import crypto

    Cluster.objects.filter(pk=cluster.pk).update(
        store_access_key=granted.access_key, store_secret_key_encrypted=crypto.encrypt(granted.secret_key)
    )
    cluster.refresh_from_db()
    job = Job.objects.create(cluster=cluster, team=team_a, created_by=alice, entrypoint="python t.py")
    for name, value in checkpoint_store.job_environment(cluster).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("VOLT_CHECKPOINT_STAGING_DIR", str(tmp_path / "staging"))
    root = onray.checkpoint_dir(job)
    assert (
        root
        == f"s3://{store_admin.bucket}/clusters/{checkpoint_store.identity_name(cluster)}/jobs/{job.pk}/checkpoints"
    )
    yield job, root
    checkpoint_store.revoke_identity(cluster)
    assert checkpoint_store.identity_name(cluster) not in store_admin.identities()


def test_a_key_the_store_did_not_revoke_at_the_end_is_revoked_by_the_leftovers_reaper(
    store_job, store_admin, settings
):
    from clusters import checkpoint_store
    from clusters.tasks import reap_cluster_leftovers

    job, root = store_job
    cluster = job.cluster
    cluster_store = volt_store.Store.from_env()  # the key the cluster's jobs hold
    cluster_store.put_bytes(f"{root}/note.txt", b"written while the cluster ran")
    cluster.status = "terminated"
    cluster.save(update_fields=["status"])

    settings.VOLT_STORE_ENDPOINT = "http://127.0.0.1:9"  # the store does not answer the final teardown
    problems = checkpoint_store.revoke_identity(cluster)
    assert problems and checkpoint_store.identity_name(cluster) in problems[0], problems
    assert reap_cluster_leftovers.apply().get()["store_keys_revoked"] == 0  # still down: still pending
    cluster.refresh_from_db()
    assert cluster.store_secret_key_encrypted, "the secret stays until the store has revoked the key"
    assert cluster_store.get_bytes(f"{root}/note.txt") == b"written while the cluster ran"  # it still works

    settings.VOLT_STORE_ENDPOINT = store_admin.endpoint  # back
    assert reap_cluster_leftovers.apply().get()["store_keys_revoked"] == 1
    cluster.refresh_from_db()
    assert cluster.store_secret_key_encrypted == "" and cluster.store_access_key  # the key id stays, a record
    assert checkpoint_store.identity_name(cluster) not in store_admin.identities()
    with pytest.raises(volt_store.StoreError):
        cluster_store.get_bytes(f"{root}/note.txt")
    assert cluster.events.filter(
        message="checkpoint store key revoked (the store did not answer at the end)"
    ).exists()
    assert reap_cluster_leftovers.apply().get()["store_keys_revoked"] == 0  # done: not tried again


def test_retention_keeps_the_last_k_synchronized_and_drops_incomplete_ones_that_cannot_complete(
    store_job, settings
):
    from datetime import timedelta

    from django.utils import timezone

    from jobs import checkpoints

    job, root = store_job
    gather = thread_gather(1)
    for step in (10, 20, 30, 40):
        volt_ckpt.save(root, step, shard_of(0, step, 0.1), rank=0, world_size=1, gather=gather)
    volt_ckpt.wait_uploads(root)
    store = checkpoints.store_client(job.cluster)
    store.put_bytes(f"{root}/step-00000050/shard-00000-of-00002.pt", b"half of a checkpoint")  # no manifest
    # Left by a failed attempt: older than the latest synchronized step, so no run will ever finish it.
    store.put_bytes(f"{root}/step-00000035/shard-00000-of-00002.pt", b"the rest never came")
    job.resume_from = f"{root}/step-00000010"  # the running attempt resumed from it: kept while it runs
    job.status = "running"
    job.save(update_fields=["resume_from", "status"])

    rows = {c.step: c for c in checkpoints.rescan_checkpoints(job)}
    assert [s for s, c in sorted(rows.items()) if c.synchronized] == [10, 30, 40]
    assert rows[20].reason == "removed by retention: the job keeps its last 2 synchronized checkpoints"
    assert rows[35].reason == "removed by retention: incomplete, and older than step 40 (no manifest)"
    assert not rows[50].synchronized and rows[50].reason == "no manifest"  # the live job may be uploading it
    assert [e["step"] for e in volt_ckpt.scan(root)] == [10, 30, 40, 50]
    assert job.events.filter(
        message="checkpoint retention removed step-00000020, step-00000035 from the store"
    ).exists()

    # Old as it is, a live job's newest incomplete checkpoint stays; once the job has ended, it goes, and the
    # job keeps exactly its last K: the checkpoint it resumed from is no longer needed.
    job.checkpoints.filter(step=50).update(discovered_at=timezone.now() - timedelta(hours=2))
    assert {c.step: c for c in checkpoints.rescan_checkpoints(job)}[50].reason == "no manifest"
    job.status = "failed"
    job.save(update_fields=["status"])
    rows = {c.step: c for c in checkpoints.rescan_checkpoints(job)}
    assert rows[50].reason == "removed by retention: incomplete for more than 3600 s (no manifest)"
    assert rows[20].reason.startswith("removed by retention")  # not "no longer in its storage"
    assert rows[10].reason == "removed by retention: the job keeps its last 2 synchronized checkpoints"
    assert [e["step"] for e in volt_ckpt.scan(root)] == [30, 40]
    assert checkpoints.checkpoint_location(rows[40]) == f"{root}/step-00000040"


def test_the_team_downloads_a_checkpoint_from_the_store_as_a_tar_also_after_the_cluster_ended(
    store_job, alice, root
):
    import tarfile

    from rest_framework.test import APIClient

    from clusters import checkpoint_store
    from jobs import checkpoints

    job, path_root = store_job
    gather = thread_gather(2)
    run_ranks(2, lambda rank: (
        volt_ckpt.save(path_root, 10, shard_of(rank, 10, 0.2), rank=rank, world_size=2, gather=gather),
        volt_ckpt.wait_uploads(path_root, rank)))  # fmt: skip
    rows = {c.step: c for c in checkpoints.rescan_checkpoints(job)}
    job.checkpoints.create(path="/storage/jobs/x/checkpoints/step-00000004", step=4, synchronized=True)
    checkpoint_store.revoke_identity(job.cluster)  # the cluster ended: its key went, its checkpoints did not
    rows = {
        c.step: c for c in checkpoints.rescan_checkpoints(job)
    }  # no key to look with: rows stay as they were
    assert rows[10].synchronized and rows[10].path.startswith("s3://")

    api = APIClient()
    api.force_authenticate(alice)
    listed = {c["step"]: c for c in api.get(f"/api/v1/jobs/{job.pk}/checkpoints/").json()["results"]}
    assert listed[10]["location"] == rows[10].path and listed[10]["download"].endswith(
        "/checkpoints/10/download/"
    )
    assert listed[4]["download"] is None
    response = api.get(listed[10]["download"])
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Disposition"] == f'attachment; filename="job-{job.pk}-step-00000010.tar"'
    archive = tarfile.open(fileobj=io.BytesIO(b"".join(response.streaming_content)))
    names = archive.getnames()
    assert names == ["step-00000010/manifest.json", "step-00000010/shard-00000-of-00002.pt",
                     "step-00000010/shard-00001-of-00002.pt"]  # fmt: skip
    folder = Path(tempfile.mkdtemp())
    archive.extractall(folder, filter="data")
    _, shards = volt_ckpt.load(folder / "step-00000010")  # the manifest and its checksums hold
    assert torch.equal(shards[1]["weights"], shard_of(1, 10, 0.2)["weights"])

    refused = api.get(f"/api/v1/jobs/{job.pk}/checkpoints/4/download/")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "not_downloadable"
    assert "shared storage" in refused.json()["error"]["message"]
    admin = APIClient()
    admin.force_authenticate(root)  # a platform admin sees the job, but the checkpoint is the team's
    assert admin.get(listed[10]["download"]).status_code == 403
    assert api.get(f"/api/v1/jobs/{job.pk}/checkpoints/99999999999/download/").status_code == 404


def test_a_shard_left_by_an_earlier_attempt_at_the_same_step_is_never_taken_for_this_saves(
    cluster_root, monkeypatch
):
    """A resumed run saves step 20 again where the failed attempt left rank 1's shard: rank 0 waits for the
    shard of *this* save (its token on the object), not the old one already there."""
    store = volt_store.Store.from_env()
    stale = b"rank 1's shard of the attempt that failed"
    store.put_bytes(
        f"{cluster_root}/step-00000020/shard-00001-of-00002.pt", stale, hashlib.sha256(stale).hexdigest()
    )
    real_upload = volt_store.Store.upload_file

    def slow(self, path, url, sha256, **metadata):
        if url.endswith("shard-00001-of-00002.pt"):
            import time

            time.sleep(1.5)  # rank 1's upload lands well after rank 0 first looks
        return real_upload(self, path, url, sha256, **metadata)

    monkeypatch.setattr(volt_store.Store, "upload_file", slow)
    gather = thread_gather(2)

    def body(rank: int) -> None:
        volt_ckpt.save(cluster_root, 20, shard_of(rank, 20, 0.25), rank=rank, world_size=2, gather=gather)
        volt_ckpt.wait_uploads(cluster_root, rank)

    run_ranks(2, body)
    _, shards = volt_ckpt.load(f"{cluster_root}/step-00000020")  # hashes what it downloads
    assert torch.equal(shards[1]["weights"], shard_of(1, 20, 0.25)["weights"])
