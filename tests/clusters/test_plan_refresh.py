"""A cluster's plan follows its nodes (issue 23, "Plans stay current"): after a recovery moved a node to
another block, the page said "Spans one block", predicted the in-block figure, and the next probe was
flagged "below expectation" — a false alarm, since a fresh cluster on the same hosts is predicted lower.
Any change of a cluster's nodes now recomputes span, prediction and reference all-reduce time from the
same model a fresh plan uses, and the timeline keeps the earlier figures."""

from __future__ import annotations

import pytest
from django.utils import timezone

from clusters import placement, planning, provision, services
from clusters.models import Cluster, ClusterNode
from inventory import services as inventory
from inventory.choices import FabricKind

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_blocks(northwind, iad1):
    fabric = inventory.create_fabric(northwind, iad1, "ndr", FabricKind.IB_NDR, 400.0, 4.0, ["a1", "a2"])
    return {block.name: block for block in fabric.blocks.all()}


def test_a_node_moved_to_another_block_moves_the_plan_and_the_prediction(
    team_a, alice, two_blocks, make_host
):
    h0, h1 = make_host(two_blocks["a1"]), make_host(two_blocks["a1"])
    h2 = make_host(two_blocks["a2"])
    made = services.request_cluster(team_a, alice, {"name": "moves", "nodes": 2, "gpus_per_node": 8,
                                                    "gpu_models": ["H100"]})  # fmt: skip
    services.place_cluster(made.pk)
    cluster = Cluster.objects.get(pk=made.pk)
    assert cluster.plan["spanned_level"] == "block"
    in_block = cluster.predicted_busbw_gbps
    assert {n.host_id for n in cluster.nodes.all()} == {h0.pk, h1.pk}

    # What a replacement does to the rows: the worker on h1 released, a node on h2 in its rank.
    worker = cluster.nodes.get(is_head=False)
    ClusterNode.objects.filter(pk=worker.pk).update(released_at=timezone.now())
    ClusterNode.objects.create(cluster=cluster, host=h2, rank=worker.rank, is_head=False,
                               gpu_indices=list(range(8)))  # fmt: skip
    provision.refresh_plan(cluster, "h1 replaced by h2")

    cluster.refresh_from_db()
    assert cluster.plan["spanned_level"] == "fabric"
    assert cluster.predicted_busbw_gbps == pytest.approx(in_block / 4.0)  # per-host / oversubscription
    assert cluster.predicted_allreduce_s > 0
    assert [n["host_id"] for n in cluster.plan["nodes"]] == sorted([cluster.nodes.get(is_head=True).host_id,
                                                                   h2.pk])  # fmt: skip
    # A fresh cluster on the same two hosts is predicted the same.
    fresh = placement.plan_for_nodes(
        planning.to_request(cluster.spec),
        [(s, tuple(range(8))) for s in planning.snapshots_by_id([h0.pk, h2.pk]).values()],
        str(h0.pk), 0.0,
    )  # fmt: skip
    assert fresh.predicted_busbw_gbps == pytest.approx(cluster.predicted_busbw_gbps)
    lines = list(cluster.events.values_list("message", flat=True))
    assert any(
        "plan now: spans one fabric (was one block)" in line and "was 400" in line for line in lines
    ), lines
