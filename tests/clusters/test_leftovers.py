"""A machine that is off when its cluster ends keeps what the cluster left on it (its Ray processes' files,
its Unix user, the team's key, the workdir). Volt records which hosts the final teardown cleaned and the
reaper cleans the others once they answer again (issue 25: "a host that comes back keeps the old workdir").
The host driver is the seam: one host does not answer, then does."""

from __future__ import annotations

import pytest

from clusters import services
from clusters.models import Cluster
from inventory import services as inventory
from inventory.drivers.base import CommandResult, HostDriver, HostUnreachable
from inventory.models import Host
from tests.security.test_drills import hosts, node_host, ready_cluster, tom  # noqa: F401 - fixtures
from voltweb.periodic import SCHEDULE
from voltweb.taskutils import registered

pytestmark = [pytest.mark.django_db]


class Machine(HostDriver):
    """A provider's machine over SSH: off (every command unreachable) or on (records what it was told)."""

    def __init__(self, name: str, machines: dict) -> None:
        self.address = name
        self.machines = machines

    def run(self, command, timeout=None):
        state = self.machines[self.address]
        if not state["on"]:
            raise HostUnreachable(f"{self.address} is not answering")
        state["commands"].append(command)
        return CommandResult(0, "LEFT \n", "")

    def copy_file(self, local_path, remote_path, timeout=None):
        self.run("copy")

    def check_reachable(self, timeout=None):
        self.run("true")


@pytest.fixture
def machines(hosts, monkeypatch):  # noqa: F811
    """The two hosts' machines, both on (the hosts become SSH hosts once the cluster is placed on them)."""
    state = {h.name: {"on": True, "commands": []} for h in hosts}
    monkeypatch.setattr(inventory, "driver_for", lambda host: Machine(host.name, state))
    return state


def test_a_machine_off_at_the_end_is_cleaned_by_the_reaper_once_it_answers(team_a, tom, machines):  # noqa: F811
    cluster = ready_cluster(team_a, tom)
    Host.objects.filter(cluster_nodes__cluster=cluster).update(driver="ssh", ssh_user="volt")
    for slot, node in enumerate(cluster.nodes.all(), start=5):  # provisioning started both nodes
        node.slot = slot
        node.save(update_fields=["slot"])
    off, on = node_host(cluster, 0), node_host(cluster, 1)
    machines[off.name]["on"] = False

    cluster = services.terminate_cluster(Cluster.objects.get(pk=cluster.pk), tom, wait=True)

    assert cluster.status == "terminated"
    assert f"could not reach {off.name}" in cluster.events.get(to_status="terminated").message
    cleaned = dict(cluster.nodes.values_list("host__name", "cleaned_at"))
    assert cleaned[on.name] is not None and cleaned[off.name] is None
    workdir = "volt/clusters/volt-"
    assert any(workdir in c and "rm -rf" in c for c in machines[on.name]["commands"])

    reaper = registered(SCHEDULE["reap-cluster-leftovers"]["task"])
    assert reaper.apply().get()["hosts_cleaned"] == 0  # still off: still pending
    Host.objects.filter(pk=off.pk).update(state="offline")
    machines[off.name]["on"] = True
    assert reaper.apply().get()["hosts_cleaned"] == 0  # marked offline: not tried
    assert machines[off.name]["commands"] == []
    Host.objects.filter(pk=off.pk).update(state="cordoned")  # back, held out of service after the outage

    assert reaper.apply().get()["hosts_cleaned"] == 1
    told = list(machines[off.name]["commands"])
    assert any("volt_node_pids" in c and "kill" in c for c in told)  # its node stopped, then its workdir
    assert any(workdir in c and "rm -rf" in c for c in told)
    assert cluster.nodes.get(host=off).cleaned_at is not None
    assert cluster.events.filter(
        message=f"cleaned up on {off.name}, which did not answer at its end"
    ).exists()
    assert reaper.apply().get()["hosts_cleaned"] == 0  # done: not tried again
    assert machines[off.name]["commands"] == told


def test_the_teams_key_goes_first_even_when_the_clusters_user_cannot_be_removed(team_a, tom, machines):  # noqa: F811
    """A process of the cluster's user that will not die (stuck in D state on a GPU) must not keep the team's
    key on the host: the key goes before the user is tried."""
    cluster = ready_cluster(team_a, tom)
    Host.objects.filter(cluster_nodes__cluster=cluster).update(
        driver="ssh", ssh_user="volt", system={"privilege": "sudo", "user": "volt"}
    )
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIteam volt-cluster-x"
    Cluster.objects.filter(pk=cluster.pk).update(node_user="volt999-abcdef12", ssh_public_key=key)
    for slot, node in enumerate(cluster.nodes.all(), start=5):
        node.slot = slot
        node.save(update_fields=["slot"])

    # The machines answer everything, but never say the user is gone.
    cluster = services.terminate_cluster(Cluster.objects.get(pk=cluster.pk), tom, wait=True)

    assert (
        "could not remove the cluster's user volt999-abcdef12"
        in cluster.events.get(to_status="terminated").message
    )
    for state in machines.values():
        told = state["commands"]
        key_at = next(
            i for i, c in enumerate(told) if "authorized_keys" in c and "AAAAC3NzaC1lZDI1NTE5AAAAIteam" in c
        )
        user_at = next(i for i, c in enumerate(told) if "userdel" in c)
        assert key_at < user_at and all(c.startswith("sudo -n ") for c in told)
    assert not cluster.nodes.filter(cleaned_at__isnull=False).exists()  # the reaper tries the user again
