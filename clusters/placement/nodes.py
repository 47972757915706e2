"""Which GPUs of one host a node takes (DESIGN.md "Placement"). Pure Python: no Django import.

On a host with NVLink, a node's GPUs come from one NVLink domain: the smallest free domain that fits
(best fit at GPU level). On a PCIe-only host any free GPUs will do, preferring GPUs under one PCIe
switch (`topo -m` PIX/PXB), then on one NUMA node (NODE/PHB), then across NUMA nodes (SYS); inside
each tier the tightest group that fits. The locality tier is part of the plan's rank.
"""

from __future__ import annotations

from .types import HostSnapshot

ONE_DOMAIN = 0  # one NVLink domain, or one PCIe switch
ONE_NUMA = 1  # one NUMA node, several PCIe switches
CROSS_NUMA = 2  # across the host's NUMA nodes (SYS)
LOCALITY_LABELS = ("one NVLink domain / PCIe switch", "one NUMA node", "across NUMA nodes")


def node_gpus(host: HostSnapshot, count: int) -> tuple[int, tuple[int, ...]] | None:
    """(locality tier, GPU indices) for a node of `count` GPUs on `host`, or None if it cannot give one."""
    if host.nvlink:
        fitting = [domain for domain in host.free_gpus if len(domain) >= count]
        if not fitting:
            return None
        return ONE_DOMAIN, tuple(sorted(min(fitting, key=len))[:count])
    free = sorted(index for domain in host.free_gpus for index in domain)
    if len(free) < count:
        return None
    if count == 1:
        return ONE_DOMAIN, (free[0],)
    for tier, groups in ((ONE_DOMAIN, host.pcie_switches), (ONE_NUMA, host.numa_nodes)):
        chosen = _tightest(groups, set(free), count)
        if chosen is not None:
            return tier, chosen
    return CROSS_NUMA, _spread(host.numa_nodes, free, count)


def _tightest(groups, free: set[int], count: int) -> tuple[int, ...] | None:
    """From the group with the fewest free GPUs that still has `count`: fullest switches first."""
    best: list[int] | None = None
    for group in groups:
        members = sorted(index for index in group if index in free)
        if len(members) >= count and (best is None or len(members) < len(best)):
            best = members
    return None if best is None else tuple(sorted(best[:count]))


def _spread(numa_nodes, free: list[int], count: int) -> tuple[int, ...]:
    """Across NUMA nodes: the nodes with the most free GPUs first, so the node crosses as few as possible."""
    free_set = set(free)
    groups = [sorted(i for i in group if i in free_set) for group in numa_nodes]
    grouped = {i for group in groups for i in group}
    groups.append([i for i in free if i not in grouped])  # GPUs topo -m placed on no NUMA node
    taken: list[int] = []
    for group in sorted(groups, key=lambda g: (-len(g), g)):
        taken += group[: count - len(taken)]
    return tuple(sorted(taken))
