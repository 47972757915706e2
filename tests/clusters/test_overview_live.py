"""The health overview over its websocket (ws/overview/): who may connect, what each provider admin sees
of their own hosts' health (theirs only), and a change pushed without polling."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser

from clusters import services, transitions
from clusters.models import Cluster, NodeHealth
from inventory import services as inventory
from tests.clusters.live_helpers import Listener

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
PATH = "/ws/overview/"


@pytest.fixture
def world(alice, team_a, northwind_ib, helios_roce, make_host):
    north = [make_host(northwind_ib.blocks.order_by("name").first(), name=f"nw-{i}") for i in range(2)]
    helios = make_host(helios_roce.blocks.first(), name="he-0")
    cluster = services.request_cluster(
        team_a, alice, {"name": "watched", "nodes": 2, "gpus_per_node": 8, "gpu_models": ["H100"]}
    )
    services.place_cluster(cluster.pk)
    cluster = transitions.transition(Cluster.objects.get(pk=cluster.pk), "verifying", "nodes joined")
    cluster = transitions.transition(cluster, "ready", "probe passed")
    for node, (verdict, rule, temp) in zip(
        cluster.nodes.order_by("rank"),
        [("ok", "", 51), ("warning", "GPU 3 at 87 C (warning above 85 C)", 87)],
        strict=True,
    ):
        NodeHealth.objects.create(node=node, verdict=verdict, rule=rule, readings={"gpu_temp_c": temp})
    return {"north": north, "helios": helios, "cluster": cluster}


def view_of(listener: Listener) -> dict:
    return listener.wait_for(lambda m: m["kind"] == "overview")


def test_anonymous_and_bad_tokens_are_refused(world):
    for listener in (
        Listener(AnonymousUser(), path=PATH),
        Listener(None, path=PATH, headers=[(b"authorization", b"Bearer volt_not-a-token")]),
    ):
        assert (listener.connected, listener.close_code) == (False, 4404)


def test_each_provider_admin_sees_the_health_of_their_own_hosts_only(world, priya, omar, alice):
    listener = Listener(priya, path=PATH)
    mine = {row["host"]: row for row in view_of(listener)["hosts"]}
    listener.close()
    assert set(mine) == {"nw-0", "nw-1"}  # not Helios's he-0
    hosts = {n.host.name for n in world["cluster"].nodes.select_related("host")}
    assert hosts == {"nw-0", "nw-1"}
    worst = next(row for row in mine.values() if row["verdict"] == "warning")
    assert worst["rule"].startswith("GPU 3 at 87 C") and worst["gpu_temp_c"] == 87 and worst["clusters"] == 1

    listener = Listener(omar, path=PATH)
    theirs = view_of(listener)["hosts"]
    listener.close()
    assert [(row["host"], row["verdict"]) for row in theirs] == [("he-0", None)]  # no cluster on it

    listener = Listener(alice, path=PATH)  # a researcher acts for no provider
    view = view_of(listener)
    listener.close()
    assert view["hosts"] == [] and view["counts"]["clusters_healthy"] == 1


def test_a_change_is_pushed_to_the_open_overview(world, priya, alice):
    listener = Listener(priya, path=PATH)
    assert view_of(listener)["counts"]["hosts_unhealthy"] == 0
    inventory.act_on_host(world["north"][1], "cordon", actor=priya)
    pushed = listener.wait_for(lambda m: m["kind"] == "overview" and m["counts"]["hosts_unhealthy"] == 1)
    listener.close()
    assert {row["host"]: row["state"] for row in pushed["hosts"]}["nw-1"] == "cordoned"

    listener = Listener(alice, path=PATH)
    assert view_of(listener)["counts"]["clusters_degraded"] == 0
    transitions.transition(world["cluster"], "degraded", "nw-1 failed")
    pushed = listener.wait_for(lambda m: m["kind"] == "overview" and m["counts"]["clusters_degraded"] == 1)
    listener.close()
    assert pushed["counts"]["clusters_healthy"] == 0
