"""Topology-aware placement (DESIGN.md "Placement"). Pure Python: no Django import.

`plan(request, hosts, measured)` returns a `Plan` or a `Refusal`. The rules, in order; each one only
breaks ties left by the ones above it:

1. Hard constraints: an allowed GPU model; `gpus_per_node` free GPUs of one host — from ONE NVLink
   domain on NVLink hosts, any free GPUs on PCIe-only hosts (nodes.py); price per GPU-hour <= the
   maximum; an allowed region; a required interconnect (every host on one of the named fabric
   kinds); a required topology level L (every node inside one domain of L); one node per host.
2. Models: `ordered` takes the first listed model that can be placed at all. `any_of` plans every
   listed model and compares the plans by rules 3-6, so for collective workloads the best busbw
   wins and the cheapest of those; for the others the cheapest plan wins.
3. Interconnect `preferred`: plans on the preferred kinds first; otherwise any fabric, said so.
4. Topology `preferred` level L (Kueue TAS): plans inside one domain of L first, then of the next
   level up, and so on; each fall-back is said in the explanation.
5. Collective workloads (data_parallel, tensor_pipeline, more than one node): highest predicted
   busbw (`bandwidth.cluster_busbw_gbps`), then lowest price. Others (independent tasks, inference
   replicas, one node): lowest price.
6. Fit, for every request kind (select.FIELDS, in order): the best GPU locality inside the hosts
   (PCIe switch, NUMA node), the fewest regions, then sites, fabrics, blocks spanned (top level down,
   as Kueue TAS and Slurm do); the tightest hosts (fewest GPUs left); the tightest blocks, fabrics,
   sites (least free capacity); the most reliable hosts; then host primary keys. Never names.

The search tries levels finest first and works on per-block aggregates of an `Inventory` index; it
touches single hosts only in candidate domains. The best busbw of any set of n hosts is the n-th
largest host cap inside some domain at its own level (caps only shrink as levels coarsen), so
evaluating each domain "as if" spanned at its level finds the optimal busbw and every domain that
reaches it; inside each, `select.choose` takes the cheapest hosts and, among the hosts at the
marginal price, the exact optimum of rule 6 (a dynamic programme over the topology tree).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass

from .bandwidth import (
    Measured,
    allreduce_seconds,
    cluster_busbw_gbps,
    describe_level_sources,
    hop_gbps,
    level_caps_gbps,
    lowest_common_level,
    measured_notes,
    port_notes,
)
from .index import Inventory, _Entry, _Group, _Shape
from .nodes import LOCALITY_LABELS
from .select import FIELDS, Fit, choose
from .types import (
    LEVELS,
    Constraint,
    HostSnapshot,
    InvalidRequest,
    Level,
    ModelPolicy,
    NodeAssignment,
    Parallelism,
    PlacementRequest,
    Plan,
    Refusal,
)

_GLOBAL = len(LEVELS) - 1
WARNING_PREFIX = "warning: "  # explanation lines the console and the API also show apart
_WAN_LEVELS = (Level.REGION, Level.GLOBAL)  # a plan spanning these crosses a WAN link (DESIGN.md table)
_KIND_LABELS = {"infiniband": "InfiniBand", "roce": "RoCE", "ethernet": "Ethernet"}


@dataclass(slots=True)
class _Usable:
    """A group that passes a request's filters: how many of its hosts, and its caps per level."""

    group: _Group
    count: int
    caps: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class _Scope:
    """One tier of the search: the interconnect kinds allowed and the coarsest level allowed."""

    kinds: frozenset[str] | None
    level_index: int
    note: str  # what this tier gave up, for the explanation ("" for the first tier)


@dataclass(frozen=True, slots=True)
class _Option:
    """A candidate set of hosts and the figures placement ranks it by."""

    entries: tuple[_Entry, ...]
    level_index: int  # lowest common level of the hosts; -1 for a single node
    busbw: float | None
    price_per_hour: float
    fit: Fit  # select.FIELDS: locality, domains spanned, tightness, reliability
    spare: int  # hosts that fit this node shape left in the spanned domain (for the explanation)

    def rank(self, collective: bool) -> tuple:
        """Sort key implementing rules 5-7 of the module docstring (smaller is better)."""
        price = round(self.price_per_hour, 6)
        head = (-(self.busbw or 0.0), price) if collective else (price,)
        return (*head, self.fit, tuple(sorted(e.id_key for e in self.entries)))


@dataclass(frozen=True, slots=True)
class _Choice:
    """The best option of one model, the tier it was found in, and how the search went."""

    model: str
    tier: int
    option: _Option
    notes: tuple[str, ...]


def _scopes(request: PlacementRequest) -> list[_Scope]:
    """Tiers in preference order: preferred interconnect first, then preferred level upward."""
    kinds = request.interconnect_kinds()
    ic_options: list[tuple[frozenset[str] | None, str]] = [(None, "")]
    if request.interconnect_mode == Constraint.REQUIRED:
        ic_options = [(kinds, "")]
    elif request.interconnect_mode == Constraint.PREFERRED:
        label = _interconnect_label(request)
        ic_options = [(kinds, ""), (None, f"preferred interconnect {label} cannot fit: any fabric used")]
    levels = [(_GLOBAL, "")]
    if request.topology_level is not None:
        start = LEVELS.index(Level(request.topology_level))
        levels = [(start, "")]
        if request.topology_mode == Constraint.PREFERRED:
            levels += [(i, _fallback_note(request, i)) for i in range(start + 1, len(LEVELS))]
    return [_Scope(k, i, "; ".join(filter(None, (kn, ln)))) for k, kn in ic_options for i, ln in levels]


def _fallback_note(request: PlacementRequest, index: int) -> str:
    wanted = f"preferred level {request.topology_level} cannot fit {request.nodes} nodes"
    return f"{wanted}: fell back to {LEVELS[index]}"


def _interconnect_label(request: PlacementRequest) -> str:
    return " or ".join(_KIND_LABELS.get(name, name) for name in request.interconnect)


def _usable_groups(
    shape: _Shape, request: PlacementRequest, kinds: frozenset[str] | None, measured: Measured | None
) -> list[_Usable]:
    """The groups that pass region, interconnect and price filters, with their caps."""
    regions, cap = set(request.regions), request.max_price_per_gpu_hour
    usable = []
    for group in shape.groups:
        host = group.host
        if (regions and host.path.region not in regions) or (
            kinds is not None and host.fabric_kind not in kinds
        ):
            continue
        count = len(group.prices) if cap is None else bisect_right(group.prices, cap)
        if count:
            caps = level_caps_gbps(host, measured) if measured else group.declared_caps
            usable.append(_Usable(group, count, caps))
    return usable


def _by_domain(usable: list[_Usable], level_index: int) -> dict[tuple[str, ...], list[_Usable]]:
    domains: dict[tuple[str, ...], list[_Usable]] = {}
    for item in usable:
        domains.setdefault(item.group.keys[level_index], []).append(item)
    return domains


def _threshold(members: list[_Usable], level_index: int, nodes: int) -> float:
    """The best busbw n hosts of this domain reach spanning its level: the n-th largest cap."""
    if len(members) == 1:
        return members[0].caps[level_index]
    total = 0
    for item in sorted(members, key=lambda m: -m.caps[level_index]):
        total += item.count
        if total >= nodes:
            return item.caps[level_index]
    raise AssertionError("domain has fewer hosts than nodes")


def _option(members: list[_Usable], shape: _Shape, nodes: int, gpus: int) -> _Option:
    """The best `nodes` hosts of these groups (select.choose), with the figures they rank by."""
    entries, fit = choose(shape, [(item.group, item.count) for item in members], nodes)
    caps = {item.group.ordinal: item.caps for item in members}
    groups = {entry.ordinal: shape.groups[entry.ordinal].host.path for entry in entries}
    level = 0 if len(groups) == 1 else _lowest_common_index(list(groups.values()))
    busbw = min(caps[ordinal][level] for ordinal in groups) if nodes > 1 else None
    spare = shape.fit_counts[level][entries[0].host.path.domain(LEVELS[level])] - nodes
    price = sum(entry.price for entry in entries) * gpus
    return _Option(entries, level if nodes > 1 else -1, busbw, price, fit, spare)


def _lowest_common_index(paths: list) -> int:
    for index, level in enumerate(LEVELS):
        if len({path.domain(level) for path in paths}) == 1:
            return index
    return _GLOBAL


def _best_bandwidth(
    usable: list[_Usable], request: PlacementRequest, top: int
) -> tuple[float, list[tuple[int, list[_Usable]]], list[str]]:
    """Collective search: the best busbw over levels finest..top, and every domain reaching it."""
    best, candidates, notes, skipped = -1.0, [], [], []
    for index in range(top + 1):
        bound = max(item.caps[index] for item in usable)
        if bound < best:  # no domain of this level can reach what a finer level already gives
            skipped.append(f"{LEVELS[index]} (at most {bound:g} GB/s)")
            continue
        domains = _by_domain(usable, index)
        level_best, fits, short = -1.0, 0, 0
        for members in domains.values():
            total = sum(item.count for item in members)
            if total < request.nodes:
                short = max(short, total)
                continue
            fits, value = fits + 1, _threshold(members, index, request.nodes)
            level_best = max(level_best, value)
            if value > best:
                best, candidates = value, []
            if value == best:
                candidates.append((index, members))
        notes.append(_level_note(LEVELS[index], len(domains), fits, short, level_best, request.nodes))
    if skipped:
        notes.append(f"not tried, cannot beat {best:g} GB/s: {', '.join(skipped)}")
    return best, candidates, notes


def plural(count: int, noun: str) -> str:
    """Count and noun: "1 usable host", "3 usable hosts", "0 spare hosts"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _level_note(level: str, total: int, fits: int, short: int, best: float, nodes: int) -> str:
    if not fits:
        largest = f"the largest has {plural(short, 'usable host')}"
        return f"{level}: none of {total} {level} domain(s) fits {nodes} nodes ({largest})"
    others = f"; the others have at most {plural(short, 'usable host')}" if short else ""
    return f"{level}: {fits} of {total} {level} domain(s) fit {nodes} nodes, best {best:g} GB/s{others}"


def _search(
    usable: list[_Usable], shape: _Shape, request: PlacementRequest, scope: _Scope, price_band: float = 0.0
) -> tuple[_Option | None, list[str]]:
    """The best option inside one tier, and notes on the levels tried; (None, notes) if none fits."""
    nodes, gpus = request.nodes, request.gpus_per_node
    if sum(item.count for item in usable) < nodes:
        return None, [f"only {plural(sum(item.count for item in usable), 'usable host')}; {nodes} needed"]
    collective = request.is_collective()
    if collective:
        best, candidates, notes = _best_bandwidth(usable, request, scope.level_index)
        options = [
            _option([m for m in members if m.caps[i] >= best], shape, nodes, gpus)
            for i, members in candidates
        ]
    else:
        domains = _by_domain(usable, scope.level_index).values()
        fitting = [members for members in domains if sum(item.count for item in members) >= nodes]
        options = [_option(members, shape, nodes, gpus) for members in fitting]
        notes = [_cheapest_note(request, scope.level_index, len(fitting))]
    if not options:
        return None, notes
    best = min(options, key=lambda option: option.rank(collective))
    banded = _within_band(options, best, collective, price_band)
    if banded is not best:
        notes.append(
            f"prices within {price_band:.0%} of the cheapest count as equal (VOLT_PLACEMENT_PRICE_BAND): the "
            f"tighter fit at ${banded.price_per_hour:.2f}/hour beats ${best.price_per_hour:.2f}/hour"
        )
    return banded, notes


def _within_band(options: list[_Option], best: _Option, collective: bool, band: float) -> _Option:
    """With a price band: among the options as good as `best` on bandwidth (collective requests) and
    priced at most `band` above it, the best fit (rule 6), then the cheaper, then primary keys. Packing
    whole blocks into partly used ones keeps large contiguous capacity for later requests, which strict
    price order across domains gave away (bench/churn.py)."""
    if band <= 0:
        return best
    ceiling = best.price_per_hour * (1 + band) + 1e-9
    pool = [
        o
        for o in options
        if o.price_per_hour <= ceiling and (not collective or (o.busbw or 0.0) == (best.busbw or 0.0))
    ]
    return min(
        pool, key=lambda o: (o.fit, round(o.price_per_hour, 6), tuple(sorted(e.id_key for e in o.entries)))
    )


def _cheapest_note(request: PlacementRequest, level_index: int, fitting: int) -> str:
    why = "one node" if request.nodes == 1 else f"{request.parallelism} needs no inter-node bandwidth"
    if level_index == _GLOBAL:
        return f"cheapest hosts anywhere ({why})"
    return f"cheapest hosts inside one {LEVELS[level_index]} ({why}): {fitting} {LEVELS[level_index]} domain(s) fit"


def _place_model(
    inventory: Inventory,
    request: PlacementRequest,
    model: str,
    measured: Measured | None,
    price_band: float = 0.0,
) -> tuple[_Choice | None, list[str]]:
    """`model`'s best option over the tiers in preference order, and the explanation of the search."""
    shape = inventory.shape(model, request.gpus_per_node)
    usable_by_kinds: dict[frozenset[str] | None, list[_Usable]] = {}
    tried: list[str] = []
    for tier, scope in enumerate(_scopes(request)):
        if scope.kinds not in usable_by_kinds:
            usable_by_kinds[scope.kinds] = _usable_groups(shape, request, scope.kinds, measured)
        option, notes = _search(usable_by_kinds[scope.kinds], shape, request, scope, price_band)
        lines = [f"{model}: {note}" for note in ([scope.note] if scope.note else []) + notes]
        tried += [line for line in lines if line not in tried]  # a fall-back tier re-tries finer levels
        if option is not None:
            return _Choice(model, tier, option, tuple(tried)), tried
    return None, tried


def as_inventory(hosts: Inventory | Iterable[HostSnapshot]) -> Inventory:
    """`hosts` as an Inventory (built here when a plain iterable of snapshots is given)."""
    return hosts if isinstance(hosts, Inventory) else Inventory(hosts)


def validate(request: PlacementRequest, hosts: Inventory | Iterable[HostSnapshot] | None = None) -> None:
    """Raise InvalidRequest listing what is wrong with the request (and, given hosts, against them).

    A model no host offers is an error; so is asking more GPUs per node than the largest host of
    every listed model has. Too few free hosts is not an error: that is a Refusal from `plan()`.
    """
    problems = request.problems()
    if hosts is not None and not problems:
        problems = _inventory_problems(request, as_inventory(hosts))
    if problems:
        raise InvalidRequest(problems)


def _inventory_problems(request: PlacementRequest, inventory: Inventory) -> list[str]:
    offered = ", ".join(inventory.models) or "nothing"
    unknown = [m for m in request.models if m not in inventory.models]
    if unknown:
        return [f"unknown GPU model '{m}': the inventory offers {offered}" for m in unknown]
    largest = {m: inventory.largest_host_gpus(m) for m in request.models}
    if all(size < request.gpus_per_node for size in largest.values()):
        asked = request.gpus_per_node
        return [
            f"{asked} GPUs per node asked; the largest {m} host has {size}" for m, size in largest.items()
        ]
    return []


def plan(
    request: PlacementRequest,
    hosts: Inventory | Iterable[HostSnapshot],
    measured: Measured | None = None,
    validate_inventory: bool = True,
    price_band: float = 0.0,
) -> Plan | Refusal:
    """Place `request` on `hosts` (an Inventory, or snapshots to index); raise InvalidRequest.

    `price_band` (a fraction, VOLT_PLACEMENT_PRICE_BAND): between candidate domains, options priced at
    most this much above the cheapest count as equal and the best fit among them wins; 0 is strict price
    order (rule 5).

    `measured` maps ("block"|"fabric"|"site"|"region"|"global", id) to a measured busbw in GB/s
    that replaces the declared figure of that domain.
    """
    inventory = as_inventory(hosts)
    # The database layer passes only hosts with free capacity and validates the request against the
    # whole inventory itself (validate_inventory=False): a model with no free host must queue, not 400.
    validate(request, inventory if validate_inventory else None)
    choices: list[_Choice] = []
    skipped: list[str] = []
    tried: list[str] = []
    for model in request.models:
        choice, notes = _place_model(inventory, request, model, measured, price_band)
        if choice is None:
            skipped += _model_refusal(request, inventory, model)
            tried += notes
        else:
            choices.append(choice)
            if request.model_policy == ModelPolicy.ORDERED:
                break
    if not choices:
        return Refusal(tuple(skipped), tuple(tried))
    best = min(choices, key=lambda c: (c.tier, c.option.rank(request.is_collective())))
    return _to_plan(request, best, measured, _model_notes(request, choices, best, skipped))


def _model_notes(
    request: PlacementRequest, choices: list[_Choice], best: _Choice, skipped: list[str]
) -> list[str]:
    notes = [*best.notes, *(f"skipped: {reason}" for reason in skipped)]
    if request.model_policy == ModelPolicy.ORDERED and skipped:
        notes.append(f"ordered: {best.model} is the first listed model that can be placed")
    if len(choices) > 1:
        figures = "; ".join(f"{c.model} {_figures(c.option)}" for c in choices)
        notes.append(f"any_of: {figures} -> {best.model}")
    return notes


def _figures(option: _Option) -> str:
    bandwidth = f"{option.busbw:g} GB/s, " if option.busbw is not None else ""
    return f"{bandwidth}${option.price_per_hour:.2f}/h"


def _to_plan(request: PlacementRequest, choice: _Choice, measured: Measured | None, notes: list[str]) -> Plan:
    """Turn the chosen option into a Plan: nodes in topology order, head, figures, explanation."""
    entries = sorted(choice.option.entries, key=lambda e: (e.host.path.domain(Level.BLOCK), e.id_key))
    hosts = [entry.host for entry in entries]
    busbw = cluster_busbw_gbps(hosts, measured)
    level = LEVELS[choice.option.level_index] if busbw is not None else None
    seconds = None
    explanation = [*notes, *_fit_notes(request, choice.option)]
    if busbw is not None:
        explanation += port_notes(hosts)
        explanation += measured_notes(hosts, measured)
    explanation.append(_chosen_note(request, choice, hosts, busbw, level, measured))
    if busbw is not None and level is not None:
        seconds = allreduce_seconds(request.reference_gradient_bytes, len(hosts), busbw, level)
        gigabytes = request.reference_gradient_bytes / 1e9
        explanation.append(f"predicted ring all-reduce of a {gigabytes:g} GB gradient: {seconds:.4g} s")
        if request.is_collective() and level in _WAN_LEVELS:
            explanation.append(_wan_note(request, level, busbw, hosts, measured))
    stages = _stage_order(request, hosts)
    explanation += _pipeline_notes(stages, {host.host_id: host for host in hosts}, measured)
    return Plan(
        model=choice.model,
        nodes=tuple(NodeAssignment(entry.host.host_id, entry.gpus) for entry in entries),
        head_host_id=max(hosts, key=lambda host: host.reliability).host_id,
        spanned_level=str(level) if level is not None else "host",
        spanned_domain=hosts[0].path.domain(level) if level is not None else (hosts[0].host_id,),
        predicted_busbw_gbps=busbw,
        predicted_allreduce_s=seconds,
        price_per_hour=round(choice.option.price_per_hour, 6),
        explanation=tuple(explanation),
        stage_order=stages,
    )


def plan_for_nodes(
    request: PlacementRequest,
    nodes: Iterable[tuple[HostSnapshot, tuple[int, ...]]],
    head_host_id: str,
    price_per_hour: float,
    measured: Measured | None = None,
    why: str = "",
) -> Plan:
    """The Plan of nodes already chosen (a cluster after a recovery swapped some): nothing is picked, the
    span, the predicted busbw and the reference all-reduce time are what these hosts give, by the same
    model a fresh plan uses — so a probe is judged against the cluster as it now is."""
    entries = sorted(nodes, key=lambda pair: (pair[0].path.domain(Level.BLOCK), pair[0].host_id))
    hosts = [host for host, _ in entries]
    busbw = cluster_busbw_gbps(hosts, measured)
    level = lowest_common_level(hosts) if busbw is not None else None
    explanation = [why] if why else []
    seconds = None
    if busbw is not None and level is not None:
        explanation += measured_notes(hosts, measured)
        seconds = allreduce_seconds(request.reference_gradient_bytes, len(hosts), busbw, level)
        explanation.append(
            f"current nodes span one {level}: predicted busbw {busbw:g} GB/s; ring all-reduce of a "
            f"{request.reference_gradient_bytes / 1e9:g} GB gradient: {seconds:.4g} s"
        )
        if request.is_collective() and level in _WAN_LEVELS:
            explanation.append(_wan_note(request, level, busbw, hosts, measured))
    return Plan(
        model=hosts[0].gpu_model,
        nodes=tuple(NodeAssignment(host.host_id, gpus) for host, gpus in entries),
        head_host_id=head_host_id,
        spanned_level=str(level) if level is not None else "host",
        spanned_domain=hosts[0].path.domain(level) if level is not None else (hosts[0].host_id,),
        predicted_busbw_gbps=busbw,
        predicted_allreduce_s=seconds,
        price_per_hour=round(price_per_hour, 6),
        explanation=tuple(explanation),
        stage_order=_stage_order(request, hosts),
    )


def _fit_notes(request: PlacementRequest, option: _Option) -> list[str]:
    """How the plan fits: node locality on PCIe hosts, domains spanned, and the tie-break order."""
    fit = dict(zip(FIELDS, option.fit, strict=True))
    notes = []
    pcie = [entry for entry in option.entries if not entry.host.nvlink]
    if pcie and request.gpus_per_node > 1:
        worst = max(entry.locality for entry in pcie)
        notes.append(f"PCIe hosts (no NVLink): each node's GPUs lie within {LOCALITY_LABELS[worst]} at worst")
    spans = ", ".join(plural(fit[name], name[:-1]) for name in ("regions", "sites", "fabrics", "blocks"))
    notes.append(
        f"fit: spans {spans}; leaves {fit['free_gpus_in_blocks'] - len(option.entries) * request.gpus_per_node} "
        f"free GPUs in the blocks used and {fit['gpus_left_on_hosts']} on the hosts used. Among equal bandwidth and price, "
        "ties break on node locality, the fewest regions, sites, fabrics, then blocks spanned, the fewest GPUs left on the hosts, the "
        "least free capacity left in the domains, reliability, then host primary key — never on names"
    )
    return notes


def _chosen_note(
    request: PlacementRequest,
    choice: _Choice,
    hosts: list,
    busbw: float | None,
    level,
    measured: Measured | None,
) -> str:
    option, shape = choice.option, f"{request.nodes} x {request.gpus_per_node} {choice.model}"
    price = f"${option.price_per_hour:.2f}/h"
    if busbw is None:
        return f"chosen: host {hosts[0].host_id} for {shape} at {price} (one node: no inter-node all-reduce)"
    domain = "/".join(hosts[0].path.domain(level)) or "all regions"
    source = describe_level_sources(hosts, level, measured)
    return (
        f"chosen: {level} {domain} for {shape}: predicted busbw {busbw:g} GB/s ({source}), {price}, "
        f"best-fit leaves {plural(option.spare, 'spare host')} that fit this node shape there"
    )


def _wan_note(
    request: PlacementRequest,
    level: Level,
    busbw: float,
    hosts: list[HostSnapshot],
    measured: Measured | None,
) -> str:
    """A collective plan that crosses a WAN: what that costs against the same hosts' in-block figure, and
    how to wait for one site instead."""
    where = "between the sites of one region" if level == Level.REGION else "between regions"
    in_block = min(level_caps_gbps(host, measured)[0] for host in hosts)
    return (
        f"{WARNING_PREFIX}no single site can hold these {request.nodes} nodes within this request's "
        f"constraints now, so every all-reduce crosses the WAN {where}: {busbw:.3g} GB/s, "
        f"{in_block / busbw:,.0f}x below the {in_block:.3g} GB/s these hosts reach inside one block. A "
        f"{request.parallelism.replace('_', ' ')} job spends most of each step waiting on it. To wait for room "
        "in one site instead, ask for topology_level=site with topology_mode=required (the cluster queues "
        "until a site can hold it)"
    )


def _stage_order(request: PlacementRequest, hosts: list[HostSnapshot]) -> tuple[tuple[str, ...], ...]:
    """Pipeline stages over hosts already sorted by topology path: each domain is one contiguous
    run, so the chain crosses every slow boundary once and nodes of a stage sit together."""
    if request.parallelism != Parallelism.TENSOR_PIPELINE or len(hosts) < 2:
        return ()
    per_stage = len(hosts) // (request.pipeline_stages or len(hosts))
    ids = [host.host_id for host in hosts]
    return tuple(tuple(ids[i : i + per_stage]) for i in range(0, len(ids), per_stage))


def _pipeline_notes(stages, by_id: dict[str, HostSnapshot], measured: Measured | None) -> list[str]:
    if len(stages) < 2:
        return []
    hops: dict[tuple[str, float], int] = {}
    for before, after in zip(stages, stages[1:], strict=False):
        hop = hop_gbps(by_id[before[-1]], by_id[after[0]], measured)
        hops[hop] = hops.get(hop, 0) + 1
    listed = ", ".join(f"{n} within one {level} ({gbps:g} GB/s)" for (level, gbps), n in sorted(hops.items()))
    order = " -> ".join("+".join(stage) for stage in stages)
    return [f"pipeline: {len(stages)} stages in order {order}; hops: {listed}"]


def _model_refusal(request: PlacementRequest, inventory: Inventory, model: str) -> list[str]:
    """The binding constraint for `model`, with numbers: the first filter that leaves too few hosts."""
    rows = [(group, len(group.entries)) for group in inventory.shape(model, request.gpus_per_node).groups]
    gpus = "GPU" if request.gpus_per_node == 1 else "GPUs"
    where = "for one node" if model in inventory.pcie_models else "in one NVLink domain"
    subject = f"with {request.gpus_per_node} free {model} {gpus} {where}"
    for qualifier, step in _funnel(request):
        kept = step(rows)
        count = sum(count for _, count in kept)
        if count < request.nodes:
            return [_shortfall(request, count, subject, qualifier, rows)]
        rows, subject = kept, subject + qualifier
    if request.topology_level is None or request.topology_mode != Constraint.REQUIRED:
        return [f"{model}: no plan found"]  # unreachable: the funnel covers every hard constraint
    return [_topology_shortfall(request, rows, subject)]


def _funnel(request: PlacementRequest) -> list[tuple[str, object]]:
    steps: list[tuple[str, object]] = [("", lambda rows: rows)]
    if request.regions:
        regions = set(request.regions)
        where = f" in {'/'.join(request.regions)}"
        steps.append((where, lambda rows: [(g, c) for g, c in rows if g.host.path.region in regions]))
    if request.max_price_per_gpu_hour is not None:
        cap = request.max_price_per_gpu_hour
        priced = f" at or under ${cap:.2f}/GPU-hour"
        steps.append((priced, lambda rows: [(g, bisect_right(g.prices, cap)) for g, _ in rows]))
    if request.interconnect_mode == Constraint.REQUIRED:
        kinds, label = request.interconnect_kinds(), f" on {_interconnect_label(request)}"
        steps.append((label, lambda rows: [(g, c) for g, c in rows if g.host.fabric_kind in kinds]))
    return steps


def _shortfall(request: PlacementRequest, count: int, subject: str, qualifier: str, before: list) -> str:
    hosts = "host" if count == 1 else "hosts"
    if count == 0 and qualifier.startswith(" at or under"):
        cheapest = min((g.prices[0] for g, c in before if c), default=None)
        asks = f" (the cheapest asks ${cheapest:.2f})" if cheapest is not None else ""
        return f"no host {subject} is offered{qualifier}{asks}; {request.nodes} needed"
    if count == 0:
        return f"no host {subject}{qualifier}; {request.nodes} needed"
    return f"only {count} {hosts} {subject}{qualifier}; {request.nodes} needed"


def _topology_shortfall(request: PlacementRequest, rows: list, subject: str) -> str:
    level = Level(request.topology_level)
    index = LEVELS.index(level)
    counts: dict[tuple[str, ...], int] = {}
    for group, count in rows:
        counts[group.keys[index]] = counts.get(group.keys[index], 0) + count
    domain, best = max(counts.items(), key=lambda item: (item[1], item[0]))
    verb = "shares" if best == 1 else "share"
    hosts = "host" if best == 1 else "hosts"
    where = "/".join(domain)
    return f"only {best} {hosts} {subject} {verb} one {level} (most in {where}); {request.nodes} needed"
