"""A cluster whose head was replaced, as its pages show it (issue 24's second walk): once it ended, the
placement and node health listed its first plan's ranks and every node it ever had (a 2-node cluster with
5 nodes, two heads); the overview counted replaced nodes' last verdict as failed nodes now."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from clusters import live
from clusters.choices import Verdict
from clusters.models import Cluster, ClusterNode, NodeHealth

pytestmark = pytest.mark.django_db


def plan_node(host, rank: int) -> dict:
    return {
        "rank": rank, "host": host.name, "provider": host.provider.name, "region": host.site.region,
        "site": host.site.name, "fabric": host.fabric.name, "block": host.block.name, "gpu_indices": [0],
    }  # fmt: skip


@pytest.fixture
def head_replaced(team_a, alice, northwind_ib, make_host):
    block = northwind_ib.blocks.first()
    first_head, worker, new_head = (make_host(block, name=n) for n in ("h-first", "h-worker", "h-new"))
    cluster = Cluster.objects.create(
        team=team_a, created_by=alice, name="c", status="ready",
        spec={"nodes": 2, "gpus_per_node": 1, "gpu_models": ["H100"]},
        plan={"placed": True, "nodes": [plan_node(first_head, 0), plan_node(worker, 1)], "explanation": []},
    )  # fmt: skip
    gone = timezone.now() - timedelta(minutes=5)
    replaced = ClusterNode.objects.create(
        cluster=cluster, host=first_head, rank=0, is_head=True, gpu_indices=[0], released_at=gone
    )
    NodeHealth.objects.create(node=replaced, verdict=Verdict.FAILED, rule="Ray node process not running")
    for host, rank in ((worker, 1), (new_head, 0)):
        node = ClusterNode.objects.create(
            cluster=cluster, host=host, rank=rank, is_head=rank == 0, gpu_indices=[0]
        )
        NodeHealth.objects.create(node=node, verdict=Verdict.OK)
    return cluster


def test_the_overview_counts_nodes_in_service_not_replaced_ones(head_replaced, alice):
    page = Client()
    page.force_login(alice)
    html = page.get("/clusters/overview/").content.decode()
    assert re.search(r'id="count-nodes-failed">0<', html), html[:2000]


def test_an_ended_cluster_shows_its_nodes_as_they_were_at_its_end(head_replaced, alice):
    ClusterNode.objects.filter(cluster=head_replaced, released_at__isnull=True).update(
        released_at=timezone.now()
    )
    Cluster.objects.filter(pk=head_replaced.pk).update(status="terminated", ended_at=timezone.now())
    cluster = Cluster.objects.get(pk=head_replaced.pk)

    nodes = live.snapshot(cluster)["nodes"]
    assert [(n["host"], n["rank"], n["is_head"]) for n in nodes] == [
        ("h-new", 0, True),
        ("h-worker", 1, False),
    ]

    page = Client()
    page.force_login(alice)
    html = page.get(f"/clusters/{cluster.pk}/").content.decode()
    placed = re.findall(r'<div class="topo-node( head)?"[^>]*><strong>([^<]+)</strong><span>rank (\d+)', html)
    assert sorted(placed, key=lambda n: n[2]) == [(" head", "h-new", "0"), ("", "h-worker", "1")]
