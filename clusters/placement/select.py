"""Which hosts of a candidate domain a plan takes: exact, by a tree dynamic programme. Pure Python.

Given the usable hosts of one domain (each group's entries sorted cheapest first), `choose` returns
the `nodes` hosts that minimise, in this order:

1. price: the cheapest hosts; only hosts at the marginal price are a choice,
2. then the vector `Fit` (see `FIELDS`): the nodes' locality inside their hosts, the fewest regions,
   then sites, fabrics and blocks spanned (top level down, as Kueue TAS and Slurm's topology/tree
   minimise: a cross-site hop costs more than any number of in-fabric ones), the fewest GPUs left on
   the hosts used (the tightest hosts: whole hosts stay whole for 8-GPU nodes), the least free capacity
   in the blocks, fabrics and sites touched (the tightest domains), the most reliable hosts, and last the
   hosts' primary keys (never names).

Every component but the last is a sum over hosts, or over the distinct domains touched, so a
min-plus convolution over the topology tree (block -> fabric -> site -> region -> global) finds the
optimum: a block takes a prefix of its hosts in entry order, which is optimal for the per-host sums.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import islice
from operator import add

from .index import Entry, _Group, _Shape

FIELDS = (
    "locality",
    "regions",
    "sites",
    "fabrics",
    "blocks",
    "gpus_left_on_hosts",
    "free_gpus_in_blocks",
    "free_gpus_in_fabrics",
    "free_gpus_in_sites",
    "unreliability_ppm",
)
Fit = tuple[int, ...]
_ZERO: Fit = (0,) * len(FIELDS)
_COUNT_FIELD = (4, 3, 2, 1)  # block, fabric, site, region: where each span count sits (coarsest first)
_FREE_FIELD = (6, 7, 8, None)  # free capacity of touched blocks, fabrics, sites (regions: not ranked)
_PRICE_EPS = 1e-9


def host_fit(entry: Entry) -> Fit:
    """The per-host part of the fit vector."""
    return (entry.locality, 0, 0, 0, 0, entry.left, 0, 0, 0, round(entry.unreliability * 1e6))


def _add(a: Fit, b: Fit) -> Fit:
    return tuple(map(add, a, b))


def _domain_cost(level: int, free: int) -> Fit:
    cost = [0] * len(FIELDS)
    cost[_COUNT_FIELD[level]] = 1
    if _FREE_FIELD[level] is not None:
        cost[_FREE_FIELD[level]] = free
    return tuple(cost)


def choose(shape: _Shape, usable: Sequence[tuple[_Group, int]], nodes: int) -> tuple[tuple[Entry, ...], Fit]:
    """The best `nodes` entries of these groups (the first `count` entries of each are usable)."""
    if len(usable) == 1:  # one block: entry order is price, then the per-host fit, so a prefix is best
        group = usable[0][0]
        entries = tuple(group.entries[:nodes])
        free = [shape.free_gpus[level].get(key, 0) for level, key in enumerate(group.keys[:3])]
        locality = left = unreliability = 0
        for entry in entries:
            locality += entry.locality
            left += entry.left
            unreliability += round(entry.unreliability * 1e6)
        return entries, (locality, 1, 1, 1, 1, left, *free, unreliability)
    marginal = _marginal_price(usable, nodes)
    mandatory: list[Entry] = []
    tied: dict[tuple, list[Entry]] = {}  # block key -> entries at the marginal price
    for group, count in usable:
        prices = group.prices
        low = bisect_left(prices, marginal - _PRICE_EPS, 0, count)
        high = bisect_right(prices, marginal + _PRICE_EPS, low, count)
        mandatory += group.entries[:low]
        if high > low:
            tied.setdefault(group.keys[0], []).extend(group.entries[low:high])
    touched = [set() for _ in _COUNT_FIELD]
    base = _ZERO
    for entry in mandatory:
        base = _add(base, host_fit(entry))
        for level, key in enumerate(shape.groups[entry.ordinal].keys[:4]):  # block .. region
            if key not in touched[level]:
                touched[level].add(key)
                base = _add(base, _domain_cost(level, shape.free_gpus[level].get(key, 0)))
    remaining = nodes - len(mandatory)
    if remaining == 0:
        return tuple(mandatory), base
    best, chosen = _solve(shape, _tree(shape, tied), remaining, touched)
    return tuple(mandatory) + tuple(chosen), _add(base, best)


def _marginal_price(usable: Sequence[tuple[_Group, int]], nodes: int) -> float:
    """The price of the `nodes`-th cheapest usable host."""
    merged = heapq.merge(*(group.prices[:count] for group, count in usable))
    return list(islice(merged, nodes))[-1]


def _tree(shape: _Shape, tied: dict[tuple, list[Entry]]) -> dict:
    """region key -> site key -> fabric key -> block key -> entries (sorted), in primary-key order."""
    tree: dict = {}
    for block, entries in sorted(tied.items(), key=lambda item: min(e.id_key for e in item[1])):
        entries.sort()
        keys = shape.groups[entries[0].ordinal].keys
        tree.setdefault(keys[3], {}).setdefault(keys[2], {}).setdefault(keys[1], {})[block] = entries
    return tree


def _solve(shape: _Shape, tree: dict, limit: int, touched) -> tuple[Fit, list[Entry]]:
    """Best fit vector and entries for exactly `limit` hosts of the tree."""
    table, pick = _table(shape, (), tree, 4, limit, touched)
    return table[limit], pick(limit)


def _table(shape: _Shape, key: tuple, node, level: int, limit: int, touched):
    """(best[x] for x = 0..limit, None where impossible; pick(x) -> entries) for the domain `key` at
    `level` (0 block .. 4 global); `node` is its entries (a block) or its children by key."""
    if level == 0:
        best: list[Fit | None] = [_ZERO]
        for entry in node[:limit]:
            best.append(_add(best[-1], host_fit(entry)))
        best += [None] * (limit + 1 - len(best))
        pick = node.__getitem__  # a prefix: pick(slice(x))
        picker = lambda x: pick(slice(x))  # noqa: E731
    else:
        children = [_table(shape, k, child, level - 1, limit, touched) for k, child in node.items()]
        best, backs = _convolve([table for table, _ in children], limit)
        picker = _picker(children, backs)
    if level < 4 and key not in touched[level]:  # a new domain at this level costs its count and free
        cost = _domain_cost(level, shape.free_gpus[level].get(key, 0))
        best = [best[0]] + [None if b is None else _add(b, cost) for b in best[1:]]
    return best, picker


def _convolve(tables: list[list], limit: int) -> tuple[list, list[list[int]]]:
    """Min-plus convolution of children's tables; backs[i][t] = hosts child i gives for total t."""
    current: list[Fit | None] = [_ZERO] + [None] * limit
    backs: list[list[int]] = []
    for table in tables:
        merged: list[Fit | None] = [None] * (limit + 1)
        back = [0] * (limit + 1)
        for total, value in enumerate(current):
            if value is None:
                continue
            for take, cost in enumerate(table[: limit - total + 1]):
                if cost is None:
                    break
                candidate = _add(value, cost)
                slot = merged[total + take]
                if slot is None or candidate <= slot:  # equal: earlier (lower-key) children keep theirs
                    merged[total + take], back[total + take] = candidate, take
        current = merged
        backs.append(back)
    return current, backs


def _picker(children, backs):
    def pick(total: int) -> list[Entry]:
        entries: list[Entry] = []
        for (_, child_pick), back in zip(reversed(children), reversed(backs), strict=True):
            take = back[total]
            entries += child_pick(take) if take else []
            total -= take
        return entries

    return pick
