"""What verification makes of a probe result (the host driver is the seam: rank 0's output is given here)."""

from __future__ import annotations

import json

import pytest

from clusters import provision, transitions
from clusters.models import Cluster
from clusters.probes import allreduce

from .conftest import spec


@pytest.fixture
def verifying(alice, rack, client_for, committed):
    """A 2-node cluster placed in r01, its nodes up (as far as Volt knows), waiting for the probe."""
    with committed():
        response = client_for(alice).post("/api/v1/clusters/", spec(), format="json")
    cluster = Cluster.objects.get(pk=response.json()["id"])
    Cluster.objects.filter(pk=cluster.pk).update(dashboard_url="http://127.0.0.1:1")
    return transitions.transition(Cluster.objects.get(pk=cluster.pk), "verifying", "nodes joined")


def probe_logs(cluster: Cluster, local_gbps: list[float], busbw: float) -> str:
    ips = [n.host.address for n in provision.active_nodes(cluster)]
    size = allreduce.MB
    time_s = size / (busbw / (2 * (len(ips) - 1) / len(ips))) / 1e9
    summary = allreduce.summarize(
        len(ips), "gloo", [size], [[time_s]] * len(ips), node_ips=ips, correct=True,
        hosts=allreduce.summarize_hosts(ips, local_gbps, [(0, 1, 1.0)]),
    )  # fmt: skip
    return "job output\n" + allreduce.RESULT_PREFIX + json.dumps(summary) + "\n"


def test_a_slow_host_is_named_but_kept_when_replacements_are_off(verifying, settings, probe_hosts):
    settings.VOLT_SLOW_HOST_REPLACEMENTS = 0
    nodes_before = [n.host.name for n in provision.active_nodes(verifying)]
    logs = probe_logs(verifying, [120.0, 20.0], busbw=1.0)
    probe_hosts.answer(logs)

    cluster = provision.verify(verifying)

    assert cluster.status == "ready" and cluster.bandwidth_flagged and cluster.slow_hosts_replaced == 0
    assert [n.host.name for n in provision.active_nodes(cluster)] == nodes_before
    message = cluster.events.order_by("-id").first().message
    assert f"{nodes_before[1]} is the slowest host: local memory bandwidth 20.00 GB/s, 17% of" in message
    assert "not replaced: VOLT_SLOW_HOST_REPLACEMENTS reached" in message


def test_a_slow_host_is_left_alone_when_the_cluster_meets_its_prediction(verifying, probe_hosts):
    logs = probe_logs(verifying, [120.0, 20.0], busbw=verifying.predicted_busbw_gbps)
    probe_hosts.answer(logs)

    cluster = provision.verify(verifying)

    assert cluster.status == "ready" and not cluster.bandwidth_flagged and cluster.slow_hosts_replaced == 0
    assert "is the slowest host" in cluster.events.order_by("-id").first().message


def test_a_probe_that_prints_no_result_fails_verification(verifying, probe_hosts):
    probe_hosts.answer("", returncode=1, stderr="Traceback\nboom")

    cluster = provision.verify(verifying)

    assert cluster.status == "failed" and cluster.failure_reason == "verification_failed"
    assert "all-reduce probe failed: rank 0 on " in cluster.failure_message
    assert "exited 1: Traceback\nboom" in cluster.failure_message
    assert not cluster.allocations.filter(active=True).exists()


def test_a_host_that_cannot_be_reached_fails_verification_with_why(verifying, probe_hosts, monkeypatch):
    from inventory import services as inventory
    from inventory.drivers.base import HostUnreachable

    class Unreachable:
        def __init__(self, host):
            self.address = host.address

        def run(self, command, timeout=None):
            raise HostUnreachable(f"{self.address} is not answering")

        def close(self):
            pass

    probe_hosts.answer("")  # the nodes get their slots, as bring-up leaves them
    monkeypatch.setattr(inventory, "driver_for", Unreachable)

    cluster = provision.verify(verifying)

    assert cluster.status == "failed" and cluster.failure_reason == "verification_failed"
    assert "all-reduce probe error: rank 0 on " in cluster.failure_message
    assert "is not answering" in cluster.failure_message
    assert not cluster.allocations.filter(active=True).exists()
