"""Damaging a job's checkpoints as a failure would, wherever they are: folders on shared storage, or
objects in the checkpoint store (CI runs with a store: scripts/test starts one, so local clusters use it)."""

from __future__ import annotations

import shutil
from pathlib import Path

from jobs import checkpoints
from jobs.workloads import volt_ckpt, volt_store


def _client(job):
    client = checkpoints.store_client(job.cluster)
    assert client is not None, "the cluster has no key in the checkpoint store"
    return client


def shard_names(job, path: str) -> list[str]:
    if volt_ckpt.is_store(path):
        return sorted(name for name in _client(job).listing(path)[1] if volt_ckpt.SHARD_RE.match(name))
    return sorted(p.name for p in Path(path).glob("shard-*.pt"))


def remove_manifest(job, path: str) -> None:
    if volt_ckpt.is_store(path):
        bucket, key = volt_store.split(f"{path}/{volt_ckpt.MANIFEST}")
        _client(job).client.delete_object(Bucket=bucket, Key=key)
    else:
        (Path(path) / volt_ckpt.MANIFEST).unlink()


def truncate_shard(job, path: str, name: str, keep: int = 10) -> None:
    if volt_ckpt.is_store(path):
        client = _client(job)
        client.put_bytes(f"{path}/{name}", client.get_bytes(f"{path}/{name}")[:keep])
    else:
        shard = Path(path) / name
        shard.write_bytes(shard.read_bytes()[:keep])


def copy_shard_without_manifest(job, source: str, target: str, name: str) -> None:
    """`target` gets one shard of `source` and no manifest: a checkpoint a failure caught half-written."""
    if volt_ckpt.is_store(source):
        client = _client(job)
        client.put_bytes(f"{target}/{name}", client.get_bytes(f"{source}/{name}"))
    else:
        Path(target).mkdir()
        shutil.copyfile(Path(source) / name, Path(target) / name)


def synchronized_paths(job) -> list[str]:
    """The job's synchronized checkpoints, oldest first, as the scan finds them."""
    return [entry["path"] for entry in checkpoints.scan_storage(job) if entry["synchronized"]]
