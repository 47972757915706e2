"""The placement engine: Slurm/Kueue topology scenarios, validation, and hypothesis properties.

Pure Python: no database. The property tests (brute force on random inventories) live in
test_placement_properties.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from clusters.placement import (
    DECLARED_HOST_GBPS,
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
    first_fit,
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
    assert "best-fit leaves 0 spare hosts" in result.explanation[-2]
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


def test_a_collective_plan_across_a_wan_says_so_and_how_to_wait_for_one_site():
    """bench/churn.py --comm-share: a data-parallel job spread over regions runs ~160x slower; a user who
    sees only "0.125 GB/s" may not know to ask for one site instead."""
    inventory = hosts_in("b1", 2, site="s1", region="eu") + hosts_in("b2", 2, site="s2", region="us")
    result = plan(fsdp(4), inventory)
    assert result.spanned_level == "global"
    warning = next(line for line in result.explanation if line.startswith("warning:"))
    assert (
        "crosses the WAN between regions: 0.125 GB/s, 3,200x below the 400 GB/s these hosts reach" in warning
    )
    assert "topology_level=site with topology_mode=required" in warning

    same_region = hosts_in("b1", 2, site="s1") + hosts_in("b2", 2, site="s2")
    warning = next(line for line in plan(fsdp(4), same_region).explanation if line.startswith("warning:"))
    assert "between the sites of one region: 1.25 GB/s, 320x below the 400 GB/s" in warning

    one_site = hosts_in("b1", 2) + hosts_in("b2", 2, fabric="f2")
    assert not any(line.startswith("warning:") for line in plan(fsdp(4), one_site).explanation)
    independent = plan(fsdp(4, parallelism="independent"), inventory)
    assert not any(line.startswith("warning:") for line in independent.explanation)

    waiting = plan(fsdp(4, topology_level="site", topology_mode="required"), inventory)
    assert isinstance(waiting, Refusal)
