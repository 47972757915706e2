"""`lab down` leaves nothing of the lab on the box, and a lab whose `up` was killed half-way is removed by the
next `lab up`."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from inventory.lab import network, state
from tests.lab.conftest import Lab


@pytest.fixture
def lab(lab_number, lab_base):
    lab = Lab(lab_number, lab_base)
    yield lab
    lab.manage("down", check=False)


def box(lab: Lab) -> dict:
    """What this lab could leave on the box (other test runs add users and mounts of their own meanwhile):
    its namespaces, links, mounts, users and gates."""
    record = state.read(lab.directory)
    user = f"{record.login_user if record else 'volt'}:"
    listeners = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return {
        "namespaces": network.namespaces(lab.number),
        "links": sorted(
            name
            for name in (line.split(":")[1].strip() for line in _lines(["ip", "-o", "link", "show"]))
            if name.startswith(("vm", "br", "veth")) or name.split("@")[0] == network.MACHINE_DEVICE
        ),
        "mounts": sorted(
            m for m in mounts if "volt-lab" in m or m.startswith(str(lab.base)) or m == "/run/netns"
        ),
        "users": [
            line
            for table in ("/etc/passwd", "/etc/group", "/etc/shadow")
            for line in Path(table).read_text().splitlines()
            if line.startswith(user)
        ],
        "gates": [line for line in listeners.splitlines() if f"127.77.{lab.number}." in line],
    }


def _lines(argv: list[str]) -> list[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()


def started_processes(lab: Lab) -> list[state.ProcessRef]:
    record = state.read(lab.directory)
    refs = [record.gate] + [r for m in record.machines.values() for r in (m.launcher, m.pid1)]
    return [ref for ref in refs if ref is not None]


def test_lab_down_leaves_nothing_behind(lab):
    before = box(lab)
    lab.manage("up", "--machines", "2")
    during = box(lab)
    processes = started_processes(lab)
    assert len(during["namespaces"]) == 3 and len(during["gates"]) == 2
    assert during["users"] == [] and during["links"] == before["links"]  # users and links only in the lab
    root_namespace = "\n".join(
        _lines(["ip", "-4", "addr"]) + _lines(["ip", "route"]) + _lines(["ip", "neigh"])
    )
    assert "10.77." not in root_namespace  # lab addresses live only in the lab's namespaces
    assert len(processes) == 5 and all(ref.alive() for ref in processes)
    again = lab.manage("up", "--machines", "2", check=False)
    assert (
        again.returncode != 0
        and f"lab {lab.number} is already up (2 machines): `lab down` first" in again.stderr
    )

    result = lab.manage("down")

    assert "no namespace, link, mount or process of it is left" in result.stdout
    assert box(lab) == before
    assert not any(ref.alive() for ref in processes)
    assert not lab.directory.exists()
    assert not lab.base.exists() or any(lab.base.iterdir())  # the base folder stays only for other labs
    assert "nothing to remove" in lab.manage("down").stdout


def test_lab_whose_up_was_killed_half_way_is_removed_by_the_next_up(lab):
    before = box(lab)
    killed = lab.popen_up("--machines", "3")
    record = None
    for _poll in range(3000):  # until the gate serves and some machine is booting
        record = state.read(lab.directory)
        if record is not None and record.gate and any(m.launcher for m in record.machines.values()):
            break
        assert killed.poll() is None, killed.stdout.read()
        time.sleep(0.02)
    killed.kill()
    killed.wait()
    killed.stdout.close()
    assert record is not None and record.status == state.STARTING
    left = started_processes(lab)
    assert network.namespaces(lab.number) and any(ref.alive() for ref in left)

    result = lab.manage("up", "--machines", "2")

    assert f"lab {lab.number}: removing what an earlier lab left behind" in result.stdout
    assert not any(ref.alive() for ref in left)
    status = lab.status()
    assert [(m.name, m.power) for m in status.machines] == [("nw-01", "on"), ("nw-02", "on")]
    assert set(network.namespaces(lab.number)) == {
        network.router_namespace(lab.number),
        network.machine_namespace(lab.number, "nw-01"),
        network.machine_namespace(lab.number, "nw-02"),
    }
    assert lab.ssh("nw-02", "hostname").strip() == "nw-02"

    lab.manage("down")
    assert box(lab) == before
