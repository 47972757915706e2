"""Issue 21 finding 4, "Drills outlive their cluster", and issue 24 item 4: a fault drill's effect ends with
the team's own cluster. Whatever a drill left on a provider's host (the fault it injected, the cordon
recovery put on the host after it) is undone when the cluster ends; a fault or cordon that was not the
drill's stays.

Real local hosts (sandboxes, discovery and health checks run for real) and the real database; no Ray:
the cluster is READY as far as Volt knows, and recovery's cordon of a failed node's host is its own code
(provision.replace_hosts with no free host left).
"""

from __future__ import annotations

import os
import subprocess

import pytest
from django.utils import timezone

from clusters import drills, provision, services, transitions
from clusters.choices import FailureReason
from clusters.models import Cluster
from clusters.provisioning import node_users
from inventory import health
from inventory import services as inventory
from inventory.drivers.base import HostDriver, HostUnreachable
from inventory.models import Host
from voltweb import services as accounts
from voltweb.choices import TeamRole
from voltweb.periodic import SCHEDULE
from voltweb.taskutils import registered

pytestmark = pytest.mark.django_db


@pytest.fixture
def tom(make_user, team_a):
    """An admin of team A: runs drills on the team's clusters."""
    user = make_user("tom")
    accounts.add_member(team_a, user, TeamRole.ADMIN)
    return user


@pytest.fixture
def hosts(northwind, northwind_ib, add_local_host):
    """Two local H100 hosts of Northwind (priya's), 2 GPUs each: a 2 x 2 cluster takes both."""
    return [add_local_host(northwind, northwind_ib, f"h100-{c}", gpus=2) for c in "ab"]


def ready_cluster(team, user, name: str = "drilled") -> Cluster:
    cluster = services.request_cluster(team, user, {"name": name, "nodes": 2, "gpus_per_node": 2,
                                                    "gpu_models": ["H100"]})  # fmt: skip
    cluster = services.place_cluster(cluster.pk)
    assert cluster.status == "provisioning", cluster.queue_reason
    cluster = transitions.transition(cluster, "verifying", "joined")
    return transitions.transition(cluster, "ready", "probe passed", extra={"ready_at": timezone.now()})


@pytest.fixture
def cluster(hosts, team_a, tom):
    return ready_cluster(team_a, tom)


def node_host(cluster: Cluster, rank: int) -> Host:
    return Host.objects.select_related("provider").get(
        cluster_nodes__cluster=cluster, cluster_nodes__rank=rank
    )


def recovery_cordons(cluster: Cluster, host: Host) -> None:
    """What recovery does with a failed node's host when nothing is free to replace it: cordon it."""
    with pytest.raises(provision.NoReplacement):
        provision.replace_hosts(cluster, [host.pk], "host unreachable: not answering", context="recovering")
    assert Host.objects.get(pk=host.pk).state == "cordoned"


def faults(host: Host) -> dict:
    return inventory.active_faults(host)


def test_terminate_takes_back_the_faults_its_drills_injected_and_leaves_real_ones(cluster, tom, priya):
    first, second = node_host(cluster, 0), node_host(cluster, 1)
    inventory.inject_fault(first, "gpu_lost", "1", actor=priya)  # the provider's own: a real fault
    drills.run_drill(cluster, tom, "unreachable", rank=1)
    drills.run_drill(cluster, tom, "ecc_uncorrectable", rank=0, value="0")
    assert "unreachable" in faults(second) and "ecc_uncorrectable" in faults(first)

    services.terminate_cluster(cluster, tom, wait=True)

    assert faults(second) == {}  # unreachable: the next cluster placed there would have failed
    assert faults(first) == {"gpu_lost": "1"}  # priya's fault is not the drill's: it stays


def test_a_drill_does_not_take_a_fault_the_host_already_had(cluster, tom, priya):
    second = node_host(cluster, 1)
    inventory.inject_fault(second, "unreachable", actor=priya)
    result = drills.run_drill(cluster, tom, "unreachable", rank=1)
    assert "had this fault already" in result.detail

    with pytest.raises(drills.DrillRefused, match="only they clear it"):
        drills.run_drill(cluster, tom, "unreachable", rank=1, clear=True)  # not the team's to clear
    services.terminate_cluster(cluster, tom, wait=True)
    assert "unreachable" in faults(second)


def test_a_fault_injected_by_hand_over_a_drills_fault_stays(cluster, tom, priya):
    second = node_host(cluster, 1)
    drills.run_drill(cluster, tom, "unreachable", rank=1)
    inventory.inject_fault(second, "unreachable", actor=priya)  # the provider makes it theirs
    services.terminate_cluster(cluster, tom, wait=True)
    assert "unreachable" in faults(second)


def test_a_cordon_after_a_drill_is_lifted_when_the_cluster_ends_and_the_hosts_fit_again(
    cluster, tom, priya, team_a
):
    second = node_host(cluster, 1)
    drills.run_drill(cluster, tom, "unreachable", rank=1)
    recovery_cordons(cluster, second)
    cordon = second.events.filter(to_state="cordoned").first()
    assert cordon.drill is not None and cordon.drill.actor == tom and cordon.drill.cluster_pk == cluster.pk
    assert "after a fault drill (unreachable by tom)" in cordon.message

    services.terminate_cluster(cluster, tom, wait=True)

    second.refresh_from_db()
    assert second.state == "available" and faults(second) == {}
    lifted = second.events.filter(to_state="available").first()
    assert f"cordon after a fault drill lifted: cluster drilled (#{cluster.pk}) terminated" in lifted.message
    again = ready_cluster(team_a, tom, "next")  # the same 2 x 2 request fits again
    assert {n.host_id for n in again.nodes.all()} == {h.pk for h in Host.objects.all()}


def test_a_failed_cluster_ends_its_drills_too(cluster, tom):
    second = node_host(cluster, 1)
    drills.run_drill(cluster, tom, "unreachable", rank=1)
    cluster = transitions.transition(cluster, "degraded", "a node failed")
    cluster = transitions.transition(cluster, "recovering", "recovering")
    recovery_cordons(cluster, second)
    provision.fail(cluster, FailureReason.HOST_FAILED, "gave up after 3 failed replacements")
    second.refresh_from_db()
    assert second.state == "available" and faults(second) == {}


def test_cordons_that_were_not_the_drills_stay(cluster, tom, priya):
    first, second = node_host(cluster, 0), node_host(cluster, 1)
    inventory.act_on_host(first, "cordon", priya, "maintenance")  # the provider's own cordon
    drills.run_drill(cluster, tom, "unreachable", rank=1)
    recovery_cordons(cluster, second)
    inventory.inject_fault(second, "driver_not_loaded", actor=priya)  # a real fault found meanwhile

    services.terminate_cluster(cluster, tom, wait=True)

    first.refresh_from_db()
    second.refresh_from_db()
    assert first.state == "cordoned"
    assert second.state == "cordoned" and faults(second) == {"driver_not_loaded": ""}
    kept = second.events.filter(kind="error").first()
    assert "stays cordoned after its fault drill ended" in kept.message and "driver" in kept.message.lower()
    assert inventory.drill_keeping_out(second) is None  # a real fault's cordon now, no drill's


def test_no_drill_on_a_cluster_that_is_terminating(cluster, tom, client_for):
    loaded = Cluster.objects.get(pk=cluster.pk)  # as a view loaded it, before the terminate below
    services.terminate_cluster(cluster, tom)  # TERMINATING; its worker has not run yet
    with pytest.raises(drills.DrillRefused, match="The cluster is terminating"):
        drills.run_drill(loaded, tom, "unreachable", rank=1)
    assert faults(node_host(cluster, 1)) == {}

    response = client_for(tom).post(
        f"/api/v1/clusters/{cluster.pk}/drills/", {"drill": "unreachable", "rank": 1}, format="json"
    )
    assert response.status_code == 400, response.json()
    assert "drills run on a ready, degraded or recovering cluster" in response.json()["error"]["message"]


def test_a_terminate_that_slips_in_while_the_fault_is_injected_leaves_no_fault(cluster, tom, monkeypatch):
    """The end ran between the drill's check and its fault file reaching the host (the host seam)."""
    from inventory import local_fabric

    write = local_fabric.set_fault

    def terminated_meanwhile(sandbox, name, content=""):
        services.terminate_cluster(Cluster.objects.get(pk=cluster.pk), tom, wait=True)
        write(sandbox, name, content)

    monkeypatch.setattr(local_fabric, "set_fault", terminated_meanwhile)
    with pytest.raises(drills.DrillRefused, match="became terminated while the drill ran"):
        drills.run_drill(cluster, tom, "unreachable", rank=1)
    assert faults(node_host(cluster, 1)) == {}
    assert not inventory.open_drill_cluster_pks()


# --- the cluster's Unix user goes whatever its hosts' state ----------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="creating Unix users needs root (CI runs as root)")


def user_exists(name: str) -> bool:
    return subprocess.run(["id", "-u", name], capture_output=True).returncode == 0


@pytest.fixture
def cluster_user(cluster, tmp_path):
    """The cluster's own Unix user, as provisioning made it, with a process that escaped its node."""
    name = node_users.user_name(cluster.pk, str(tmp_path))
    subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--shell",
                    "/usr/sbin/nologin", name], check=True)  # fmt: skip
    escaped = subprocess.Popen(
        ["setpriv", f"--reuid={name}", f"--regid={name}", "--clear-groups", "--", "sleep", "300"],
        start_new_session=True,
    )
    Cluster.objects.filter(pk=cluster.pk).update(node_user=name)
    for slot, node in enumerate(cluster.nodes.all(), start=90):  # as bring-up gives: nodes started
        type(node).objects.filter(pk=node.pk).update(slot=slot)
    yield name, escaped
    escaped.kill()
    escaped.wait()
    subprocess.run(["userdel", "-f", name], capture_output=True)


@needs_root
def test_terminate_removes_the_clusters_user_when_its_hosts_do_not_answer(cluster, cluster_user, tom, priya):
    name, escaped = cluster_user
    for rank in (0, 1):  # a real outage of both hosts (the provider's faults, not a drill's)
        inventory.inject_fault(node_host(cluster, rank), "unreachable", actor=priya)

    cluster = services.terminate_cluster(Cluster.objects.get(pk=cluster.pk), tom, wait=True)

    assert cluster.status == "terminated"
    assert not user_exists(name)  # local hosts share this machine: removed here, not through a host
    assert escaped.wait(timeout=30) is not None
    assert Cluster.objects.get(pk=cluster.pk).node_user_removed_at is not None


class Refusing(HostDriver):
    """This machine refusing commands (what a stuck userdel or a full process table looks like)."""

    address = "this machine"

    def run(self, command, timeout=None):
        raise HostUnreachable("this machine refused the command")

    def copy_file(self, local_path, remote_path, timeout=None):
        raise HostUnreachable("this machine refused the copy")

    def check_reachable(self, timeout=None):
        raise HostUnreachable("this machine refused")


@needs_root
def test_a_user_that_could_not_be_removed_is_retried_by_the_reaper_until_it_is_gone(
    cluster, cluster_user, tom, monkeypatch
):
    name, _ = cluster_user
    monkeypatch.setattr(inventory, "local_machine_driver", lambda: Refusing())
    cluster = services.terminate_cluster(Cluster.objects.get(pk=cluster.pk), tom, wait=True)
    assert cluster.status == "terminated" and user_exists(name)
    assert f"user {name}" in cluster.events.order_by("-at", "-id").filter(to_status="terminated")[0].message
    assert Cluster.objects.get(pk=cluster.pk).node_user_removed_at is None  # pending removal

    reaper = registered(SCHEDULE["reap-cluster-leftovers"]["task"])
    assert reaper.apply().get()["node_users_removed"] == 0  # still refused: still pending
    monkeypatch.undo()
    assert reaper.apply().get()["node_users_removed"] == 1
    assert not user_exists(name) and Cluster.objects.get(pk=cluster.pk).node_user_removed_at is not None
    assert reaper.apply().get()["node_users_removed"] == 0  # done: not tried again


def test_the_reaper_ends_the_drills_of_a_cluster_whose_worker_died_at_its_end(cluster, tom):
    second = node_host(cluster, 1)
    drills.run_drill(cluster, tom, "unreachable", rank=1)
    recovery_cordons(cluster, second)
    Cluster.objects.filter(pk=cluster.pk).update(status="terminated")  # the worker died right after

    reaper = registered(SCHEDULE["reap-cluster-leftovers"]["task"])
    assert reaper.apply().get()["clusters_drills_ended"] == 1
    second.refresh_from_db()
    assert second.state == "available" and faults(second) == {}
    assert reaper.apply().get()["clusters_drills_ended"] == 0


def test_a_drills_failure_is_not_held_against_the_hosts_reliability(cluster, tom, priya):
    first, second = node_host(cluster, 0), node_host(cluster, 1)
    Host.objects.update(reliability=0.9)
    inventory.inject_fault(first, "unreachable", actor=priya)  # a real outage: the provider's
    drills.run_drill(cluster, tom, "unreachable", rank=1)  # the team's drill

    health.health_sweep()

    first.refresh_from_db()
    second.refresh_from_db()
    assert first.state == second.state == "offline"
    assert first.reliability == pytest.approx(0.81)  # a failed check counts against the provider
    assert second.reliability == pytest.approx(0.9)  # the drill's does not
    assert f"fault drill unreachable by tom on cluster {cluster.pk}" in second.events.first().message

    services.terminate_cluster(cluster, tom, wait=True)
    second.refresh_from_db()
    assert second.state == "available" and second.reliability >= 0.9  # back with the cluster's end
    assert Host.objects.get(pk=first.pk).state == "offline"


# --- the host says so, and who may lift it ----------------------------------------------------------------


def console(user):
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def drill_cordoned(cluster, tom):
    """rank 1's host, cordoned by recovery after tom's `unreachable` drill."""
    host = node_host(cluster, 1)
    drills.run_drill(cluster, tom, "unreachable", rank=1)
    recovery_cordons(cluster, host)
    return host


def test_the_host_says_it_was_cordoned_after_a_drill_and_by_whom(
    cluster, drill_cordoned, tom, priya, root, client_for
):
    note = f"cordoned after a fault drill by tom on cluster {cluster.pk} (drilled): unreachable"
    url = f"/api/v1/hosts/{drill_cordoned.pk}/"
    for user in (priya, root, tom):
        body = client_for(user).get(url).json()
        assert body["state"] == "cordoned" and body["after_drill"]["note"] == note, body
        assert body["after_drill"]["by"] == "tom" and body["after_drill"]["cluster"] == cluster.pk
        assert body["may_uncordon"] is True
    assert "address" in client_for(priya).get(url).json()
    assert "address" not in client_for(tom).get(url).json()  # the provider's details stay the provider's

    page = console(priya).get(f"/inventory/hosts/{drill_cordoned.pk}/").content.decode()
    assert note.capitalize() in page and f"/hosts/{drill_cordoned.pk}/uncordon/" in page
    page = console(tom).get(f"/inventory/hosts/{drill_cordoned.pk}/").content.decode()
    assert note.capitalize() in page and f"/hosts/{drill_cordoned.pk}/uncordon/" in page
    assert f"/hosts/{drill_cordoned.pk}/retire/" not in page and "host-history" not in page


def test_the_team_admin_who_ran_the_drill_may_uncordon_the_host_and_nothing_else(
    drill_cordoned, tom, alice, bob, client_for
):
    base = f"/api/v1/hosts/{drill_cordoned.pk}"
    for stranger in (alice, bob):  # alice: same team, did not run it; bob: another team
        assert client_for(stranger).get(f"{base}/").status_code == 404
        assert client_for(stranger).post(f"{base}/uncordon/").status_code == 404
    for action in ("retire", "drain", "rediscover"):
        assert client_for(tom).post(f"{base}/{action}/").status_code == 404
        assert console(tom).post(f"/inventory/hosts/{drill_cordoned.pk}/{action}/").status_code == 404
    response = client_for(tom).post(f"{base}/uncordon/", {"reason": "drill done"}, format="json")
    assert response.status_code == 202, response.json()
    assert response.json()["state"] == "available" and "address" not in response.json()
    assert response.json()["after_drill"] is None
    drill_cordoned.refresh_from_db()
    assert drill_cordoned.state == "available"
    assert drill_cordoned.events.first().actor == tom


def test_the_drills_team_admin_may_not_lift_a_cordon_that_is_no_longer_the_drills(
    drill_cordoned, tom, priya, team_a, client_for
):
    url = f"/api/v1/hosts/{drill_cordoned.pk}/uncordon/"
    inventory.act_on_host(drill_cordoned, "uncordon", priya)
    inventory.act_on_host(drill_cordoned, "cordon", priya, "maintenance")  # the provider's cordon now
    assert client_for(tom).post(url).status_code == 404
    assert client_for(tom).get(f"/api/v1/hosts/{drill_cordoned.pk}/").json()["after_drill"] is None

    inventory.act_on_host(drill_cordoned, "uncordon", priya)
    accounts.add_member(team_a, tom, TeamRole.RESEARCHER)  # no longer an admin of the team
    drill = inventory.drill_behind(drill_cordoned.pk, drill_cordoned.drills.first().cluster_pk)
    inventory.act_on_host(drill_cordoned, "cordon", reason="suspect after a drill", drill=drill)
    assert client_for(tom).post(url).status_code == 404


def test_the_cluster_page_names_the_hosts_its_drills_keep_out_of_service(cluster, drill_cordoned, tom, alice):
    page = console(tom).get(f"/clusters/{cluster.pk}/").content.decode()
    assert "Out of service after this cluster's drills" in page
    assert (
        f'href="/inventory/hosts/{drill_cordoned.pk}/">h100-b</a> (cordoned after unreachable by tom)' in page
    )
    assert "drill-kept-out" not in console(alice).get(f"/clusters/{cluster.pk}/").content.decode()


def test_the_demos_start_line_lists_cordoned_hosts_and_why(cluster, drill_cordoned, priya):
    from io import StringIO

    from voltweb.management.commands.demo import Command

    def start_line() -> str:
        out = StringIO()
        Command(stdout=out)._announce(8000)
        return out.getvalue()

    inventory.act_on_host(node_host(cluster, 0), "cordon", priya, "maintenance")
    assert (
        f"Cordoned hosts: h100-a (maintenance), h100-b (after a fault drill by tom on cluster {cluster.pk})"
        in start_line()
    )
    Host.objects.update(state="available")
    assert "Cordoned hosts" not in start_line()
