"""volt_upload: volt_ckpt's saves into Volt's checkpoint store, in the background.

Runs ON a cluster, shipped next to volt_ckpt.py (which calls it for an `s3://` root; jobs call volt_ckpt).
What a save holds training for: a copy of the rank's state in memory and an exchange of names, which is the
barrier (every rank has its copy, every rank's previous upload is over). Then, in threads of their own:

- each rank's upload: the copy serialized to a local staging file, hashed, uploaded (multipart when large)
  with its sha256 and rank 0's token for this save on the object;
- on rank 0, the manifest: written once every rank's shard of this save is in the store with its size and
  checksum. The next save's exchange settles it (every upload is over by then), so a rank whose upload
  failed never holds the others in a collective; `finish_uploads` is the last barrier.

A machine lost mid-upload leaves that checkpoint without a manifest: never synchronized.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

if __package__:  # inside Volt (jobs.workloads): the package's volt_ckpt, never a second copy
    from . import volt_ckpt as ck
else:  # shipped next to volt_ckpt.py in the job's working dir
    import volt_ckpt as ck  # type: ignore[no-redef]

# How long rank 0 waits for every rank's upload before it gives up on the manifest.
UPLOAD_TIMEOUT_S = float(os.environ.get("VOLT_CHECKPOINT_UPLOAD_TIMEOUT_S") or 900)

_uploads: dict[tuple[str, int], threading.Thread] = {}  # (root, rank): that rank's shard upload
_watchers: dict[str, tuple[threading.Thread, threading.Event]] = {}  # root: rank 0's wait for the manifest
_uploads_lock = threading.Lock()


def _join_upload(root: str, rank: int) -> None:
    with _uploads_lock:
        thread = _uploads.get((root, rank))
    if thread is not None:
        thread.join()
        with _uploads_lock:
            if _uploads.get((root, rank)) is thread:
                del _uploads[(root, rank)]


def _join_watcher(root: str, settle: bool) -> None:
    """Rank 0's manifest wait under `root`; `settle`: every rank's upload is over (a barrier passed since), so
    one more look decides it."""
    with _uploads_lock:
        found = _watchers.get(root)
    if found is None:
        return
    thread, settled = found
    if settle:
        settled.set()
    thread.join()
    with _uploads_lock:
        if _watchers.get(root) is found:
            del _watchers[root]


def wait_uploads(root: str | os.PathLike | None = None, rank: int | None = None) -> None:
    """Until the background uploads (of `root` and `rank`, default all) are over and, on rank 0, the manifest
    is written or given up (which may take VOLT_CHECKPOINT_UPLOAD_TIMEOUT_S when a rank's shard never comes:
    ranks that can meet use `finish_uploads`)."""
    with _uploads_lock:
        keys = [k for k in _uploads if (root is None or k[0] == str(root)) and (rank is None or k[1] == rank)]
        watched = [r for r in _watchers if root is None or r == str(root)] if rank in (None, 0) else []
    for key in keys:
        _join_upload(*key)
    for watched_root in watched:
        _join_watcher(watched_root, settle=False)


def finish_uploads(
    root: str | os.PathLike, rank: int, world_size: int, gather: Callable[[Any], list[Any]] | None = None
) -> None:
    """At the end of training, every rank: its last upload done, then a barrier, so rank 0 knows every shard
    that will ever arrive has, and writes the last manifest or gives up at once. Nothing on shared storage."""
    if not ck.is_store(root):
        return
    _join_upload(str(root), rank)
    (gather or ck.default_gather(world_size))({"rank": int(rank), "done": True})
    if rank == 0:
        _join_watcher(str(root), settle=True)


def save_to_store(root, step, shard, rank, world_size, meta, gather, on_synchronized) -> None:
    """The store's save: what holds training is a copy of the shard in memory and an exchange of names (which
    is the barrier: every rank has its copy, and every rank's previous upload is over); writing, hashing and
    uploading run in a thread of their own, and on rank 0 another waits for every shard, then writes the
    manifest."""
    import torch

    started = time.time()
    root = str(root)
    _join_upload(root, rank)  # this rank's previous upload: the one wait a step may have
    # The state as it is now (training may change it once this returns), serialized here: a deep copy that the
    # upload thread would serialize costs less here, but more to training, whose Python the serializing
    # thread then holds back (bench/checkpoint.py: +7-8 % a step against +5 %).
    payload = io.BytesIO()
    torch.save(shard, payload)
    name = ck.shard_file_name(rank, world_size)
    # Rank 0's token names this save on every shard's object: a shard left by an earlier attempt at the
    # same step is never taken for this one's.
    entries = ck.ranks_in_order(
        (gather or ck.default_gather(world_size))({"rank": int(rank), "file": name, "save": os.urandom(8).hex()}),
        rank, world_size,
    )  # fmt: skip
    save_id = next(entry["save"] for entry in entries if entry["rank"] == 0)
    upload = threading.Thread(target=_upload, name=f"volt-ckpt-upload-{rank}", daemon=True,
                              args=(root, int(step), name, payload, save_id))  # fmt: skip
    with _uploads_lock:
        _uploads[(root, int(rank))] = upload
    upload.start()
    if rank != 0:
        return
    _join_watcher(root, settle=True)  # every rank's previous upload is over: that manifest is decided
    manifest = {"format": ck.FORMAT, "step": int(step), "world_size": int(world_size), "created": None,
                "save_s": round(time.time() - started, 6), "upload_s": None,
                "shards": [{"rank": e["rank"], "file": e["file"]} for e in entries], "meta": dict(meta or {})}  # fmt: skip
    settled = threading.Event()
    watcher = threading.Thread(target=_write_manifest, name="volt-ckpt-manifest", daemon=True,
                               args=(root, save_id, manifest, settled, on_synchronized))  # fmt: skip
    with _uploads_lock:
        _watchers[root] = (watcher, settled)
    watcher.start()


def _upload(root: str, step: int, name: str, payload: io.BytesIO, save_id: str) -> None:
    """One rank's shard (its bytes): written to the staging folder, hashed, uploaded with the save's token.
    Never raises: a shard that fails here leaves its checkpoint without a manifest, and training goes on."""
    local = ck.staging_dir(root) / ck.step_dir_name(step) / f"{name}.{save_id}"
    tmp = local.with_name(f".{local.name}.tmp")
    _yield_cpu()
    try:
        local.parent.mkdir(parents=True, exist_ok=True)
        # No fsync: the staging copy is a way station, the store's copy is the durable one (a machine that
        # loses it mid-way leaves the checkpoint without a manifest, as when it dies).
        tmp.write_bytes(payload.getbuffer())
        payload.close()
        os.replace(tmp, local)
        digest = ck.sha256_file(local)
        store = ck.env_store()
        store.upload_file(local, f"{ck.checkpoint_path(root, step)}/{name}", digest, save=save_id)
    except Exception as error:  # noqa: BLE001 - a failed checkpoint must not stop training
        print(f"volt_ckpt: step {step} {name}: upload failed: {error}", file=sys.stderr, flush=True)
    finally:
        tmp.unlink(missing_ok=True)
        local.unlink(missing_ok=True)
        try:
            local.parent.rmdir()
        except OSError:
            pass


def _yield_cpu() -> None:
    """This thread only (Linux: a thread's own nice value): training's threads come first for the CPU."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


def _write_manifest(
    root: str, save_id: str, manifest: dict, settled: threading.Event, on_synchronized
) -> None:
    """Rank 0: once every rank's shard of this save is in the store (sizes and checksums as their uploaders
    recorded them), the manifest. Gives up when `settled` (every upload is over) and a shard is still
    missing, or after UPLOAD_TIMEOUT_S. Never raises."""
    step, started = manifest["step"], time.time()
    folder = ck.checkpoint_path(root, step)
    try:
        store = ck.env_store()
        found: dict[str, tuple[int, str]] = {}
        deadline, pause = time.monotonic() + UPLOAD_TIMEOUT_S, 0.1
        while True:
            last_look = settled.is_set()
            for entry in manifest["shards"]:
                if entry["file"] in found:
                    continue
                try:
                    info = store.info(f"{folder}/{entry['file']}")
                except Exception:  # noqa: BLE001 - a store that blinks is asked again
                    info = None
                if info is not None and info[1].get("save") == save_id and info[1].get("sha256"):
                    found[entry["file"]] = (info[0], info[1]["sha256"])
            missing = [e["file"] for e in manifest["shards"] if e["file"] not in found]
            if not missing:
                break
            if last_look or time.monotonic() > deadline:
                why = "every upload is over" if last_look else f"{UPLOAD_TIMEOUT_S:g} s passed"
                print(f"volt_ckpt: step {step}: {len(missing)} shard(s) not in the store ({missing[0]} first) "
                      f"and {why}; no manifest written", file=sys.stderr, flush=True)  # fmt: skip
                return
            settled.wait(pause)
            # Quick looks while uploads usually end (the manifest's time is the checkpoint's upload time),
            # then one a second.
            pause = min(0.25 if time.time() - started < 15 else 1.0, pause * 1.5)
        for entry in manifest["shards"]:
            entry["bytes"], entry["sha256"] = found[entry["file"]]
        manifest["created"] = time.time()
        manifest["upload_s"] = round(manifest["created"] - started, 6)
        body = json.dumps(manifest, indent=1).encode()
        store.put_bytes(f"{folder}/{ck.MANIFEST}", body, hashlib.sha256(body).hexdigest())
        if on_synchronized is not None:
            on_synchronized(manifest, folder)
    except Exception as error:  # noqa: BLE001 - a failed checkpoint must not stop training
        print(f"volt_ckpt: step {step}: no manifest written: {error}", file=sys.stderr, flush=True)
