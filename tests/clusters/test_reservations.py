"""Reservations and backfill (issue 28.2): the request at the head of the queue gets a reservation, the
earliest time and hosts it can start on from the running clusters' durations; smaller requests start
around it only where they end before it or use other hosts. The clock is the outer seam (`clock`)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from clusters import durations, services
from clusters.models import Cluster
from tests.clusters.conftest import spec

pytestmark = pytest.mark.django_db
HOUR = 3600


@pytest.fixture
def clock(monkeypatch):
    """Volt's clock (django.utils.timezone.now), moved by `clock.at = ...`; real until then."""

    class Clock:
        at = None

    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: Clock.at or real())
    return Clock


@pytest.fixture
def sixty_four(northwind_ib, make_host):
    """64 H100 hosts of 8 GPUs: 32 in each of Northwind's two InfiniBand blocks."""
    r01, r02 = northwind_ib.blocks.order_by("name")
    return [make_host(block) for block in (r01, r02) for _ in range(32)]


def page_of(user, cluster: Cluster) -> str:
    console = Client()
    console.force_login(user)
    return console.get(f"/clusters/{cluster.pk}/").content.decode()


def request(client, committed, **overrides) -> Cluster:
    with committed():
        response = client.post("/api/v1/clusters/", spec(**overrides), format="json")
    assert response.status_code == 202, response.json()
    return Cluster.objects.get(pk=response.json()["id"])


def drain(committed) -> None:
    with committed():
        services.drain_queue()


@pytest.fixture
def busy(alice, client_for, committed, sixty_four):
    """Eight 1-node clusters with 2 h, 3 h ... 9 h left: 56 hosts free, the rest freed hour by hour."""
    client = client_for(alice)
    running = [
        request(client, committed, name=f"small-{i}", nodes=1, duration_s=(2 + i) * HOUR) for i in range(8)
    ]
    assert {c.status for c in running} == {"provisioning"}
    return running


def test_a_64_node_request_starts_by_its_reservation_while_smaller_ones_backfill_around_it(
    alice, bob, client_for, committed, clock, busy, sixty_four
):
    client = client_for(alice)
    big = request(client, committed, name="big", nodes=64, duration_s=4 * HOUR)
    assert big.status == "queued"
    drain(committed)
    last_end = max(c.ends_at for c in Cluster.objects.filter(name__startswith="small-"))
    shown = client.get(f"/api/v1/clusters/{big.pk}/").json()
    assert shown["starts_by"].startswith(f"{last_end:%Y-%m-%dT%H:%M:%S}")
    assert shown["start_bound_note"] == ""
    big.refresh_from_db()
    assert sorted(big.reserved_hosts) == sorted(h.pk for h in sixty_four)
    page = page_of(alice, big)
    assert f"Starts by {big.reserved_from:%Y-%m-%d %H:%M} UTC" in page and "64 hosts reserved for it" in page

    # Behind it: one that ends before the reservation starts backfills at once; one without a duration,
    # and one that would still run at the reservation's start, wait (every host is reserved).
    short = request(client, committed, name="short", nodes=1, duration_s=HOUR)
    forever = request(client_for(bob), committed, name="forever", nodes=1)
    long = request(client, committed, name="long", nodes=2, duration_s=20 * HOUR)
    assert short.status == "provisioning"
    assert forever.status == "queued" and long.status == "queued"
    assert "64 hosts reserved for 1 request ahead in the queue" in forever.queue_reason
    assert "it asks for no duration, so it may not use them at all" in forever.queue_reason
    assert "it would not end before they start" in long.queue_reason

    # Small requests keep coming and keep ending; none delays it. At its bound the last small one ends,
    # and it starts.
    drain(committed)
    bound = big.reserved_from
    clock.at = bound + timedelta(seconds=1)
    with committed():
        counts = durations.expire_clusters(now=clock.at)
    assert counts["terminated"] == 9  # the eight that ran, and the one that backfilled
    big.refresh_from_db()
    assert big.status == "provisioning"
    assert big.placed_at <= bound + timedelta(seconds=1)  # by its bound (a beat's lag allowed)
    assert big.reserved_from is None  # a placed cluster keeps no reservation
    assert Cluster.objects.get(pk=forever.pk).status == "queued"


def test_without_reservations_skip_ahead_lets_small_requests_starve_the_large_one(
    alice, bob, client_for, committed, clock, busy, settings
):
    """The same queue with VOLT_QUEUE_RESERVATIONS=0 (plain skip-ahead): a request without a duration
    takes a freed host, and the large one has no start bound and does not start when the others end."""
    settings.VOLT_QUEUE_RESERVATIONS = 0
    client = client_for(alice)
    big = request(client, committed, name="big", nodes=64, duration_s=4 * HOUR)
    drain(committed)
    assert client.get(f"/api/v1/clusters/{big.pk}/").json()["starts_by"] is None
    forever = request(client, committed, name="forever", nodes=1)
    assert forever.status == "provisioning"
    clock.at = max(c.ends_at for c in busy) + timedelta(seconds=1)
    with committed():
        durations.expire_clusters(now=clock.at)
    big.refresh_from_db()
    assert big.status == "queued"


def test_a_request_needing_hosts_of_clusters_without_a_duration_has_no_bound_and_says_why(
    alice, client_for, committed, sixty_four
):
    client = client_for(alice)
    request(client, committed, name="holder", nodes=1)  # no duration: it may run for ever
    big = request(client, committed, name="big", nodes=64)
    drain(committed)
    shown = client.get(f"/api/v1/clusters/{big.pk}/").json()
    assert shown["starts_by"] is None
    assert shown["start_bound_note"].startswith(
        "no start bound yet: the GPUs it needs are held by clusters without a duration"
    )
    page = page_of(alice, big)
    assert "No start bound yet: the GPUs it needs are held by clusters without a duration" in page


def test_requests_behind_the_head_are_bounded_around_its_window(alice, client_for, committed, busy):
    """Each of the first requests gets a bound. The head holds all 64 hosts from 9 h to 13 h; a 60-node
    request for 1 h fits before that window (60 hosts free 5 h in), one for 5 h only after it."""
    client = client_for(alice)
    first = request(client, committed, name="first", nodes=64, duration_s=4 * HOUR)
    second = request(client, committed, name="second", nodes=60, duration_s=HOUR)
    third = request(client, committed, name="third", nodes=60, duration_s=5 * HOUR)
    drain(committed)
    first.refresh_from_db()
    second.refresh_from_db()
    third.refresh_from_db()
    fifth_end = sorted(c.ends_at for c in busy)[3]  # 56 free now, 60 once four have ended
    assert first.reserved_from == max(c.ends_at for c in busy)
    assert first.reserved_until == first.reserved_from + timedelta(hours=4)
    assert second.reserved_from == fifth_end and second.reserved_until <= first.reserved_from
    assert third.reserved_from == first.reserved_until


def test_a_queued_clusters_page_is_told_when_its_start_bound_moves(
    alice, client_for, committed, busy, monkeypatch
):
    """ "Starts by" was drawn once: a bound set or moved while the page was open stayed unseen until reload."""
    from voltweb import realtime

    sent: list[tuple[str, dict]] = []
    monkeypatch.setattr(realtime, "broadcast", lambda group, event: sent.append((group, event)))
    first = request(alice_client := client_for(alice), committed, name="first", nodes=64, duration_s=4 * HOUR)
    drain(committed)

    assert (f"cluster-{first.pk}", {"kind": "queue"}) in sent
    sent.clear()
    drain(committed)  # nothing moved: nothing sent
    assert (f"cluster-{first.pk}", {"kind": "queue"}) not in sent
    assert alice_client.get(f"/api/v1/clusters/{first.pk}/").json()["starts_by"] is not None


def test_an_extension_that_would_run_into_a_reservation_is_refused_with_the_most_it_may_take(
    alice, client_for, committed, busy
):
    client = client_for(alice)
    big = request(client, committed, name="big", nodes=64, duration_s=HOUR)
    drain(committed)
    big.refresh_from_db()
    shortest = min(busy, key=lambda c: c.ends_at)
    response = client.post(f"/api/v1/clusters/{shortest.pk}/extend/", {"seconds": 8 * HOUR}, format="json")
    assert response.status_code == 409
    detail = response.json()["error"]["message"]
    assert f"reserved for queued cluster #{big.pk} from {big.reserved_from:%Y-%m-%d %H:%M} UTC" in detail
    assert "extend by at most 7h" in detail  # the shortest ends 2 h in, the reservation 9 h in
    ok = client.post(f"/api/v1/clusters/{shortest.pk}/extend/", {"seconds": 7 * HOUR}, format="json")
    assert ok.status_code == 200, ok.json()


def test_a_reservation_leaves_the_row_once_the_cluster_leaves_the_queue(
    alice, client_for, committed, clock, busy
):
    client = client_for(alice)
    big = request(client, committed, name="big", nodes=64, duration_s=HOUR)
    drain(committed)
    big.refresh_from_db()
    assert big.reserved_hosts
    with committed():  # no drain: leaving the queue drops it at once
        client.post(f"/api/v1/clusters/{big.pk}/terminate/")
    big.refresh_from_db()
    assert big.status == "terminated"
    assert big.reserved_from is None and big.reserved_hosts == [] and big.start_bound_note == ""


def test_a_later_request_of_higher_priority_never_pushes_a_given_bound_back(
    alice, client_for, committed, busy
):
    client = client_for(alice)
    big = request(client, committed, name="big", nodes=64, duration_s=4 * HOUR)
    drain(committed)
    big.refresh_from_db()
    bound = big.reserved_from
    urgent = request(client, committed, name="urgent", nodes=64, duration_s=HOUR, priority=50)
    drain(committed)
    big.refresh_from_db()
    urgent.refresh_from_db()
    assert big.reserved_from == bound
    assert urgent.reserved_from == big.reserved_until  # after the window it would have overlapped
    drain(committed)  # and again, now that both hold one: the earlier keeps its place
    big.refresh_from_db()
    urgent.refresh_from_db()
    assert (big.reserved_from, urgent.reserved_from) == (bound, big.reserved_until)


@pytest.fixture
def two_sites(northwind_ib, helios_roce, make_host):
    """iad1: 3 H100 hosts; ams1: 2 H100 hosts."""
    r01, _ = northwind_ib.blocks.order_by("name")
    a01 = helios_roce.blocks.get()
    return {"iad1": [make_host(r01) for _ in range(3)], "ams1": [make_host(a01) for _ in range(2)]}


def test_a_collective_request_is_reserved_in_one_site_and_does_not_start_across_sites_before_it(
    alice, client_for, committed, clock, two_sites
):
    """Two iad1 hosts are busy for 2 h, one ams1 host for 1 h: across sites 3 nodes fit in 1 h, in one
    site (iad1) in 2 h. The reservation is iad1's, and at 1 h the request still waits for it."""
    client = client_for(alice)
    iad1_busy = request(client, committed, name="iad1-busy", nodes=2, duration_s=2 * HOUR,
                        regions=["us-east"])  # fmt: skip
    ams1_busy = request(client, committed, name="ams1-busy", nodes=1, duration_s=HOUR, regions=["eu-west"])
    assert {iad1_busy.status, ams1_busy.status} == {"provisioning"}
    big = request(client, committed, name="big", nodes=3, duration_s=HOUR)
    assert big.status == "queued"
    drain(committed)
    big.refresh_from_db()
    iad1_busy.refresh_from_db()
    assert big.reserved_from == iad1_busy.ends_at
    assert sorted(big.reserved_hosts) == sorted(h.pk for h in two_sites["iad1"])
    clock.at = ams1_busy.ends_at + timedelta(seconds=1)
    with committed():
        durations.expire_clusters(now=clock.at)  # ams1 frees up: 3 hosts free across two sites
    big.refresh_from_db()
    assert big.status == "queued"
    assert big.queue_reason.startswith(
        f"it starts on its reservation in one site by {big.reserved_from:%Y-%m-%d %H:%M} UTC"
    )
    clock.at = iad1_busy.ends_at + timedelta(seconds=1)
    with committed():
        durations.expire_clusters(now=clock.at)
    big.refresh_from_db()
    assert big.status == "provisioning"
    assert set(big.nodes.values_list("host__site__name", flat=True)) == {"iad1"}


def test_a_request_that_says_never_wait_is_reserved_across_sites(alice, client_for, committed, two_sites):
    client = client_for(alice)
    request(client, committed, name="iad1-busy", nodes=2, duration_s=2 * HOUR, regions=["us-east"])
    ams1_busy = request(client, committed, name="ams1-busy", nodes=1, duration_s=HOUR, regions=["eu-west"])
    big = request(client, committed, name="big", nodes=3, duration_s=HOUR, wait_for_locality=[])
    drain(committed)
    big.refresh_from_db()
    assert big.reserved_from == ams1_busy.ends_at  # the earliest, across sites, as it asked


def test_a_reservation_that_fails_to_plan_is_noted_and_the_queue_still_drains(
    alice, client_for, committed, busy, monkeypatch
):
    from clusters import planning

    client = client_for(alice)
    big = request(client, committed, name="big", nodes=64, duration_s=HOUR)

    def broken(request):
        raise RuntimeError("inventory row in a bad state")

    monkeypatch.setattr(planning, "schedulable_snapshots", broken)
    drain(committed)
    shown = client.get(f"/api/v1/clusters/{big.pk}/").json()
    assert shown["starts_by"] is None
    assert shown["start_bound_note"] == "no start bound: planning it failed (see the worker's log)"
    small = request(client, committed, name="small", nodes=1, duration_s=HOUR)
    assert small.status == "provisioning"  # placement goes on


def test_one_drain_plans_reservations_at_a_time_and_a_dead_holders_lock_expires(
    alice, client_for, committed, clock, busy
):
    """Two workers draining at once must not both write windows: the second finds the planning lock taken,
    plans nothing and places against the stored reservations; once the lock is gone, the next drain plans."""
    from django.core.cache import cache

    from clusters import reservations

    client = client_for(alice)
    assert cache.add(reservations.LOCK_KEY, "another worker", timeout=60)
    try:
        big = request(client, committed, name="big", nodes=64, duration_s=HOUR)
        drain(committed)
        assert reservations.schedule() == {}
        big.refresh_from_db()
        assert big.status == "queued" and big.reserved_from is None
    finally:
        cache.delete(reservations.LOCK_KEY)

    drain(committed)
    big.refresh_from_db()
    assert big.reserved_from is not None and len(big.reserved_hosts) == 64
    assert cache.get(reservations.LOCK_KEY) is None  # released after planning
