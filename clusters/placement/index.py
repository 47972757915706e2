"""The placement index: host snapshots grouped per (model, GPUs per node) and block, built once and
reused by many plans (engine.py searches it). Pure Python: no Django import.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .bandwidth import level_caps_gbps
from .types import LEVELS, HostSnapshot

# price, leftover GPUs in the NVLink domain used, -reliability, host id, NVLink domain index, group
# ordinal, host. Tuples sort in placement's in-domain order; host ids are unique, so the comparison
# never reaches the host object.
_Entry = tuple[float, int, float, str, int, int, HostSnapshot]


@dataclass(slots=True)
class _Group:
    """Hosts of one model in one block, with one set of fabric figures, that fit k GPUs per node."""

    ordinal: int
    host: HostSnapshot  # representative: path and fabric figures are the group's
    keys: tuple[tuple[str, ...], ...]  # domain key at each level, finest first
    entries: list[_Entry]
    prices: list[float]
    price_sums: list[float]  # price_sums[i] = sum of the i cheapest prices
    reliability_sums: list[float]
    declared_caps: tuple[float, ...]


@dataclass(slots=True)
class _Shape:
    """The index for one (model, GPUs per node): groups, and fitting-host counts per domain."""

    groups: list[_Group]
    fit_counts: list[dict[tuple[str, ...], int]]  # per level: domain key -> hosts that fit


class Inventory:
    """An index of host snapshots, built once and reused by many plans.

    Per (model, GPUs per node) it groups the hosts that can give that many GPUs from one NVLink
    domain by block, sorted in placement order with prefix sums, and counts them per domain at
    every level. Shapes are built on first use; `prepare()` builds them ahead of time.
    """

    def __init__(self, hosts: Iterable[HostSnapshot]):
        self.hosts: dict[str, HostSnapshot] = {}
        self._blocks: dict[str, dict[tuple, list[HostSnapshot]]] = {}  # model -> group key -> hosts
        self._largest: dict[str, int] = {}
        for host in hosts:
            if host.host_id in self.hosts:
                raise ValueError(f"host {host.host_id} appears twice in the snapshot")
            self.hosts[host.host_id] = host
            self._blocks.setdefault(host.gpu_model, {}).setdefault(_group_key(host), []).append(host)
            self._largest[host.gpu_model] = max(self._largest.get(host.gpu_model, 0), host.total_gpus)
        self.models: tuple[str, ...] = tuple(sorted(self._blocks))  # GPU models some host offers
        self._shapes: dict[tuple[str, int], _Shape] = {}

    def largest_host_gpus(self, model: str) -> int:
        """The most GPUs any host of `model` has (0 when none)."""
        return self._largest.get(model, 0)

    def prepare(
        self, gpus_per_node: Iterable[int] = range(1, 9), models: Iterable[str] | None = None
    ) -> None:
        """Build the index for these node shapes now rather than inside the first plan."""
        for model in self.models if models is None else models:
            for count in gpus_per_node:
                self.shape(model, count)

    def shape(self, model: str, gpus_per_node: int) -> _Shape:
        """The (cached) index of hosts of `model` that can give `gpus_per_node` GPUs in one domain."""
        key = (model, gpus_per_node)
        if key not in self._shapes:
            self._shapes[key] = _build_shape(self._blocks.get(model, {}).values(), gpus_per_node)
        return self._shapes[key]


def _group_key(host: HostSnapshot) -> tuple:
    """Hosts share a group when everything the bandwidth model reads from them is equal."""
    figures = (host.fabric_kind, host.fabric_host_gbps, host.fabric_oversubscription)
    return (host.path, *figures, host.site_backbone_gbps)


def _entries(hosts: list[HostSnapshot], count: int, ordinal: int) -> list[_Entry]:
    """Each host's place for `count` GPUs: its smallest NVLink domain with enough free GPUs."""
    entries = []
    for host in hosts:
        best_size, best_index = 0, -1
        for index, free in enumerate(host.free_gpus):
            size = len(free)
            if size >= count and (best_index < 0 or size < best_size):
                best_size, best_index = size, index
        if best_index >= 0:
            rank = (host.price_per_gpu_hour, best_size - count, -host.reliability, host.host_id)
            entries.append((*rank, best_index, ordinal, host))
    return entries


def _build_shape(blocks: Iterable[list[HostSnapshot]], count: int) -> _Shape:
    groups: list[_Group] = []
    for hosts in blocks:
        entries = _entries(hosts, count, len(groups))
        if entries:
            groups.append(_build_group(entries))
    fit_counts: list[dict[tuple[str, ...], int]] = [{} for _ in LEVELS]
    for group in groups:
        for index, key in enumerate(group.keys):
            fit_counts[index][key] = fit_counts[index].get(key, 0) + len(group.entries)
    return _Shape(groups, fit_counts)


def _build_group(entries: list[_Entry]) -> _Group:
    entries.sort()
    host = entries[0][6]
    price_sums, reliability_sums = [0.0], [0.0]
    for entry in entries:
        price_sums.append(price_sums[-1] + entry[0])
        reliability_sums.append(reliability_sums[-1] - entry[2])
    keys = tuple(host.path.domain(level) for level in LEVELS)
    prices = [entry[0] for entry in entries]
    caps = level_caps_gbps(host)
    return _Group(entries[0][5], host, keys, entries, prices, price_sums, reliability_sums, caps)
