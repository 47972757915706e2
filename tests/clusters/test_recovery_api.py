"""Recovery without Ray: where a replacement goes, the record, the beat retry, the API and the drills' rules.

The repair itself (real Ray nodes replaced, re-formed, waiting for capacity) is in
tests/integration/test_recovery.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from clusters import planning, provision, recovery, transitions
from clusters.models import Cluster, Recovery
from clusters.provisioning import replacement
from voltweb import services as accounts
from voltweb.choices import TeamRole

from .conftest import spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def ready(alice, rack, client_for, committed):
    """A READY 2-node cluster on r02 (the cheaper block), as far as Volt knows."""
    with committed():
        response = client_for(alice).post("/api/v1/clusters/", spec(), format="json")
    cluster = transitions.transition(Cluster.objects.get(pk=response.json()["id"]), "verifying", "joined")
    return transitions.transition(cluster, "ready", "probe passed", extra={"ready_at": timezone.now()})


@pytest.fixture
def carol(make_user, team_a):
    """An admin of team A (alice is a researcher there)."""
    user = make_user("carol")
    accounts.add_member(team_a, user, TeamRole.ADMIN)
    return user


def replacement_for(cluster: Cluster, node):
    request = planning.to_request(cluster.spec)
    request = type(request)(
        **{**request.__dict__, "nodes": 1, "topology_level": None, "topology_mode": "any"}
    )
    used = {str(n.host_id) for n in cluster.nodes.all()}
    candidates = [
        s for s in planning.candidate_snapshots(request, team_id=cluster.team_id) if s.host_id not in used
    ]
    survivors = [n for n in provision.active_nodes(cluster) if n.pk != node.pk]
    return provision.near_survivors(request, candidates, survivors)


def test_a_replacement_goes_to_the_survivors_block_before_a_cheaper_host_elsewhere(ready, rack, make_host):
    node = provision.active_nodes(ready)[1]
    assert {n.host.block.name for n in provision.active_nodes(ready)} == {"r02"}
    plan, level = replacement_for(ready, node)
    assert level == "fabric" and plan.host_ids[0] in {str(h.pk) for h in rack["r01"]}  # r02 is full

    dearer = make_host(rack["r02"][0].block, price="2.90")
    plan, level = replacement_for(ready, node)
    assert (level, plan.host_ids) == ("block", (str(dearer.pk),))


def test_a_replacement_takes_a_host_no_queued_reservation_holds_before_one_at_the_same_level(
    ready, rack, alice, client_for, committed
):
    """A queued request's reservation holds two of r01's hosts from now: the replacement takes r01's third.
    With all three held it still goes to r01 (keeping a running cluster whole comes first; the reservation
    is planned again at the next drain)."""
    node = provision.active_nodes(ready)[1]
    r01 = [str(h.pk) for h in rack["r01"]]
    with committed():
        response = client_for(alice).post("/api/v1/clusters/", spec(name="big", nodes=5), format="json")
    big = Cluster.objects.get(pk=response.json()["id"])
    assert big.status == "queued"
    now = timezone.now()
    held = Cluster.objects.filter(pk=big.pk)
    held.update(
        reserved_from=now, reserved_until=now + timedelta(hours=1), reserved_hosts=[int(h) for h in r01[:2]]
    )

    plan, level = replacement.replacement_plan(ready, [node])
    assert (level, plan.host_ids) == ("fabric", (r01[2],))

    held.update(reserved_hosts=[int(h) for h in r01])
    plan, level = replacement.replacement_plan(ready, [node])
    assert level == "fabric" and plan.host_ids[0] in r01


def test_the_record_leaves_out_workers_that_only_lost_their_head(ready):
    head, worker = provision.active_nodes(ready)
    record = recovery.start(
        ready,
        [(head, "Ray head not answering: refused"), (worker, "Ray node process not running on the host")],
        "head failed",
    )
    assert record.head_lost and [h["id"] for h in record.failed_hosts] == [head.host_id]
    assert record.phases[0]["phase"] == "detected"


def test_retry_queues_waiting_and_unattended_degraded_clusters_only(
    ready, settings, django_capture_on_commit_callbacks
):
    settings.VOLT_AUTO_RECOVER = True
    with django_capture_on_commit_callbacks() as queued:
        assert recovery.retry_recoveries() == 0  # READY: nothing to do
    assert queued == []
    cluster = transitions.transition(ready, "degraded", "node failed")
    with django_capture_on_commit_callbacks() as queued:
        assert recovery.retry_recoveries() == 1  # DEGRADED without a recovery (the hook never ran)
    assert len(queued) == 1
    record = recovery.start(cluster, [], "node failed")
    record.status = "waiting"
    record.save()
    Cluster.objects.filter(pk=cluster.pk).update(status="recovering")
    with django_capture_on_commit_callbacks() as queued:
        assert recovery.retry_recoveries() == 1  # waiting for capacity: tried again
    settings.VOLT_AUTO_RECOVER = False
    Recovery.objects.filter(pk=record.pk).update(status="succeeded")
    Cluster.objects.filter(pk=cluster.pk).update(status="degraded")
    assert recovery.retry_recoveries() == 0  # auto-recovery off: a DEGRADED cluster is left alone


def test_a_recovery_of_a_terminated_cluster_is_abandoned(ready):
    record = recovery.start(ready, [], "node failed")
    Cluster.objects.filter(pk=ready.pk).update(status="terminated")
    assert recovery.recover_cluster(ready.pk) == "terminated"
    record.refresh_from_db()
    assert record.status == "abandoned" and record.ended_at is not None and record.phase == "abandoned"


def console(user):
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


def test_recoveries_api_and_cluster_detail_show_the_record(ready, alice, bob, client_for):
    recovery.start(ready, [(provision.active_nodes(ready)[1], "host unreachable: down")], "h failed")
    body = client_for(alice).get(f"/api/v1/clusters/{ready.pk}/recoveries/").json()
    assert body["count"] == 1 and body["results"][0]["failed_hosts"][0]["rule"] == "host unreachable: down"
    detail = client_for(alice).get(f"/api/v1/clusters/{ready.pk}/").json()
    assert detail["recovery"]["phase"] == "detected" and detail["recovery_policy"] == "replace"
    assert client_for(bob).get(f"/api/v1/clusters/{ready.pk}/recoveries/").status_code == 404
    page = console(alice).get(f"/clusters/{ready.pk}/")
    assert (
        b"recoveries-table" in page.content and b"host unreachable" not in page.content.split(b"Timeline")[1]
    )


def test_recovery_policy_is_for_team_admins(ready, alice, carol, client_for):
    url = f"/api/v1/clusters/{ready.pk}/recovery-policy/"
    assert client_for(alice).patch(url, {"recovery_policy": "shrink"}, format="json").status_code == 403
    response = client_for(carol).patch(url, {"recovery_policy": "shrink"}, format="json")
    assert response.status_code == 200 and response.json()["recovery_policy"] == "shrink"
    bad = client_for(carol).patch(url, {"recovery_policy": "pray"}, format="json")
    assert bad.status_code == 400 and "recovery_policy" in bad.json()["error"]["fields"], bad.json()


def test_drills_are_for_admins_and_refuse_what_cannot_run(ready, alice, bob, carol, root, client_for):
    url = f"/api/v1/clusters/{ready.pk}/drills/"
    assert client_for(alice).get(url).status_code == 403  # a researcher of the team
    assert client_for(bob).post(url, {"drill": "kill_processes", "rank": 0}, format="json").status_code == 404
    listed = client_for(carol).get(url).json()["results"]  # a page, like every collection
    assert {d["drill"] for d in listed} >= {
        "kill_processes",
        "ecc_uncorrectable",
        "unreachable",
        "link_degraded",
    }

    def refused(body, field):
        response = client_for(root).post(url, body, format="json")
        assert response.status_code == 400 and field in response.json()["error"]["fields"], response.json()
        return response.json()["error"]["fields"][field][0]

    assert "ranks are [0, 1]" in refused({"drill": "kill_processes", "rank": 7}, "rank")
    assert "local hosts only" in refused(
        {"drill": "unreachable", "rank": 1}, "drill"
    )  # the rack is SSH hosts
    refused({"drill": "meteor", "rank": 1}, "drill")
    refused({"drill": "kill_processes", "rank": "one"}, "rank")
    Cluster.objects.filter(pk=ready.pk).update(status="terminated")
    assert "terminated" in refused({"drill": "kill_processes", "rank": 0}, "drill")


def test_console_drill_form_is_for_admins(ready, alice, carol):
    assert b'id="drills"' not in console(alice).get(f"/clusters/{ready.pk}/").content
    assert b'id="drills"' in console(carol).get(f"/clusters/{ready.pk}/").content
    response = console(alice).post(f"/clusters/{ready.pk}/drills/", {"drill": "kill_processes", "rank": 0})
    assert response.status_code == 403
    response = console(carol).post(
        f"/clusters/{ready.pk}/drills/", {"drill": "unreachable", "rank": "1"}, follow=True
    )
    assert b"local hosts only" in response.content
