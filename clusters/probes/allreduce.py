"""All-reduce bandwidth probe: one rank per host, timed as nccl-tests times it.

Runs ON a cluster's hosts (plain Python, no Django, no Ray; torch is imported only there). The caller
(`clusters/probes/launch.py`) starts one process per host through the host's driver, at once:

    python - --rank R --world N --master <rank 0's IP> --port P --node-ip <this host's IP> ... < allreduce.py

Rank 0 serves the rendezvous (a TCPStore on its node IP and the port of its Ray slot reserved for the
probe), the ranks form a process group, check one small all-reduce for correctness, then all-reduce
float32 tensors of the planned sizes: `warmup` untimed calls, then the average of `iters` timed calls; a
size's time is the slowest rank's. Per size it reports bytes, time_s, algbw_gbps = bytes / time / 1e9
and busbw_gbps = algbw * 2(n-1)/n, and rank 0 prints one line

    VOLT_PROBE_RESULT {"nodes": n, "backend": "gloo", "results": [...], "max_busbw_gbps": ...,
                       "hosts": [...], "links": [...]}

The probe does not start as a Ray job: a job's fixed start-up (the job supervisor, the working_dir
upload, a driver, one Ray worker per node) cost 5-10 s of every bring-up on a loaded box and measured
nothing. The ranks run the cluster's runtime, as the cluster's Unix user, with the node's environment
(its marker, so teardown finds a leftover rank), so they see the links Ray's workers see.

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
throttled one (CPU quota, bad DIMM, degraded NIC) stays slow in every window. A host's `link_gbps` is
its best link: on a ring of three or more, a slow host is the one whose best link is slow too.
`slowest_host()` reads the verdict.

Backend: nccl when every rank sees CUDA (`torch.cuda.is_available()`), else gloo. Gloo binds to the
node's IP (not to whatever the hostname resolves to), so local hosts stay on their 127.0.0.N address
and real hosts on the interface Ray uses.

The caller side (`parse_result`, `budget_plan`, `slowest_host`) imports nothing heavy and may be used
from Django.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

RESULT_PREFIX = "VOLT_PROBE_RESULT "
_STARTED_UNIX = time.time()  # this rank's process is up (before `import torch`): phases count from here
MB = 1 << 20
_GROUP_TIMEOUT = timedelta(seconds=120)


def add_launch_times(result: dict[str, Any], launched_unix: float, finished_unix: float) -> None:
    """The caller's side of where the probe's time went: launch -> rank 0's process up (the host
    driver's command, the interpreter's start) and the whole probe as the caller saw it (`wall_s`)."""
    phases = result.setdefault("phases_s", {})
    if "started_unix" in result:
        phases = {"launch_s": round(max(0.0, result["started_unix"] - launched_unix), 3), **phases}
        result["phases_s"] = phases
    result["wall_s"] = round(finished_unix - launched_unix, 3)


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
# The whole probe keeps the budget: what its start-up (the launch on every host, `import torch`, the
# rendezvous) took comes off the measurement, which gets what is left less _FINISH_S (the hand-over
# of figures to rank 0, the processes' exit, the caller's read of rank 0's output): the per-host
# windows keep their length (each costs ~_WINDOW_OVERHEAD_S more: a warm-up and a calibration step, the
# barrier), the sweep gets the rest, at least _MIN_SWEEP_S.
_FINISH_S = 0.3
_WINDOW_OVERHEAD_S = 0.1
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


_CALIBRATION_STEPS = 3


def _best_rate(
    step: Any, nbytes: int, window_s: float, rounds: int, agree: Any = None, count: int | None = None
) -> tuple[float, int]:
    """(GB/s of `step()`, which moves nbytes and waits for it: the best of `rounds` timed windows; the
    window's step count).

    A window is a fixed number of steps, sized from the fastest of three timed steps (after a warm-up)
    to last about `window_s` of unthrottled time; `agree(count)` lets two ranks that step together
    settle on one count (every send needs its recv). With `count` (from an earlier call on the same
    thing) the warm-up and sizing are skipped.
    """
    if count is None:
        step()  # warm up: allocations, connections
        once = float("inf")
        for _ in range(_CALIBRATION_STEPS):  # the fastest: a step that waited out a CPU quota's period
            started = time.perf_counter()  # would size the window in few steps, which then fit in one
            step()  # quota slice and pass a throttled host as healthy
            once = min(once, time.perf_counter() - started)
        count = max(1, min(10_000, round(window_s / max(once, 1e-6))))
        if agree is not None:
            count = agree(count)
    best = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(count):
            step()
        best = max(best, nbytes * count / (time.perf_counter() - started) / 1e9)
    return best, count


def _window_rate(step: Any, nbytes: int, window_s: float, rounds: int) -> float:
    """GB/s of `step()` over windows of `window_s` of wall time (as many steps as fit; the best of `rounds`).

    For a test one rank runs alone (no peer to agree on a step count with): a window measured in time
    spans the periods of a CPU quota whatever one step costs, so a throttled host shows as throttled.
    """
    step()  # warm up: allocations, first touch
    best = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        steps, elapsed = 0, 0.0
        while elapsed < window_s:
            step()
            steps += 1
            elapsed = time.perf_counter() - started
        best = max(best, nbytes * steps / elapsed / 1e9)
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
    """One probe rank: a process on one host, started by the caller through the host's driver."""

    def __init__(self, node_ip: str) -> None:
        self.node_ip = node_ip
        self._store: Any = None
        self._group: _Collective | None = None
        self._world = 1
        self._counts: dict[str, int] = {}  # link-test window step counts, sized in the first round

    def info(self) -> dict[str, Any]:
        import torch

        return {"node_ip": self.node_ip, "hostname": socket.gethostname(), "cuda": torch.cuda.is_available()}

    def connect(self, rank: int, world: int, master: str, port: int, timeout: timedelta) -> Any:
        """The rendezvous store: rank 0 serves it on its node's IP and `port`, the others connect."""
        from torch.distributed import TCPStore

        if rank == 0:
            self._store = TCPStore(
                master, port, world, is_master=True, wait_for_workers=False, timeout=timeout
            )
        else:
            self._store = TCPStore(master, port, world, is_master=False, timeout=timeout)
        return self._store

    def join(self, rank: int, world: int, backend: str) -> bool:
        """Form the process group; True when a small all-reduce adds up right on this rank."""
        import torch

        self._group = _Collective(backend, self._store, rank, world, self.node_ip)
        self._world = world
        check = torch.full((8,), float(rank + 1), device=self._group.device)
        self._group.all_reduce(check)
        self._group.synchronize()
        return bool(torch.all(check == world * (world + 1) / 2).item())

    def barrier(self) -> None:
        import torch

        self._group.all_reduce(torch.zeros(1, device=self._group.device))
        self._group.synchronize()

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
                # Both figures averaged over the ranks, so every rank takes the same decision: one that
                # stopped alone would leave the others blocked in the next size's all-reduce.
                seen = torch.tensor(
                    [time.perf_counter() - started, times[-1]], dtype=torch.float64, device=device
                )
                self._group.all_reduce(seen)  # the sum: the same on every rank
                elapsed, last = (value / self._world for value in seen.tolist())
                if elapsed + 2 * last * (iters + warmup) > budget_s:
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

        return _window_rate(step, 3 * size, window_s, rounds)

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

        key = f"link-{peer}"  # both sides size the window once, in their first round, together
        rate, self._counts[key] = _best_rate(
            lambda: self._group.exchange(peer, send, recv),
            size,
            window_s,
            rounds,
            agree,
            self._counts.get(key),
        )
        return rate

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


def _publish(store: Any, key: str, value: Any) -> None:
    store.set(key, json.dumps(value))


def _read(store: Any, key: str) -> Any:
    return json.loads(store.get(key))


def run_rank(
    rank: int,
    world: int,
    master: str,
    port: int,
    node_ip: str,
    *,
    max_mb: int = 256,
    iters: int = 20,
    warmup: int = 5,
    backend: str = "auto",
    host_window_s: float = 0.2,
    host_rounds: int = 3,
    sizes: list[int] | None = None,
    link_bytes: int | None = None,
    local_bytes: int | None = None,
    budget_s: float | None = None,
    job_started_unix: float | None = None,
    rendezvous_timeout_s: float = 120.0,
    hosts_below_gbps: float | None = None,
) -> dict[str, Any] | None:
    """This process's part of the probe (every rank runs the same steps); rank 0 returns the summary.

    Ranks meet at rank 0's TCPStore (`master`:`port`), form the group, agree on rank 0's plan (the
    budget left after start-up, `measure_budget`), run the sweep together, then the per-host phase one
    host / one set of disjoint links at a time (a barrier between steps), and hand their figures to
    rank 0 through the store. With `job_started_unix` (when the caller launched the ranks), the
    measurement gets what the start-up left of `budget_s`. With `hosts_below_gbps`, the per-host phase
    runs only when the sweep's busbw is below it (the cluster missed its expectation: which host is
    to blame?); a cluster that meets it is not held up by tests whose verdict nobody would act on.
    """
    started_at = time.perf_counter()
    phases: dict[str, float] = {}
    mark = [started_at]

    def lap(name: str) -> None:  # where the probe's time goes (stored with its result)
        now = time.perf_counter()
        phases[name] = round(now - mark[0], 3)
        mark[0] = now

    timeout = timedelta(seconds=rendezvous_timeout_s)
    me = Rank(node_ip)
    info = me.info()  # `import torch`
    lap("import_s")
    store = me.connect(rank, world, master, port, timeout)
    _publish(store, f"volt/info/{rank}", info)
    infos = [_read(store, f"volt/info/{i}") for i in range(world)]
    if backend == "auto":
        backend = "nccl" if all(other["cuda"] for other in infos) else "gloo"
    correct = me.join(rank, world, backend)
    lap("join_s")  # the rendezvous (every rank up and connected) and the correctness all-reduce
    sizes = list(sizes or message_sizes(max_mb))
    groups = link_groups(ring_links(world))
    pairs = ring_links(world)
    try:
        if rank == 0:  # one clock decides what is left of the budget
            # A per-host phase that may not run gets no share: the sweep takes what is left.
            windows = host_rounds * (world + len(groups)) if hosts_below_gbps is None else 0
            _publish(store, "volt/plan", measure_budget(budget_s, job_started_unix, windows, host_window_s))
        sweep_budget, host_window_s, spent = _read(store, "volt/plan")
        lap("plan_s")
        times = me.allreduce_times(sizes, iters, warmup, sweep_budget)
        _publish(store, f"volt/times/{rank}", times)
        every = [_read(store, f"volt/times/{i}") for i in range(world)]
        sweep_busbw = summarize(world, backend, sizes, every)["max_busbw_gbps"]  # alike on every rank
        run_hosts = hosts_below_gbps is None or sweep_busbw < hosts_below_gbps
        lap("sweep_s")
        # One host at a time, then disjoint links at once: no two measured things share a host. Rounds
        # go round-robin, so a host's windows lie apart in time and a burst of load elsewhere that
        # spoils one of them does not spoil the other: the best window counts.
        ran = sizes[: len(times)]
        local_size = local_bytes or min(ran[-1], 64 * MB)
        # A link-test step lasts ~_LINK_STEP_S at the rate the sweep measured (not only the predicted one:
        # without a prediction the plan's message is 64 MB, seconds per window on a slow link).
        link_size = _power_of_two_at_most(
            min(link_bytes or min(ran[-1], 64 * MB), max(MIN_MESSAGE_BYTES, sweep_busbw * 1e9 * _LINK_STEP_S))
        )
        local = 0.0
        link_rates: dict[str, list[float]] = {}  # "a-b" -> this rank's figure per round
        for _ in range(host_rounds if run_hosts else 0):
            for turn in range(world):
                if turn == rank:
                    local = max(local, me.local_gbps(local_size, host_window_s, 1))
                me.barrier()
        for _ in range(host_rounds if run_hosts else 0):
            for group in groups:
                for a, b in group:
                    if rank in (a, b):
                        rate = me.link_gbps(b if rank == a else a, link_size, host_window_s, 1)
                        link_rates.setdefault(f"{a}-{b}", []).append(rate)
                me.barrier()
        lap("hosts_s")
        _publish(store, f"volt/result/{rank}", {"times": times, "local": local, "links": link_rates})
        if rank != 0:
            return None
        mine = [_read(store, f"volt/result/{i}") for i in range(world)]
    finally:
        me.close()
    lap("gather_s")
    ran = sizes[: min(len(r["times"]) for r in mine)]  # the sizes every rank ran
    links = []
    for a, b in pairs:  # per round, the slower side's figure; the best round counts
        key = f"{a}-{b}"
        rounds = zip(mine[a]["links"].get(key, []), mine[b]["links"].get(key, []), strict=False)
        links.append((a, b, max((min(x, y) for x, y in rounds), default=0.0)))
    node_ips = [other["node_ip"] for other in infos]
    if run_hosts:
        phase = {"ran": True, "why": "always" if hosts_below_gbps is None else
                 f"the sweep's {sweep_busbw:.3g} GB/s is below {hosts_below_gbps:.3g} GB/s"}  # fmt: skip
    else:
        phase = {"ran": False, "why": f"the sweep's {sweep_busbw:.3g} GB/s met {hosts_below_gbps:.3g} GB/s"}
    return summarize(
        world, backend, ran, [r["times"] for r in mine],
        node_ips=node_ips, iters=iters, warmup=warmup, correct=bool(correct),
        hosts=summarize_hosts(node_ips, [r["local"] for r in mine], links) if run_hosts else [],
        links=[{"ranks": [a, b], "gbps": gbps} for a, b, gbps in links] if run_hosts else [],
        hosts_phase=phase,
        sizes_bytes=ran, link_bytes=link_size, local_bytes=local_size, budget_s=budget_s,
        link_groups=[[list(pair) for pair in group] for group in groups],
        elapsed_s=time.perf_counter() - started_at, phases_s=phases,
        spent_before_measuring_s=spent, sweep_budget_s=sweep_budget, host_window_s=host_window_s,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Volt all-reduce bandwidth probe: one rank per host (run the same on every host)."
    )
    parser.add_argument("--rank", type=int, required=True, help="this host's rank (0 serves the rendezvous)")
    parser.add_argument("--world", type=int, required=True, help="number of ranks (hosts)")
    parser.add_argument("--master", required=True, help="rank 0's IP (its node IP)")
    parser.add_argument("--port", type=int, required=True, help="rank 0's rendezvous port")
    parser.add_argument("--node-ip", required=True, help="this host's IP: gloo binds to it")
    parser.add_argument("--max-mb", type=int, default=256, help="largest message, MB (power of two)")
    parser.add_argument("--iters", type=int, default=20, help="timed all-reduces per size")
    parser.add_argument("--warmup", type=int, default=5, help="untimed all-reduces per size")
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    parser.add_argument(
        "--host-window-s", type=float, default=0.2, help="per-host tests: seconds per timed window"
    )
    parser.add_argument("--host-rounds", type=int, default=3, help="per-host tests: windows (best counts)")
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
        help="when the caller launched the ranks (the budget counts from it)",
    )
    parser.add_argument(
        "--rendezvous-timeout-s", type=float, default=120.0, help="how long ranks wait for each other"
    )
    parser.add_argument(
        "--hosts-below-gbps",
        type=float,
        default=None,
        help="run the per-host phase only when the sweep's busbw is below this (default: always)",
    )
    args = parser.parse_args(argv)
    summary = run_rank(
        args.rank,
        args.world,
        args.master,
        args.port,
        args.node_ip,
        max_mb=args.max_mb,
        iters=args.iters,
        warmup=args.warmup,
        backend=args.backend,
        host_window_s=args.host_window_s,
        host_rounds=args.host_rounds,
        sizes=[int(size) for size in args.sizes.split(",") if size] or None,
        link_bytes=args.link_bytes,
        local_bytes=args.local_bytes,
        budget_s=args.budget_s,
        job_started_unix=min(args.submitted_unix, _STARTED_UNIX) if args.submitted_unix else None,
        rendezvous_timeout_s=args.rendezvous_timeout_s,
        hosts_below_gbps=args.hosts_below_gbps,
    )
    if summary is not None:
        summary["started_unix"] = _STARTED_UNIX
        print(RESULT_PREFIX + json.dumps(summary), flush=True)
    return 0 if summary is None or summary["correct"] else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown (torch's and gloo's destructors: ~1 s of every bring-up measured):
    # the figures are out, the store's clients are gone, nothing is left to write.
    os._exit(code)
