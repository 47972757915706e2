"""Lab machines are apart: own /opt and processes, own sshd and host key behind a gate, shaped links
between them, power and cables that act like a machine's.

One lab of three machines for the module: nw-01 and nw-02 in two blocks of one fabric (northwind), he-01
at another provider (its own network, through the router).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from inventory.drivers.base import DriverError, HostKeyMismatch
from inventory.lab import network, operations

TOPOLOGY = {
    "sites": {
        "iad1": {"region": "us-east", "backbone_gbytes_per_s": 12.5},
        "ord1": {"region": "us-east", "backbone_gbytes_per_s": 12.5},
    },
    "fabrics": {
        "iad1-ndr": {"site": "iad1", "kind": "ib_ndr", "per_host_gbytes_per_s": 400, "oversubscription": 2},
        "ord1-roce": {"site": "ord1", "kind": "roce", "per_host_gbytes_per_s": 200},
    },
    "machines": [
        {
            "name": "nw-01",
            "provider": "northwind",
            "fabric": "iad1-ndr",
            "block": "r1",
            "gpu_model": "H100",
            "gpu_count": 8,
        },
        {
            "name": "nw-02",
            "provider": "northwind",
            "fabric": "iad1-ndr",
            "block": "r2",
            "gpu_model": "A100",
            "gpu_count": 4,
        },
        {
            "name": "he-01",
            "provider": "helios",
            "fabric": "ord1-roce",
            "block": "r1",
            "gpu_model": "L40S",
            "gpu_count": 2,
        },
    ],
}
SCALE = 0.0001  # nw-01 -> nw-02 (other block, same fabric): 400 GB/s / 2 x 0.0001 = 20 MB/s
NAMES = ("nw-01", "nw-02", "he-01")

RECEIVER = """
import socket, sys, time
server = socket.create_server((sys.argv[1], 5001))
print("listening", flush=True)
conn, _ = server.accept()
marks = []
total = 0
while data := conn.recv(1 << 20):
    total += len(data)
    marks.append((time.monotonic(), total))
start = next(m for m in marks if m[0] >= marks[0][0] + 0.5)
print((marks[-1][1] - start[1]) / (marks[-1][0] - start[0]), flush=True)
"""
SENDER = """
import socket, sys
with socket.create_connection((sys.argv[1], 5001), timeout=30) as sock:
    left = int(sys.argv[2])
    chunk = b"x" * 65536
    while left > 0:
        sock.sendall(chunk[:left])
        left -= len(chunk)
"""


@pytest.fixture(scope="module")
def lab(make_lab):
    return make_lab(TOPOLOGY, "--scale", str(SCALE))


def test_each_machine_sees_only_its_own_opt_and_processes(lab):
    for name in NAMES:
        lab.ssh(name, f"sudo touch /opt/made-on-{name}")

    for name in NAMES:
        assert lab.ssh(name, "ls /opt").split() == [f"made-on-{name}", "volt-lab"]
        processes = [line.split() for line in lab.ssh(name, "ps -e -o pid=,comm=").splitlines()]
        assert processes[0] == ["1", "sshd"]
        assert len(processes) < 10, processes  # sshd, this session's sshd and shell, ps
        assert lab.ssh(name, "hostname").strip() == name
        assert lab.ssh(name, "whoami; sudo -n whoami").split() == ["volt", "root"]


def test_each_machine_has_its_own_var_lib_and_sees_no_other_machines_disk(lab):
    """Every machine saw the box's /var/lib: a key one machine wrote there was every machine's, and the
    default lab folder (/var/lib/volt-lab, every machine's disk) and Volt's database files were in view."""
    for name in NAMES:
        lab.ssh(name, f"sudo mkdir -p /var/lib/volt && echo {name} | sudo tee /var/lib/volt/mine >/dev/null")

    for name in NAMES:
        assert lab.ssh(name, "cat /var/lib/volt/mine").strip() == name
        seen = lab.ssh(name, "sudo ls -A /var/lib").split()
        assert "volt" in seen and not {"postgresql", "redis", "dpkg", "volt-lab"} & set(seen), seen
        # The lab's folder (here or under /var/lib) holds nothing of the machines' disks in a machine's view.
        assert lab.ssh(name, f"sudo ls -A {lab.directory} 2>/dev/null || true").split() == []
    assert (
        not Path("/var/lib/volt/mine").exists() or Path("/var/lib/volt/mine").read_text().strip() not in NAMES
    )


def test_ssh_through_each_gate_reaches_that_machine_with_its_own_host_key(lab):
    status = lab.status()
    keys = {m.name: m.host_key for m in status.machines}
    assert len(set(keys.values())) == len(NAMES)
    assert {m.gate for m in status.machines} == {f"127.77.{lab.number}.{n}" for n in (1, 2, 3)}

    for name in NAMES:
        driver = lab.driver(name)
        assert driver.run("hostname").stdout.strip() == name
        assert driver.seen_host_key == keys[name]
        driver.close()

    impostor = lab.driver("nw-01", host_key=keys["nw-02"])  # nw-01's gate, pinned to nw-02's key
    with pytest.raises(HostKeyMismatch):
        impostor.run("true")
    impostor.close()


def test_simulated_tools_print_the_machines_declared_gpus(lab):
    listing = lab.ssh("nw-02", "nvidia-smi -L").splitlines()
    assert len(listing) == 4 and all("A100" in line for line in listing)
    assert "CA 'mlx5_0'" in lab.ssh("nw-01", "ibstat")
    assert (
        lab.ssh("he-01", "nvidia-smi --query-gpu=name --format=csv,noheader").splitlines()
        == ["NVIDIA L40S"] * 2
    )


def test_machines_reach_each_other_on_their_lab_addresses(lab):
    status = lab.status()
    banner = "import socket, sys; print(socket.create_connection((sys.argv[1], 22), timeout=10).recv(64))"
    for src, dst in (("nw-01", "nw-02"), ("nw-01", "he-01"), ("he-01", "nw-02")):
        address = status.machine(dst).address
        assert "SSH-2.0-OpenSSH" in lab.ssh(src, f"python3 -c '{banner}' {address}")
    assert "SSH-2.0" in lab.ssh("nw-01", f"python3 -c '{banner}' nw-02")  # by name: each /etc/hosts


def test_rate_between_machines_in_different_blocks_is_the_shaped_one(lab):
    record, topology = operations.read_lab(lab.base, lab.number)
    src, dst = topology.machine("nw-01"), topology.machine("nw-02")
    assert topology.level(src, dst) == "fabric"
    expected = topology.rate_bytes(src, dst, record.scale)
    assert expected == 20_000_000

    receiver = subprocess.Popen(
        operations.command_in(lab.base, lab.number, "nw-02", ["python3", "-c", RECEIVER, dst.address]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert receiver.stdout.readline().strip() == "listening", receiver.stderr.read()
        sent = lab.exec("nw-01", "python3", "-c", SENDER, dst.address, str(expected * 3))
        assert sent.returncode == 0, sent.stderr
        out, err = receiver.communicate(timeout=120)
    finally:
        if receiver.poll() is None:
            receiver.kill()
    measured = float(out.strip())
    assert 0.7 <= measured / expected <= 1.3, f"{measured / 1e6:.1f} MB/s, shaped to {expected / 1e6:.1f}"


def test_power_off_ends_every_process_and_power_on_brings_sshd_back(lab):
    name = "he-01"
    namespace = network.machine_namespace(lab.number, name)
    lab.ssh(name, "nohup sleep 1000 >/dev/null 2>&1 &")
    before = lab.status().machine(name)
    assert len(network.pids(namespace)) >= 3  # unshare (PID 1's parent), sshd, sleep

    lab.manage("power-off", name)

    assert network.pids(namespace) == []
    assert lab.status().machine(name).power == "off"
    driver = lab.driver(name)
    with pytest.raises(DriverError):
        driver.run("true")
    driver.close()

    lab.manage("power-on", name)

    after = lab.status().machine(name)
    assert after.power == "on" and after.pid1 != before.pid1
    assert lab.ssh(name, "ps -e -o pid=,comm=").split()[:2] == ["1", "sshd"]
    assert "sleep" not in lab.ssh(name, "ps -e -o comm=")
    assert lab.driver(name).run("hostname").stdout.strip() == name  # same host key: still pinned


def test_unplugged_machine_is_unreachable_until_plugged_back(lab):
    name = "nw-02"
    lab.manage("unplug", name)
    try:
        assert lab.status().machine(name).plugged is False
        driver = lab.driver(name)
        with pytest.raises(DriverError):
            driver.run("true")
        driver.close()
        reach = "import socket, sys; socket.create_connection((sys.argv[1], 22), timeout=3)"
        address = lab.status().machine(name).address
        assert lab.exec("nw-01", "python3", "-c", reach, address).returncode != 0
        assert lab.status().machine(name).power == "on"  # unplugged, not off
    finally:
        lab.manage("plug", name)

    assert lab.ssh(name, "hostname").strip() == name


# Queues 12 MB on a connection to nw-02 (a send buffer that holds it all: root may force one), then waits.
QUEUE_AND_WAIT = """
import socket, sys, time
sock = socket.create_connection((sys.argv[1], 5002), timeout=30)
sock.setsockopt(socket.SOL_SOCKET, 32, 32 << 20)  # SO_SNDBUFFORCE
sock.sendall(b"x" * (12 << 20))
print("queued", flush=True)
time.sleep(120)
"""
COUNT = """
import socket, sys
server = socket.create_server((sys.argv[1], 5002))
server.settimeout(60)
print("listening", flush=True)
conn, _ = server.accept()
conn.settimeout(60)
total, end = 0, "eof"
try:
    while data := conn.recv(1 << 20):
        total += len(data)
except OSError as exc:
    end = type(exc).__name__
print(total, end, flush=True)
"""


def test_power_off_also_ends_what_the_machine_had_queued_on_the_wire(lab):
    """A machine's power-off used to leave its closed sockets to its kernel, which went on sending what they
    had queued and FIN'd it: an upload completed by a machine without power (it made a checkpoint look
    synchronized in tests/lab/test_recovery.py). The peer now gets a reset and never all of it."""
    status = lab.status()
    receiver = subprocess.Popen(
        operations.command_in(lab.base, lab.number, "nw-02", ["python3", "-c", COUNT, status.machine("nw-02").address]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    sender = None
    try:
        assert receiver.stdout.readline().strip() == "listening", receiver.stderr.read()
        sender = subprocess.Popen(
            operations.command_in(lab.base, lab.number, "he-01", ["python3", "-c", QUEUE_AND_WAIT,
                                                                 status.machine("nw-02").address]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert sender.stdout.readline().strip() == "queued", sender.stderr.read()
        lab.manage("power-off", "he-01")
        out, err = receiver.communicate(timeout=90)
        total, end = out.split()
        assert int(total) < 12 << 20 and end != "eof", (total, end, err)
    finally:
        for process in (receiver, sender):
            if process is not None and process.poll() is None:
                process.kill()
        lab.manage("power-on", "he-01")
