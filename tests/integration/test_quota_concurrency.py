"""Issue 28 item 3's acceptance: quota caps hold under 50 racing cluster requests, on PostgreSQL.

One team with a cap of 40 GPUs sends 50 requests (8-24 GPUs each, far more than the cap) at an inventory
that could hold them all: only the quota stops them. Each request asks for its own region, so no two
placements meet on a host's row lock and only the quota row's lock orders them (without it, this test
sees the cap overrun). Each request is placed in its own thread with its own database connection,
started together behind a barrier, as concurrent Celery workers would run `place_cluster`.
"""

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from clusters import services
from clusters.models import Allocation, Cluster
from inventory import services as inventory
from inventory.choices import FabricKind
from tests.clusters.conftest import spec
from voltweb import services as accounts

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
REQUESTS = 50
CAP = 40


@pytest.fixture
def postgres():
    if connection.vendor != "postgresql":
        pytest.skip("row locks and concurrent writers need PostgreSQL (CI sets DATABASE_URL to it)")


def race(cluster_ids: list[int]) -> Counter:
    barrier = threading.Barrier(len(cluster_ids))

    def place(cluster_id: int) -> str:
        try:
            barrier.wait(timeout=30)
            return services.place_cluster(cluster_id).status
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=len(cluster_ids)) as pool:
        return Counter(pool.map(place, cluster_ids))


def test_fifty_racing_requests_never_take_a_team_over_its_gpu_cap(
    postgres, alice, root, team_a, northwind, make_host
):
    for i in range(REQUESTS):  # a region per request, 3 hosts x 8 H100 each: room for every request
        site = inventory.get_or_create_site(f"site{i}", f"region-{i}")
        fabric = inventory.create_fabric(northwind, site, f"ib-{i}", FabricKind.IB_NDR, 400.0, 2.0, ["r01"])
        for _ in range(3):
            make_host(fabric.blocks.get())
    accounts.set_team_quota(team_a, root, max_gpus=CAP)
    clusters = [  # 8, 16 or 24 GPUs each, ~800 asked
        services.request_cluster(
            team_a, alice, spec(name=f"race-{i}", nodes=1 + i % 3, regions=[f"region-{i}"])
        )
        for i in range(REQUESTS)
    ]

    statuses = race([c.pk for c in clusters])

    assert set(statuses) <= {"provisioning", "queued"} and statuses["queued"] >= 1, statuses
    held = Allocation.objects.filter(active=True, cluster__team=team_a).count()
    assert 0 < held <= CAP
    placed = Cluster.objects.filter(status="provisioning")
    assert held == sum(c.spec["nodes"] * c.spec["gpus_per_node"] for c in placed)
    assert held > CAP - 24  # the cap was used, not starved: no request of 24 or fewer would still fit
    for cluster in Cluster.objects.filter(status="queued"):
        assert cluster.queue_reason.startswith("over quota: Lab A would use ")
        assert not Allocation.objects.filter(cluster=cluster).exists()


def test_fifty_racing_requests_never_take_a_team_over_a_model_cap(
    postgres, alice, root, team_a, northwind_ib, make_host
):
    r01, r02 = northwind_ib.blocks.order_by("name")
    for _ in range(10):
        make_host(r01, model="H100")
        make_host(r02, model="A100-80GB")
    accounts.set_team_quota(team_a, root, gpu_model_caps={"H100": 16, "A100": 24})
    clusters = [
        services.request_cluster(team_a, alice, spec(name=f"m-{i}", nodes=1, gpu_models=["H100", "A100"]))
        for i in range(REQUESTS)
    ]

    statuses = race([c.pk for c in clusters])

    held = Counter(Allocation.objects.filter(active=True).values_list("gpu__model", flat=True))
    assert held["H100"] <= 16 and held["A100-80GB"] <= 24, held
    assert statuses["provisioning"] == (held["H100"] + held["A100-80GB"]) // 8
    assert statuses["provisioning"] >= 2 and statuses["queued"] >= 1, statuses
