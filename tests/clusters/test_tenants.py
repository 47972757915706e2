"""A host serves one team at a time (DESIGN.md "Security"): alice's team A and bob's team B on one host."""

import pytest

from clusters import allocations, planning, services
from clusters.models import Allocation, Cluster
from inventory.models import Host
from tests.clusters.conftest import spec

pytestmark = pytest.mark.django_db

HALF = {"nodes": 1, "gpus_per_node": 4}  # half of the one 8-GPU host


@pytest.fixture
def one_host(northwind_ib, make_host):
    """The whole inventory: one 8 x H100 host."""
    return make_host(northwind_ib.blocks.order_by("name").first(), gpus=8)


def request(client, committed, **overrides) -> dict:
    with committed():
        response = client.post("/api/v1/clusters/", spec(**HALF, **overrides), format="json")
    assert response.status_code == 202, response.json()
    return client.get(f"/api/v1/clusters/{response.json()['id']}/").json()


def test_another_team_cannot_land_on_a_host_partly_allocated_until_the_first_team_leaves(
    alice, bob, one_host, client_for, committed
):
    first = request(client_for(alice), committed, name="a-first")
    assert first["status"] == "provisioning" and [n["host"] for n in first["nodes"]] == [one_host.name]
    assert Host.objects.get(pk=one_host.pk).free_gpus == 4  # half of it is still free

    preview = client_for(bob).post("/api/v1/placements/preview", spec(**HALF), format="json").json()
    assert not preview["placed"]
    assert any("1 host with 4 free H100 GPUs left out: serving another team" in r for r in preview["reasons"])
    queued = request(client_for(bob), committed, name="b-waits")
    assert queued["status"] == "queued" and "serving another team" in queued["queue_reason"]
    assert not Allocation.objects.filter(cluster_id=queued["id"]).exists()

    second = request(client_for(alice), committed, name="a-second")  # the same team shares the host
    assert second["status"] == "provisioning" and [n["host"] for n in second["nodes"]] == [one_host.name]

    for cluster in (first, second):
        with committed():
            client_for(alice).post(f"/api/v1/clusters/{cluster['id']}/terminate/")
    placed = client_for(bob).get(f"/api/v1/clusters/{queued['id']}/").json()
    assert placed["status"] == "provisioning" and [n["host"] for n in placed["nodes"]] == [one_host.name]


def test_allocation_rechecks_the_team_under_the_host_lock(
    alice, bob, team_b, one_host, client_for, committed
):
    """A plan made while the host was empty cannot be allocated once another team took part of it."""
    stale_plan = planning.preview(spec(**HALF), bob, team_b)
    assert stale_plan.host_ids == (str(one_host.pk),)
    request(client_for(alice), committed, name="a-first")  # team A takes half the host meanwhile
    late = services.request_cluster(team_b, bob, spec(**HALF, name="b-late"))

    with pytest.raises(allocations.CapacityChanged, match="serve another team"):
        allocations.allocate(late, stale_plan)

    assert not Allocation.objects.filter(cluster=late).exists()
    assert Cluster.objects.get(pk=late.pk).status == "pending"


def test_a_plan_says_when_hosts_were_left_out_for_another_team(
    alice, bob, northwind_ib, make_host, client_for, committed
):
    block = northwind_ib.blocks.order_by("name").first()
    taken, free = make_host(block, gpus=8, price="2.00"), make_host(block, gpus=8, price="3.00")
    request(client_for(alice), committed, name="a-first")  # the cheaper host

    placed = request(client_for(bob), committed, name="b-elsewhere")

    assert placed["status"] == "provisioning" and [n["host"] for n in placed["nodes"]] == [free.name]
    assert any("left out: serving another team" in line for line in placed["plan"]["explanation"])
    assert Allocation.objects.filter(cluster_id=placed["id"], gpu__host=taken).count() == 0
