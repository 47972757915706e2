"""volt_ckpt: sharded checkpoints with a manifest written last, on shared storage or in Volt's store.

Runs ON a cluster, shipped next to every job's entrypoint (plain Python: the standard library, and
torch only inside the functions that save, load or time tensors; no Django, nothing of Volt).

Checkpoint protocol (one folder per step under the job's `VOLT_CHECKPOINT_DIR`):

    step-00000040/
        shard-00000-of-00002.pt     every rank writes its own shard (tmp file, fsync, rename)
        shard-00001-of-00002.pt
        manifest.json               rank 0 writes it LAST, after a barrier (gather of every rank's
                                    file name, size and sha256), by tmp file + fsync + os.replace

A checkpoint is *synchronized* only when its manifest is present and every shard it lists is
present with the listed size and checksum. A checkpoint cut short by a failure (some shards, no
manifest), a truncated shard or a flipped byte is never synchronized, so never resumed from.

    save(root, step, shard, rank=r, world_size=n)   every rank calls it at the same step
    load(path)                                      every shard object, rank order (verifies first)
    scan(root) / latest_synchronized(root)          what Volt and resuming jobs read
    python volt_ckpt.py scan DIR                    the same, as JSON

In the store: a root `s3://bucket/prefix` (Volt's checkpoint store, through volt_store.py beside this
file) keeps the same layout as objects. `save` holds training only for a copy of the rank's state in memory
and an exchange of names; the shard goes up in the background (a thread of its own), and rank 0
writes the manifest only once every listed shard is in the store with its size and checksum. The next
`save` of the same rank first waits for its previous upload (the only time a step waits on one);
`finish_uploads()` at the end. A machine lost mid-upload leaves that checkpoint without a manifest: never
synchronized. `load` downloads the shards to the machine it runs on and hashes them before use.

Events (`VOLT_EVENT <json>` lines: emit, parse_event, ...) and the all-reduce timer (AllReduceTimer) live
in volt_events.py, shipped beside this file; their names still answer here (`volt_ckpt.emit_step`).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FORMAT = "volt-ckpt/1"
MANIFEST = "manifest.json"
STEP_DIR_RE = re.compile(r"^step-(\d+)$")
SHARD_RE = re.compile(r"^shard-(\d{5})-of-(\d{5})\.pt$")
# How long rank 0 waits for every rank's shard to be visible on shared storage before it gives up
# on the manifest (the checkpoint then stays unsynchronized; training goes on).
SHARD_VISIBLE_TIMEOUT_S = 10.0


class CheckpointError(Exception):
    """A checkpoint that cannot be used (not synchronized, unreadable); the message says why."""


# --------------------------------------------------------------------------------------- layout


def step_dir_name(step: int) -> str:
    """`step-00000040`: the folder of one checkpoint."""
    return f"step-{int(step):08d}"


def shard_file_name(rank: int, world_size: int) -> str:
    """`shard-00001-of-00002.pt`: rank 1's shard of a 2-rank checkpoint."""
    return f"shard-{int(rank):05d}-of-{int(world_size):05d}.pt"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename is still atomic
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so readers see the old file, no file, or all of the new one."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------- save


def _default_gather(world_size: int) -> Callable[[Any], list[Any]]:
    """all_gather_object over the default torch.distributed group (a barrier as well)."""

    def gather(obj: Any) -> list[Any]:
        if world_size == 1:
            return [obj]
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise CheckpointError(
                f"world_size is {world_size} but torch.distributed is not initialized: pass gather="
            )
        return _all_gather_json(obj, world_size)

    return gather


def _all_gather_json(obj: Any, world_size: int) -> list[Any]:
    """Every rank's JSON-able `obj` (all_gather of padded byte tensors; needs no numpy, unlike
    torch's all_gather_object)."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    data = json.dumps(obj).encode()
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world_size)]
    dist.all_gather(sizes, size)
    longest = max(int(s.item()) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8, device=device)
    mine[: len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    chunks = [torch.zeros_like(mine) for _ in range(world_size)]
    dist.all_gather(chunks, mine)
    return [
        json.loads(bytes(chunk[: int(n.item())].cpu().tolist()))
        for chunk, n in zip(chunks, sizes, strict=True)
    ]


def _store_module():
    try:
        import volt_store  # shipped next to this file in the job's working dir
    except ImportError:
        from . import volt_store  # type: ignore[no-redef]
    return volt_store


def is_store(root: str | os.PathLike) -> bool:
    """True when `root` is a folder in Volt's checkpoint store (`s3://...`)."""
    return str(root).startswith("s3://")


def checkpoint_path(root: str | os.PathLike, step: int) -> str:
    """Where the checkpoint of `step` under `root` is: a folder, or an `s3://` prefix."""
    if is_store(root):
        return str(root).rstrip("/") + "/" + step_dir_name(step)
    return os.path.join(str(root), step_dir_name(step))


def staging_dir(root: str | os.PathLike) -> Path:
    """This machine's folder for shards on their way to or from the store root `root`."""
    base = os.environ.get("VOLT_CHECKPOINT_STAGING_DIR") or tempfile.gettempdir()
    return Path(base) / f"volt-ckpt-{hashlib.sha1(str(root).encode()).hexdigest()[:12]}"


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
    if not is_store(root):
        return
    _join_upload(str(root), rank)
    (gather or _default_gather(world_size))({"rank": int(rank), "done": True})
    if rank == 0:
        _join_watcher(str(root), settle=True)


def _save_to_store(root, step, shard, rank, world_size, meta, gather, on_synchronized) -> None:
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
    name = shard_file_name(rank, world_size)
    # Rank 0's token names this save on every shard's object: a shard left by an earlier attempt at the
    # same step is never taken for this one's.
    entries = _ranks_in_order(
        (gather or _default_gather(world_size))({"rank": int(rank), "file": name, "save": os.urandom(8).hex()}),
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
    manifest = {"format": FORMAT, "step": int(step), "world_size": int(world_size), "created": None,
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
    local = staging_dir(root) / step_dir_name(step) / f"{name}.{save_id}"
    tmp = local.with_name(f".{local.name}.tmp")
    _yield_cpu()
    try:
        local.parent.mkdir(parents=True, exist_ok=True)
        # No fsync: the staging copy is a way station, the store's copy is the durable one (a machine that
        # loses it mid-way leaves the checkpoint without a manifest, as when it dies).
        tmp.write_bytes(payload.getbuffer())
        payload.close()
        os.replace(tmp, local)
        digest = _sha256_file(local)
        store = _env_store()
        store.upload_file(local, f"{checkpoint_path(root, step)}/{name}", digest, save=save_id)
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
    folder = checkpoint_path(root, step)
    try:
        store = _env_store()
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
        store.put_bytes(f"{folder}/{MANIFEST}", body, hashlib.sha256(body).hexdigest())
        if on_synchronized is not None:
            on_synchronized(manifest, folder)
    except Exception as error:  # noqa: BLE001 - a failed checkpoint must not stop training
        print(f"volt_ckpt: step {step}: no manifest written: {error}", file=sys.stderr, flush=True)


def save(
    root: str | os.PathLike,
    step: int,
    shard: Any,
    *,
    rank: int,
    world_size: int,
    meta: dict[str, Any] | None = None,
    gather: Callable[[Any], list[Any]] | None = None,
    on_synchronized: Callable[[dict[str, Any], str], Any] | None = None,
) -> dict[str, Any] | None:
    """Save this rank's `shard` (any object torch.save takes) of the checkpoint at `step`.

    Every rank calls it at the same step. Each writes its shard atomically, then all ranks exchange
    (file, bytes, sha256) through `gather` (default: torch.distributed.all_gather_object, which is
    also the barrier); rank 0 then checks every shard is visible and writes the manifest last, and
    calls `on_synchronized(manifest, path)`. Returns the manifest on rank 0 (None when it could not be
    written), None on other ranks. In the store (`s3://` root) the upload and the manifest happen in the
    background: it returns None at once, and `on_synchronized` runs once the manifest is in the store.
    """
    import torch

    if is_store(root):
        _save_to_store(root, step, shard, rank, world_size, meta, gather, on_synchronized)
        return None
    started = time.time()
    folder = Path(root) / step_dir_name(step)
    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(shard, buffer)
    data = buffer.getvalue()
    name = shard_file_name(rank, world_size)
    write_atomic(folder / name, data)
    mine = {"rank": int(rank), "file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    entries = _ranks_in_order((gather or _default_gather(world_size))(mine), rank, world_size)
    if rank != 0:
        return None
    if not _wait_visible(folder, entries):
        print(f"volt_ckpt: step {step}: not every shard is visible in {folder}; no manifest written",
              file=sys.stderr, flush=True)  # fmt: skip
        return None
    manifest = {"format": FORMAT, "step": int(step), "world_size": int(world_size), "created": time.time(),
                "save_s": None, "shards": entries, "meta": dict(meta or {})}  # fmt: skip
    # How long the save held training (rank 0's clock: its shard, the exchange that waits for every
    # rank's, the visibility check): Volt's goodput ledger counts it as checkpoint time.
    manifest["save_s"] = round(manifest["created"] - started, 6)
    write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1).encode())
    if on_synchronized is not None:
        on_synchronized(manifest, checkpoint_path(root, step))
    return manifest


def _ranks_in_order(entries: list[dict[str, Any]], rank: int, world_size: int) -> list[dict[str, Any]]:
    entries = sorted(entries, key=lambda entry: entry["rank"])
    if rank == 0 and [entry["rank"] for entry in entries] != list(range(world_size)):
        raise CheckpointError(
            f"gathered shards of ranks {[e['rank'] for e in entries]}, not 0..{world_size - 1}"
        )
    return entries


def _wait_visible(folder: Path, entries: list[dict[str, Any]]) -> bool:
    """True once every listed shard has its size on (possibly lagging) shared storage."""
    deadline = time.monotonic() + SHARD_VISIBLE_TIMEOUT_S
    while True:
        try:
            if all((folder / e["file"]).stat().st_size == e["bytes"] for e in entries):
                return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


# ----------------------------------------------------------------------------------- verify/scan


def parse_manifest(text: bytes | str | None) -> dict[str, Any]:
    """The manifest in `text` (None: there is none); CheckpointError if absent or unreadable."""
    if text is None:
        raise CheckpointError("no manifest")
    try:
        manifest = json.loads(text)
    except ValueError as error:
        raise CheckpointError(f"manifest unreadable: {error}") from None
    if not isinstance(manifest, dict):
        raise CheckpointError("manifest unreadable: not a JSON object")
    return manifest


def read_manifest(path: str | os.PathLike, *, store: Any = None) -> dict[str, Any]:
    """The manifest of the checkpoint folder (or store prefix) `path`; CheckpointError if absent or unreadable."""
    if is_store(path):
        return parse_manifest(_client(store).get_bytes(f"{str(path).rstrip('/')}/{MANIFEST}"))
    try:
        return parse_manifest((Path(path) / MANIFEST).read_bytes())
    except FileNotFoundError:
        raise CheckpointError("no manifest") from None
    except OSError as error:
        raise CheckpointError(f"manifest unreadable: {error}") from None


def _client(store: Any) -> Any:
    return store if store is not None else _env_store()


_env_stores: dict[tuple, Any] = {}
_env_lock = threading.Lock()


def _env_store() -> Any:
    """The store of this process's environment, one client kept (making a boto3 client loads its service
    models: a quarter second of CPU that every upload would take from training)."""
    volt_store = _store_module()
    key = tuple(os.environ.get(name, "") for name in volt_store.ENV)
    with _env_lock:
        if key not in _env_stores:
            store = volt_store.Store.from_env()
            store.client  # noqa: B018 - made here, under the lock, once
            _env_stores[key] = store
        return _env_stores[key]


def check_manifest(
    manifest: dict[str, Any], folder_name: str, shard: Callable[[str, int], tuple[int, str] | None]
) -> str:
    """Why the checkpoint `manifest` describes is not synchronized ("" when it is). `shard(file, expected
    bytes)` says what is there: None when missing, else (size, sha256; "" when not checked)."""
    if manifest.get("format") != FORMAT:
        return f"unknown manifest format {manifest.get('format')!r} (expected {FORMAT})"
    match = STEP_DIR_RE.match(folder_name)
    if match and manifest.get("step") != int(match.group(1)):
        return f"manifest says step {manifest.get('step')}, folder is {folder_name}"
    shards, world = manifest.get("shards"), manifest.get("world_size")
    if not isinstance(world, int) or not isinstance(shards, list) or len(shards) != world or world < 1:
        return f"manifest lists {len(shards) if isinstance(shards, list) else 'no'} shards for world size {world}"
    for entry in shards:
        try:
            name, expected, digest = str(entry["file"]), int(entry["bytes"]), str(entry["sha256"])
        except (KeyError, TypeError, ValueError):
            return f"manifest shard entry malformed: {entry!r}"
        if "/" in name or name.startswith("."):
            return f"manifest names a file outside the checkpoint: {name!r}"
        found = shard(name, expected)
        if found is None:
            return f"{name} missing"
        size, found_digest = found
        if size < expected:
            return f"{name} truncated: {size} of {expected} bytes"
        if size != expected:
            return f"{name} is {size} bytes, manifest says {expected}"
        if found_digest and found_digest != digest:
            return f"{name} checksum mismatch"
    return ""


def verify(
    path: str | os.PathLike, *, checksums: bool = True, store: Any = None
) -> tuple[dict[str, Any] | None, str]:
    """(manifest or None, reason): reason is "" when the checkpoint at `path` is synchronized. In the store,
    each shard's size and the checksum its uploader recorded (`load` hashes what it downloads)."""
    name = str(path).rstrip("/").rsplit("/", 1)[-1]
    try:
        manifest = read_manifest(path, store=store)
    except CheckpointError as error:
        return None, str(error)
    if is_store(path):
        client = _client(store)

        def in_store(file: str, expected: int) -> tuple[int, str] | None:
            found = client.head(f"{str(path).rstrip('/')}/{file}")
            return None if found is None else (found[0], found[1] or "no checksum recorded")

        return manifest, check_manifest(manifest, name, in_store)
    folder = Path(path)

    def on_disk(file: str, expected: int) -> tuple[int, str] | None:
        try:
            size = (folder / file).stat().st_size
        except OSError:
            return None
        return size, _sha256_file(folder / file) if checksums and size == expected else ""

    return manifest, check_manifest(manifest, name, on_disk)


def _shard_bytes(folder: Path) -> tuple[int, int]:
    total = count = 0
    for child in folder.iterdir():
        if SHARD_RE.match(child.name):
            try:
                total += child.stat().st_size
                count += 1
            except OSError:
                pass
    return total, count


def scan(root: str | os.PathLike, *, checksums: bool = True, store: Any = None) -> list[dict[str, Any]]:
    """Every `step-*` checkpoint folder (or store prefix) under `root`, sorted by step, each verified.

    One dict per folder: path, step, synchronized, reason ("" when synchronized), bytes (of the
    shards present), created (the manifest's, else None), world_size (the manifest's, else None),
    save_s (how long the save held training, the manifest's, else None), upload_s (in the store: how long
    the uploads took, else None), shards_present. A missing or unreadable root is an empty list. `store`:
    a volt_store.Store (default: from the environment) for an `s3://` root.
    """
    if is_store(root):
        client = _client(store)
        folders, _ = client.listing(str(root))
        children = [(str(root).rstrip("/") + "/" + name, name) for name in folders]
    else:
        try:
            listed = list(Path(root).iterdir())
        except OSError:
            return []
        children = [(str(child), child.name) for child in listed
                    if STEP_DIR_RE.match(child.name) and child.is_dir()]  # fmt: skip
    found = []
    for path, name in children:
        match = STEP_DIR_RE.match(name)
        if not match:
            continue
        if is_store(root):
            files = client.listing(path)[1]
            if not files:  # a prefix whose objects were all removed (some stores keep it as a folder)
                continue
            sizes = [size for file, size in files.items() if SHARD_RE.match(file)]
            size, present = sum(sizes), len(sizes)
        else:
            size, present = _shard_bytes(Path(path))
        manifest, reason = verify(path, checksums=checksums, store=store)
        manifest = manifest or {}
        created = manifest.get("created")
        world = manifest.get("world_size")
        timings = {key: manifest.get(key) for key in ("save_s", "upload_s")}
        found.append({
            "path": path,
            "step": int(match.group(1)),
            "synchronized": reason == "",
            "reason": reason,
            "bytes": size,
            "created": float(created) if isinstance(created, int | float) else None,
            "world_size": world if isinstance(world, int) else None,
            **{key: float(value) if isinstance(value, int | float) and value >= 0 else None
               for key, value in timings.items()},
            "shards_present": present,
        })  # fmt: skip
    return sorted(found, key=lambda entry: (entry["step"], entry["path"]))


def latest_synchronized(root: str | os.PathLike, *, store: Any = None) -> dict[str, Any] | None:
    """The synchronized checkpoint with the highest step under `root` (a `scan` entry), or None."""
    synchronized = [entry for entry in scan(root, store=store) if entry["synchronized"]]
    return synchronized[-1] if synchronized else None


# ----------------------------------------------------------------------------------------- load


def fetch(path: str, *, store: Any = None) -> Path:
    """The checkpoint at store prefix `path`, downloaded to this machine's staging folder (manifest last)."""
    client = _client(store)
    manifest, reason = verify(path, store=client)
    if reason:
        raise CheckpointError(f"{path} is not a synchronized checkpoint: {reason}")
    assert manifest is not None
    root, name = path.rstrip("/").rsplit("/", 1)
    local = staging_dir(root) / f"fetched-{os.getpid()}-{threading.get_ident()}" / name
    local.mkdir(parents=True, exist_ok=True)
    for entry in manifest["shards"]:
        client.download_file(f"{path.rstrip('/')}/{entry['file']}", local / entry["file"])
    write_atomic(local / MANIFEST, json.dumps(manifest).encode())
    return local


def load(
    path: str | os.PathLike, *, checksums: bool = True, store: Any = None
) -> tuple[dict[str, Any], list[Any]]:
    """(manifest, every shard object in rank order) of the checkpoint at `path`.

    Refuses (CheckpointError with the reason) a checkpoint that is not synchronized. A checkpoint in the
    store is downloaded first, and what arrived is hashed against the manifest.
    """
    import torch

    if is_store(path):
        local = fetch(str(path), store=store)
        try:
            return load(local, checksums=True)
        finally:
            import shutil

            shutil.rmtree(local.parent, ignore_errors=True)
    manifest, reason = verify(path, checksums=checksums)
    if reason:
        raise CheckpointError(f"{path} is not a synchronized checkpoint: {reason}")
    assert manifest is not None
    shards = []
    for entry in sorted(manifest["shards"], key=lambda e: e["rank"]):
        with open(Path(path) / entry["file"], "rb") as handle:
            shards.append(torch.load(handle, map_location="cpu", weights_only=True))
    return manifest, shards


def step_of(path: str | os.PathLike, *, store: Any = None) -> int:
    """The step of a checkpoint folder, from its manifest."""
    return int(read_manifest(path, store=store)["step"])


# ------------------------------------------------------------------- events (volt_events.py)


def _events_module():
    try:
        import volt_events  # shipped next to this file in the job's working dir
    except ImportError:
        from . import volt_events  # type: ignore[no-redef]
    return volt_events


def __getattr__(name: str) -> Any:
    """The events and the all-reduce timer live in volt_events.py; jobs may still reach them here."""
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return getattr(_events_module(), name)
    except (ImportError, AttributeError):
        raise AttributeError(f"module 'volt_ckpt' has no attribute {name!r}") from None


# ------------------------------------------------------------------------------------------ CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Volt checkpoints: list and verify.")
    commands = parser.add_subparsers(dest="command", required=True)
    scan_parser = commands.add_parser("scan", help="every step-* checkpoint under DIR, verified, as JSON")
    scan_parser.add_argument("dir")
    scan_parser.add_argument("--no-checksums", action="store_true", help="check sizes only")
    latest_parser = commands.add_parser("latest", help="the latest synchronized checkpoint under DIR")
    latest_parser.add_argument("dir")
    args = parser.parse_args(argv)
    if args.command == "scan":
        print(json.dumps(scan(args.dir, checksums=not args.no_checksums), indent=1))
        return 0
    latest = latest_synchronized(args.dir)
    print(json.dumps(latest))
    return 0 if latest else 1


if __name__ == "__main__":
    sys.exit(main())
