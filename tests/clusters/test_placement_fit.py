"""Issue 10, placement points 1-5: PCIe hosts, best fit for every request kind, fewest domains,
name-free tie-breaks, and measured bandwidth that stays local to what it measured. Pure Python.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

from clusters.placement import (
    DECLARED_HOST_GBPS,
    FabricKind,
    HostSnapshot,
    Inventory,
    PlacementRequest,
    Plan,
    Refusal,
    TopologyPath,
    plan,
)


def host(
    host_id: str,
    block: str = "b1",
    fabric: str = "f1",
    site: str = "s1",
    *,
    model: str = "H100",
    free: tuple[tuple[int, ...], ...] = (tuple(range(8)),),
    total: int = 8,
    price: float = 2.0,
    reliability: float = 0.99,
    **pcie,
) -> HostSnapshot:
    kind = FabricKind.IB_NDR
    return HostSnapshot(
        host_id=host_id,
        provider_id="acme",
        gpu_model=model,
        free_gpus=free,
        total_gpus=total,
        path=TopologyPath("r1", site, fabric, block),
        fabric_kind=kind,
        fabric_host_gbps=DECLARED_HOST_GBPS[kind],
        price_per_gpu_hour=price,
        fabric_oversubscription=2.0,
        reliability=reliability,
        **pcie,
    )


def l40s(host_id: str, free: tuple[int, ...], total: int = 8, block: str = "p1", **kwargs) -> HostSnapshot:
    """A PCIe-only host as discovery reports it: every GPU its own NVLink domain; two GPUs per PCIe
    switch, half the GPUs per NUMA node (the simulator's layout)."""
    switches = tuple(tuple(range(i, i + 2)) for i in range(0, total, 2))
    numa = (tuple(range(total // 2)), tuple(range(total // 2, total)))
    return host(
        host_id,
        block,
        model="L40S",
        free=tuple((i,) for i in free),
        total=total,
        nvlink=False,
        pcie_switches=switches,
        numa_nodes=numa,
        **kwargs,
    )


def ask(nodes: int = 1, gpus: int = 8, model: str = "H100", **kwargs) -> PlacementRequest:
    return PlacementRequest(nodes=nodes, gpus_per_node=gpus, models=(model,), **kwargs)


def blocks(result: Plan, inventory: list[HostSnapshot]) -> list[str]:
    by_id = {h.host_id: h for h in inventory}
    return sorted(by_id[n.host_id].path.block_id for n in result.nodes)


# --- 1. PCIe hosts ----------------------------------------------------------------------------------


def test_a_free_four_l40s_host_gives_one_node_all_four_gpus():
    result = plan(ask(1, 4, "L40S"), [l40s("box", (0, 1, 2, 3), total=4)])
    assert isinstance(result, Plan), result
    assert result.nodes[0].gpu_indices == (0, 1, 2, 3)
    assert plan(ask(2, 4, "L40S"), [l40s("box", (0, 1, 2, 3), total=4)]).reasons == (
        "only 1 host with 4 free L40S GPUs for one node; 2 needed",
    )


def test_pcie_node_prefers_one_switch_then_one_numa_node_then_spans_them():
    box = l40s("box", (0, 2, 3, 4, 5, 6))  # GPUs 1 and 7 are taken
    assert plan(ask(1, 2, "L40S"), [box]).nodes[0].gpu_indices == (2, 3)  # one PCIe switch
    three = plan(ask(1, 3, "L40S"), [box])
    assert three.nodes[0].gpu_indices == (0, 2, 3)  # one NUMA node
    assert "each node's GPUs lie within one NUMA node at worst" in " ".join(three.explanation)
    assert plan(ask(1, 5, "L40S"), [box]).nodes[0].gpu_indices == (0, 2, 3, 4, 5)  # across NUMA


def test_pcie_host_where_the_node_fits_one_switch_is_preferred_over_a_cheaper_spread():
    spread = l40s("a", (1, 2), reliability=0.999)  # two free GPUs, on different switches
    paired = l40s("b", (4, 5), block="p2")
    assert plan(ask(1, 2, "L40S"), [spread, paired]).host_ids == ("b",)


def test_nvlink_hosts_still_take_one_domain_and_refuse_otherwise():
    split = host("split", free=((0, 1), (4, 5, 6)))
    assert plan(ask(1, 3), [split]).nodes[0].gpu_indices == (4, 5, 6)
    refused = plan(ask(1, 4), [split])
    assert isinstance(refused, Refusal)
    assert refused.reasons == ("no host with 4 free H100 GPUs in one NVLink domain; 1 needed",)


# --- 2. Best fit for every request kind -----------------------------------------------------------


def test_one_node_takes_the_tightest_block_so_a_later_three_node_job_fits_one_block():
    trio = [host(f"a{i}", "roomy") for i in range(3)]  # named to come first
    lone = host("z", "tight")
    inventory = [*trio, lone]
    first = plan(ask(1), inventory)
    assert first.host_ids == ("z",)
    later = plan(ask(3), [h for h in inventory if h.host_id not in first.host_ids])
    assert later.spanned_level == "block"


def test_one_node_takes_the_tightest_host_not_only_the_tightest_nvlink_domain():
    roomy = host("a", free=((0, 1), (2, 3, 4, 5, 6, 7)))  # its domain of 2 fits exactly too
    tight = host("z", free=((0, 1),))
    result = plan(ask(1, 2), [roomy, tight])
    assert (result.host_ids, result.nodes[0].gpu_indices) == (("z",), (0, 1))


def test_a_partly_used_host_is_filled_before_a_whole_host_is_opened_even_in_a_tighter_block():
    whole = host("a", "tight")  # the only host of its block: the tighter block
    partial = host("z", "roomy", free=((7,),))
    result = plan(ask(1, 1), [whole, partial, host("y", "roomy")])
    assert result.host_ids == ("z",)  # 8 free GPUs in "a" stay whole for an 8-GPU node


def test_independent_and_inference_requests_take_the_tightest_block_too():
    inventory = [host(f"a{i}", "roomy") for i in range(5)] + [host(f"z{i}", "tight") for i in range(2)]
    for parallelism in ("independent", "inference_replicas"):
        result = plan(ask(2, parallelism=parallelism), inventory)
        assert blocks(result, inventory) == ["tight", "tight"], parallelism


# --- 3. Fewest domains when a plan must span ------------------------------------------------------


def test_four_nodes_over_blocks_of_one_one_one_and_three_span_two_blocks_whatever_the_names():
    layout = [("s1", "b1"), ("s2", "b2"), ("s3", "b3"), ("t1", "b4"), ("t2", "b4"), ("t3", "b4")]
    for names in itertools.permutations("abcdef"):
        inventory = [host(name, block) for name, (_, block) in zip(names, layout, strict=True)]
        result = plan(ask(4), inventory)
        assert result.spanned_level == "fabric"
        assert blocks(result, inventory).count("b4") == 3 and len(set(blocks(result, inventory))) == 2


def test_a_spanning_plan_uses_the_fewest_blocks_then_the_fewest_fabrics():
    inventory = [host(f"x{i}", "one", "f1") for i in range(2)] + [
        host(f"y{i}", "two", "f1") for i in range(2)
    ]
    inventory += [host(f"c{i}", "three", "f2") for i in range(3)] + [host("d", "four", "f3")]
    result = plan(ask(4, parallelism="independent"), inventory)
    assert blocks(result, inventory) == ["one", "one", "two", "two"]  # 2 blocks in 1 fabric


def _two_sites_or_three_blocks() -> list[HostSnapshot]:
    """Site s1: three blocks of one host in fabric f1; site s2: one block of two hosts. Three nodes fit
    as 2 sites / 2 fabrics / 2 blocks (s2's pair and one of s1) or 1 site / 1 fabric / 3 blocks (s1)."""
    inventory = [host(f"a{i}", f"s1b{i}", "f1", "s1") for i in range(3)]
    inventory += [host(f"z{i}", "s2b", "f2", "s2") for i in range(2)]
    return [replace(h, site_backbone_gbps=500.0) for h in inventory]


def test_equal_bandwidth_and_price_span_the_fewest_sites_before_the_fewest_blocks():
    """Issue 23, item 6 (Kueue and Slurm minimise from the top level down): at equal bandwidth and price,
    a plan of 1 site and 3 blocks beats one of 2 sites and 2 blocks."""
    inventory = _two_sites_or_three_blocks()
    for parallelism in ("independent", "inference_replicas"):
        result = plan(ask(3, parallelism=parallelism), inventory)
        assert sorted(result.host_ids) == ["a0", "a1", "a2"], parallelism
    # Collective work: a measured WAN as fast as the fabric makes both spans equal on busbw too.
    measured = {("region", "r1"): 200.0}
    result = plan(ask(3), inventory, measured)
    assert sorted(result.host_ids) == ["a0", "a1", "a2"]
    assert result.predicted_busbw_gbps == 200.0  # the fabric's 400 / 2, as the 2-site plan's WAN
    assert "spans 1 region, 1 site, 1 fabric, 3 blocks" in " ".join(result.explanation)


# --- Issue 23, item 5: a host's ports cap what it injects ------------------------------------------


def test_a_host_whose_ports_give_less_predicts_from_them_and_ranks_below_its_block():
    """One 200 Gb/s port is 25 GB/s, whatever the fabric declares: the plan predicts from the smaller
    figure, says so, and a block's full hosts come before the short one."""
    short = replace(host("1", "b1"), discovered_host_gbps=25.0)
    full = [replace(host(i, "b1"), discovered_host_gbps=400.0) for i in ("2", "3")]

    both = plan(ask(2), [short, full[0]])
    assert both.predicted_busbw_gbps == 25.0
    assert "ports: host 1 injects 25 GB/s through its ports, below the 400 GB/s its fabric declares" in (
        " ".join(both.explanation)
    )
    assert set(plan(ask(2), [short, *full]).host_ids) == {"2", "3"}
    unknown = replace(short, discovered_host_gbps=None)  # nothing seen: the declared figure stands
    assert plan(ask(2), [unknown, full[0]]).predicted_busbw_gbps == 400.0


# --- 4. Ties never depend on names -----------------------------------------------------------------


def test_ties_break_on_reliability_then_primary_key_and_the_explanation_says_so():
    inventory = [host("10", "b1", reliability=0.95), host("9", "b2", reliability=0.95)]
    inventory.append(host("2", "b3", reliability=0.9))
    result = plan(ask(1), inventory)
    assert result.host_ids == ("9",)  # primary key order: 9 before 10 (not "10" < "9" as text)
    assert "reliability, then host primary key — never on names" in " ".join(result.explanation)
    assert plan(
        ask(1), [replace(h, reliability=0.97) if h.host_id == "2" else h for h in inventory]
    ).host_ids == ("2",)


# --- 5. Measured bandwidth stays local ---------------------------------------------------------------


def test_a_slow_block_keeps_its_hierarchy_and_ranks_below_healthy_blocks():
    slow = [host("a", "slow"), host("b", "slow")]
    cheap_neighbour = host("c", "other", price=1.0)
    measured = {("block", "slow"): 100.0}  # 25% of the declared 400 GB/s
    result = plan(ask(2), [*slow, cheap_neighbour], measured)
    # In the slow block its hosts still reach 100 GB/s; leaving it runs at 25% of the fabric's 200.
    assert (set(result.host_ids), result.predicted_busbw_gbps) == ({"a", "b"}, 100.0)
    assert "measured: block r1/s1/f1/slow at 100 GB/s against 400 GB/s declared (efficiency 25%" in " ".join(
        result.explanation
    )
    healthy = [host("d", "ok", price=3.0), host("e", "ok", price=3.0)]
    assert set(plan(ask(2), [*slow, cheap_neighbour, *healthy], measured).host_ids) == {"d", "e"}


def test_a_block_sample_does_not_touch_other_blocks_or_the_fabric_figure():
    inventory = [host("a", "b1"), host("b", "b2"), host("c", "b3"), host("d", "b3")]
    result = plan(ask(2), inventory[:2], {("block", "b3"): 1.1})
    assert (result.spanned_level, result.predicted_busbw_gbps) == ("fabric", 200.0)
    assert not any(line.startswith("measured:") for line in result.explanation)


# --- the index follows allocations ---------------------------------------------------------------------


def test_an_index_kept_current_by_update_plans_like_a_fresh_one():
    rng = random.Random(3)
    hosts = {f"{b}{i}": host(f"{b}{i}", b) for b in ("p", "q", "r") for i in range(4)}
    hosts |= {f"l{i}": l40s(f"l{i}", tuple(range(8)), block="s") for i in range(3)}
    index = Inventory(hosts.values())
    index.prepare(range(1, 9), ("H100", "L40S"))
    asks = [ask(n, g, m) for n in (1, 2, 3) for g in (1, 4, 8) for m in ("H100", "L40S")]
    for _ in range(40):
        h = hosts[rng.choice(sorted(hosts))]
        free = sorted(rng.sample(range(8), rng.randint(0, 8)))
        hosts[h.host_id] = replace(h, free_gpus=(tuple(free),) if h.nvlink else tuple((i,) for i in free))
        index.update(hosts[h.host_id])
        fresh = Inventory(hosts.values())
        for request in asks:
            ours, theirs = plan(request, index), plan(request, fresh)
            assert type(ours) is type(theirs)
            if isinstance(ours, Plan):
                assert (ours.nodes, ours.price_per_hour) == (theirs.nodes, theirs.price_per_hour)


def test_update_many_plans_like_a_fresh_index_whatever_hosts_change_together():
    """Inventory.update_many (several hosts, each group refreshed once) against a fresh index."""
    rng = random.Random(5)
    hosts = {f"{b}{i}": host(f"{b}{i}", b) for b in ("p", "q", "r") for i in range(4)}
    hosts |= {f"l{i}": l40s(f"l{i}", tuple(range(8)), block="s") for i in range(3)}
    index = Inventory(hosts.values())
    index.prepare(range(1, 9), ("H100", "L40S"))
    asks = [ask(n, g, m) for n in (1, 2, 3) for g in (1, 4, 8) for m in ("H100", "L40S")]
    for _ in range(20):
        changed = []
        for h in rng.sample(sorted(hosts.values(), key=lambda h: h.host_id), rng.randint(1, 6)):
            free = sorted(rng.sample(range(8), rng.randint(0, 8)))
            hosts[h.host_id] = replace(h, free_gpus=(tuple(free),) if h.nvlink else tuple((i,) for i in free))
            changed.append(hosts[h.host_id])
        index.update_many(changed)
        fresh = Inventory(hosts.values())
        for request in asks:
            ours, theirs = plan(request, index), plan(request, fresh)
            assert type(ours) is type(theirs)
            if isinstance(ours, Plan):
                assert (ours.nodes, ours.price_per_hour) == (theirs.nodes, theirs.price_per_hour)


def test_a_price_band_fills_a_partly_used_block_before_opening_a_cheaper_whole_one():
    """bench/churn.py: strict price order across blocks sends a 2-node job of 4-GPU nodes to a cheaper
    block of whole hosts while half-used hosts wait in a dearer one, and whole hosts are what 8-GPU nodes
    need later. Within VOLT_PLACEMENT_PRICE_BAND the tighter fit wins, and the explanation says why."""
    half = (tuple(range(4)),)
    hosts = [
        host("1", "cheap", fabric="f2", price=2.0),
        host("2", "cheap", fabric="f2", price=2.0),
        host("3", "dear", fabric="f1", price=2.3, free=half),
        host("4", "dear", fabric="f1", price=2.3, free=half),
    ]
    ask = PlacementRequest(nodes=2, gpus_per_node=4, models=("H100",), parallelism="data_parallel")

    strict, banded = plan(ask, hosts), plan(ask, hosts, price_band=0.2)

    assert set(strict.host_ids) == {"1", "2"}  # the default: strict price order
    assert set(banded.host_ids) == {"3", "4"}  # 15% dearer, and the whole hosts stay whole
    assert banded.predicted_busbw_gbps == strict.predicted_busbw_gbps
    assert any("count as equal" in line for line in banded.explanation)
    assert set(plan(ask, hosts, price_band=0.1).host_ids) == {"1", "2"}  # beyond the band: price decides
