"""All-reduce bandwidth probe: one rank per Ray node, timed as nccl-tests times it.

Runs ON a cluster as a Ray job (plain Python, no Django; torch and ray are imported only there):

    python allreduce.py --max-mb 256 --iters 20 --warmup 5

It places one actor on every ALIVE node (NodeAffinitySchedulingStrategy, hard), forms a process
group rooted at rank 0's node IP, checks one small all-reduce for correctness, then all-reduces
float32 tensors of 1 MB .. max MB (powers of two): `warmup` untimed calls, then the average of
`iters` timed calls; a size's time is the slowest rank's. Per size it reports bytes, time_s,
algbw_gbps = bytes / time / 1e9 and busbw_gbps = algbw * 2(n-1)/n, and prints one line

    VOLT_PROBE_RESULT {"nodes": n, "backend": "gloo", "results": [...], "max_busbw_gbps": ...}

Backend: nccl when every rank sees CUDA (`torch.cuda.is_available()`), else gloo. The actors ask Ray
for no GPU: CPU-only local hosts advertise GPUs that do not exist, and Ray 2.60 leaves
CUDA_VISIBLE_DEVICES alone for zero-GPU actors, so on GPU hosts a rank still sees the node's devices.
Gloo binds to the node's Ray IP (not to whatever the hostname resolves to), so local hosts stay on
their 127.0.0.N address and real hosts on the interface Ray uses.

The caller side (`probe_job`, `parse_result`) imports nothing heavy and may be used from Django.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

RESULT_PREFIX = "VOLT_PROBE_RESULT "
MB = 1 << 20
_GROUP_TIMEOUT = timedelta(seconds=120)
_RAY_TIMEOUT_S = 600.0


def probe_job(
    max_mb: int = 256,
    iters: int = 20,
    warmup: int = 5,
    *,
    python: str = "python",
    expected_nodes: int | None = None,
    env_vars: Mapping[str, str] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The (entrypoint, runtime_env) to submit this probe as a Ray job.

    The working_dir upload ships this folder; pass `env_vars={"GLOO_SOCKET_IFNAME": "lo"}` on local
    hosts (DESIGN.md) so any other torch code in the job stays on loopback too.
    """
    args = [python, "allreduce.py", "--max-mb", str(max_mb), "--iters", str(iters), "--warmup", str(warmup)]
    if expected_nodes is not None:
        args += ["--nodes", str(expected_nodes)]
    runtime_env: dict[str, Any] = {
        "working_dir": str(Path(__file__).resolve().parent),
        "excludes": ["__pycache__"],
    }
    if env_vars:
        runtime_env["env_vars"] = dict(env_vars)
    return " ".join(args), runtime_env


def parse_result(logs: str) -> dict[str, Any]:
    """The probe's result from a job's logs (the last VOLT_PROBE_RESULT line); ValueError if absent."""
    for line in reversed(logs.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    tail = "\n".join(logs.splitlines()[-20:])
    raise ValueError(f"the probe printed no {RESULT_PREFIX.strip()} line; its last output:\n{tail}")


def message_sizes(max_mb: int, min_mb: int = 1) -> list[int]:
    """Message sizes in bytes: powers of two from min_mb MB up to max_mb MB."""
    sizes, size = [], min_mb * MB
    while size <= max_mb * MB:
        sizes.append(size)
        size *= 2
    if not sizes:
        raise ValueError(f"--max-mb {max_mb} is below --min-mb {min_mb}")
    return sizes


def summarize(
    nodes: int, backend: str, sizes: list[int], rank_times: list[list[float]], **extra: Any
) -> dict[str, Any]:
    """nccl-tests figures per size from every rank's average times (the slowest rank counts)."""
    factor = 2 * (nodes - 1) / nodes
    results = []
    for index, size in enumerate(sizes):
        time_s = max(times[index] for times in rank_times)
        algbw = size / time_s / 1e9
        results.append({"bytes": size, "time_s": time_s, "algbw_gbps": algbw, "busbw_gbps": algbw * factor})
    return {
        "nodes": nodes,
        "backend": backend,
        "results": results,
        "max_busbw_gbps": max(r["busbw_gbps"] for r in results),
        **extra,
    }


class _Collective:
    """all-reduce and barrier over gloo (bound to this node's IP) or NCCL."""

    def __init__(self, backend: str, store: Any, rank: int, world: int, node_ip: str):
        import torch
        import torch.distributed as dist

        self.backend = backend
        self.device = torch.device("cuda:0" if backend == "nccl" else "cpu")
        if backend == "nccl":
            dist.init_process_group(
                "nccl",
                store=store,
                rank=rank,
                world_size=world,
                timeout=_GROUP_TIMEOUT,
                device_id=self.device,
            )
            self._group = None
        else:
            gloo = dist.ProcessGroupGloo
            options = gloo._Options()
            options._devices = [gloo.create_device(hostname=node_ip)]
            options._timeout = _GROUP_TIMEOUT
            self._group = gloo(store, rank, world, options)

    def all_reduce(self, tensor: Any) -> None:
        if self._group is None:
            import torch.distributed as dist

            dist.all_reduce(tensor)
        else:
            self._group.allreduce([tensor]).wait()

    def synchronize(self) -> None:
        if self.backend == "nccl":
            import torch

            torch.cuda.synchronize()

    def close(self) -> None:
        if self._group is None:
            import torch.distributed as dist

            dist.destroy_process_group()


class Rank:
    """One probe rank (a Ray actor on one node)."""

    def __init__(self) -> None:
        import ray

        self.node_ip = ray.util.get_node_ip_address()
        self._store = None

    def info(self) -> dict[str, Any]:
        import torch

        return {"node_ip": self.node_ip, "hostname": socket.gethostname(), "cuda": torch.cuda.is_available()}

    def host_store(self, world: int) -> int:
        """Rank 0: open the rendezvous store on this node's IP; returns its (kernel-chosen, free) port."""
        from torch.distributed import TCPStore

        self._store = TCPStore(
            self.node_ip, 0, world, is_master=True, wait_for_workers=False, timeout=_GROUP_TIMEOUT
        )
        return self._store.port

    def run(
        self,
        rank: int,
        world: int,
        master: str,
        port: int,
        backend: str,
        sizes: list[int],
        iters: int,
        warmup: int,
    ) -> dict[str, Any]:
        import torch
        from torch.distributed import TCPStore

        store = self._store or TCPStore(master, port, world, is_master=False, timeout=_GROUP_TIMEOUT)
        group = _Collective(backend, store, rank, world, self.node_ip)
        try:
            check = torch.full((8,), float(rank + 1), device=group.device)
            group.all_reduce(check)
            group.synchronize()
            correct = bool(torch.all(check == world * (world + 1) / 2).item())
            times = [self._time(group, torch.zeros(size // 4, dtype=torch.float32, device=group.device), iters, warmup)
                     for size in sizes]  # fmt: skip
        finally:
            group.close()
        return {"rank": rank, "node_ip": self.node_ip, "times": times, "correct": correct}

    @staticmethod
    def _time(group: _Collective, tensor: Any, iters: int, warmup: int) -> float:
        for _ in range(warmup):
            group.all_reduce(tensor)
        group.synchronize()
        started = time.perf_counter()
        for _ in range(iters):
            group.all_reduce(tensor)
        group.synchronize()
        return (time.perf_counter() - started) / iters


def run_probe(max_mb: int, iters: int, warmup: int, backend: str = "auto", expected_nodes: int | None = None):
    """Run the probe on the connected Ray cluster (call ray.init() first); returns the summary dict."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = sorted(
        (node for node in ray.nodes() if node["Alive"]),
        key=lambda node: ("node:__internal_head__" not in node["Resources"], node["NodeManagerAddress"]),
    )
    if expected_nodes is not None and len(nodes) != expected_nodes:
        raise RuntimeError(f"expected {expected_nodes} ALIVE nodes, found {len(nodes)}")
    remote_rank = ray.remote(num_cpus=0, max_restarts=0)(Rank)
    ranks = [
        remote_rank.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        ).remote()
        for node in nodes
    ]
    infos = ray.get([rank.info.remote() for rank in ranks], timeout=_RAY_TIMEOUT_S)
    if backend == "auto":
        backend = "nccl" if all(info["cuda"] for info in infos) else "gloo"
    world, sizes = len(ranks), message_sizes(max_mb)
    port = ray.get(ranks[0].host_store.remote(world), timeout=_RAY_TIMEOUT_S)
    master = infos[0]["node_ip"]
    runs = ray.get(
        [
            rank.run.remote(i, world, master, port, backend, sizes, iters, warmup)
            for i, rank in enumerate(ranks)
        ],
        timeout=_RAY_TIMEOUT_S,
    )
    return summarize(
        world, backend, sizes, [run["times"] for run in runs],
        node_ips=[info["node_ip"] for info in infos], iters=iters, warmup=warmup,
        correct=all(run["correct"] for run in runs),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Volt all-reduce bandwidth probe (one rank per Ray node).")
    parser.add_argument("--max-mb", type=int, default=256, help="largest message, MB (power of two)")
    parser.add_argument("--iters", type=int, default=20, help="timed all-reduces per size")
    parser.add_argument("--warmup", type=int, default=5, help="untimed all-reduces per size")
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    parser.add_argument(
        "--nodes", type=int, default=None, help="fail unless exactly this many nodes are ALIVE"
    )
    args = parser.parse_args(argv)

    import ray

    ray.init(log_to_driver=False)  # inside the job: the job supervisor sets RAY_ADDRESS
    try:
        summary = run_probe(args.max_mb, args.iters, args.warmup, args.backend, args.nodes)
    finally:
        ray.shutdown()
    print(RESULT_PREFIX + json.dumps(summary), flush=True)
    return 0 if summary["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
