"""One API call to a verified Ray cluster on `local` hosts: real `ray start` on 127.0.0.N, the real probe.

Each test requests clusters through the API; placement and provisioning run as Celery tasks in-process
at commit (the tasks' bodies are the production code). Every test terminates what it started, and a
fixture checks that no Ray process of any of its clusters survives.
"""

from __future__ import annotations

import textwrap

import pytest

from clusters.models import Allocation, Cluster
from clusters.provision import ray_cluster_id
from clusters.provisioning import ray_nodes
from inventory import services as inventory
from inventory.drivers.local import clear_fault, set_fault
from inventory.models import Host

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture(autouse=True)
def provisioning_settings(settings):
    settings.VOLT_AUTO_PROVISION = True
    settings.VOLT_PROBE_MAX_MB = 8
    settings.VOLT_PROBE_ITERS = 3
    settings.VOLT_NODE_JOIN_TIMEOUT_S = 60


@pytest.fixture
def local_hosts(northwind, northwind_ib, add_local_host):
    """Four local H100 x 2 hosts in one block (cheapest first: h0 < h1 < h2 < h3)."""
    return [add_local_host(northwind, northwind_ib, f"h{i}", gpus=2, price=f"2.{i}0") for i in range(4)]


@pytest.fixture
def no_leftovers(local_hosts):
    """After the test: no process of any cluster it created runs on any host."""
    yield
    for host in local_hosts:
        clear_fault(inventory.sandbox_path(host), "unreachable")  # look at every host, broken ones too
    for cluster in Cluster.objects.all():
        for host in local_hosts:
            with inventory.driver_for(host) as driver:
                assert ray_nodes.node_processes(driver, ray_cluster_id(cluster)) == [], (cluster, host)


def request(client, committed, nodes, name="run"):
    body = {"name": name, "nodes": nodes, "gpus_per_node": 2, "gpu_models": ["H100"]}
    with committed():
        response = client.post("/api/v1/clusters/", body, format="json")
    assert response.status_code == 202, response.json()
    return client.get(f"/api/v1/clusters/{response.json()['id']}/").json()


def run_on_every_node(dashboard_url: str, host_ids: list[int]) -> set[str]:
    """A Ray task pinned to each host through the returned job submission address; the IPs it ran on."""
    script = textwrap.dedent(f"""
        import ray
        ray.init()
        @ray.remote(num_cpus=0)
        def where():
            return ray.util.get_node_ip_address()
        refs = [where.options(resources={{"volt_host_{{}}".format(h): 0.01}}).remote() for h in {host_ids}]
        print("NODE_IPS", ",".join(sorted(ray.get(refs))))
    """)
    status, logs = ray_nodes.submit_job(dashboard_url, f"python -c '{script}'", timeout_s=120)
    assert status == "SUCCEEDED", logs
    line = next(line for line in logs.splitlines() if line.startswith("NODE_IPS"))
    return set(line.split()[1].split(","))


def test_three_node_cluster_becomes_ready_runs_work_and_terminates_clean(
    alice, local_hosts, client_for, committed, no_leftovers
):
    client = client_for(alice)
    cluster = request(client, committed, nodes=3)

    assert cluster["status"] == "ready", cluster["failure_message"]
    assert cluster["probe_result"]["nodes"] == 3 and cluster["measured_busbw_gbps"] > 0
    sizes = [r["bytes"] for r in cluster["probe_result"]["results"]]
    assert sizes == [2**20, 2**21, 2**22, 2**23]
    connection = cluster["connection"]
    assert connection["ray_address"].startswith("127.0.") and connection["dashboard_url"].startswith(
        "http://127.0."
    )
    assert client.get(f"/api/v1/clusters/{cluster['id']}/ssh-key/").content.startswith(b"-----BEGIN OPENSSH")
    timeline = [
        e["to_status"] for e in client.get(f"/api/v1/clusters/{cluster['id']}/events/").json()["results"]
    ]
    assert timeline[-2:] == ["verifying", "ready"]

    hosts = [n["host"] for n in cluster["nodes"]]
    host_rows = list(Host.objects.filter(name__in=hosts))
    assert run_on_every_node(connection["dashboard_url"], [h.pk for h in host_rows]) == {
        h.address for h in host_rows
    }

    response = client.post(f"/api/v1/clusters/{cluster['id']}/terminate/")
    assert response.json()["status"] == "terminated"
    assert not Allocation.objects.filter(active=True).exists()
    assert all(h.free_gpus == h.gpu_count for h in Host.objects.all())


def test_unreachable_host_is_replaced_and_cordoned_as_suspect(
    alice, local_hosts, client_for, committed, no_leftovers
):
    set_fault(inventory.sandbox_path(local_hosts[0]), "unreachable")  # the cheapest: placement picks it

    cluster = request(client_for(alice), committed, nodes=2)

    assert cluster["status"] == "ready", cluster["failure_message"]
    assert "h0" not in [n["host"] for n in cluster["nodes"]]
    bad = Host.objects.get(pk=local_hosts[0].pk)
    assert bad.state == "cordoned" and "suspect" in bad.events.first().message
    assert bad.free_gpus == 2  # its GPUs went back; the cordon keeps it out of placement
    client_for(alice).post(f"/api/v1/clusters/{cluster['id']}/terminate/")


def test_exhausted_retries_fail_cleanly(alice, local_hosts, client_for, committed, settings, no_leftovers):
    settings.VOLT_PROVISION_ATTEMPTS = 1
    set_fault(inventory.sandbox_path(local_hosts[0]), "unreachable")

    cluster = request(client_for(alice), committed, nodes=2)

    assert cluster["status"] == "failed" and cluster["failure_reason"] == "host_failed"
    assert "h0" in cluster["failure_message"] and "not answering" in cluster["failure_message"]
    assert not Allocation.objects.filter(active=True).exists()
    assert all(h.free_gpus == h.gpu_count for h in Host.objects.all())
