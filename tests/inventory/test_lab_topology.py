"""The lab's declared topology (pure; no root): the default lab, addresses, gates and link rates."""

from __future__ import annotations

import ipaddress

import pytest

from inventory.lab import network
from inventory.lab.topology import TopologyError, as_json, build, default_topology, from_json


def test_default_lab_has_two_providers_with_blocks_of_two():
    lab = build(1, default_topology())

    assert [(m.name, m.provider, m.block) for m in lab.machines] == [
        ("nw-01", "northwind", "iad1-ndr/r1"),
        ("nw-02", "northwind", "iad1-ndr/r1"),
        ("nw-03", "northwind", "iad1-ndr/r2"),
        ("nw-04", "northwind", "iad1-ndr/r2"),
        ("he-01", "helios", "ord1-roce/r1"),
        ("he-02", "helios", "ord1-roce/r1"),
        ("he-03", "helios", "ord1-roce/r2"),
        ("he-04", "helios", "ord1-roce/r2"),
    ]
    assert [(p.name, p.network, p.gateway) for p in lab.providers] == [
        ("northwind", "10.77.1.0/24", "10.77.1.1"),
        ("helios", "10.77.2.0/24", "10.77.2.1"),
    ]
    assert [m.address for m in lab.machines[:2]] == ["10.77.1.11", "10.77.1.12"]
    assert lab.machine("he-01").address == "10.77.2.11"
    assert (lab.machine("he-04").spec["gpu_model"], lab.machine("he-04").spec["gpu_count"]) == ("RTX 4090", 8)


def test_gates_are_loopback_addresses_apart_from_local_hosts():
    lab = build(7, default_topology(3))

    gates = [ipaddress.ip_address(m.gate) for m in lab.machines]
    assert [str(g) for g in gates] == ["127.77.7.1", "127.77.7.2", "127.77.7.3"]
    assert all(g.is_loopback and g not in ipaddress.ip_network("127.0.0.0/16") for g in gates)
    assert all(ipaddress.ip_address(m.address).is_private for m in lab.machines)


def test_links_run_at_the_finest_shared_levels_rate_times_the_scale():
    lab = build(1, default_topology())
    nw1, nw2, nw3, he1 = (lab.machine(n) for n in ("nw-01", "nw-02", "nw-03", "he-01"))

    assert [lab.level(nw1, other) for other in (nw2, nw3, he1)] == ["block", "fabric", "region"]
    assert lab.rate_bytes(nw1, nw2, 0.001) == 400_000_000  # NDR 400 GB/s per host
    assert lab.rate_bytes(nw1, nw3, 0.001) == 200_000_000  # oversubscribed 2:1 between blocks
    assert lab.rate_bytes(nw1, he1, 0.001) == 1_250_000  # WAN within a region


def test_each_machine_gets_its_declared_gpus_and_its_fabrics_nics():
    nics = lambda model, count, kind: [{"name": f"{kind}_{i}"} for i in range(2)]  # noqa: E731
    lab = build(1, default_topology(5), default_nics=nics)

    spec = lab.machine("he-01").spec
    assert (spec["gpu_model"], spec["gpu_count"], spec["seed"]) == ("L40S", 4, "lab-he-01")
    assert spec["nics"] == [{"name": "roce_0"}, {"name": "roce_1"}]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t["machines"].append(dict(t["machines"][0])), "machine names must be unique: nw-01"),
        (lambda t: t["machines"][0].update(fabric="nope"), "fabric 'nope' is not declared"),
        (lambda t: t["machines"][0].update(name="NW_01"), "lower-case letters"),
        (lambda t: t["machines"][0].update(gpu_count=0), "declare gpu_model"),
        (lambda t: t["fabrics"]["iad1-ndr"].update(kind="token-ring"), "kind 'token-ring' is not one of"),
        (lambda t: t["machines"].clear(), "declares no machines"),
        (lambda t: t["machines"][0].update(role="router"), "role 'router' is not one of gpu, control"),
        (lambda t: t.update(providers={"northwind": {"nat": "yes"}}), "nat is true or false, not 'yes'"),
        (lambda t: t.update(providers={"northwind": {"nat": True, "udp": 1}}), "an object with nat and"),
        (lambda t: t.update(providers={"northwind": {"forward_udp": True}}), "applies to a NAT'd provider"),
        (lambda t: t.update(providers={"acme": {"nat": True}}), "providers acme are configured but no"),
    ],
)
def test_a_topology_the_lab_cannot_build_is_refused_saying_what_to_change(change, message):
    declared = default_topology(2, providers=1)
    change(declared)

    with pytest.raises(TopologyError, match=message):
        build(1, declared)


def test_a_machine_is_a_providers_host_unless_declared_a_control_machine():
    declared = default_topology(2, providers=1)
    declared["machines"][1]["role"] = "control"

    lab = build(3, declared)

    assert [m.role for m in lab.machines] == ["gpu", "control"]
    assert from_json(as_json(lab)).machines[1].role == "control"


def test_a_natted_provider_forwards_ssh_and_one_udp_port_per_machine_from_its_public_address():
    declared = default_topology(8, providers=2)
    declared["providers"] = {"northwind": {"nat": True}, "helios": {"nat": True, "forward_udp": False}}

    lab = build(4, declared)
    nw2, he1 = lab.machine("nw-02"), lab.machine("he-01")

    assert lab.provider("northwind").public_address == "10.77.255.1"
    assert nw2.ssh_endpoint == ("10.77.255.1", 22002) and nw2.udp_endpoint == "10.77.255.1:51822"
    assert he1.ssh_endpoint == ("10.77.255.2", 22001) and he1.udp_endpoint == ""  # the relay case
    assert from_json(as_json(lab)).machine("nw-02").udp_endpoint == "10.77.255.1:51822"
    rules = network.nat_ruleset(lab)
    assert "ip daddr 10.77.255.1 tcp dport 22002 dnat to 10.77.1.12:22" in rules
    assert "ip daddr 10.77.255.1 udp dport 51822 dnat to 10.77.1.12:51820" in rules
    assert "udp dport 51821 dnat to 10.77.2.11" not in rules
    assert "ip saddr 10.77.2.0/24 ip daddr != 10.77.2.0/24 snat to 10.77.255.2" in rules
    assert "ip daddr 10.77.1.0/24 ip saddr != 10.77.1.0/24 drop" in rules


def test_a_routed_provider_is_reached_on_its_private_addresses_and_needs_no_rules():
    lab = build(4, default_topology(8, providers=2))

    assert lab.machine("he-01").ssh_endpoint == ("10.77.2.11", 22)
    assert lab.machine("he-01").udp_endpoint == "10.77.2.11:51820"
    assert network.nat_ruleset(lab) == ""
