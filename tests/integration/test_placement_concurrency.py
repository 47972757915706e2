"""50 cluster requests racing for capacity that fits only some of them, on PostgreSQL.

Each request is placed in its own thread with its own database connection, started together behind a
barrier, exactly as concurrent Celery workers would run `place_cluster`.
"""

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from clusters import services
from clusters.models import Allocation, Cluster
from inventory.models import GPU, Host
from tests.clusters.conftest import spec

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
REQUESTS = 50


@pytest.fixture
def postgres():
    if connection.vendor != "postgresql":
        pytest.skip("row locks and concurrent writers need PostgreSQL (CI sets DATABASE_URL to it)")


def test_fifty_racing_requests_never_double_book(postgres, alice, team_a, northwind_ib, make_host):
    r01, r02 = northwind_ib.blocks.order_by("name")
    for block in (r01, r02):
        for _ in range(6):
            make_host(block)  # 12 hosts x 8 H100 = 96 GPUs
    shapes = [(1 + i % 3, 8 if i % 2 else 4) for i in range(REQUESTS)]  # 2..24 GPUs each, ~600 asked
    clusters = [
        services.request_cluster(team_a, alice, spec(name=f"race-{i}", nodes=n, gpus_per_node=g))
        for i, (n, g) in enumerate(shapes)
    ]
    barrier = threading.Barrier(REQUESTS)

    def place(cluster_id: int) -> str:
        try:
            barrier.wait(timeout=30)
            return services.place_cluster(cluster_id).status
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=REQUESTS) as pool:
        statuses = Counter(pool.map(place, [c.pk for c in clusters]))

    assert set(statuses) <= {"provisioning", "queued"}, statuses
    assert statuses["provisioning"] >= 1 and statuses["queued"] >= 1
    active = Allocation.objects.filter(active=True)
    gpu_ids = list(active.values_list("gpu_id", flat=True))
    assert len(gpu_ids) == len(set(gpu_ids)) <= 96  # every GPU allocated at most once
    for cluster in Cluster.objects.filter(status="provisioning"):
        nodes = list(cluster.nodes.all())
        assert len(nodes) == cluster.spec["nodes"]
        assert all(len(n.gpu_indices) == cluster.spec["gpus_per_node"] for n in nodes)
        assert active.filter(cluster=cluster).count() == cluster.spec["nodes"] * cluster.spec["gpus_per_node"]
    for cluster in Cluster.objects.filter(status="queued"):
        assert cluster.queue_reason and not active.filter(cluster=cluster).exists()
    for host in Host.objects.all():  # the fast-path counters agree with the allocation table
        held = active.filter(gpu__host=host).count()
        assert host.free_gpus == GPU.objects.filter(host=host).count() - held


def test_two_teams_racing_for_hosts_never_share_one(
    postgres, alice, bob, team_a, team_b, northwind_ib, make_host
):
    """Requests of two teams race for 4 hosts, each asking half a host: no host ends up serving both."""
    for _ in range(4):
        make_host(northwind_ib.blocks.order_by("name").first(), gpus=8)
    clusters = [
        services.request_cluster(team, user, spec(name=f"{team.slug}-{i}", nodes=1, gpus_per_node=4))
        for i in range(6)
        for team, user in ((team_a, alice), (team_b, bob))
    ]
    barrier = threading.Barrier(len(clusters))

    def place(cluster_id: int) -> str:
        try:
            barrier.wait(timeout=30)
            return services.place_cluster(cluster_id).status
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=len(clusters)) as pool:
        statuses = Counter(pool.map(place, [c.pk for c in clusters]))

    assert statuses["provisioning"] >= 2 and set(statuses) <= {"provisioning", "queued"}, statuses
    teams_per_host = Counter(
        host
        for host, _team in set(
            Allocation.objects.filter(active=True).values_list("gpu__host_id", "cluster__team_id")
        )
    )
    assert teams_per_host and max(teams_per_host.values()) == 1, teams_per_host
