"""The overlay's plan (pure): who dials whom, where a relay is needed, what each host's `wg` file says."""

from __future__ import annotations

import base64

import pytest

from clusters.provisioning.overlay import (
    DIRECT,
    OVERLAY,
    RELAY,
    Member,
    OverlayFailed,
    cluster_network,
    config,
    interface,
    needs_overlay,
    plan,
)


def key(n: int) -> str:
    return base64.b64encode(bytes([n]) * 32).decode()


NW1 = Member("nw-01", "northwind", "10.77.1.11", "10.77.255.1:51821")
NW2 = Member("nw-02", "northwind", "10.77.1.12", "10.77.255.1:51822")
HE1 = Member("he-01", "helios", "10.77.2.11", "")  # its provider forwards no UDP port
OR1 = Member("or-01", "orion", "10.77.3.11", "")
KEYS = {m.name: key(i) for i, m in enumerate((NW1, NW2, HE1, OR1), start=1)}


def test_nodes_of_one_network_need_no_overlay():
    assert not needs_overlay([NW1, NW2])
    assert needs_overlay([NW1, HE1])


def test_one_network_dials_private_addresses_and_the_natted_node_dials_the_public_endpoint():
    result = plan([NW1, NW2, HE1], KEYS, "100.96.7.0/24")

    assert [result.nodes[n].address for n in ("nw-01", "nw-02", "he-01")] == [
        "100.96.7.1",
        "100.96.7.2",
        "100.96.7.3",
    ]
    assert result.paths == {
        ("nw-01", "nw-02"): DIRECT,
        ("he-01", "nw-01"): OVERLAY,
        ("he-01", "nw-02"): OVERLAY,
    }
    assert result.path == OVERLAY and result.relay == ""
    nw1_peers = {p.name: p for p in result.nodes["nw-01"].peers}
    assert nw1_peers["nw-02"].endpoint == "10.77.1.12:51820"  # same network: its private address
    assert nw1_peers["he-01"].endpoint == ""  # he-01 dials in
    assert not nw1_peers["he-01"].keepalive
    he_peers = {p.name: p for p in result.nodes["he-01"].peers}
    assert he_peers["nw-02"].endpoint == "10.77.255.1:51822" and he_peers["nw-02"].keepalive


def test_two_nodes_nobody_can_dial_go_through_a_node_that_can():
    result = plan([NW1, HE1, OR1], KEYS, "100.96.0.0/24")

    assert result.relay == "nw-01" and result.path == RELAY
    assert result.paths[("he-01", "or-01")] == RELAY
    he_peers = {p.name: p for p in result.nodes["he-01"].peers}
    assert set(he_peers) == {"nw-01"}  # or-01 is reached through the relay
    assert he_peers["nw-01"].allowed_ips == ("100.96.0.1/32", "100.96.0.3/32")
    assert result.nodes["nw-01"].forwards and not result.nodes["he-01"].forwards
    text = config(result.nodes["he-01"])
    assert "AllowedIPs = 100.96.0.1/32, 100.96.0.3/32" in text
    assert "Endpoint = 10.77.255.1:51821" in text and "PersistentKeepalive = 25" in text
    assert "PrivateKey = @KEY@" in text  # filled in on the host, from its own key file


def test_no_node_to_relay_through_is_refused_saying_what_to_do():
    with pytest.raises(OverlayFailed, match="ask a provider to forward a UDP port"):
        plan([HE1, OR1], KEYS, "100.96.0.0/24")


def test_a_bad_public_key_is_refused():
    with pytest.raises(OverlayFailed, match="not a WireGuard public key"):
        plan([NW1, HE1], {**KEYS, "he-01": "ssh-ed25519 AAAA"}, "100.96.0.0/24")


def test_each_live_cluster_gets_its_own_range_and_interface():
    assert cluster_network([]) == "100.96.0.0/24"
    assert cluster_network(["100.96.0.0/24", "100.96.2.0/24"]) == "100.96.1.0/24"
    assert interface(42) == "vo42"
