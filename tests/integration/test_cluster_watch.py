"""Fault tests of the cluster watch on local hosts, through a real Celery worker and beat.

A READY cluster's worker node gets an uncorrectable ECC error, becomes unreachable, has its Ray node
SIGKILLed; a second (single-node) cluster has its head SIGKILLed. Each time the node turns failed and the
cluster DEGRADED within two sweep intervals, and the change reaches a connected websocket. Between the
first cases the test clears the fault, sees the node recover (ok) while the cluster stays DEGRADED, and
moves the cluster back to READY along the table's recovery edges (DEGRADED → RECOVERING → READY), as the
recovery issue will.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from clusters import provision, services, transitions
from clusters.models import Cluster, NodeHealth
from clusters.provision import ray_cluster_id
from clusters.provisioning import ray_nodes
from inventory import services as inventory
from inventory.drivers.local import clear_fault, set_fault
from tests.clusters.live_helpers import Listener, start_cluster_ids_at, worker_and_beat

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
INTERVAL_S = 5.0  # the default VOLT_WATCH_INTERVAL_S


@pytest.fixture(autouse=True)
def watch_settings(settings):
    settings.VOLT_PROBE_MAX_MB = 4
    settings.VOLT_PROBE_ITERS = 2
    settings.VOLT_NODE_JOIN_TIMEOUT_S = 150  # a loaded shared machine starts heads slowly
    settings.VOLT_SLOW_HOST_REPLACEMENTS = 0  # local hosts share two CPUs: no slow-host verdicts here
    settings.VOLT_WATCH_INTERVAL_S = INTERVAL_S


@pytest.fixture
def local_hosts(northwind, northwind_ib, add_local_host):
    return [add_local_host(northwind, northwind_ib, f"w{i}", gpus=2, price=f"2.{i}0") for i in range(4)]


@pytest.fixture
def clusters_to_clean(local_hosts):
    start_cluster_ids_at(random.randrange(100_000, 900_000))
    made: list[int] = []
    yield made
    for host in local_hosts:
        for fault in ("unreachable", "ecc_uncorrectable"):
            clear_fault(inventory.sandbox_path(host), fault)
    for cluster in Cluster.objects.filter(pk__in=made):
        if cluster.status not in ("terminated", "failed"):
            services.terminate_cluster(cluster, wait=True)
    for cluster in Cluster.objects.filter(pk__in=made):
        for host in local_hosts:
            with inventory.driver_for(host) as driver:
                assert ray_nodes.node_processes(driver, ray_cluster_id(cluster)) == [], (cluster, host)


def ready_cluster(team, user, nodes: int, name: str) -> Cluster:
    """Request, place and provision in this thread (the tasks' bodies), before the worker starts."""
    cluster = services.request_cluster(team, user, {"name": name, "nodes": nodes, "gpus_per_node": 2,
                                                    "gpu_models": ["H100"]})  # fmt: skip
    services.place_cluster(cluster.pk)
    cluster = provision.provision_cluster(cluster.pk)
    assert cluster.status == "ready", cluster.failure_message
    return cluster


def node_of(cluster: Cluster, head: bool):
    return cluster.nodes.select_related("host__provider").get(is_head=head, released_at__isnull=True)


def wait_degraded(cluster: Cluster, node, since: float) -> tuple[float, NodeHealth]:
    """Seconds from `since` until the node is failed and the cluster DEGRADED (fails after 4 intervals)."""
    deadline = since + 4 * INTERVAL_S + 10
    while time.monotonic() < deadline:
        cluster.refresh_from_db()
        row = NodeHealth.objects.filter(node=node).first()
        if cluster.status == "degraded" and row is not None and row.verdict == "failed":
            return time.monotonic() - since, row
        time.sleep(0.2)
    raise AssertionError(f"{cluster} not degraded with {node.host.name} failed; health: {row and row.rule}")


def wait_verdict(node, verdict: str) -> NodeHealth:
    deadline = time.monotonic() + 4 * INTERVAL_S
    while time.monotonic() < deadline:
        row = NodeHealth.objects.filter(node=node).first()
        if row is not None and row.verdict == verdict:
            return row
        time.sleep(0.2)
    raise AssertionError(f"{node.host.name} never {verdict}: {row and (row.verdict, row.rule)}")


def back_to_ready(cluster: Cluster) -> None:
    """The recovery issue's path, through the transition table (not a raw update)."""
    transitions.transition(cluster, "recovering", "test: fault cleared")
    transitions.transition(Cluster.objects.get(pk=cluster.pk), "ready", "test: recovered")


def assert_degraded_seen(listener: Listener, host_name: str) -> None:
    listener.wait_for(lambda m: m.get("kind") == "status" and m.get("status") == "degraded", 10)
    listener.wait_for(
        lambda m: (
            m.get("kind") == "health"
            and any(n["host"] == host_name and n["verdict"] == "failed" for n in m["nodes"])
        ),
        10,
    )


def test_node_faults_turn_the_node_failed_and_the_cluster_degraded_within_two_sweeps(
    alice, team_a, local_hosts, clusters_to_clean, tmp_path
):
    pair = ready_cluster(team_a, alice, 2, "pair")
    single = ready_cluster(team_a, alice, 1, "single")
    clusters_to_clean += [pair.pk, single.pk]
    worker, head = node_of(pair, head=False), node_of(single, head=True)
    worker_sandbox = inventory.sandbox_path(worker.host)

    with worker_and_beat(tmp_path, INTERVAL_S):
        wait_verdict(worker, "ok")  # the watch runs and finds the healthy cluster healthy
        assert Cluster.objects.get(pk=pair.pk).status == "ready"

        # 1. An uncorrectable ECC error on the worker's GPU 0.
        listener = Listener(alice, pair.pk)
        assert (
            listener.connected and listener.wait_for(lambda m: m["kind"] == "snapshot")["status"] == "ready"
        )
        started = time.monotonic()
        set_fault(worker_sandbox, "ecc_uncorrectable", "0")
        elapsed, row = wait_degraded(pair, worker, started)
        assert "uncorrectable ECC" in row.rule and elapsed <= 2 * INTERVAL_S, (elapsed, row.rule)
        assert_degraded_seen(listener, worker.host.name)
        assert worker.host.name in pair.events.filter(to_status="degraded").last().message
        clear_fault(worker_sandbox, "ecc_uncorrectable")
        assert wait_verdict(worker, "ok").rule == ""  # a recovered node clears; the cluster stays DEGRADED
        assert Cluster.objects.get(pk=pair.pk).status == "degraded"
        listener.close()
        back_to_ready(pair)

        # 2. The worker's host stops answering.
        listener = Listener(alice, pair.pk)
        started = time.monotonic()
        set_fault(worker_sandbox, "unreachable")
        elapsed, row = wait_degraded(pair, worker, started)
        assert row.rule.startswith("host unreachable") and elapsed <= 2 * INTERVAL_S, (elapsed, row.rule)
        assert_degraded_seen(listener, worker.host.name)
        clear_fault(worker_sandbox, "unreachable")
        wait_verdict(worker, "ok")
        listener.close()
        back_to_ready(pair)

        # 3. SIGKILL of the worker node's Ray processes.
        listener = Listener(alice, pair.pk)
        with inventory.driver_for(worker.host) as driver:
            handle = ray_nodes.find_node(driver, ray_cluster_id(pair))
        started = time.monotonic()
        os.killpg(handle.pgid, signal.SIGKILL)
        elapsed, row = wait_degraded(pair, worker, started)
        assert "not running" in row.rule and elapsed <= 2 * INTERVAL_S, (elapsed, row.rule)
        assert_degraded_seen(listener, worker.host.name)
        listener.close()

        # 4. SIGKILL of a READY cluster's head.
        listener = Listener(alice, single.pk)
        with inventory.driver_for(head.host) as driver:
            handle = ray_nodes.find_node(driver, ray_cluster_id(single))
        started = time.monotonic()
        os.killpg(handle.pgid, signal.SIGKILL)
        elapsed, row = wait_degraded(single, head, started)
        assert "Ray head not answering" in row.rule and elapsed <= 2 * INTERVAL_S, (elapsed, row.rule)
        assert_degraded_seen(listener, head.host.name)
        listener.close()
