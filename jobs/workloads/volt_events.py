"""volt_events: what a job tells Volt on stdout, and the job's own all-reduce bandwidth.

Runs ON a cluster, shipped next to every job's entrypoint with volt_ckpt (which still answers for every
name here: `volt_ckpt.emit_step`, `volt_ckpt.AllReduceTimer`, ...). Plain Python: the standard library, and
torch only inside the functions that hash or time tensors.

Events: the workload prints one line per event on stdout, `VOLT_EVENT <json object>`
(`emit(kind, **fields)`, `parse_event(line)`): step, busbw, checkpoint, resumed, done.
`AllReduceTimer` is a DDP communication hook that all-reduces gradient buckets as DDP's default
hook does, times them, and reports bytes, seconds and nccl-tests figures every few steps:
algbw = bytes / seconds, busbw = algbw * 2(n-1)/n.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

EVENT_PREFIX = "VOLT_EVENT "
_stdout_lock = threading.Lock()


# --------------------------------------------------------------------------------------- events


def event_line(kind: str, **fields: Any) -> str:
    """`VOLT_EVENT {"kind": ..., ...}`: one event as the line a workload prints."""
    return EVENT_PREFIX + json.dumps({"kind": kind, **fields}, separators=(", ", ": "))


def emit(kind: str, *, sink: Callable[[str], Any] | None = None, **fields: Any) -> str:
    """Print one event line on stdout (or hand it to `sink`); returns the line."""
    line = event_line(kind, **fields)
    if sink is None:  # one write under a lock: a checkpoint's event comes from its upload thread
        with _stdout_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
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
        fields.update({key: manifest[key] for key in ("save_s", "upload_s") if manifest.get(key) is not None})
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
