"""volt_ckpt: sharded checkpoints with a manifest written last, and the job's own all-reduce bandwidth.

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

Events: the workload prints one line per event on stdout, `VOLT_EVENT <json object>`
(`emit(kind, **fields)`, `parse_event(line)`): step, busbw, checkpoint, resumed, done.
`AllReduceTimer` is a DDP communication hook that all-reduces gradient buckets as DDP's default
hook does, times them, and reports bytes, seconds and nccl-tests figures every few steps:
algbw = bytes / seconds, busbw = algbw * 2(n-1)/n.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import io
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FORMAT = "volt-ckpt/1"
MANIFEST = "manifest.json"
EVENT_PREFIX = "VOLT_EVENT "
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


def save(
    root: str | os.PathLike,
    step: int,
    shard: Any,
    *,
    rank: int,
    world_size: int,
    meta: dict[str, Any] | None = None,
    gather: Callable[[Any], list[Any]] | None = None,
) -> dict[str, Any] | None:
    """Save this rank's `shard` (any object torch.save takes) of the checkpoint at `step`.

    Every rank calls it at the same step. Each writes its shard atomically, then all ranks exchange
    (file, bytes, sha256) through `gather` (default: torch.distributed.all_gather_object, which is
    also the barrier); rank 0 then checks every shard is visible and writes the manifest last.
    Returns the manifest on rank 0 (None when it could not be written), None on other ranks.
    """
    import torch

    started = time.time()
    folder = Path(root) / step_dir_name(step)
    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(shard, buffer)
    data = buffer.getvalue()
    name = shard_file_name(rank, world_size)
    write_atomic(folder / name, data)
    mine = {"rank": int(rank), "file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    entries = (gather or _default_gather(world_size))(mine)
    if rank != 0:
        return None
    entries = sorted(entries, key=lambda entry: entry["rank"])
    if [entry["rank"] for entry in entries] != list(range(world_size)):
        raise CheckpointError(
            f"gathered shards of ranks {[e['rank'] for e in entries]}, not 0..{world_size - 1}"
        )
    if not _wait_visible(folder, entries):
        print(f"volt_ckpt: step {step}: not every shard is visible in {folder}; no manifest written",
              file=sys.stderr, flush=True)  # fmt: skip
        return None
    created = time.time()
    manifest = {
        "format": FORMAT,
        "step": int(step),
        "world_size": int(world_size),
        "created": created,
        # How long the save held training (rank 0's clock: its shard, the exchange that waits for every
        # rank's, the visibility check): Volt's goodput ledger counts it as checkpoint time.
        "save_s": round(created - started, 6),
        "shards": entries,
        "meta": dict(meta or {}),
    }
    write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1).encode())
    return manifest


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


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest of the checkpoint folder `path`; CheckpointError if absent or unreadable."""
    file = Path(path) / MANIFEST
    try:
        manifest = json.loads(file.read_text())
    except FileNotFoundError:
        raise CheckpointError("no manifest") from None
    except (OSError, ValueError) as error:
        raise CheckpointError(f"manifest unreadable: {error}") from None
    if not isinstance(manifest, dict):
        raise CheckpointError("manifest unreadable: not a JSON object")
    return manifest


def verify(path: str | os.PathLike, *, checksums: bool = True) -> tuple[dict[str, Any] | None, str]:
    """(manifest or None, reason): reason is "" when the checkpoint at `path` is synchronized."""
    folder = Path(path)
    try:
        manifest = read_manifest(folder)
    except CheckpointError as error:
        return None, str(error)
    if manifest.get("format") != FORMAT:
        return manifest, f"unknown manifest format {manifest.get('format')!r} (expected {FORMAT})"
    match = STEP_DIR_RE.match(folder.name)
    if match and manifest.get("step") != int(match.group(1)):
        return manifest, f"manifest says step {manifest.get('step')}, folder is {folder.name}"
    shards, world = manifest.get("shards"), manifest.get("world_size")
    if not isinstance(world, int) or not isinstance(shards, list) or len(shards) != world or world < 1:
        return (
            manifest,
            f"manifest lists {len(shards) if isinstance(shards, list) else 'no'} shards for world size {world}",
        )
    for entry in shards:
        try:
            name, expected, digest = str(entry["file"]), int(entry["bytes"]), str(entry["sha256"])
        except (KeyError, TypeError, ValueError):
            return manifest, f"manifest shard entry malformed: {entry!r}"
        if "/" in name or name.startswith("."):
            return manifest, f"manifest names a file outside the checkpoint: {name!r}"
        try:
            size = (folder / name).stat().st_size
        except OSError:
            return manifest, f"{name} missing"
        if size < expected:
            return manifest, f"{name} truncated: {size} of {expected} bytes"
        if size != expected:
            return manifest, f"{name} is {size} bytes, manifest says {expected}"
        if checksums and _sha256_file(folder / name) != digest:
            return manifest, f"{name} checksum mismatch"
    return manifest, ""


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


def scan(root: str | os.PathLike, *, checksums: bool = True) -> list[dict[str, Any]]:
    """Every `step-*` checkpoint folder under `root`, sorted by step, each verified.

    One dict per folder: path, step, synchronized, reason ("" when synchronized), bytes (of the
    shards present), created (the manifest's, else None), world_size (the manifest's, else None),
    save_s (how long the save took, the manifest's, else None), shards_present. A missing or unreadable root is an empty list.
    """
    base = Path(root)
    try:
        children = list(base.iterdir())
    except OSError:
        return []
    found = []
    for child in children:
        match = STEP_DIR_RE.match(child.name)
        if not match or not child.is_dir():
            continue
        manifest, reason = verify(child, checksums=checksums)
        size, present = _shard_bytes(child)
        manifest = manifest or {}
        created = manifest.get("created")
        world = manifest.get("world_size")
        save_s = manifest.get("save_s")
        found.append({
            "path": str(child),
            "step": int(match.group(1)),
            "synchronized": reason == "",
            "reason": reason,
            "bytes": size,
            "created": float(created) if isinstance(created, int | float) else None,
            "world_size": world if isinstance(world, int) else None,
            "save_s": float(save_s) if isinstance(save_s, int | float) and save_s >= 0 else None,
            "shards_present": present,
        })  # fmt: skip
    return sorted(found, key=lambda entry: (entry["step"], entry["path"]))


def latest_synchronized(root: str | os.PathLike) -> dict[str, Any] | None:
    """The synchronized checkpoint with the highest step under `root` (a `scan` entry), or None."""
    synchronized = [entry for entry in scan(root) if entry["synchronized"]]
    return synchronized[-1] if synchronized else None


# ----------------------------------------------------------------------------------------- load


def load(path: str | os.PathLike, *, checksums: bool = True) -> tuple[dict[str, Any], list[Any]]:
    """(manifest, every shard object in rank order) of the checkpoint at `path`.

    Refuses (CheckpointError with the reason) a checkpoint that is not synchronized.
    """
    import torch

    manifest, reason = verify(path, checksums=checksums)
    if reason:
        raise CheckpointError(f"{path} is not a synchronized checkpoint: {reason}")
    assert manifest is not None
    shards = []
    for entry in sorted(manifest["shards"], key=lambda e: e["rank"]):
        with open(Path(path) / entry["file"], "rb") as handle:
            shards.append(torch.load(handle, map_location="cpu", weights_only=True))
    return manifest, shards


def step_of(path: str | os.PathLike) -> int:
    """The step of a checkpoint folder, from its manifest."""
    return int(read_manifest(path)["step"])


# --------------------------------------------------------------------------------------- events


def event_line(kind: str, **fields: Any) -> str:
    """`VOLT_EVENT {"kind": ..., ...}`: one event as the line a workload prints."""
    return EVENT_PREFIX + json.dumps({"kind": kind, **fields}, separators=(", ", ": "))


def emit(kind: str, *, sink: Callable[[str], Any] | None = None, **fields: Any) -> str:
    """Print one event line on stdout (or hand it to `sink`); returns the line."""
    line = event_line(kind, **fields)
    if sink is None:
        print(line, flush=True)
    else:
        sink(line)
    return line


def emit_step(step: int, loss: float, *, sink: Callable[[str], Any] | None = None) -> str:
    return emit("step", sink=sink, step=int(step), loss=float(loss), time=time.time())


def emit_checkpoint(
    step: int, path: str, manifest: dict[str, Any] | None = None, *, sink: Callable[[str], Any] | None = None
) -> str:
    """A synchronized checkpoint: its step and folder, and with its `manifest` how many shards and bytes."""
    fields: dict[str, Any] = {"step": int(step), "path": str(path)}
    if manifest is not None:
        shards = manifest.get("shards") or []
        fields.update(shards=len(shards), bytes=sum(int(s.get("bytes") or 0) for s in shards))
    return emit("checkpoint", sink=sink, **fields)


def emit_resumed(step: int, path: str, *, sink: Callable[[str], Any] | None = None) -> str:
    return emit("resumed", sink=sink, step=int(step), path=str(path))


def emit_done(step: int, params_sha256: str, *, sink: Callable[[str], Any] | None = None) -> str:
    return emit("done", sink=sink, step=int(step), params_sha256=params_sha256)


def busbw_fields(step: int, nbytes: int, seconds: float, world_size: int) -> dict[str, Any]:
    """nccl-tests figures of all-reduces that moved `nbytes` (message bytes) in `seconds`."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    factor = 2 * (world_size - 1) / world_size if world_size > 0 else 0.0
    return {"step": int(step), "bytes": int(nbytes), "seconds": float(seconds), "algbw_gbps": algbw,
            "busbw_gbps": algbw * factor, "world_size": int(world_size)}  # fmt: skip


def emit_busbw(step: int, nbytes: int, seconds: float, world_size: int, *,
               sink: Callable[[str], Any] | None = None) -> str:  # fmt: skip
    return emit("busbw", sink=sink, **busbw_fields(step, nbytes, seconds, world_size))


def parse_event(line: str) -> dict[str, Any] | None:
    """The event of one log line (`VOLT_EVENT {...}`, possibly after a log prefix), else None."""
    if not isinstance(line, str):
        return None
    index = line.find(EVENT_PREFIX)
    if index < 0:
        return None
    try:
        event = json.loads(line[index + len(EVENT_PREFIX) :].strip())
    except ValueError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("kind"), str):
        return None
    return event


def parse_events(text: str) -> list[dict[str, Any]]:
    """Every event in a block of log text, in order."""
    return [event for event in map(parse_event, text.splitlines()) if event is not None]


# ------------------------------------------------------------------------------ model utilities


def params_sha256(model: Any) -> str:
    """sha256 over the model's state (names and raw bytes, in state_dict order): bitwise identity."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        if not isinstance(tensor, torch.Tensor):
            continue
        exact = tensor.detach().cpu().clone(memory_format=torch.contiguous_format)
        digest.update(name.encode() + b"\0" + str(exact.dtype).encode() + str(tuple(exact.shape)).encode())
        # The raw bytes in place (bytes(storage) walks them one by one in Python: seconds per MB).
        digest.update(ctypes.string_at(exact.data_ptr(), exact.numel() * exact.element_size()))
    return digest.hexdigest()


class AllReduceTimer:
    """DDP communication hook: all-reduce (average) each gradient bucket and time it.

        timer = AllReduceTimer(world_size, every=5)
        ddp.register_comm_hook(None, timer.hook)
        ... after each optimizer step:  timer.step_done(step, sink=...)   (emits on rank 0)

    A step's all-reduce time is the time during which at least one of its buckets was in flight
    (overlapping buckets are counted once); bytes are the buckets' sizes. Every `every` steps the
    window's totals are reported as a busbw event, the time taken from the rank that waited least (every
    rank must call step_done each step: it agrees with the others then). On CUDA tensors the time comes
    from CUDA events.
    """

    def __init__(self, world_size: int, every: int = 5, process_group: Any = None, emit_on_rank: bool = True):
        self.world_size = int(world_size)
        self.every = max(1, int(every))
        self.process_group = process_group
        self.emit_on_rank = emit_on_rank
        self._records: list[list[Any]] = []  # [bytes, start, end] per bucket all-reduce
        self._window_bytes = 0
        self._window_seconds = 0.0
        self._window_steps = 0

    def hook(self, state, bucket):  # noqa: ANN001 - DDP refuses annotations other than its own types
        import torch
        import torch.distributed as dist

        tensor = bucket.buffer()
        tensor.div_(self.world_size)
        record: list[Any] = [tensor.numel() * tensor.element_size(), None, None]
        if tensor.is_cuda:
            record[1] = torch.cuda.Event(enable_timing=True)
            record[1].record()
        else:
            record[1] = time.perf_counter()
        self._records.append(record)
        future = dist.all_reduce(tensor, group=self.process_group, async_op=True).get_future()

        def finished(fut: Any) -> Any:
            if tensor.is_cuda:
                record[2] = torch.cuda.Event(enable_timing=True)
                record[2].record()
            else:
                record[2] = time.perf_counter()
            return fut.value()[0]

        return future.then(finished)

    def _take(self) -> tuple[int, float]:
        """(bytes, busy seconds) of the all-reduces since the last call."""
        records, self._records = self._records, []
        done = [r for r in records if r[2] is not None]
        if not done:
            return 0, 0.0
        if not isinstance(done[0][1], float):  # CUDA events: times relative to the first start
            done[-1][2].synchronize()
            first = done[0][1]
            spans = [(first.elapsed_time(r[1]) / 1e3, first.elapsed_time(r[2]) / 1e3) for r in done]
        else:
            spans = [(r[1], r[2]) for r in done]
        busy, end = 0.0, None
        for start, stop in sorted(spans):
            if end is None or start >= end:
                busy += stop - start
                end = stop
            elif stop > end:
                busy += stop - end
                end = stop
        return sum(r[0] for r in done), busy

    def _last_rank_seconds(self) -> float:
        """The window's all-reduce time as the rank that came last to each bucket saw it (the least over
        ranks; every rank calls step_done at the same steps). A rank that reaches a bucket first waits
        there for the others, and its clock counts that wait as if the wire were busy: on a loaded
        2-core host the ranks' skew halved the job's figure against the probe on the same link."""
        seconds = self._window_seconds
        try:
            import torch
            import torch.distributed as dist
        except ImportError:
            return seconds
        if self.world_size < 2 or not dist.is_available() or not dist.is_initialized():
            return seconds
        value = torch.tensor([seconds], dtype=torch.float64)
        if dist.get_backend(self.process_group) == "nccl":
            value = value.cuda()
        dist.all_reduce(value, op=dist.ReduceOp.MIN, group=self.process_group)
        return float(value.item())

    def reset(self) -> None:
        """Forget what was timed so far (e.g. a warm-up iteration)."""
        self._take()
        self._window_bytes, self._window_seconds, self._window_steps = 0, 0.0, 0

    def step_done(self, step: int, *, sink: Callable[[str], Any] | None = None,
                  emit_event: bool = True) -> dict[str, Any] | None:  # fmt: skip
        """Account this step's all-reduces; every `every` steps, the window's figures (and an event)."""
        nbytes, seconds = self._take()
        self._window_bytes += nbytes
        self._window_seconds += seconds
        self._window_steps += 1
        if self._window_steps < self.every:
            return None
        fields = busbw_fields(step, self._window_bytes, self._last_rank_seconds(), self.world_size)
        self._window_bytes, self._window_seconds, self._window_steps = 0, 0.0, 0
        if fields["bytes"] and emit_event:
            emit("busbw", sink=sink, **fields)
        return fields


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
