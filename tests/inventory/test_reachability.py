"""Who reaches whom directly (inventory/reachability.py): checks run on the hosts (here, through a driver
that runs the host's commands in a shell on this machine, the outer seam), their rows, and the networks
clusters are planned from."""

from __future__ import annotations

import shutil
import subprocess
from decimal import Decimal

import pytest

from inventory import reachability
from inventory.choices import DriverKind, HostEventKind, HostState
from inventory.drivers.base import CommandResult, HostDriver
from inventory.models import Host

pytestmark = pytest.mark.django_db


class ShellDriver(HostDriver):
    """A host's commands in a shell on this machine (every address here is a loopback one)."""

    def __init__(self, host: Host):
        self.address = host.name

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=timeout or 30)
        return CommandResult(done.returncode, done.stdout, done.stderr)

    def copy_file(self, local_path, remote_path, timeout=None):
        shutil.copyfile(local_path, remote_path)

    def check_reachable(self, timeout=None):
        return None


@pytest.fixture
def shell_hosts(monkeypatch):
    monkeypatch.setattr(reachability, "driver_for", ShellDriver)


def ssh_host(provider, fabric, name: str, node_ip: str, state=HostState.AVAILABLE) -> Host:
    block = fabric.blocks.first()
    return Host.objects.create(
        provider=provider, name=name, site=fabric.site, fabric=fabric, block=block, driver=DriverKind.SSH,
        address=f"{name}.example.net", private_address=node_ip, ssh_user="volt", state=state,
        price_per_gpu_hour=Decimal("2.00"),
    )  # fmt: skip


def test_peers_that_reach_a_hosts_node_address_are_recorded_with_an_event(
    shell_hosts, northwind, northwind_ib
):
    a = ssh_host(northwind, northwind_ib, "nw-a", "127.0.0.1")
    b = ssh_host(northwind, northwind_ib, "nw-b", "127.0.0.1")
    new = ssh_host(northwind, northwind_ib, "nw-new", "127.0.0.1", state=HostState.ONBOARDING)

    rows = reachability.check(new)

    assert sorted((r.peer.name, r.ok, r.address) for r in rows) == [
        ("nw-a", True, "127.0.0.1"),
        ("nw-b", True, "127.0.0.1"),
    ]
    event = new.events.filter(kind=HostEventKind.REACH).get()
    assert event.message in (
        "127.0.0.1 reached directly from nw-a, nw-b",
        "127.0.0.1 reached directly from nw-b, nw-a",
    )
    assert len({label for label in reachability.networks([a, b, new]).values()}) == 1


def test_a_host_that_cannot_listen_on_its_address_is_reached_by_no_peer_and_split_off(
    shell_hosts, northwind, northwind_ib
):
    peer = ssh_host(northwind, northwind_ib, "nw-a", "127.0.0.1")
    other = ssh_host(northwind, northwind_ib, "nw-b", "127.0.0.1")
    lost = ssh_host(northwind, northwind_ib, "nw-lost", "192.0.2.1")  # not an address of this machine

    rows = reachability.check(lost)

    assert {r.ok for r in rows} == {False}
    assert "could not listen on 192.0.2.1" in rows[0].detail
    assert "reached directly from no peer; not from" in lost.events.get(kind=HostEventKind.REACH).message
    labels = reachability.networks([peer, other, lost])
    assert labels[peer.pk] == labels[other.pk] != labels[lost.pk]  # the unchecked two: their provider's


def test_hosts_of_different_providers_never_share_a_network_and_local_hosts_share_one(
    northwind, northwind_ib, helios, helios_roce, add_local_host
):
    # Volt checks a host from peers of its own provider only: unchecked, each provider is its own network.
    nw = ssh_host(northwind, northwind_ib, "nw-a", "10.0.0.1")
    he = ssh_host(helios, helios_roce, "he-a", "10.0.0.2")
    assert reachability.networks([nw, he])[nw.pk] != reachability.networks([nw, he])[he.pk]

    local_1 = add_local_host(northwind, northwind_ib, "loc-1", onboard=False)
    local_2 = add_local_host(northwind, northwind_ib, "loc-2", onboard=False)
    assert set(reachability.networks([local_1, local_2]).values()) == {"local"}


def test_the_stalest_hosts_are_rechecked_first_and_a_failing_check_stops_no_other(
    shell_hosts, northwind, northwind_ib, settings, monkeypatch
):
    settings.VOLT_REACHABILITY_RECHECK_S = 3600
    hosts = [ssh_host(northwind, northwind_ib, f"nw-{i}", "127.0.0.1") for i in range(3)]
    assert [h.pk for h in reachability.stale(10)] == [h.pk for h in hosts]
    real = reachability.check

    def check(host):
        if host.pk == hosts[0].pk:
            raise RuntimeError("the host went away mid-check")
        return real(host)

    monkeypatch.setattr(reachability, "check", check)
    assert reachability.recheck(limit=3) == 2
    assert [h.pk for h in reachability.stale(10)] == [hosts[0].pk]
