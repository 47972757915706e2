"""The churn bench's simulated state (bench/churn.py): a request of the trace and what happened to it (`Job`),
and the inventory under one policy: free GPUs per host, hosts up or down, hosts held for reservations, and
for Volt's policies one placement index kept current."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace

from clusters.placement import HostSnapshot, Inventory, PlacementRequest, Plan, best_fit, first_fit, plan
from clusters.placement.nodes import node_gpus


@dataclass
class Job:
    """One request of the trace and what happened to it under one policy."""

    number: int
    arrival_s: float
    duration_s: float
    request: PlacementRequest
    remaining_s: float = 0.0
    queued_since_s: float = 0.0
    wait_s: float = 0.0
    placed: bool = False
    plan: Plan | None = None  # the running plan
    first_plan: Plan | None = None  # the plan it first started on (what the shares count)
    end_s: float = math.inf
    slowdown: float = 1.0  # time on its plan / time at rack speed, for the same work (`Slowdown`)
    hosts: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    over_ask: float = 1.0  # its requested duration / its actual run time (bench/churn_queue.py)
    requested_end_s: float = math.inf
    started_s: float | None = None
    bound_s: float | None = None  # the first start bound it was given (volt_goodput)
    late: bool = False  # started after that bound
    quota_blocked: bool = False  # held by its team's quota after it got a bound


class Cluster:
    """The simulated inventory under one policy: free GPUs per host, hosts up, and for Volt one index
    kept current by Inventory.update (a down host is indexed with no free GPUs)."""

    def __init__(self, hosts: list[HostSnapshot], policy: str, price_band: float = 0.0):
        self.policy = policy
        self.price_band = price_band
        self.hosts = {h.host_id: h for h in hosts}
        self.by_model: dict[str, list[str]] = {}  # listing order per model (first fit walks it)
        for host in hosts:
            self.by_model.setdefault(host.gpu_model, []).append(host.host_id)
        self.down: set[str] = set()
        self.hidden: set[str] = set()  # held for reservations (volt_goodput): indexed with no free GPUs
        self.index = Inventory(hosts) if policy.startswith("volt") else None
        self.busy = 0
        self.useful = 0.0  # GPUs' worth of progress: busy GPUs, each divided by its job's slowdown
        self.spend = 0.0  # US dollars per hour of the plans running
        self.total = sum(h.total_gpus for h in hosts)
        self.node_size: dict[str, Counter] = {}  # model -> largest node a host can give -> hosts
        for host in hosts:
            self.node_size.setdefault(host.gpu_model, Counter())[_largest_node(host)] += 1

    def _set(self, host: HostSnapshot, free: tuple[tuple[int, ...], ...]) -> None:
        updated = replace(host, free_gpus=free)
        self.hosts[host.host_id] = updated
        if host.host_id not in self.down:
            sizes = self.node_size[host.gpu_model]
            sizes[_largest_node(host)] -= 1
            sizes[_largest_node(updated)] += 1
            self._index(updated)

    def _index(self, host: HostSnapshot) -> None:
        if self.index is not None:
            gone = host.host_id in self.down or host.host_id in self.hidden
            self.index.update(replace(host, free_gpus=()) if gone else host)

    def hide(self, host_ids, hidden: bool) -> None:
        """Hold hosts out of placement (a reservation's), or give them back."""
        changed = [h for h in host_ids if (h in self.hidden) != hidden]
        (self.hidden.update if hidden else self.hidden.difference_update)(changed)
        if self.index is not None and changed:
            gone = self.down | self.hidden
            snapshots = (self.hosts[h] for h in changed)
            self.index.update_many(replace(h, free_gpus=()) if h.host_id in gone else h for h in snapshots)

    def could_fit(self, request: PlacementRequest) -> bool:
        sizes = self.node_size[request.models[0]]
        return sum(n for size, n in sizes.items() if size >= request.gpus_per_node) >= request.nodes

    def place(self, request: PlacementRequest) -> Plan | None:
        if not self.could_fit(request):
            return None
        if self.index is not None:
            result = plan(request, self.index, validate_inventory=False, price_band=self.price_band)
        else:
            listed = [self.hosts[i] for i in self.by_model[request.models[0]] if i not in self.down]
            result = (first_fit if self.policy == "first_fit" else best_fit)(request, listed)
        return result if isinstance(result, Plan) else None

    def allocate(self, job: Job) -> None:
        for node in job.plan.nodes:
            host = self.hosts[node.host_id]
            taken = set(node.gpu_indices)
            self._set(host, tuple(tuple(i for i in d if i not in taken) for d in host.free_gpus))
            job.hosts.append((node.host_id, node.gpu_indices))
            self.busy += len(taken)
            self.useful += len(taken) / job.slowdown
        self.spend += job.plan.price_per_hour

    def release(self, job: Job) -> None:
        for host_id, indices in job.hosts:
            host = self.hosts[host_id]
            free = {i for d in host.free_gpus for i in d} | set(indices)
            self._set(host, _domains(host, free))
            self.busy -= len(indices)
            self.useful -= len(indices) / job.slowdown
        if job.hosts:
            self.spend -= job.plan.price_per_hour
        job.hosts = []

    def set_down(self, host_id: str, down: bool) -> None:
        host = self.hosts[host_id]
        sizes = self.node_size[host.gpu_model]
        sizes[_largest_node(host)] += -1 if down else 1
        self.total += -host.total_gpus if down else host.total_gpus
        (self.down.add if down else self.down.discard)(host_id)
        self._index(host)

    def partly_used(self, running_on: dict[str, set[int]], jobs: list[Job]) -> tuple[int, int]:
        """(up hosts with some but not all GPUs free, those of them on which a multi-node job runs)."""
        hosts = [i for i, h in self.hosts.items() if i not in self.down and 0 < h.free_count() < h.total_gpus]
        multi = sum(any(jobs[j].request.nodes > 1 for j in running_on.get(i, ())) for i in hosts)
        return len(hosts), multi

    def free_split(self) -> tuple[int, int]:
        """(free GPUs on up hosts with every GPU free, free GPUs on up hosts partly used)."""
        whole = partial = 0
        for host_id, host in self.hosts.items():
            free = host.free_count()
            if host_id in self.down or not free:
                continue
            if free == host.total_gpus:
                whole += free
            else:
                partial += free
        return whole, partial

    def stranded(self, gpus: int) -> int:
        """Free GPUs on up hosts that cannot give a node of `gpus` GPUs."""
        return sum(
            h.free_count() for i, h in self.hosts.items() if i not in self.down and node_gpus(h, gpus) is None
        )


def _largest_node(host: HostSnapshot) -> int:
    if not host.nvlink:
        return host.free_count()
    return max((len(d) for d in host.free_gpus), default=0)


def _domains(host: HostSnapshot, free: set[int]) -> tuple[tuple[int, ...], ...]:
    if not host.nvlink:
        return tuple((i,) for i in sorted(free))
    return (tuple(sorted(free)),)  # the bench's NVLink hosts have one domain of all their GPUs
