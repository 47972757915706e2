"""A NAT'd provider's machines, as real providers' are: its gateway forwards only each machine's SSH port and
(unless the provider forwards none) one UDP port; no one outside its network reaches a private address,
and what its machines send out leaves from the provider's public address.

One lab for the module: northwind (NAT, SSH and a UDP port per machine) with nw-01 and nw-02, helios (NAT,
SSH alone: the relay case) with he-01.
"""

from __future__ import annotations

import subprocess

import pytest

from inventory.lab import operations
from inventory.lab.topology import OVERLAY_PORT

TOPOLOGY = {
    "sites": {"iad1": {"region": "us-east"}, "ord1": {"region": "us-east"}},
    "fabrics": {
        "iad1-ndr": {"site": "iad1", "kind": "ib_ndr", "per_host_gbytes_per_s": 400},
        "ord1-roce": {"site": "ord1", "kind": "roce", "per_host_gbytes_per_s": 200},
    },
    "providers": {"northwind": {"nat": True}, "helios": {"nat": True, "forward_udp": False}},
    "machines": [
        {"name": "nw-01", "provider": "northwind", "fabric": "iad1-ndr", "block": "r1", "gpu_model": "H100",
         "gpu_count": 2},
        {"name": "nw-02", "provider": "northwind", "fabric": "iad1-ndr", "block": "r1", "gpu_model": "H100",
         "gpu_count": 2},
        {"name": "he-01", "provider": "helios", "fabric": "ord1-roce", "block": "r1", "gpu_model": "L40S",
         "gpu_count": 2},
    ],
}  # fmt: skip
CONNECT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3) as sock:
        print(sock.recv(64).decode().strip() or "connected")
except OSError as exc:
    print("unreachable:", exc)
"""
# Answers the first datagram with the address it came from, then ends; waits 5 s at most.
UDP_ECHO = f"""
import socket, time
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind(("0.0.0.0", {OVERLAY_PORT}))
sock.settimeout(1)
print("listening", flush=True)
end = time.monotonic() + 5
while time.monotonic() < end:
    try:
        data, sender = sock.recvfrom(512)
    except TimeoutError:
        continue
    sock.sendto(sender[0].encode(), sender)
    break
"""
UDP_ASK = """
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.settimeout(1)
for _ in range(3):
    sock.sendto(b"who am i", (host, int(port)))
    try:
        print(sock.recvfrom(512)[0].decode())
        break
    except TimeoutError:
        pass
else:
    print("no answer")
"""


@pytest.fixture(scope="module")
def lab(make_lab):
    return make_lab(TOPOLOGY)


def _connect(lab, src: str, address: str, port: int) -> str:
    return lab.exec(src, "python3", "-c", CONNECT, address, str(port)).stdout.strip()


def test_only_a_machines_own_provider_reaches_its_private_address(lab):
    _, topology = operations.read_lab(lab.base, lab.number)
    nw1, nw2, he1 = (topology.machine(n) for n in ("nw-01", "nw-02", "he-01"))

    assert _connect(lab, "nw-01", nw2.address, 22).startswith("SSH-2.0")
    assert _connect(lab, "nw-01", he1.address, 22).startswith("unreachable")
    assert _connect(lab, "he-01", nw1.address, 22).startswith("unreachable")


def test_the_gateway_forwards_each_machines_ssh_port_and_nothing_else(lab):
    _, topology = operations.read_lab(lab.base, lab.number)
    nw2, he1 = topology.machine("nw-02"), topology.machine("he-01")
    assert he1.ssh_endpoint == (he1.public_address, 22001)
    assert nw2.ssh_endpoint == (nw2.public_address, 22002)

    assert _connect(lab, "nw-01", *he1.ssh_endpoint).startswith("SSH-2.0")
    assert _connect(lab, "he-01", *nw2.ssh_endpoint).startswith("SSH-2.0")
    assert _connect(lab, "he-01", nw2.public_address, 22).startswith("unreachable")  # not forwarded
    for name in ("nw-01", "nw-02", "he-01"):  # Volt's gates go through the forwarded ports too
        assert lab.ssh(name, "hostname").strip() == name
    assert "behind nat" in lab.manage("status").stdout.lower()


def _udp_from(lab, receiver: str, sender: str, endpoint: str) -> str:
    echo = subprocess.Popen(
        operations.command_in(lab.base, lab.number, receiver, ["python3", "-c", UDP_ECHO]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert echo.stdout.readline().strip() == "listening", echo.stderr.read()
        return lab.exec(sender, "python3", "-c", UDP_ASK, endpoint).stdout.strip()
    finally:
        echo.wait(timeout=15)  # ends by itself (killing it here would leave the machine's python running)


def test_a_forwarded_udp_port_reaches_the_machine_and_what_it_sends_leaves_from_the_public_address(lab):
    _, topology = operations.read_lab(lab.base, lab.number)
    nw2, he1 = topology.machine("nw-02"), topology.machine("he-01")
    assert nw2.udp_endpoint == f"{nw2.public_address}:51822"

    assert _udp_from(lab, "nw-02", "he-01", nw2.udp_endpoint) == he1.public_address  # he-01's, SNAT'd
    assert (
        _udp_from(lab, "nw-02", "nw-01", f"{nw2.address}:{OVERLAY_PORT}") == topology.machine("nw-01").address
    )


def test_a_provider_that_forwards_no_udp_port_is_not_reachable_over_udp(lab):
    _, topology = operations.read_lab(lab.base, lab.number)
    he1 = topology.machine("he-01")
    assert he1.udp_endpoint == ""

    for endpoint in (f"{he1.address}:{OVERLAY_PORT}", f"{he1.public_address}:51821"):
        assert _udp_from(lab, "he-01", "nw-01", endpoint) == "no answer"
