"""The placement engine: Slurm/Kueue topology scenarios, validation, and hypothesis properties.

Pure Python: no database. The brute force below enumerates every set of hosts and ranks them by the
rules of `clusters.placement.engine`'s docstring; the engine must agree with it.
"""

from __future__ import annotations

import math
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
    Inventory,
    PlacementRequest,
    Plan,
    Refusal,
    TopologyPath,
    allreduce_seconds,
    busbw_from_algbw,
    cluster_busbw_gbps,
    first_fit,
    lowest_common_level,
    plan,
    validate,
)

ALL_FREE = (tuple(range(8)),)


def host(
    host_id: str,
    block: str = "b1",
    fabric: str = "f1",
    site: str = "s1",
    region: str = "r1",
    *,
    model: str = "H100",
    free: tuple[tuple[int, ...], ...] = ALL_FREE,
    price: float = 2.0,
    kind: str = FabricKind.IB_NDR,
    oversubscription: float = 2.0,
    reliability: float = 0.99,
) -> HostSnapshot:
    """An 8-GPU host; by default all free, on a non-blocking-per-block NDR fabric (400 GB/s)."""
    return HostSnapshot(
        host_id=host_id,
        provider_id="acme",
        gpu_model=model,
        free_gpus=free,
        total_gpus=8,
        path=TopologyPath(region, site, fabric, block),
        fabric_kind=kind,
        fabric_host_gbps=DECLARED_HOST_GBPS[kind],
        price_per_gpu_hour=price,
        fabric_oversubscription=oversubscription,
        reliability=reliability,
    )


def hosts_in(block: str, count: int, prefix: str | None = None, **kwargs) -> list[HostSnapshot]:
    return [host(f"{prefix or block}-h{i}", block, **kwargs) for i in range(count)]


def fsdp(nodes: int = 4, gpus: int = 8, **kwargs) -> PlacementRequest:
    return PlacementRequest(nodes=nodes, gpus_per_node=gpus, models=kwargs.pop("models", ("H100",)), **kwargs)


def blocks_of(result: Plan, inventory: list[HostSnapshot]) -> set[str]:
    by_id = {h.host_id: h for h in inventory}
    return {by_id[node.host_id].path.block_id for node in result.nodes}


# --- Slurm topology/tree and Kueue TAS scenarios -----------------------------------------------


def test_fits_in_one_block():
    inventory = hosts_in("b1", 3) + hosts_in("b2", 5)
    result = plan(fsdp(4), inventory)
    assert isinstance(result, Plan)
    assert blocks_of(result, inventory) == {"b2"}
    assert (result.spanned_level, result.predicted_busbw_gbps) == ("block", 400.0)
    assert result.price_per_hour == 4 * 8 * 2.0


def test_must_span_blocks_of_one_fabric():
    inventory = hosts_in("b1", 2) + hosts_in("b2", 2) + hosts_in("b9", 3, fabric="f2")
    result = plan(fsdp(4), inventory)
    assert blocks_of(result, inventory) == {"b1", "b2"}
    assert result.spanned_level == "fabric"
    assert result.predicted_busbw_gbps == 200.0  # 400 GB/s per host over a 2:1 oversubscribed spine
    assert any("block: none of 3 block domain(s) fits 4 nodes" in line for line in result.explanation)


def test_fragmented_fabric_best_fit_beats_first_fit():
    inventory = hosts_in("big", 6) + hosts_in("small", 4)
    result = plan(fsdp(4), inventory)
    assert blocks_of(result, inventory) == {"small"}  # leaves the 6-host block whole for a 6-node job
    assert "best-fit leaves 0 spare host(s)" in result.explanation[-2]
    baseline = first_fit(fsdp(4), inventory)
    assert blocks_of(baseline, inventory) == {"big"}


def test_required_level_unmet_is_refused_with_reason():
    inventory = hosts_in("b1", 3) + hosts_in("b2", 3)
    result = plan(fsdp(4, topology_level="block", topology_mode="required"), inventory)
    assert isinstance(result, Refusal)
    assert result.reasons == (
        "only 3 hosts with 8 free H100 GPUs in one NVLink domain share one block (most in r1/s1/f1/b2); 4 needed",
    )
    assert result.explanation == (
        "H100: block: none of 2 block domain(s) fits 4 nodes (the largest has 3 usable hosts)",
    )


def test_required_interconnect_and_fabric_refusal_counts_hosts_on_that_fabric():
    inventory = (
        hosts_in("b1", 3) + hosts_in("b2", 3, fabric="f2") + hosts_in("e1", 5, fabric="f3", kind="roce")
    )
    request = fsdp(4, interconnect=("infiniband",), interconnect_mode="required")
    refused = plan(replace(request, topology_level="fabric", topology_mode="required"), inventory)
    assert refused.reasons == (
        "only 3 hosts with 8 free H100 GPUs in one NVLink domain on InfiniBand share one fabric "
        "(most in r1/s1/f2); 4 needed",
    )
    assert isinstance(plan(request, inventory), Plan)  # without the level, IB across fabrics fits


def test_preferred_level_falls_back_upward_and_says_so():
    inventory = hosts_in("b1", 3) + hosts_in("b2", 3)
    result = plan(fsdp(4, topology_level="block", topology_mode="preferred"), inventory)
    assert isinstance(result, Plan)
    assert result.spanned_level == "fabric"
    assert "H100: preferred level block cannot fit 4 nodes: fell back to fabric" in result.explanation


def test_preferred_level_wins_over_bandwidth_when_it_fits():
    # A RoCE block fits 4 nodes; the NDR fabric only across blocks (200 GB/s, faster). `preferred`
    # block is honoured first, as in Kueue; without it the faster fabric wins.
    inventory = hosts_in("b1", 2) + hosts_in("b2", 2) + hosts_in("r1", 4, fabric="f2", kind="roce")
    preferred = plan(fsdp(4, topology_level="block", topology_mode="preferred"), inventory)
    assert (blocks_of(preferred, inventory), preferred.predicted_busbw_gbps) == ({"r1"}, 100.0)
    free_choice = plan(fsdp(4), inventory)
    assert (blocks_of(free_choice, inventory), free_choice.predicted_busbw_gbps) == ({"b1", "b2"}, 200.0)


def test_ordered_takes_first_model_that_fits():
    inventory = hosts_in("b1", 2, model="H200", price=3.0) + hosts_in("b2", 4, price=2.0)
    inventory += hosts_in("b3", 4, model="A100", price=1.0)
    result = plan(fsdp(4, models=("H200", "H100", "A100"), model_policy="ordered"), inventory)
    assert result.model == "H100"  # H200 cannot fit; H100 is listed before the cheaper A100
    assert any(line.startswith("skipped: only 2 hosts with 8 free H200") for line in result.explanation)


def test_any_of_takes_cheapest():
    inventory = hosts_in("b1", 4, model="H100", price=2.5) + hosts_in("b2", 4, model="A100", price=1.2)
    result = plan(fsdp(4, models=("H100", "A100")), inventory)
    assert result.model == "A100"
    assert result.price_per_hour == pytest.approx(4 * 8 * 1.2)
    assert any(
        line.startswith("any_of: H100 400 GB/s, $80.00/h; A100 400 GB/s") for line in result.explanation
    )


def test_any_of_prefers_bandwidth_before_price_for_collective_work():
    inventory = hosts_in("b1", 4, price=2.5) + hosts_in("a1", 2, model="A100", price=1.2)
    inventory += hosts_in("a2", 2, model="A100", price=1.2)
    assert plan(fsdp(4, models=("A100", "H100")), inventory).model == "H100"


def test_pipeline_orders_stages_so_slow_hops_fall_between_stages():
    # Two 2-host blocks, listed interleaved; 2 stages of 2 nodes: each stage stays in one block.
    listed = [host("x0", "b1"), host("y0", "b2"), host("x1", "b1"), host("y1", "b2")]
    request = fsdp(4, parallelism="tensor_pipeline", pipeline_stages=2)
    result = plan(request, listed)
    assert result.stage_order == (("x0", "x1"), ("y0", "y1"))
    assert result.host_ids == ("x0", "x1", "y0", "y1")
    assert any("hops: 1 within one fabric (200 GB/s)" in line for line in result.explanation)


def test_pipeline_with_one_stage_per_node_crosses_each_slow_boundary_once():
    listed = [host("a", "b1"), host("c", "b2"), host("b", "b1"), host("d", "b2")]
    result = plan(fsdp(4, parallelism="tensor_pipeline"), listed)
    assert result.stage_order == (("a",), ("b",), ("c",), ("d",))
    line = next(line for line in result.explanation if line.startswith("pipeline"))
    assert "2 within one block (400 GB/s), 1 within one fabric (200 GB/s)" in line


def test_non_blocking_fabric_mixes_blocks_when_that_is_cheaper():
    # Non-blocking: spanning b1 and b2 runs at the block figure, so the cheaper mix wins.
    inventory = hosts_in("b1", 3, price=2.5, oversubscription=1.0) + hosts_in(
        "b2", 2, price=1.0, oversubscription=1.0
    )
    result = plan(fsdp(3), inventory)
    assert (result.spanned_level, result.predicted_busbw_gbps) == ("fabric", 400.0)
    assert result.price_per_hour == (1.0 + 1.0 + 2.5) * 8


def test_spanning_a_fabric_leaves_out_a_cheap_host_behind_a_slow_leaf():
    inventory = hosts_in("b1", 2) + hosts_in("b2", 1) + hosts_in("b3", 1, price=1.0)
    result = plan(fsdp(3), inventory, {("block", "b3"): 3.0})
    assert blocks_of(result, inventory) == {"b1", "b2"}
    assert result.predicted_busbw_gbps == 200.0


def test_measured_bandwidth_overrides_declared():
    inventory = hosts_in("b1", 4) + hosts_in("b2", 4, price=2.5)
    assert blocks_of(plan(fsdp(4), inventory), inventory) == {"b1"}
    measured = {("block", "b1"): 150.0, ("block", "b2"): 380.0}  # b1's leaf is degraded
    result = plan(fsdp(4), inventory, measured)
    assert blocks_of(result, inventory) == {"b2"}
    assert result.predicted_busbw_gbps == 380.0
    assert "predicted busbw 380 GB/s (measured)" in result.explanation[-2]


def test_measured_fabric_figure_can_make_spanning_blocks_the_best_choice():
    inventory = hosts_in("b1", 2) + hosts_in("b2", 2) + hosts_in("e1", 4, fabric="f2", kind="eth_100g")
    result = plan(fsdp(4), inventory, {("fabric", "f1"): 390.0})
    assert (result.spanned_level, result.predicted_busbw_gbps) == ("fabric", 390.0)


def test_independent_tasks_take_cheapest_hosts_across_sites():
    inventory = hosts_in("b1", 4, price=3.0)
    inventory += [host("cheap-a", "c1", "g1", "s2", price=1.0), host("cheap-b", "c2", "g2", "s3", price=1.0)]
    inventory += [
        host("cheap-c", "c3", "g3", "s4", "r2", price=1.1),
        host("cheap-d", "c4", "g4", "s5", price=1.2),
    ]
    result = plan(fsdp(4, parallelism="independent"), inventory)
    assert set(result.host_ids) == {"cheap-a", "cheap-b", "cheap-c", "cheap-d"}
    assert result.spanned_level == "global"
    assert blocks_of(plan(fsdp(4), inventory), inventory) == {"b1"}  # FSDP pays for the block


def test_node_gpus_come_from_one_nvlink_domain_best_fit():
    split = host("split", free=((1, 2, 3), (4, 5, 6, 7)))
    roomy = host("roomy", free=(tuple(range(8)),))
    result = plan(fsdp(1, 4), [roomy, split])
    assert result.nodes[0].host_id == "split"  # 0 GPUs left over in its domain, against 4
    assert result.nodes[0].gpu_indices == (4, 5, 6, 7)
    refused = plan(fsdp(1, 4), [host("halves", free=((0, 1), (4, 5, 6)))])
    assert refused.reasons == ("no host with 4 free H100 GPUs in one NVLink domain; 1 needed",)


def test_single_node_plan_has_no_inter_node_figures():
    result = plan(fsdp(1), [host("a", price=2.0), host("b", price=1.5)])
    assert (result.host_ids, result.spanned_level) == (("b",), "host")
    assert result.predicted_busbw_gbps is None and result.predicted_allreduce_s is None
    assert result.head_host_id == "b"


def test_price_cap_refusal_names_the_cheapest_offer():
    inventory = hosts_in("b1", 4, model="RTX 4090", price=1.8, kind="eth_100g")
    result = plan(fsdp(2, models=("RTX 4090",), max_price_per_gpu_hour=1.5), inventory)
    assert result.reasons == (
        "no host with 8 free RTX 4090 GPUs in one NVLink domain is offered at or under $1.50/GPU-hour "
        "(the cheapest asks $1.80); 2 needed",
    )


def test_regions_and_interconnect_preference():
    inventory = hosts_in("b1", 4, region="eu") + hosts_in("e1", 4, fabric="f2", kind="roce", region="us")
    eu_only = plan(
        fsdp(4, regions=("us",), interconnect=("infiniband",), interconnect_mode="preferred"), inventory
    )
    assert blocks_of(eu_only, inventory) == {"e1"}
    assert "H100: preferred interconnect InfiniBand cannot fit: any fabric used" in eu_only.explanation
    refused = plan(
        fsdp(4, regions=("us",), interconnect=("infiniband",), interconnect_mode="required"), inventory
    )
    assert refused.reasons == (
        "no host with 8 free H100 GPUs in one NVLink domain in us on InfiniBand; 4 needed",
    )


def test_head_is_the_most_reliable_host_and_figures_follow_the_ring_model():
    inventory = [host("a", reliability=0.95), host("b", reliability=0.999), host("c", reliability=0.97)]
    result = plan(fsdp(3), inventory)
    assert result.head_host_id == "b"
    expected = 2 * 2 / 3 * 14e9 / 400e9 + 2 * 2 * 2e-6
    assert result.predicted_allreduce_s == pytest.approx(expected)
    assert allreduce_seconds(14e9, 3, 400.0, "block") == pytest.approx(expected)
    assert busbw_from_algbw(300.0, 4) == pytest.approx(450.0)


def test_one_inventory_index_serves_many_plans():
    inventory = Inventory(hosts_in("b1", 4) + hosts_in("b2", 2, model="A100"))
    inventory.prepare()
    assert plan(fsdp(4), inventory).model == "H100"
    assert plan(fsdp(2, 4, models=("A100",)), inventory).model == "A100"
    assert plan(fsdp(4), inventory).host_ids == plan(fsdp(4), inventory).host_ids


# --- Validation ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_kwargs", "message"),
    [
        ({"nodes": 0}, "nodes and GPUs per node must be at least 1 (0 x 8 asked)"),
        ({"gpus": 9}, "9 GPUs per node asked; the largest H100 host has 8"),
        ({"models": ("B300",)}, "unknown GPU model 'B300': the inventory offers A100, H100"),
        ({"models": ()}, "name at least one GPU model"),
        ({"pipeline_stages": 2}, "pipeline stages only apply to tensor_pipeline parallelism"),
        (
            {"parallelism": "tensor_pipeline", "pipeline_stages": 3},
            "3 pipeline stages cannot split 4 nodes evenly",
        ),
        ({"interconnect_mode": "required"}, "interconnect is required but no fabric kind is named"),
        (
            {"interconnect": ("myrinet",)},
            "unknown interconnect myrinet; known: infiniband, roce, ethernet, ib_ndr",
        ),
        ({"topology_level": "block"}, "a topology level needs a topology mode (required or preferred)"),
        (
            {"topology_mode": "required", "topology_level": "rack"},
            "topology level 'rack' is not one of block",
        ),
        ({"max_price_per_gpu_hour": 0}, "the maximum price per GPU-hour must be positive"),
    ],
)
def test_invalid_requests_say_what_is_wrong(request_kwargs, message):
    inventory = [host("a"), host("b", model="A100")]
    kwargs = dict(request_kwargs)
    request = fsdp(kwargs.pop("nodes", 4), kwargs.pop("gpus", 8), **kwargs)
    with pytest.raises(InvalidRequest) as raised:
        plan(request, inventory)
    assert raised.value.problems[0].startswith(message)


def test_prefiltered_snapshots_queue_instead_of_failing_validation():
    # The database layer passes only hosts with free capacity: a model with none free is a Refusal.
    result = plan(fsdp(2, models=("H200",)), [host("a")], validate_inventory=False)
    assert result.reasons == ("no host with 8 free H200 GPUs in one NVLink domain; 2 needed",)


def test_a_model_that_cannot_take_the_node_size_is_fine_when_another_can():
    l40s = replace(host("l", model="L40S", free=((0, 1), (2, 3))), total_gpus=4)
    inventory = [host("a"), l40s]
    validate(fsdp(1, 8, models=("L40S", "H100")), inventory)
    with pytest.raises(InvalidRequest, match="8 GPUs per node asked; the largest L40S host has 4"):
        validate(fsdp(1, 8, models=("L40S",)), inventory)


# --- Properties over random inventories -----------------------------------------------------------

KINDS = tuple(FabricKind)
LEVEL_NAMES = tuple(str(level) for level in LEVELS)
PARALLELISMS = ("data_parallel", "data_parallel", "tensor_pipeline", "independent", "inference_replicas")


# Strategies are built once: building them inside each draw costs more than the engine and brute force.
def _any(*values):
    return st.sampled_from(values)


HOST_COUNT, REGION, SITE, FABRIC, BLOCK = (
    _any(1, 3, 5, 6, 7, 8, 8),
    _any("r0", "r0", "r1"),
    _any(0, 1),
    _any(0, 1),
    _any(0, 1, 2),
)
KIND, OVERSUBSCRIPTION, BACKBONE = st.sampled_from(KINDS), _any(1.0, 1.0, 2.0, 4.0), _any(12.5, 25.0, 500.0)
TOTAL, MODEL, PRICE, RELIABILITY = (
    _any(2, 3, 4, 8, 8),
    _any("H100", "H100", "A100"),
    _any(1.0, 1.5, 2.0, 2.5),
    _any(0.9, 0.99),
)
FREE = {n: st.lists(_any(True, True, True, True, True, False), min_size=n, max_size=n) for n in (2, 3, 4, 8)}
MODES, NODES, GPUS = _any("any", "any", "required", "preferred"), _any(1, 2, 2, 3, 3, 4), _any(1, 2, 2, 4)
KIND_NAMES, REGIONS = _any(("infiniband",), ("roce", "ib_hdr"), ("ethernet",)), _any((), (), ("r0",), ("r1",))
MAX_PRICE, SAMPLE_GBPS = _any(None, None, 1.2, 1.8, 2.5), _any(3.0, 50.0, 150.0, 390.0, 600.0)


@st.composite
def inventories(draw) -> list[HostSnapshot]:
    """<= 8 hosts over 1-2 regions, sites, fabrics and 1-3 blocks; 2-8 GPUs in 1-2 NVLink domains."""
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
        hosts.append(_random_host(draw, f"h{index}", path, *fabrics[fabric], backbones[site]))
    return hosts


def _random_host(
    draw, host_id: str, path: TopologyPath, kind: str, oversub: float, backbone: float
) -> HostSnapshot:
    total = draw(TOTAL)
    cut = total if draw(st.booleans()) else total // 2
    free = draw(FREE[total])
    domains = (range(cut), range(cut, total)) if cut < total else (range(total),)
    return HostSnapshot(
        host_id=host_id,
        provider_id="p",
        gpu_model=draw(MODEL),
        free_gpus=tuple(tuple(i for i in domain if free[i]) for domain in domains),
        total_gpus=total,
        path=path,
        fabric_kind=kind,
        fabric_host_gbps=DECLARED_HOST_GBPS[kind],
        price_per_gpu_hour=draw(PRICE),
        fabric_oversubscription=oversub,
        site_backbone_gbps=backbone,
        reliability=draw(RELIABILITY),
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


def _fits(request: PlacementRequest, h: HostSnapshot, model: str, kinds: frozenset[str]) -> bool:
    cap = request.max_price_per_gpu_hour
    return (
        h.gpu_model == model
        and any(len(domain) >= request.gpus_per_node for domain in h.free_gpus)
        and (cap is None or h.price_per_gpu_hour <= cap)
        and (not request.regions or h.path.region in request.regions)
        and (request.interconnect_mode != "required" or h.fabric_kind in kinds)
    )


def _tier(request: PlacementRequest, chosen: tuple[HostSnapshot, ...]) -> tuple[int, int] | None:
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


def brute_force(request, hosts, measured):
    """Best (tier, busbw, price) over every set of hosts by the engine's rules, or None."""
    kinds = request.interconnect_kinds()
    ranked = []
    for model in request.models:
        fitting = [h for h in hosts if _fits(request, h, model, kinds)]
        for chosen in combinations(fitting, request.nodes):
            tier = _tier(request, chosen)
            if tier is not None:
                price = sum(h.price_per_gpu_hour for h in chosen) * request.gpus_per_node
                ranked.append((tier, cluster_busbw_gbps(chosen, measured), price))
        if ranked and request.model_policy == "ordered":
            break
    if not ranked:
        return None
    best_tier = min(tier for tier, _, _ in ranked)
    ranked = [(bw, price) for tier, bw, price in ranked if tier == best_tier]
    if request.parallelism in COLLECTIVE and request.nodes > 1:
        best_bw = max(bw for bw, _ in ranked)
        return best_tier, best_bw, min(price for bw, price in ranked if bw == best_bw)
    return best_tier, None, min(price for _, price in ranked)


def assert_plan_keeps_hard_constraints(request: PlacementRequest, result: Plan, hosts, measured) -> None:
    by_id = {h.host_id: h for h in hosts}
    chosen = tuple(by_id[node.host_id] for node in result.nodes)
    assert len(chosen) == request.nodes == len(set(result.host_ids))
    assert result.model in request.models and result.head_host_id in result.host_ids
    for node, h in zip(result.nodes, chosen, strict=True):
        assert _fits(request, h, result.model, request.interconnect_kinds())
        assert len(node.gpu_indices) == len(set(node.gpu_indices)) == request.gpus_per_node
        assert any(set(node.gpu_indices) <= set(domain) for domain in h.free_gpus)  # free, one domain
    assert _tier(request, chosen) is not None
    assert result.price_per_hour == pytest.approx(
        sum(h.price_per_gpu_hour for h in chosen) * request.gpus_per_node
    )
    assert result.predicted_busbw_gbps == cluster_busbw_gbps(chosen, measured)
    if request.parallelism == "tensor_pipeline" and request.nodes > 1:
        assert tuple(host_id for stage in result.stage_order for host_id in stage) == result.host_ids


# PLACEMENT_EXAMPLES=10000 runs a deeper check (under 3 minutes here; it passes); 1000 keeps this quick.
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
    tier, busbw, price = expected
    assert _tier(request, tuple(by_id[i] for i in result.host_ids)) == tier
    if busbw is not None:
        assert result.predicted_busbw_gbps == busbw
    assert math.isclose(result.price_per_hour, price, abs_tol=1e-6)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_first_fit_baseline_keeps_hard_constraints_but_never_beats_the_engine(data):
    hosts = data.draw(inventories())
    request = data.draw(requests(hosts))
    request = replace(request, topology_mode="any", topology_level=None, interconnect_mode="any")
    request = replace(request, parallelism="data_parallel")
    try:
        ours = plan(request, hosts)
    except InvalidRequest:
        return
    baseline = first_fit(replace(request, model_policy="any_of"), hosts)
    if isinstance(baseline, Plan) and baseline.predicted_busbw_gbps is not None:
        assert isinstance(ours, Plan)
        assert_plan_keeps_hard_constraints(request, baseline, hosts, None)
        if request.model_policy == "any_of":
            assert ours.predicted_busbw_gbps >= baseline.predicted_busbw_gbps
