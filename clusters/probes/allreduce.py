"""All-reduce bandwidth probe: one rank per Ray node, timed as nccl-tests times it.

Runs ON a cluster as a Ray job (plain Python, no Django; torch and ray are imported only there):

    python allreduce.py --max-mb 256 --iters 20 --warmup 5

It places one actor on every ALIVE node (NodeAffinitySchedulingStrategy, hard), forms a process
group rooted at rank 0's node IP, checks one small all-reduce for correctness, then all-reduces
float32 tensors of 1 MB .. max MB (powers of two): `warmup` untimed calls, then the average of
`iters` timed calls; a size's time is the slowest rank's. Per size it reports bytes, time_s,
algbw_gbps = bytes / time / 1e9 and busbw_gbps = algbw * 2(n-1)/n, and prints one line

    VOLT_PROBE_RESULT {"nodes": n, "backend": "gloo", "results": [...], "max_busbw_gbps": ...,
                       "hosts": [...], "links": [...]}

Sizes follow a time budget (`budget_plan`): from the predicted busbw and VOLT_PROBE_BUDGET_S the
caller picks the largest message the sweep can afford (a cross-site cluster is not probed with
256 MB) and the link-test message, and passes them as `--sizes` / `--link-bytes`; the result repeats
them (`sizes_bytes`, `link_bytes`, `budget_s`) with the probe's own run time (`elapsed_s`).

A collective's time is set by its slowest member, so the all-reduce alone cannot say which host is
slow. A second, per-host phase tells: one host at a time, a local memory test (`local_gbps`: an
in-place add over `--local-bytes`, 3 bytes moved per byte); then the ring's links (0-1, 1-2, ...,
n-1 - 0; one link for two nodes), disjoint links at once (`link_groups`: the even links, then the odd
ones, and the closing link of an odd ring on its own), each a two-way exchange between neighbours,
so the phase's cost does not grow with the node count on a non-blocking fabric. Each figure
is the best of `--host-rounds` windows of `--host-window-s` seconds, taken round-robin so a host's
windows lie apart in time: a moment of load elsewhere does not make a host look slow, while a
throttled one (CPU quota, bad DIMM, degraded NIC) stays slow in every window. A host's `link_gbps` is its best link: on a ring of three or more, a slow host is
the one whose best link is slow too. `slowest_host()` reads the verdict.

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
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

RESULT_PREFIX = "VOLT_PROBE_RESULT "
_STARTED_UNIX = time.time()  # the job's driver process is up (before `import ray`): phases count from here
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
    plan: ProbePlan | None = None,
    submitted_unix: float | None = None,
) -> tuple[str, dict[str, Any]]:
    """The (entrypoint, runtime_env) to submit this probe as a Ray job.

    The working_dir upload ships this folder; pass `env_vars={"GLOO_SOCKET_IFNAME": "lo"}` on local
    hosts (DESIGN.md) so any other torch code in the job stays on loopback too. With a `plan`
    (`budget_plan`), its sizes replace 1 MB .. max_mb.
    """
    args = [python, "allreduce.py", "--max-mb", str(max_mb), "--iters", str(iters), "--warmup", str(warmup)]
    if plan is not None:
        args += ["--sizes", ",".join(str(size) for size in plan.sizes), "--link-bytes", str(plan.link_bytes),
                 "--local-bytes", str(plan.local_bytes), "--budget-s", f"{plan.budget_s:g}"]  # fmt: skip
    if expected_nodes is not None:
        args += ["--nodes", str(expected_nodes)]
    if submitted_unix is not None:  # the budget counts from here: Ray's job start-up is inside it
        args += ["--submitted-unix", f"{submitted_unix:.3f}"]
    runtime_env: dict[str, Any] = {
        "working_dir": str(Path(__file__).resolve().parent),
        "excludes": ["__pycache__"],
    }
    if env_vars:
        runtime_env["env_vars"] = dict(env_vars)
    return " ".join(args), runtime_env


def add_submission_times(result: dict[str, Any], submitted_unix: float, finished_unix: float) -> None:
    """The caller's side of where the probe's time went: submission -> the driver process up (Ray's job
    supervisor, the working_dir upload and unpacking, the driver's Python start) and the whole job as
    the caller saw it (`job_s`, with its status polling and log fetch)."""
    phases = result.setdefault("phases_s", {})
    if "started_unix" in result:
        phases["to_driver_s"] = round(max(0.0, result["started_unix"] - submitted_unix), 3)
    result["job_s"] = round(finished_unix - submitted_unix, 3)


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


@dataclass(frozen=True)
class ProbePlan:
    """What the probe runs: all-reduce message sizes (bytes), link-test and local-test message sizes."""

    sizes: tuple[int, ...]
    link_bytes: int
    local_bytes: int
    budget_s: float


MIN_MESSAGE_BYTES = 64 * 1024
_SWEEP_SHARE = 0.6  # of the budget; the per-host phase gets the rest
# The whole job keeps the budget: what Ray's start-up (job supervisor, working_dir, driver, one worker
# per node, `import torch`) took comes off the measurement, which gets what is left less _FINISH_S
# (ray.shutdown, the job's end, the caller's status poll and log fetch: ~1 s measured): the per-host
# windows keep their length (each costs ~_WINDOW_OVERHEAD_S more: a warm-up and a calibration step, the
# actor call), the sweep gets the rest, at least _MIN_SWEEP_S.
_FINISH_S = 1.0
_WINDOW_OVERHEAD_S = 0.15
_MIN_SWEEP_S = 0.5
_SIZES_SPAN = 64  # smallest size = largest / 64 (7 sizes at most)
# One link-test exchange lasts about this long at the predicted rate: a few fit in a window, and a link
# far slower than predicted (a fault) still takes seconds, not minutes.
_LINK_STEP_S = 0.05


def _power_of_two_at_most(value: float) -> int:
    size = MIN_MESSAGE_BYTES
    while size * 2 <= value:
        size *= 2
    return size


def budget_plan(
    predicted_busbw_gbps: float | None,
    budget_s: float,
    nodes: int,
    iters: int,
    warmup: int,
    max_bytes: int,
) -> ProbePlan:
    """Message sizes that let the probe finish in about `budget_s` at the predicted busbw.

    The sweep moves (iters + warmup) x 2(n-1)/n x size per size, and sizes double up to the largest,
    so the largest is about share x budget x busbw / (2 x calls x 2(n-1)/n); the probe also stops
    early when a size would end past the sweep's share (a link slower than predicted). A link-test
    exchange lasts about _LINK_STEP_S at the predicted rate. Sizes are powers of two, 64 KB and up,
    at most `max_bytes`.
    """
    busbw = (predicted_busbw_gbps or 0.0) * 1e9
    if busbw <= 0:
        largest = max_bytes
        link = min(max_bytes, 64 * MB)
    else:
        factor = 2 * (nodes - 1) / nodes if nodes > 1 else 1.0
        largest = _SWEEP_SHARE * budget_s * busbw / (2 * (iters + warmup) * factor)
        link = busbw * _LINK_STEP_S
    largest = _power_of_two_at_most(min(largest, max_bytes))
    sizes = tuple(message_sizes_bytes(largest, max(MIN_MESSAGE_BYTES, largest // _SIZES_SPAN)))
    link_bytes = _power_of_two_at_most(min(link, max_bytes, 64 * MB))
    return ProbePlan(sizes, link_bytes, min(max_bytes, 64 * MB), budget_s)


def measure_budget(
    budget_s: float | None, job_started_unix: float | None, windows: int, host_window_s: float
) -> tuple[float | None, float, float | None]:
    """(sweep budget, per-host window, seconds the job had spent before measuring).

    Without a start time the sweep gets _SWEEP_SHARE of the budget and the windows stay (the budget
    then covers the measurement only). With one, the whole job keeps the budget where it can: the
    measurement gets budget - spent - _FINISH_S, the per-host windows as they are, the sweep the rest."""
    if not budget_s:
        return None, host_window_s, None
    if job_started_unix is None:
        return budget_s * _SWEEP_SHARE, host_window_s, None
    # A clock that disagrees with the caller's (another host) counts as no start-up, at most half.
    spent = min(max(0.0, time.time() - job_started_unix), budget_s / 2)
    left = max(0.0, budget_s - spent - _FINISH_S)
    # The windows keep their length: a CPU-throttled host (a cgroup quota over a 100 ms period) shows
    # only in a window longer than the period, so only the sweep gives way to a slow start-up.
    sweep = max(_MIN_SWEEP_S, left - windows * (host_window_s + _WINDOW_OVERHEAD_S))
    window = host_window_s
    return round(sweep, 3), round(window, 3), round(spent, 3)


def message_sizes_bytes(max_bytes: int, min_bytes: int) -> list[int]:
    """Powers of two (times min_bytes) from min_bytes up to max_bytes."""
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    return sizes


def link_groups(pairs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Ring links in rounds of disjoint links (no host in two links of a round): even, odd, closing."""
    groups: list[list[tuple[int, int]]] = []
    for pair in pairs:
        for group in groups:
            if not {pair[0], pair[1]} & {host for link in group for host in link}:
                group.append(pair)
                break
        else:
            groups.append([pair])
    return groups


def summarize(
    nodes: int, backend: str, sizes: list[int], rank_times: list[list[float]], **extra: Any
) -> dict[str, Any]:
    """nccl-tests figures per size from every rank's average times (the slowest rank counts)."""
    factor = 2 * (nodes - 1) / nodes
    results = []
    for index, size in enumerate(sizes[: min(len(times) for times in rank_times)]):
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


def ring_links(world: int) -> list[tuple[int, int]]:
    """The neighbour pairs the per-host phase tests: a ring, or the one link between two nodes."""
    if world < 2:
        return []
    if world == 2:
        return [(0, 1)]
    return [(i, (i + 1) % world) for i in range(world)]


def summarize_hosts(
    node_ips: list[str], local_gbps: list[float], links: list[tuple[int, int, float]]
) -> list[dict[str, Any]]:
    """One row per rank: its local memory bandwidth and its best link's bandwidth (GB/s per direction)."""
    hosts = []
    for rank, ip in enumerate(node_ips):
        own = [gbps for a, b, gbps in links if rank in (a, b)]
        hosts.append(
            {
                "rank": rank,
                "node_ip": ip,
                "local_gbps": local_gbps[rank],
                "link_gbps": max(own) if own else None,
            }
        )
    return hosts


_METRICS = (("link_gbps", "best link"), ("local_gbps", "local memory bandwidth"))


def slowest_host(result: Mapping[str, Any], fraction: float = 0.5) -> dict[str, Any] | None:
    """The host that holds the cluster back, or None when no host stands out.

    A host stands out when one of its figures is below `fraction` of the median of the other hosts'.
    Links decide only on three or more nodes (two nodes share their one link); the local test decides
    for any number. Returns {"rank", "node_ip", "metric", "what", "gbps", "others_gbps", "ratio"} for the
    lowest ratio found.
    """
    hosts = list(result.get("hosts") or [])
    worst: dict[str, Any] | None = None
    for metric, what in _METRICS:
        if metric == "link_gbps" and len(hosts) < 3:
            continue
        for host in hosts:
            others = [h[metric] for h in hosts if h is not host and h.get(metric)]
            if host.get(metric) is None or not others:
                continue
            median = statistics.median(others)
            ratio = host[metric] / median
            if worst is None or ratio < worst["ratio"]:
                worst = {
                    "rank": host["rank"],
                    "node_ip": host["node_ip"],
                    "metric": metric,
                    "what": what,
                    "gbps": host[metric],
                    "others_gbps": median,
                    "ratio": ratio,
                }
    return worst if worst is not None and worst["ratio"] < fraction else None


def _best_rate(step: Any, nbytes: int, window_s: float, rounds: int, agree: Any = None) -> float:
    """GB/s of `step()` (which moves nbytes and waits for it): the best of `rounds` timed windows.

    A window is a fixed number of steps, sized from a first timed step to last about `window_s`;
    `agree(count)` lets two ranks that step together settle on one count (every send needs its recv).
    """
    step()  # warm up: allocations, connections
    started = time.perf_counter()
    step()
    once = max(time.perf_counter() - started, 1e-6)
    count = max(1, min(10_000, round(window_s / once)))
    if agree is not None:
        count = agree(count)
    best = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(count):
            step()
        best = max(best, nbytes * count / (time.perf_counter() - started) / 1e9)
    return best


class _Collective:
    """all-reduce and barrier over gloo (bound to this node's IP) or NCCL."""

    def __init__(self, backend: str, store: Any, rank: int, world: int, node_ip: str):
        import torch
        import torch.distributed as dist

        self.backend = backend
        self.device = torch.device("cuda:0" if backend == "nccl" else "cpu")
        if backend == "nccl":
            torch.cuda.set_device(self.device)  # NCCL's P2P calls hang without a current device
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

    def exchange(self, peer: int, send: Any, recv: Any) -> None:
        """Send `send` to peer while receiving `recv` from it; returns when both are done."""
        if self._group is None:
            import torch.distributed as dist

            ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            self.synchronize()
        else:
            sent = self._group.send([send], peer, 7)
            received = self._group.recv([recv], peer, 7)
            sent.wait()
            received.wait()

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
        self._group: _Collective | None = None

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

    def join(self, rank: int, world: int, master: str, port: int, backend: str) -> bool:
        """Form the process group; True when a small all-reduce adds up right on this rank."""
        import torch
        from torch.distributed import TCPStore

        store = self._store or TCPStore(master, port, world, is_master=False, timeout=_GROUP_TIMEOUT)
        self._group = _Collective(backend, store, rank, world, self.node_ip)
        self._world = world
        check = torch.full((8,), float(rank + 1), device=self._group.device)
        self._group.all_reduce(check)
        self._group.synchronize()
        return bool(torch.all(check == world * (world + 1) / 2).item())

    def allreduce_times(
        self, sizes: list[int], iters: int, warmup: int, budget_s: float | None = None
    ) -> list[float]:
        """Average time per size, smallest first. With `budget_s`, stops before a size that would end
        past the budget at the rate seen so far (every rank takes the same decision: the elapsed time
        is all-reduced), so a link far slower than predicted does not stretch the probe."""
        import torch

        device = self._group.device
        times: list[float] = []
        started = time.perf_counter()
        for size in sizes:
            if times and budget_s is not None:
                elapsed_ms = torch.tensor([int((time.perf_counter() - started) * 1000)], device=device)
                self._group.all_reduce(elapsed_ms)  # the sum: the same on every rank
                elapsed = elapsed_ms.item() / 1000 / self._world
                if elapsed + 2 * times[-1] * (iters + warmup) > budget_s:
                    break
            tensor = torch.zeros(size // 4, dtype=torch.float32, device=device)
            times.append(self._time(self._group, tensor, iters, warmup))
        return times

    def local_gbps(self, size: int, window_s: float, rounds: int) -> float:
        """This host alone: an in-place add over `size` bytes (reads 2, writes 1)."""
        import torch

        a = torch.ones(size // 4, dtype=torch.float32, device=self._group.device)
        b = torch.ones_like(a)

        def step() -> None:
            a.add_(b)
            self._group.synchronize()

        return _best_rate(step, 3 * size, window_s, rounds)

    def link_gbps(self, peer: int, size: int, window_s: float, rounds: int) -> float:
        """This host and `peer` (who runs the same call): both send `size` bytes to the other at once."""
        import torch

        device = self._group.device
        send = torch.ones(size // 4, dtype=torch.float32, device=device)
        recv = torch.empty_like(send)

        def agree(count: int) -> int:  # both sides run the larger of the two counts
            mine = torch.tensor([count], dtype=torch.int64, device=device)
            theirs = torch.zeros_like(mine)
            self._group.exchange(peer, mine, theirs)
            return max(count, int(theirs.item()))

        return _best_rate(lambda: self._group.exchange(peer, send, recv), size, window_s, rounds, agree)

    def close(self) -> None:
        if self._group is not None:
            self._group.close()
            self._group = None

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


def run_probe(
    max_mb: int,
    iters: int,
    warmup: int,
    backend: str = "auto",
    expected_nodes: int | None = None,
    host_window_s: float = 0.2,
    host_rounds: int = 2,
    sizes: list[int] | None = None,
    link_bytes: int | None = None,
    local_bytes: int | None = None,
    budget_s: float | None = None,
    job_started_unix: float | None = None,
):
    """Run the probe on the connected Ray cluster (call ray.init() first); returns the summary dict.

    With `budget_s` and `job_started_unix` (when the job was submitted), the measurement gets what the
    job's start-up left of the budget (`measure_budget`)."""
    import ray

    started_at = time.perf_counter()
    phases: dict[str, float] = {}
    mark = [started_at]

    def lap(name: str) -> None:  # where the probe's time goes (stored with its result)
        now = time.perf_counter()
        phases[name] = round(now - mark[0], 3)
        mark[0] = now

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

    def get(refs):
        return ray.get(refs, timeout=_RAY_TIMEOUT_S)

    infos = get([rank.info.remote() for rank in ranks])
    lap("actors_s")  # a worker process per node with the job's runtime env, `import torch` in it
    if backend == "auto":
        backend = "nccl" if all(info["cuda"] for info in infos) else "gloo"
    world, sizes = len(ranks), list(sizes or message_sizes(max_mb))
    port = get(ranks[0].host_store.remote(world))
    master = infos[0]["node_ip"]
    correct = get([rank.join.remote(i, world, master, port, backend) for i, rank in enumerate(ranks)])
    lap("join_s")  # the process group (gloo/nccl rendezvous, the correctness all-reduce)
    try:
        groups = link_groups(ring_links(world))
        windows = host_rounds * (world + len(groups))
        sweep_budget, host_window_s, spent = measure_budget(
            budget_s, job_started_unix, windows, host_window_s
        )
        lap("plan_s")
        times = get([rank.allreduce_times.remote(sizes, iters, warmup, sweep_budget) for rank in ranks])
        sizes = sizes[: min(len(t) for t in times)]  # the sizes that ran
        lap("sweep_s")
        # One host at a time, then disjoint links at once: no two measured things share a host. Rounds
        # go round-robin, so a host's windows lie apart in time and a burst of load elsewhere that
        # spoils one of them does not spoil the other: the best window counts.
        local_size = local_bytes or min(sizes[-1], 64 * MB)
        link_size = link_bytes or min(sizes[-1], 64 * MB)
        local = [0.0] * world
        pairs = ring_links(world)
        link_rates = {pair: 0.0 for pair in pairs}
        for _ in range(host_rounds):
            for i, rank in enumerate(ranks):
                local[i] = max(local[i], get(rank.local_gbps.remote(local_size, host_window_s, 1)))
        for _ in range(host_rounds):
            for group in groups:
                refs = [(ranks[a].link_gbps.remote(b, link_size, host_window_s, 1),
                         ranks[b].link_gbps.remote(a, link_size, host_window_s, 1)) for a, b in group]  # fmt: skip
                for pair, (ref_a, ref_b) in zip(group, refs, strict=True):
                    link_rates[pair] = max(link_rates[pair], min(get([ref_a, ref_b])))
        links = [(a, b, link_rates[(a, b)]) for a, b in pairs]
        lap("hosts_s")
    finally:
        get([rank.close.remote() for rank in ranks])
    lap("close_s")
    node_ips = [info["node_ip"] for info in infos]
    return summarize(
        world, backend, sizes, times,
        node_ips=node_ips, iters=iters, warmup=warmup, correct=all(correct),
        hosts=summarize_hosts(node_ips, local, links),
        links=[{"ranks": [a, b], "gbps": gbps} for a, b, gbps in links],
        sizes_bytes=sizes, link_bytes=link_size, local_bytes=local_size, budget_s=budget_s,
        link_groups=[[list(pair) for pair in group] for group in groups],
        elapsed_s=time.perf_counter() - started_at, phases_s=phases,
        spent_before_measuring_s=spent, sweep_budget_s=sweep_budget, host_window_s=host_window_s,
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
    parser.add_argument(
        "--host-window-s", type=float, default=0.2, help="per-host tests: seconds per timed window"
    )
    parser.add_argument("--host-rounds", type=int, default=2, help="per-host tests: windows (best counts)")
    parser.add_argument("--sizes", default="", help="all-reduce message sizes in bytes, comma-separated")
    parser.add_argument("--link-bytes", type=int, default=None, help="link-test message, bytes")
    parser.add_argument("--local-bytes", type=int, default=None, help="local memory test message, bytes")
    parser.add_argument(
        "--budget-s", type=float, default=None, help="the time budget the sizes were picked for"
    )
    parser.add_argument(
        "--submitted-unix",
        type=float,
        default=None,
        help="when the job was submitted (the budget counts from it)",
    )
    args = parser.parse_args(argv)

    import ray

    ray.init(log_to_driver=False)  # inside the job: the job supervisor sets RAY_ADDRESS
    driver_ready_unix = time.time()
    try:
        summary = run_probe(
            args.max_mb,
            args.iters,
            args.warmup,
            args.backend,
            args.nodes,
            args.host_window_s,
            args.host_rounds,
            sizes=[int(size) for size in args.sizes.split(",") if size] or None,
            link_bytes=args.link_bytes,
            local_bytes=args.local_bytes,
            budget_s=args.budget_s,
            job_started_unix=min(args.submitted_unix, _STARTED_UNIX) if args.submitted_unix else None,
        )
    finally:
        ray.shutdown()
    # `import ray` + ray.init() in the driver; the caller adds submission -> driver start (started_unix).
    summary["phases_s"] = {
        "driver_init_s": round(driver_ready_unix - _STARTED_UNIX, 3),
        **summary["phases_s"],
    }
    summary["started_unix"] = _STARTED_UNIX
    print(RESULT_PREFIX + json.dumps(summary), flush=True)
    return 0 if summary["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
