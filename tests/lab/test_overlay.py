"""A cluster's WireGuard overlay on machines behind NAT (issue 26): made with Volt's own host code over SSH
(clusters/provisioning/overlay.py), on four lab machines of three NAT'd providers.

northwind forwards a UDP port per machine (nw-01, nw-02); helios (he-01) and orion (or-01) forward none, so
he-01 and or-01 cannot dial each other: they go through a relay, a northwind node.
"""

from __future__ import annotations

import subprocess

import pytest

from clusters.provisioning import overlay
from inventory.drivers.sudo import SudoDriver
from inventory.lab import operations

FABRIC = {"site": "iad1", "kind": "eth_100g", "per_host_gbytes_per_s": 12.5}


def _machine(name: str, provider: str) -> dict:
    return {
        "name": name,
        "provider": provider,
        "fabric": "f",
        "block": "r1",
        "gpu_model": "L40S",
        "gpu_count": 1,
    }


TOPOLOGY = {
    "sites": {"iad1": {"region": "us-east"}},
    "fabrics": {"f": FABRIC},
    "providers": {
        "northwind": {"nat": True},
        "helios": {"nat": True, "forward_udp": False},
        "orion": {"nat": True, "forward_udp": False},
    },
    "machines": [
        _machine("nw-01", "northwind"),
        _machine("nw-02", "northwind"),
        _machine("he-01", "helios"),
        _machine("or-01", "orion"),
    ],
}
NAMES = ("nw-01", "nw-02", "he-01", "or-01")
IFACE = overlay.interface(901)
# Accepts one connection on the overlay address, answers with the host name, ends; 20 s at most.
SERVE = """
import socket, sys
server = socket.create_server((sys.argv[1], 7001))
server.settimeout(20)
print("listening", flush=True)
conn, _ = server.accept()
conn.sendall(socket.gethostname().encode())
conn.close()
"""
ASK = """
import socket, sys, time
end = time.monotonic() + 15
while True:
    try:
        with socket.create_connection((sys.argv[1], 7001), timeout=3) as sock:
            print(sock.recv(64).decode())
            break
    except OSError as exc:
        if time.monotonic() > end:
            print("unreachable:", exc)
            break
        time.sleep(0.5)
"""


@pytest.fixture(scope="module")
def lab(make_lab):
    return make_lab(TOPOLOGY)


@pytest.fixture(scope="module")
def members(lab):
    _, topology = operations.read_lab(lab.base, lab.number)
    return [
        overlay.Member(m.name, m.provider, m.address, m.udp_endpoint)
        for m in (topology.machine(n) for n in NAMES)
    ]


def _root(lab, name: str) -> SudoDriver:
    return SudoDriver(lab.driver(name))


def _reach(lab, src: str, dst: str, address: str) -> str:
    server = subprocess.Popen(
        operations.command_in(lab.base, lab.number, dst, ["python3", "-c", SERVE, address]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout.readline().strip() == "listening", server.stderr.read()
        return lab.exec(src, "python3", "-c", ASK, address).stdout.strip()
    finally:
        server.wait(timeout=30)


def test_an_overlay_across_natted_providers_reaches_every_node_and_leaves_nothing_behind(lab, members):
    keys = {}
    for name in NAMES:
        with _root(lab, name) as driver:
            keys[name] = overlay.make_key(driver, IFACE)
    result = overlay.plan(members, keys, "100.96.9.0/24")
    assert result.relay == "nw-01" and result.paths[("he-01", "or-01")] == overlay.RELAY

    kinds = set()
    for name in NAMES:
        with _root(lab, name) as driver:
            kinds.add(overlay.apply(driver, IFACE, result.nodes[name]))
    assert kinds == {"wireguard-go"}  # this kernel has no WireGuard module
    try:
        for name in NAMES:  # the private key: on its host alone, root's, 0600
            assert lab.exec(name, "stat", "-c", "%a %U", f"{overlay.KEY_DIR}/{IFACE}.key").stdout.split() == [
                "600",
                "root",
            ]
            assert (
                lab.exec(name, "sh", "-c", f"wg pubkey < {overlay.KEY_DIR}/{IFACE}.key").stdout.strip()
                == keys[name]
            )

        # he-01 and or-01 first: they dial out, so each NAT learns its mapping
        for src, dst in (("he-01", "nw-01"), ("or-01", "nw-02"), ("he-01", "or-01"), ("or-01", "he-01"),
                         ("nw-01", "he-01"), ("nw-02", "nw-01")):  # fmt: skip
            assert _reach(lab, src, dst, result.nodes[dst].address) == dst, (src, dst)
    finally:
        for name in NAMES:
            with _root(lab, name) as driver:
                overlay.remove(driver, IFACE)

    for name in NAMES:
        with _root(lab, name) as driver:
            assert overlay.leftovers(driver, IFACE) == []
        assert "wireguard-go" not in lab.exec(name, "ps", "-e", "-o", "comm=").stdout
