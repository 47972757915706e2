"""Placement against brute force on random inventories of up to 12 hosts (hypothesis). Pure Python.

The brute force enumerates every set of hosts that keeps the hard constraints and ranks it by the
rules of `clusters.placement.engine`'s docstring, computed here from their definitions: the
preference tier, then predicted busbw and price (collective work) or price (every other kind), then
the fit: node locality inside hosts, regions / sites / fabrics / blocks spanned (top level down, issue
23), GPUs left on the hosts, free GPUs left in the blocks / fabrics / sites touched, reliability. The
engine's plan must reach the same optimum, for every request kind, on NVLink and PCIe-only hosts alike.
"""

from __future__ import annotations

import os
from dataclasses import replace
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusters.placement import (
    COLLECTIVE,
    DECLARED_HOST_GBPS,
    LEVELS,
    FabricKind,
    HostSnapshot,
    InvalidRequest,
    PlacementRequest,
    Plan,
    Refusal,
    TopologyPath,
    best_fit,
    cluster_busbw_gbps,
    first_fit,
    lowest_common_level,
    plan,
)

KINDS = tuple(FabricKind)
LEVEL_NAMES = tuple(str(level) for level in LEVELS)
PARALLELISMS = ("data_parallel", "data_parallel", "tensor_pipeline", "independent", "inference_replicas")


def _any(*values):
    return st.sampled_from(values)


# Strategies are built once: building them inside each draw costs more than the engine and brute force.
HOST_COUNT, REGION, SITE, FABRIC, BLOCK = (
    _any(1, 4, 6, 8, 10, 12, 12),
    _any("r0", "r0", "r1"),
    _any(0, 1),
    _any(0, 1),
    _any(0, 1, 2, 3),
)
KIND, OVERSUBSCRIPTION, BACKBONE = st.sampled_from(KINDS), _any(1.0, 1.0, 2.0, 4.0), _any(12.5, 25.0, 500.0)
TOTAL, MODEL, PRICE, RELIABILITY = (
    _any(2, 3, 4, 8, 8),
    _any("H100", "H100", "H100", "L40S", "L40S", "A100"),
    _any(1.0, 1.0, 2.0, 2.5),  # repeated prices: ties are where best fit and span counts decide
    _any(0.9, 0.99, 0.99),
)
FREE = {n: st.lists(_any(True, True, True, False), min_size=n, max_size=n) for n in (2, 3, 4, 8)}
MODES, NODES, GPUS = (
    _any("any", "any", "any", "required", "preferred"),
    _any(1, 2, 2, 3, 3, 4),
    _any(1, 2, 2, 3, 4),
)
KIND_NAMES, REGIONS = _any(("infiniband",), ("roce", "ib_hdr"), ("ethernet",)), _any((), (), (), ("r0",))
MAX_PRICE, SAMPLE_GBPS = _any(None, None, None, None, 2.2), _any(3.0, 50.0, 150.0, 390.0, 600.0)
# What a host's ports give (issue 23): mostly unknown, sometimes below or above its fabric's figure.
DISCOVERED = _any(None, None, None, 12.5, 100.0, 400.0)


@st.composite
def inventories(draw) -> list[HostSnapshot]:
    """<= 12 hosts over 1-2 regions, sites, fabrics and 1-4 blocks; NVLink hosts with 1-2 domains and
    PCIe-only L40S hosts with two GPUs per switch and two NUMA nodes."""
    fabrics: dict[str, tuple[str, float]] = {}
    backbones: dict[str, float] = {}
    hosts = []
    for index in range(draw(HOST_COUNT)):
        region = draw(REGION)
        site = f"{region}.s{draw(SITE)}"
        fabric = f"{site}.f{draw(FABRIC)}"
        if fabric not in fabrics:
            fabrics[fabric] = (draw(KIND), draw(OVERSUBSCRIPTION))
        if site not in backbones:
            backbones[site] = draw(BACKBONE)
        path = TopologyPath(region, site, fabric, f"{fabric}.b{draw(BLOCK)}")
        hosts.append(_random_host(draw, str(index + 1), path, *fabrics[fabric], backbones[site]))
    return hosts


def _random_host(draw, host_id: str, path: TopologyPath, kind: str, oversub: float, backbone: float):
    total, model = draw(TOTAL), draw(MODEL)
    free = draw(FREE[total])
    fields = {}
    if model == "L40S":
        domains = [range(i, i + 1) for i in range(total)]
        switches = tuple(tuple(range(i, min(i + 2, total))) for i in range(0, total, 2))
        half = max(1, total // 2)
        fields = {"nvlink": False, "pcie_switches": switches, "numa_nodes": (tuple(range(half)),)}
        if half < total:
            fields["numa_nodes"] += (tuple(range(half, total)),)
    else:
        cut = total if draw(st.booleans()) else total // 2
        domains = [range(cut), range(cut, total)] if cut < total else [range(total)]
    return HostSnapshot(
        host_id=host_id,
        provider_id="p",
        gpu_model=model,
        free_gpus=tuple(tuple(i for i in domain if free[i]) for domain in domains),
        total_gpus=total,
        path=path,
        fabric_kind=kind,
        fabric_host_gbps=DECLARED_HOST_GBPS[kind],
        price_per_gpu_hour=draw(PRICE),
        fabric_oversubscription=oversub,
        site_backbone_gbps=backbone,
        reliability=draw(RELIABILITY),
        discovered_host_gbps=draw(DISCOVERED),
        **fields,
    )


@st.composite
def requests(draw, hosts: list[HostSnapshot]) -> PlacementRequest:
    models = sorted({h.gpu_model for h in hosts})
    topology_mode, interconnect_mode = draw(MODES), draw(MODES)
    return PlacementRequest(
        nodes=draw(NODES),
        gpus_per_node=draw(GPUS),
        models=tuple(draw(st.lists(st.sampled_from(models), min_size=1, max_size=2, unique=True))),
        model_policy=draw(_any("any_of", "ordered")),
        interconnect=draw(KIND_NAMES),
        interconnect_mode=interconnect_mode,
        topology_level=None if topology_mode == "any" else draw(st.sampled_from(LEVEL_NAMES)),
        topology_mode=topology_mode,
        regions=draw(REGIONS),
        max_price_per_gpu_hour=draw(MAX_PRICE),
        parallelism=draw(st.sampled_from(PARALLELISMS)),
    )


@st.composite
def measurements(draw, hosts: list[HostSnapshot]) -> dict[tuple[str, str], float]:
    keys = {("block", h.path.block_id) for h in hosts} | {("fabric", h.path.fabric_id) for h in hosts}
    keys |= {("site", h.path.site_id) for h in hosts}
    chosen = draw(st.lists(st.sampled_from(sorted(keys)), max_size=3, unique=True))
    return {key: draw(SAMPLE_GBPS) for key in chosen}


# --- the brute force, from the definitions ------------------------------------------------------------


def free_count(h: HostSnapshot) -> int:
    return sum(len(domain) for domain in h.free_gpus)


def locality(h: HostSnapshot, gpus: int) -> int | None:
    """0: one NVLink domain / PCIe switch, 1: one NUMA node, 2: across NUMA nodes; None: no node."""
    free = {i for domain in h.free_gpus for i in domain}
    if h.nvlink:
        return 0 if any(len(domain) >= gpus for domain in h.free_gpus) else None
    if len(free) < gpus:
        return None
    if gpus == 1 or any(len(free & set(group)) >= gpus for group in h.pcie_switches):
        return 0
    return 1 if any(len(free & set(group)) >= gpus for group in h.numa_nodes) else 2


def _fits(request: PlacementRequest, h: HostSnapshot, model: str, kinds: frozenset[str]) -> bool:
    cap = request.max_price_per_gpu_hour
    return (
        h.gpu_model == model
        and locality(h, request.gpus_per_node) is not None
        and (cap is None or h.price_per_gpu_hour <= cap)
        and (not request.regions or h.path.region in request.regions)
        and (request.interconnect_mode != "required" or h.fabric_kind in kinds)
    )


def _tier(request: PlacementRequest, chosen) -> tuple[int, int] | None:
    """(interconnect tier, topology tier) of a set of hosts, or None when it breaks a required level."""
    level = lowest_common_level(chosen)
    spanned = LEVELS.index(level) if level else 0
    topology = 0
    if request.topology_level is not None:
        topology = max(0, spanned - LEVELS.index(request.topology_level))
        if request.topology_mode == "required" and topology:
            return None
    preferred = request.interconnect_mode == "preferred"
    off_kind = any(h.fabric_kind not in request.interconnect_kinds() for h in chosen)
    return (int(preferred and off_kind), topology)


def fit(request: PlacementRequest, chosen, hosts) -> tuple:
    """Locality, domains spanned (regions, sites, fabrics, blocks: the coarsest first), GPUs left on
    hosts, free GPUs in the domains touched, reliability."""
    gpus, model = request.gpus_per_node, chosen[0].gpu_model
    shape = [h for h in hosts if h.gpu_model == model and locality(h, gpus) is not None]
    spans, free_in = [], []
    for depth in (4, 3, 2, 1):  # block, fabric, site, region: a path prefix of this length
        touched = {h.path.domain(LEVELS[4 - depth]) for h in chosen}
        spans.append(len(touched))
        free_in.append(sum(free_count(h) for h in shape if h.path.domain(LEVELS[4 - depth]) in touched))
    return (
        sum(locality(h, gpus) for h in chosen),
        *reversed(spans),
        sum(free_count(h) - gpus for h in chosen),
        *free_in[:3],
        sum(round(-h.reliability * 1e6) for h in chosen),
    )


def rank(request, chosen, hosts, measured) -> tuple:
    price = round(sum(h.price_per_gpu_hour for h in chosen) * request.gpus_per_node, 6)
    busbw = cluster_busbw_gbps(chosen, measured)
    head = (-busbw, price) if request.parallelism in COLLECTIVE and request.nodes > 1 else (price,)
    return (_tier(request, chosen), *head, fit(request, chosen, hosts))


def brute_force(request, hosts, measured):
    """The best rank over every set of hosts, or None when no set keeps the hard constraints."""
    kinds, best = request.interconnect_kinds(), None
    for model in request.models:
        fitting = [h for h in hosts if _fits(request, h, model, kinds)]
        for chosen in combinations(fitting, request.nodes):
            if _tier(request, chosen) is not None:
                key = rank(request, chosen, hosts, measured)
                best = key if best is None or key < best else best
        if best is not None and request.model_policy == "ordered":
            break
    return best


def assert_plan_keeps_hard_constraints(request: PlacementRequest, result: Plan, hosts, measured) -> None:
    by_id = {h.host_id: h for h in hosts}
    chosen = tuple(by_id[node.host_id] for node in result.nodes)
    assert len(chosen) == request.nodes == len(set(result.host_ids))
    assert result.model in request.models and result.head_host_id in result.host_ids
    for node, h in zip(result.nodes, chosen, strict=True):
        assert _fits(request, h, result.model, request.interconnect_kinds())
        assert len(node.gpu_indices) == len(set(node.gpu_indices)) == request.gpus_per_node
        free = {i for domain in h.free_gpus for i in domain}
        assert set(node.gpu_indices) <= free
        if h.nvlink:  # one NVLink domain
            assert any(set(node.gpu_indices) <= set(domain) for domain in h.free_gpus)
        else:  # the best locality the host offers
            given = _given_locality(h, node.gpu_indices)
            assert given == locality(h, request.gpus_per_node)
    assert _tier(request, chosen) is not None
    assert result.price_per_hour == pytest.approx(
        sum(h.price_per_gpu_hour for h in chosen) * request.gpus_per_node
    )
    assert result.predicted_busbw_gbps == cluster_busbw_gbps(chosen, measured)
    if request.parallelism == "tensor_pipeline" and request.nodes > 1:
        assert tuple(host_id for stage in result.stage_order for host_id in stage) == result.host_ids


def _given_locality(h: HostSnapshot, indices) -> int:
    taken = set(indices)
    if len(taken) == 1 or any(taken <= set(group) for group in h.pcie_switches):
        return 0
    return 1 if any(taken <= set(group) for group in h.numa_nodes) else 2


# PLACEMENT_EXAMPLES=5000 runs a deeper check; the default keeps this quick on a shared machine.
@settings(max_examples=int(os.environ.get("PLACEMENT_EXAMPLES", 1000)), deadline=None)
@given(data=st.data())
def test_plan_keeps_constraints_and_matches_brute_force(data):
    hosts = data.draw(inventories())
    request = data.draw(requests(hosts))
    measured = data.draw(measurements(hosts))
    try:
        result = plan(request, hosts, measured)
    except InvalidRequest:
        assert all(
            max(h.total_gpus for h in hosts if h.gpu_model == m) < request.gpus_per_node
            for m in request.models
        )
        return
    expected = brute_force(request, hosts, measured)
    if expected is None:
        assert isinstance(result, Refusal) and result.reasons
        return
    assert isinstance(result, Plan), result
    assert_plan_keeps_hard_constraints(request, result, hosts, measured)
    by_id = {h.host_id: h for h in hosts}
    assert rank(request, tuple(by_id[i] for i in result.host_ids), hosts, measured) == expected


# Ties on bandwidth and price, where only the span order decides: one model, one price, whole hosts, few
# places. Random inventories above reach such ties too rarely to tell a blocks-first order from the
# top-down one (3,000 examples did not); here most examples have a choice between fewer sites and
# fewer blocks. Ethernet 10G ties every level of one region at 1.25 GB/s, so collective work ties too.
TIED_HOSTS, TIED_PLACE, TIED_KIND = (
    _any(4, 6, 8, 10),
    _any(0, 1, 2),
    _any(FabricKind.ETH_10G, FabricKind.IB_NDR),
)


@st.composite
def tied_inventories(draw) -> list[HostSnapshot]:
    kind, hosts = draw(TIED_KIND), []
    for index in range(draw(TIED_HOSTS)):
        region = draw(_any("r0", "r0", "r0", "r1"))
        site = f"{region}.s{draw(TIED_PLACE)}"
        fabric = f"{site}.f{draw(_any(0, 1))}"
        path = TopologyPath(region, site, fabric, f"{fabric}.b{draw(TIED_PLACE)}")
        hosts.append(
            HostSnapshot(
                host_id=str(index + 1),
                provider_id="p",
                gpu_model="H100",
                free_gpus=(tuple(range(8)),),
                total_gpus=8,
                path=path,
                fabric_kind=kind,
                fabric_host_gbps=DECLARED_HOST_GBPS[kind],
                price_per_gpu_hour=1.0,
                reliability=0.99,
            )
        )
    return hosts


@settings(max_examples=int(os.environ.get("PLACEMENT_EXAMPLES", 1000)) // 2, deadline=None)
@given(
    hosts=tied_inventories(),
    nodes=_any(2, 3, 3, 4, 5),
    parallelism=st.sampled_from(PARALLELISMS),
)
def test_at_equal_bandwidth_and_price_plans_span_the_fewest_sites_then_fabrics_then_blocks(
    hosts, nodes, parallelism
):
    """Issue 23, item 6: the engine's plan spans no more regions, then sites, fabrics, blocks than the
    best plan brute force finds among those equal on bandwidth and price."""
    request = PlacementRequest(nodes=nodes, gpus_per_node=8, models=("H100",), parallelism=parallelism)
    result = plan(request, hosts)
    expected = brute_force(request, hosts, None)
    if expected is None:
        assert isinstance(result, Refusal)
        return
    by_id = {h.host_id: h for h in hosts}
    assert rank(request, tuple(by_id[i] for i in result.host_ids), hosts, None) == expected


@settings(max_examples=int(os.environ.get("PLACEMENT_EXAMPLES", 300)) // 2, deadline=None)
@given(data=st.data(), band=st.sampled_from([0.1, 0.2, 0.5]))
def test_a_price_band_keeps_the_constraints_and_the_bandwidth_and_pays_at_most_the_band(data, band):
    """VOLT_PLACEMENT_PRICE_BAND: the banded plan keeps every hard constraint, the strict plan's tier and
    (collective work) its busbw, costs at most `band` more, and fits at least as tightly when it costs more."""
    hosts = data.draw(inventories())
    request = data.draw(requests(hosts))
    measured = data.draw(measurements(hosts))
    try:
        strict = plan(request, hosts, measured)
    except InvalidRequest:
        return
    banded = plan(request, hosts, measured, price_band=band)
    assert isinstance(banded, Plan) == isinstance(strict, Plan)
    if not isinstance(strict, Plan):
        return
    assert_plan_keeps_hard_constraints(request, banded, hosts, measured)
    assert banded.price_per_hour <= strict.price_per_hour * (1 + band) + 1e-6
    if request.parallelism in COLLECTIVE and request.nodes > 1:
        assert banded.predicted_busbw_gbps == pytest.approx(strict.predicted_busbw_gbps)
    by_id = {h.host_id: h for h in hosts}
    if banded.price_per_hour > strict.price_per_hour + 1e-6 and banded.model == strict.model:
        chosen = [tuple(by_id[i] for i in p.host_ids) for p in (banded, strict)]
        assert fit(request, chosen[0], hosts) <= fit(request, chosen[1], hosts)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_baselines_keep_hard_constraints_but_never_beat_the_engine_on_bandwidth(data):
    hosts = data.draw(inventories())
    request = data.draw(requests(hosts))
    request = replace(request, topology_mode="any", topology_level=None, interconnect_mode="any")
    request = replace(request, parallelism="data_parallel")
    try:
        ours = plan(request, hosts)
    except InvalidRequest:
        return
    for policy in (first_fit, best_fit):
        baseline = policy(replace(request, model_policy="any_of"), hosts)
        if isinstance(baseline, Plan) and baseline.predicted_busbw_gbps is not None:
            assert isinstance(ours, Plan)
            assert_plan_keeps_hard_constraints(request, baseline, hosts, None)
            if request.model_policy == "any_of":
                assert ours.predicted_busbw_gbps >= baseline.predicted_busbw_gbps
