"""The placement index: host snapshots grouped per (model, GPUs per node) and block, built once and
reused by many plans (engine.py searches it). Pure Python: no Django import.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from .bandwidth import level_caps_gbps
from .nodes import node_gpus
from .types import LEVELS, HostSnapshot


class Entry(NamedTuple):
    """One host's place for a node shape. Tuples sort in placement's in-block order: cheapest, best
    locality, fewest GPUs left on the host, most reliable, then primary key (ids are unique, so the
    comparison never reaches the host object)."""

    price: float
    locality: int  # nodes.ONE_DOMAIN / ONE_NUMA / CROSS_NUMA
    left: int  # free GPUs the host keeps after giving this node
    unreliability: float  # -reliability
    id_key: tuple[int, str]  # primary key order: (length, id), so "9" sorts before "10"
    ordinal: int  # the group's index in its shape
    host: HostSnapshot
    gpus: tuple[int, ...]


def id_key(host_id: str) -> tuple[int, str]:
    """Primary key order for host ids (database ids as strings): numeric order, never name order."""
    return (len(host_id), host_id)


_Entry = Entry  # the engine's name for it


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
    free_gpus: list[dict[tuple[str, ...], int]]  # per level: domain key -> free GPUs of those hosts
    ordinals: dict[tuple, int]  # group key -> index in `groups`


class Inventory:
    """An index of host snapshots, built once and reused by many plans.

    Per (model, GPUs per node) it groups the hosts that can give a node that many GPUs
    (nodes.node_gpus) by block, sorted in placement order with prefix sums, and counts them per domain at
    every level. Shapes are built on first use; `prepare()` builds them ahead of time.
    """

    def __init__(self, hosts: Iterable[HostSnapshot]):
        self.hosts: dict[str, HostSnapshot] = {}
        self._blocks: dict[str, dict[tuple, list[HostSnapshot]]] = {}  # model -> group key -> hosts
        self._largest: dict[str, int] = {}
        self.pcie_models: set[str] = set()  # models some PCIe-only host offers (refusals word it so)
        for host in hosts:
            if host.host_id in self.hosts:
                raise ValueError(f"host {host.host_id} appears twice in the snapshot")
            self.hosts[host.host_id] = host
            self._blocks.setdefault(host.gpu_model, {}).setdefault(_group_key(host), []).append(host)
            self._largest[host.gpu_model] = max(self._largest.get(host.gpu_model, 0), host.total_gpus)
            if not host.nvlink:
                self.pcie_models.add(host.gpu_model)
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
        """The (cached) index of hosts of `model` that can give a node of `gpus_per_node` GPUs."""
        key = (model, gpus_per_node)
        if key not in self._shapes:
            self._shapes[key] = _build_shape(self._blocks.get(model, {}).items(), gpus_per_node)
        return self._shapes[key]

    def update(self, host: HostSnapshot) -> None:
        """Replace a host's snapshot (its free GPUs changed) and refresh its group in every shape built.

        Costs one block's hosts per shape, not a rebuild: a simulator (bench/churn.py) or a long-lived
        index can follow allocations. The host keeps its place: same model, path and fabric figures.
        """
        self.update_many((host,))

    def update_many(self, hosts: Iterable[HostSnapshot]) -> None:
        """`update` for several hosts, each group refreshed once however many of its hosts changed (a
        reservation of 64 hosts in a few blocks costs a few group rebuilds per shape, not 64)."""
        changed: dict[tuple, str] = {}
        for host in hosts:
            old = self.hosts[host.host_id]
            key = _group_key(host)
            if host.gpu_model != old.gpu_model or key != _group_key(old):
                raise ValueError(f"host {host.host_id} changed model or place; build a new Inventory")
            self.hosts[host.host_id] = host
            members = self._blocks[host.gpu_model][key]
            members[next(i for i, member in enumerate(members) if member.host_id == host.host_id)] = host
            changed[key] = host.gpu_model
        for (model, count), shape in self._shapes.items():
            for key, changed_model in changed.items():
                if changed_model == model:
                    _refresh_group(shape, key, self._blocks[model][key], count)


def _group_key(host: HostSnapshot) -> tuple:
    """Hosts share a group when everything the bandwidth model reads from them is equal."""
    figures = (host.fabric_kind, host.injection_gbps, host.fabric_host_gbps, host.fabric_oversubscription)
    return (host.path, *figures, host.site_backbone_gbps)


def _entries(hosts: list[HostSnapshot], count: int, ordinal: int) -> list[Entry]:
    """Each host's place for a node of `count` GPUs (nodes.node_gpus), if it can give one."""
    entries = []
    for host in hosts:
        chosen = node_gpus(host, count)
        if chosen is not None:
            locality, gpus = chosen
            left = host.free_count() - count
            key = id_key(host.host_id)
            entries.append(
                Entry(host.price_per_gpu_hour, locality, left, -host.reliability, key, ordinal, host, gpus)
            )
    return entries


def _build_shape(blocks: Iterable[tuple[tuple, list[HostSnapshot]]], count: int) -> _Shape:
    shape = _Shape([], [{} for _ in LEVELS], [{} for _ in LEVELS], {})
    for key, hosts in blocks:
        _refresh_group(shape, key, hosts, count)
    return shape


def _refresh_group(shape: _Shape, key: tuple, hosts: list[HostSnapshot], count: int) -> None:
    """(Re)build the group of `hosts` (one group key) in `shape` and adjust the per-domain counts."""
    ordinal = shape.ordinals.get(key)
    entries = _entries(hosts, count, len(shape.groups) if ordinal is None else ordinal)
    if ordinal is None:
        if not entries:
            return
        group = _build_group(entries, len(shape.groups), entries[0].host)
        shape.groups.append(group)
        shape.ordinals[key] = group.ordinal
        old_hosts, old_free = 0, 0
    else:
        old = shape.groups[ordinal]
        old_hosts, old_free = len(old.entries), _free(old.entries, count)
        group = shape.groups[ordinal] = _build_group(entries, ordinal, old.host)
    hosts_delta, free_delta = len(group.entries) - old_hosts, _free(group.entries, count) - old_free
    for index, domain in enumerate(group.keys):
        shape.fit_counts[index][domain] = shape.fit_counts[index].get(domain, 0) + hosts_delta
        shape.free_gpus[index][domain] = shape.free_gpus[index].get(domain, 0) + free_delta


def _free(entries: list[Entry], count: int) -> int:
    """Free GPUs of these hosts (each gives `count` and keeps `left`)."""
    return sum(entry.left for entry in entries) + count * len(entries)


def _build_group(entries: list[_Entry], ordinal: int, host: HostSnapshot) -> _Group:
    """A group's sorted entries and prefix sums; `host` represents its path and fabric figures."""
    entries.sort()
    price_sums, reliability_sums = [0.0], [0.0]
    for entry in entries:
        price_sums.append(price_sums[-1] + entry.price)
        reliability_sums.append(reliability_sums[-1] - entry.unreliability)
    keys = tuple(host.path.domain(level) for level in LEVELS)
    prices = [entry.price for entry in entries]
    caps = level_caps_gbps(host)
    return _Group(ordinal, host, keys, entries, prices, price_sums, reliability_sums, caps)
