"""Placement and the probe know the overlay (issue 26, item 4): the plan names the path its nodes will take
(direct / overlay / relay), predicts at that path's measured cost, and the probe's link tests blame the
overlay or the relay rather than a host, whose replacement would sit on the same path."""

from __future__ import annotations

import json

import pytest

from clusters import network_paths, planning, provision, transitions
from clusters.models import BandwidthSample, Cluster, ClusterNode
from clusters.probes import allreduce
from inventory.models import HostReach

from .conftest import spec

pytestmark = pytest.mark.django_db


def preview(client, **overrides) -> dict:
    response = client.post("/api/v1/placements/preview", spec(**overrides), format="json")
    assert response.status_code == 200, response.content
    return response.json()


@pytest.fixture
def two_providers(northwind_ib, helios_roce, make_host):
    """One H100 host at Northwind (no UDP endpoint) and one at Helios (51820/udp forwarded to it)."""
    nw = make_host(northwind_ib.blocks.first(), name="nw-01")
    he = make_host(helios_roce.blocks.first(), name="he-01")
    he.overlay_endpoint = "203.0.113.7:51820"
    he.save(update_fields=["overlay_endpoint"])
    return nw, he


def test_a_plan_within_one_network_is_direct_at_the_engines_figure(alice, client_for, rack):
    plan = preview(client_for(alice))

    assert plan["network_path"] == "direct" and plan["direct_busbw_gbps"] is None
    assert not any(line.startswith("network:") for line in plan["explanation"])


def test_a_plan_across_providers_names_the_overlay_and_predicts_at_its_declared_cost(
    alice, client_for, two_providers
):
    plan = preview(client_for(alice))

    direct = plan["direct_busbw_gbps"]
    assert plan["network_path"] == "overlay"
    assert plan["predicted_busbw_gbps"] == pytest.approx(direct * network_paths.DEFAULT_COST["overlay"])
    line = next(line for line in plan["explanation"] if line.startswith("network:"))
    assert "overlay: its nodes sit in 2 networks that do not reach each other's addresses" in line
    assert (
        "x0.90, the overlay's cost between ib_ndr+roce hosts (declared: no probe has measured it yet)" in line
    )


def test_a_measured_overlay_cost_replaces_the_default_and_never_a_domains_figure(
    alice, client_for, two_providers
):
    before = preview(client_for(alice))
    BandwidthSample.objects.create(
        level="overlay", domain_id="ib_ndr+roce", busbw_gbps=0.022, predicted_gbps=0.1
    )

    plan = preview(client_for(alice))

    assert plan["direct_busbw_gbps"] == pytest.approx(before["direct_busbw_gbps"])  # the engine's, unchanged
    assert plan["predicted_busbw_gbps"] == pytest.approx(plan["direct_busbw_gbps"] * 0.22)
    assert "x0.22, the overlay's cost between ib_ndr+roce hosts (measured by cluster" in " ".join(
        plan["explanation"]
    )
    assert ("overlay", "ib_ndr+roce") not in planning.measured_bandwidth()


@pytest.fixture
def relayed(northwind_ib, helios_roce, make_host):
    """Two Northwind hosts that a check found apart (neither reaches the other's address, neither has a UDP
    endpoint) and a Helios host with one: the Northwind pair can only go through it."""
    a = make_host(northwind_ib.blocks.first(), name="nw-01")
    b = make_host(northwind_ib.blocks.first(), name="nw-02")
    he = make_host(helios_roce.blocks.first(), name="he-01")
    he.overlay_endpoint = "203.0.113.7:51820"
    he.save(update_fields=["overlay_endpoint"])
    HostReach.objects.create(host=b, peer=a, address=b.node_ip, ok=False, detail="timed out")
    return a, b, he


def test_a_pair_with_no_endpoint_goes_through_the_relay_and_the_plan_says_which(alice, client_for, relayed):
    plan = preview(client_for(alice), nodes=3)

    assert plan["network_path"] == "relay"
    assert plan["predicted_busbw_gbps"] == pytest.approx(plan["direct_busbw_gbps"] * 0.45)
    line = next(line for line in plan["explanation"] if line.startswith("network:"))
    assert "relay: its nodes sit in 3 networks" in line and "nw-01-nw-02 through the relay he-01" in line


def test_hosts_that_no_relay_can_join_are_a_warning_of_the_plan(alice, client_for, northwind_ib, make_host):
    a = make_host(northwind_ib.blocks.first(), name="nw-01")
    b = make_host(northwind_ib.blocks.first(), name="nw-02")
    HostReach.objects.create(host=b, peer=a, address=b.node_ip, ok=False, detail="timed out")

    plan = preview(client_for(alice))

    assert any("nw-01, nw-02 have no reachable UDP endpoint" in warning for warning in plan["warnings"])


@pytest.fixture
def verifying_relay(alice, client_for, committed, relayed):
    """The 3-node relay cluster, its nodes up as far as Volt knows, its path set as bring-up set it."""
    with committed():
        response = client_for(alice).post("/api/v1/clusters/", spec(nodes=3), format="json")
    cluster = Cluster.objects.get(pk=response.json()["id"])
    assert cluster.plan["network_path"] == "relay"
    Cluster.objects.filter(pk=cluster.pk).update(dashboard_url="http://127.0.0.1:1", network_path="relay")
    return transitions.transition(Cluster.objects.get(pk=cluster.pk), "verifying", "nodes joined")


def relay_probe(cluster: Cluster, link_gbps: dict[str, float], busbw: float) -> str:
    """Rank 0's output: a ring over the three nodes whose link tests measured `link_gbps` by host pair."""
    names = {n.node_ip: n.host.name for n in provision.active_nodes(cluster)}
    ips = sorted(names)
    links = []
    for a, b in allreduce.ring_links(len(ips)):
        pair = "-".join(sorted((names[ips[a]], names[ips[b]])))
        links.append((a, b, link_gbps[pair]))
    size = allreduce.MB
    time_s = size / (busbw / (2 * (len(ips) - 1) / len(ips))) / 1e9
    summary = allreduce.summarize(
        len(ips), "gloo", [size], [[time_s]] * len(ips), node_ips=ips, correct=True,
        hosts=allreduce.summarize_hosts(ips, [100.0] * len(ips), links),
        links=[{"ranks": [a, b], "gbps": gbps} for a, b, gbps in links],
    )  # fmt: skip
    return allreduce.RESULT_PREFIX + json.dumps(summary) + "\n"


def test_the_probe_blames_the_relay_keeps_the_hosts_and_records_the_relays_cost(verifying_relay, probe_hosts):
    direct = verifying_relay.plan["direct_busbw_gbps"]
    slow, fast = direct * 0.1, direct * 0.9
    names_before = sorted(n.host.name for n in provision.active_nodes(verifying_relay))
    probe_hosts.answer(relay_probe(verifying_relay, {"nw-01-nw-02": slow, "he-01-nw-01": fast,
                                                     "he-01-nw-02": fast}, busbw=direct * 0.2))  # fmt: skip

    cluster = provision.verify(verifying_relay)

    assert (
        cluster.status == "ready" and cluster.bandwidth_flagged
    )  # 0.2 of direct: below 0.5 x (0.45 x direct)
    assert sorted(n.host.name for n in provision.active_nodes(cluster)) == names_before
    message = cluster.events.order_by("-id").first().message
    assert "the per-host tests blame the relay he-01: links through it (nw-01-nw-02) run at" in message
    assert "11% of the" in message and "links that do not pass it" in message
    assert "is the slowest host" not in message  # each host's best link is fast: no host stands out
    sample = BandwidthSample.objects.get(cluster=cluster)
    assert (sample.level, sample.domain_id) == ("relay", "ib_ndr+roce")
    assert sample.busbw_gbps == pytest.approx(direct * 0.2) and sample.predicted_gbps == pytest.approx(direct)
    # The next plan over these hosts predicts at the relay's measured cost.
    assert network_paths.cost("relay", "ib_ndr+roce")[0] == pytest.approx(0.2)


def test_the_probe_blames_the_overlay_when_every_link_over_it_is_slow():
    rated = [("a-b", 0.02, "overlay"), ("b-c", 0.021, "overlay"), ("a-c", 0.019, "overlay")]

    line = network_paths.judge(rated, "", direct=0.1, fraction=0.5)

    assert (
        line
        == "the per-host tests blame the overlay: links over it run at 0.02 GB/s, 20% of the 0.10 GB/s predicted without it"
    )
    assert network_paths.judge(rated, "", direct=0.03, fraction=0.5) == ""  # 67%: the overlay is not to blame


def test_a_host_without_wireguard_is_a_warning_of_an_overlay_plan(alice, client_for, two_providers):
    nw, _ = two_providers
    nw.system = {"overlay": "", "overlay_missing": "`wg` (install wireguard-tools)"}
    nw.save(update_fields=["system"])

    plan = preview(client_for(alice))

    assert (
        "network: nw-01 cannot join an overlay (needs `wg` (install wireguard-tools)): bring-up would replace it"
        in plan["warnings"]
    )


def test_a_forwarded_port_another_live_overlay_holds_is_no_endpoint_for_the_next(
    alice, team_a, client_for, two_providers
):
    _, he = two_providers
    other = Cluster.objects.create(team=team_a, name="holds-51820", spec=spec(), status="ready")
    ClusterNode.objects.create(
        cluster=other, host=he, rank=0, is_head=True, gpu_indices=[], overlay_port=51820
    )

    plan = preview(client_for(alice))

    assert plan["network_path"] == "overlay"
    assert any("nw-01, he-01 have no reachable UDP endpoint" in w or "he-01, nw-01 have no" in w
               for w in plan["warnings"]), plan["warnings"]  # fmt: skip


def test_the_cluster_page_names_its_network_path(verifying_relay, alice):
    from django.test import Client

    Cluster.objects.filter(pk=verifying_relay.pk).update(overlay_network="100.96.3.0/24")
    page = Client()
    page.force_login(alice)
    html = page.get(f"/clusters/{verifying_relay.pk}/").content.decode()
    shown = html.split('id="cluster-network">', 1)[1].split("</div>", 1)[0]
    assert "relay on" in shown and "100.96.3.0/24" in shown and "GB/s without it" in shown
