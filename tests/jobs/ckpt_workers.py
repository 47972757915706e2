"""Processes for the checkpoint tests: ranks that save through the real volt_ckpt over gloo (127.0.0.1).

Spawned with multiprocessing (spawn), so they live in an importable module, not in the test file.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from jobs.workloads import volt_ckpt


def save_rank(
    rank: int, world: int, port: int, root: str, step: int, die_before_save: int, results: Any
) -> None:
    """Join a gloo group and save a shard of `step` under `root`; rank `die_before_save` exits instead."""
    import torch
    import torch.distributed as dist
    from torch.distributed import TCPStore

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    store = TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    if rank == die_before_save:
        os._exit(7)  # a node lost in the middle of a checkpoint: this rank never writes its shard
    shard = {"rank": rank, "weights": torch.arange(1000, dtype=torch.float32) * (rank + 1)}
    try:
        manifest = volt_ckpt.save(root, step, shard, rank=rank, world_size=world, meta={"test": True})
        results.put((rank, "ok", manifest))
    except Exception as error:  # noqa: BLE001 - reported to the test
        results.put((rank, "error", f"{type(error).__name__}: {error}"))
    finally:
        dist.destroy_process_group()


def run_save(root: str, step: int, world: int = 2, die_before_save: int = -1, timeout_s: float = 120) -> dict:
    """Run `world` saving ranks; {rank: (status, manifest or error)} of those that reported."""
    import multiprocessing
    import queue
    import time

    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [
        context.Process(
            target=save_rank, args=(rank, world, store.port, root, step, die_before_save, results)
        )
        for rank in range(world)
    ]
    for process in processes:
        process.start()
    expected = world - (1 if die_before_save >= 0 else 0)
    reported: dict[int, tuple] = {}
    deadline = time.monotonic() + timeout_s
    while len(reported) < expected and time.monotonic() < deadline:
        try:
            rank, status, payload = results.get(timeout=0.5)
            reported[rank] = (status, payload)
        except queue.Empty:
            pass
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)
    return reported
