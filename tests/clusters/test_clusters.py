"""Cluster requests through the API: placement, allocation, the queue, release — what a researcher sees."""

import pytest
from django.db import IntegrityError, transaction

from clusters import allocations, planning, services
from clusters.models import Allocation, Cluster
from clusters.tasks import terminate_cluster_task
from inventory.models import Host
from tests.clusters.conftest import spec

pytestmark = pytest.mark.django_db


def request(client, committed, **overrides):
    with committed():
        response = client.post("/api/v1/clusters/", spec(**overrides), format="json")
    assert response.status_code == 202, response.json()
    return Cluster.objects.get(pk=response.json()["id"])


def test_cluster_is_placed_in_one_block_and_its_gpus_allocated(alice, rack, client_for, committed):
    client = client_for(alice)
    cluster = request(client, committed, nodes=3)

    data = client.get(f"/api/v1/clusters/{cluster.pk}/").json()
    assert data["status"] == "provisioning"
    assert {n["block"] for n in data["nodes"]} == {"r01"}
    assert data["predicted_busbw_gbps"] == 400.0 and data["price_per_hour"] == "60.00"
    assert sum(n["is_head"] for n in data["nodes"]) == 1
    assert Allocation.objects.filter(cluster=cluster, active=True).count() == 24
    assert [h.free_gpus for h in Host.objects.filter(block__name="r01")] == [0, 0, 0]
    timeline = [
        e["to_status"] for e in client.get(f"/api/v1/clusters/{cluster.pk}/events/").json()["results"]
    ]
    assert timeline == ["pending", "placing", "provisioning"]


def test_offers_shrink_when_gpus_are_allocated(alice, rack, client_for, committed):
    client = client_for(alice)
    assert client.get("/api/v1/offers/").json()["results"][0]["free_gpus"] == 40  # cached now
    request(client, committed, nodes=2)
    offers = client.get("/api/v1/offers/").json()["results"]
    assert offers[0]["free_gpus"] == 24  # the allocation invalidated the cached offers


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"nodes": 0}, "nodes", "greater than or equal to 1"),
        ({"gpus_per_node": 9}, "gpus_per_node", "the largest H100 host has 8"),
        ({"gpu_models": ["TPUv5"]}, "gpu_models", "unknown GPU model 'TPUv5'"),
        ({"nodes": 50}, "nodes", "only 5 hosts in the whole inventory"),
        ({"topology_level": "block"}, "topology_level", "topology"),
        ({"parallelism": "telepathy"}, "parallelism", "not a valid choice"),
    ],
)
def test_impossible_specs_get_400_saying_what_to_change(alice, rack, client_for, overrides, field, words):
    response = client_for(alice).post("/api/v1/clusters/", spec(**overrides), format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert field in error["fields"] and words in str(error["fields"][field])
    assert not Cluster.objects.exists()


def test_preview_allocates_nothing(alice, rack, client_for):
    response = client_for(alice).post("/api/v1/placements/preview", spec(nodes=4), format="json")
    body = response.json()
    assert response.status_code == 200 and body["placed"]
    assert body["spanned_level"] == "fabric"  # 4 nodes do not fit one 3-host block
    assert any("iad1-ib" in line for line in body["explanation"])
    assert not Allocation.objects.exists() and not Cluster.objects.exists()


def test_request_that_does_not_fit_now_queues_with_reason_and_position(alice, rack, client_for, committed):
    client = client_for(alice)
    first = request(client, committed, nodes=4)
    second = request(client, committed, nodes=2, name="second")
    third = request(client, committed, nodes=2, name="third")

    data = client.get(f"/api/v1/clusters/{second.pk}/").json()
    assert data["status"] == "queued" and data["queue_position"] == 1
    assert "needed" in data["queue_reason"] or "free" in data["queue_reason"]
    assert client.get(f"/api/v1/clusters/{third.pk}/").json()["queue_position"] == 2
    assert first.nodes.count() == 4


def test_terminating_frees_gpus_and_places_the_queue_in_priority_order(alice, rack, client_for, committed):
    client = client_for(alice)
    first = request(client, committed, nodes=4)
    request(client, committed, nodes=2, name="low", priority=0)
    high = request(client, committed, nodes=2, name="high", priority=10)
    assert Cluster.objects.get(pk=high.pk).status == "queued"

    with committed():
        response = client.post(f"/api/v1/clusters/{first.pk}/terminate/")
    assert response.status_code == 202 and response.json()["status"] == "terminating"  # a worker finishes
    assert client.get(f"/api/v1/clusters/{first.pk}/").json()["status"] == "terminated"

    statuses = dict(Cluster.objects.values_list("name", "status"))
    assert statuses["high"] == "provisioning"
    assert statuses["low"] == "provisioning"  # 5 hosts: 2 + 2 fit once 4 are freed
    assert Allocation.objects.filter(cluster=first, active=True).count() == 0


def test_queue_placement_respects_priority_when_only_one_fits(alice, rack, client_for, committed):
    client = client_for(alice)
    first = request(client, committed, nodes=5)
    low = request(client, committed, nodes=3, name="low", priority=0)
    high = request(client, committed, nodes=3, name="high", priority=5)
    with committed():
        client.post(f"/api/v1/clusters/{first.pk}/terminate/")
    low.refresh_from_db()
    high.refresh_from_db()
    assert (high.status, low.status) == ("provisioning", "queued")


def test_release_frees_gpus_exactly_once(alice, rack, client_for, committed):
    cluster = request(client_for(alice), committed, nodes=2)
    assert allocations.release(cluster) == 16
    assert allocations.release(cluster) == 0
    assert sum(Host.objects.values_list("free_gpus", flat=True)) == 40


def test_terminating_twice_is_a_409(alice, rack, client_for, committed):
    client = client_for(alice)
    cluster = request(client, committed, nodes=1)
    client.post(f"/api/v1/clusters/{cluster.pk}/terminate/")  # no commit: the worker has not finished yet
    response = client.post(f"/api/v1/clusters/{cluster.pk}/terminate/")
    assert response.status_code == 409 and response.json()["error"]["code"] == "illegal_transition"
    assert "It is terminating" in response.json()["error"]["message"]
    terminate_cluster_task.apply(args=(cluster.pk,))  # what the worker runs once the request commits
    response = client.post(f"/api/v1/clusters/{cluster.pk}/terminate/")
    assert response.status_code == 409 and "It is terminated" in response.json()["error"]["message"]


def test_queued_request_can_be_cancelled(alice, rack, client_for, committed):
    client = client_for(alice)
    request(client, committed, nodes=5)
    waiting = request(client, committed, nodes=1, name="waiting")
    response = client.post(f"/api/v1/clusters/{waiting.pk}/terminate/")
    assert response.json()["status"] == "terminated"
    assert not Allocation.objects.filter(cluster=waiting).exists()


def test_database_refuses_a_second_active_allocation_of_one_gpu(alice, rack, client_for, committed):
    cluster = request(client_for(alice), committed, nodes=1)
    taken = Allocation.objects.filter(cluster=cluster).first()
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(cluster=cluster, node=taken.node, gpu=taken.gpu)


def test_another_teams_cluster_is_a_404(alice, bob, rack, client_for, committed):
    cluster = request(client_for(alice), committed, nodes=1)
    client = client_for(bob)
    assert client.get(f"/api/v1/clusters/{cluster.pk}/").status_code == 404
    assert client.post(f"/api/v1/clusters/{cluster.pk}/terminate/").status_code == 404
    assert client.get("/api/v1/clusters/").json()["count"] == 0


def test_team_must_be_named_when_user_has_several(alice, team_b, rack, client_for):
    from voltweb import services as accounts

    accounts.add_member(team_b, alice)
    response = client_for(alice).post("/api/v1/clusters/", spec(), format="json")
    assert response.status_code == 400 and "team" in response.json()["error"]["fields"]
    response = client_for(alice).post("/api/v1/clusters/", spec(team="lab-a", name="x"), format="json")
    assert response.status_code == 202


def test_cordoned_and_draining_hosts_are_not_placed(alice, priya, rack, client_for, committed):
    from inventory import services as inventory

    for host in rack["r01"]:
        inventory.act_on_host(host, "cordon", priya)
    cluster = request(client_for(alice), committed, nodes=2)
    assert {n.host.block.name for n in cluster.nodes.select_related("host__block")} == {"r02"}


def test_measured_bandwidth_overrides_the_declared_figure(alice, rack, client_for):
    block = rack["r01"][0].block
    planning.record_bandwidth_sample("block", str(block.pk), 123.0)
    body = client_for(alice).post("/api/v1/placements/preview", spec(nodes=3), format="json").json()
    assert body["predicted_busbw_gbps"] == 123.0


def test_stuck_placing_cluster_is_requeued_by_the_reaper(alice, rack, client_for, team_a):
    from django.utils import timezone

    cluster = services.request_cluster(team_a, alice, spec())
    Cluster.objects.filter(pk=cluster.pk).update(
        status="placing", updated_at=timezone.now() - timezone.timedelta(hours=1)
    )
    assert services.reap_stuck_placing() == 1
    assert Cluster.objects.get(pk=cluster.pk).status == "queued"


def test_redelivered_placement_task_changes_nothing(alice, rack, client_for, committed):
    cluster = request(client_for(alice), committed, nodes=2)
    events = cluster.events.count()
    assert services.place_cluster(cluster.pk).status == "provisioning"
    assert cluster.events.count() == events and Allocation.objects.count() == 16


def test_a_queued_cluster_retried_by_the_queue_keeps_a_quiet_timeline(alice, rack, client_for, committed):
    """Each drain (every 30 s, and on every release) used to move a still-waiting cluster QUEUED ->
    PLACING -> QUEUED: two timeline events and two status broadcasts per retry, thousands a day."""
    client = client_for(alice)
    first = request(client, committed, nodes=5)
    waiting = request(client, committed, nodes=2, name="waiting")
    events_url = f"/api/v1/clusters/{waiting.pk}/events/"
    queued_timeline = [e["to_status"] for e in client.get(events_url).json()["results"]]
    assert queued_timeline == ["pending", "placing", "queued"]

    for _ in range(3):
        assert services.drain_queue() == 0
    data = client.get(f"/api/v1/clusters/{waiting.pk}/").json()
    assert data["status"] == "queued" and data["queue_position"] == 1 and data["queue_reason"]
    assert [e["to_status"] for e in client.get(events_url).json()["results"]] == queued_timeline

    with committed():
        client.post(f"/api/v1/clusters/{first.pk}/terminate/")  # frees 5 hosts; the release drains the queue
    timeline = [e["to_status"] for e in client.get(events_url).json()["results"]]
    assert timeline == ["pending", "placing", "queued", "placing", "provisioning"]


def test_a_small_request_behind_more_than_a_hundred_waiting_ones_still_starts(
    alice, rack, client_for, committed
):
    """The drain looked at the first 100 queued clusters only, so a request that fits behind 100 that do
    not was never tried (the queue promises to skip what does not fit)."""
    client = client_for(alice)
    request(client, committed, nodes=4)
    last_host = request(client, committed, nodes=1, name="last-host")
    for number in range(101):
        request(client, committed, nodes=5, name=f"big-{number}", priority=10)
    small = request(client, committed, nodes=1, name="small")
    assert client.get(f"/api/v1/clusters/{small.pk}/").json()["queue_position"] == 102

    with committed():
        client.post(f"/api/v1/clusters/{last_host.pk}/terminate/")  # one host frees; the release drains

    assert client.get(f"/api/v1/clusters/{small.pk}/").json()["status"] == "provisioning"
    assert Cluster.objects.filter(status="queued").count() == 101


def test_a_drain_out_of_time_leaves_the_rest_queued_for_the_next(alice, rack, client_for, committed, caplog):
    client = client_for(alice)
    first = request(client, committed, nodes=5)
    waiting = request(client, committed, nodes=1, name="waiting")
    allocations.release(first)  # not committed: nothing drains yet

    assert services.drain_queue(budget_s=-1) == 0
    assert Cluster.objects.get(pk=waiting.pk).status == "queued"
    assert "queue drain stopped after" in caplog.text and "0 of 1 queued clusters tried" in caplog.text
    assert services.drain_queue() == 1
    assert Cluster.objects.get(pk=waiting.pk).status == "provisioning"
