"""The cluster page's websocket: who may connect, the snapshot, and events of a real Celery sweep.

The cluster is READY on local hosts as far as Volt knows, but no Ray runs (its head is a closed port): a
real sweep through a worker finds the head not answering and the nodes' Ray processes gone.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser

from clusters import services, transitions
from clusters.models import Cluster
from tests.clusters.live_helpers import Listener, worker_and_beat
from voltweb import services as accounts

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def ready(alice, team_a, northwind, northwind_ib, add_local_host):
    for i in range(2):
        add_local_host(northwind, northwind_ib, f"c{i}", gpus=2, price=f"2.{i}0")
    cluster = services.request_cluster(
        team_a, alice, {"name": "live", "nodes": 2, "gpus_per_node": 2, "gpu_models": ["H100"]}
    )
    services.place_cluster(cluster.pk)
    Cluster.objects.filter(pk=cluster.pk).update(dashboard_url="http://127.0.0.1:1")
    cluster = transitions.transition(Cluster.objects.get(pk=cluster.pk), "verifying", "nodes joined")
    return transitions.transition(cluster, "ready", "probe passed")


def bearer(user) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {accounts.create_api_token(user, 'ws').secret}".encode())]


def test_anonymous_other_team_and_other_teams_token_are_refused(ready, bob):
    attempts = [
        Listener(AnonymousUser(), ready.pk),
        Listener(bob, ready.pk),
        Listener(None, ready.pk, headers=bearer(bob)),
        Listener(None, ready.pk, query=f"token={accounts.create_api_token(bob, 'q').secret}"),
        Listener(None, ready.pk, headers=[(b"authorization", b"Bearer volt_not-a-token")]),
    ]
    for listener in attempts:
        assert (listener.connected, listener.close_code) == (False, 4404)


def test_a_member_connects_with_session_or_token_and_gets_the_snapshot(ready, alice):
    # One at a time: each listener runs its own event loop, and one channel layer serves one loop at once.
    for connect in (
        lambda: Listener(alice, ready.pk),
        lambda: Listener(None, ready.pk, headers=bearer(alice)),
        lambda: Listener(None, ready.pk, query=f"token={accounts.create_api_token(alice, 'q').secret}"),
    ):
        listener = connect()
        snapshot = listener.wait_for(lambda m: m["kind"] == "snapshot")
        listener.close()
        assert snapshot["status"] == "ready" and len(snapshot["nodes"]) == 2
        assert snapshot["timeline"][-1]["status"] == "ready"


def test_a_member_gets_the_snapshot_then_the_events_of_a_real_celery_sweep(ready, alice, tmp_path):
    listener = Listener(alice, ready.pk)
    assert listener.wait_for(lambda m: m["kind"] == "snapshot")["nodes"][0]["verdict"] is None  # not swept

    with worker_and_beat(tmp_path, interval_s=2.0):
        health = listener.wait_for(lambda m: m["kind"] == "health", 30)
        status = listener.wait_for(lambda m: m["kind"] == "status", 30)
        timeline = listener.wait_for(lambda m: m["kind"] == "timeline", 30)
    listener.close()

    head = next(n for n in health["nodes"] if n["is_head"])
    assert head["verdict"] == "failed" and "Ray head not answering" in head["rule"]
    assert status["status"] == "degraded" and "failed" in status["reason"]
    assert "failed" in timeline["message"]
    assert Cluster.objects.get(pk=ready.pk).status == "degraded"
    assert listener.messages[0]["kind"] == "snapshot"  # the snapshot came before any event


def test_events_reach_a_socket_without_a_database_hop_per_message(ready, alice, monkeypatch):
    """Channels' AsyncConsumer.dispatch closes old database connections on the one sync thread before every
    handler: with 1,000 sockets, 1,000 hops in a row per event (bench/realtime.py's p99). Events skip it."""
    import channels.consumer

    from voltweb import realtime

    hops = []
    original = channels.consumer.aclose_old_connections

    async def counted():
        hops.append(1)
        return await original()

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", counted)
    listener = Listener(alice, ready.pk)
    listener.wait_for(lambda m: m["kind"] == "snapshot")
    hops.clear()  # connecting is dispatched as usual
    for seq in range(3):
        realtime.broadcast(f"cluster-{ready.pk}", {"kind": "bench", "seq": seq})
    listener.wait_for(lambda m: m.get("seq") == 2)
    during_events = list(hops)
    listener.close()
    assert [m["seq"] for m in listener.messages if m["kind"] == "bench"] == [0, 1, 2]
    assert during_events == []


@pytest.mark.django_db(transaction=True)
def test_membership_recheck_works_for_a_session_user(ready, alice):
    """A signed-in browser's scope user is Channels' lazy wrapper: the periodic membership re-check looked
    up `type(user).objects` and raised AttributeError on every event past 30 s (seen in the browser
    tests), so a removed member was never closed. Fails before, passes after."""
    from asgiref.sync import async_to_sync
    from channels.auth import UserLazyObject

    from clusters.consumers import ClusterConsumer
    from voltweb.models import Membership

    lazy = UserLazyObject()
    lazy._wrapped = alice
    consumer = ClusterConsumer()
    consumer.user, consumer.cluster_id = lazy, ready.pk
    assert async_to_sync(consumer.still_allowed)() is True
    Membership.objects.filter(team=ready.team, user=alice).delete()  # removed from the team
    assert async_to_sync(consumer.still_allowed)() is False
