"""One API call to a verified Ray cluster on `local` hosts: real `ray start` on 127.0.0.N, the real probe.

Each test requests clusters through the API; placement and provisioning run as Celery tasks in-process
at commit (the tasks' bodies are the production code). Every test terminates what it started, and a
fixture checks that no Ray process of any of its clusters survives.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from django.db import connection

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
    settings.VOLT_NODE_JOIN_TIMEOUT_S = 90  # other test runs share the two cores


# A host throttled to 20% of one CPU starts its Ray processes slowly: 40-90 s here, and CI once took
# over 90 s while the rest of the run shared the two cores (h1 then "did not join", and the test about
# the probe failed on a join timeout). These tests are about the probe, so they wait longer for the join.
THROTTLED_JOIN_TIMEOUT_S = 300


@pytest.fixture
def local_hosts(northwind, northwind_ib, add_local_host):
    """Four local H100 x 2 hosts in one block (cheapest first: h0 < h1 < h2 < h3)."""
    return [add_local_host(northwind, northwind_ib, f"h{i}", gpus=2, price=f"2.{i}0") for i in range(4)]


@pytest.fixture
def no_leftovers(local_hosts):
    """After the test: no process of any cluster it created runs on any host, and no Unix user of one is left.

    A test that failed half-way may leave a cluster up: it is terminated first (so the next test does
    not meet its ports), and the check still fails the test when terminating left a process behind.
    """
    yield
    from clusters import services

    for cluster in Cluster.objects.filter(status__in=[*services.LIVE, "terminating"]):
        if cluster.status == "terminating":
            services.finish_termination(cluster)
        else:
            services.terminate_cluster(cluster, wait=True)
    for host in local_hosts:
        clear_fault(inventory.sandbox_path(host), "unreachable")  # look at every host, broken ones too
        clear_fault(inventory.sandbox_path(host), "partitioned")
        clear_fault(inventory.sandbox_path(host), "throttled")
    for cluster in Cluster.objects.all():
        for host in local_hosts:
            with inventory.driver_for(host) as driver:
                assert ray_nodes.node_processes(driver, ray_cluster_id(cluster)) == [], (cluster, host)
        if cluster.node_user:  # its Unix user went with it, even when one of its hosts is unreachable
            assert subprocess.run(["id", cluster.node_user], capture_output=True).returncode != 0, cluster


def request(client, committed, nodes, name="run"):
    body = {"name": name, "nodes": nodes, "gpus_per_node": 2, "gpu_models": ["H100"]}
    with committed():
        response = client.post("/api/v1/clusters/", body, format="json")
    assert response.status_code == 202, response.json()
    return client.get(f"/api/v1/clusters/{response.json()['id']}/").json()


def terminate(client, committed, cluster_id: int) -> dict:
    """Terminate through the API; the terminate task runs at commit (as a worker would). The cluster after."""
    with committed():
        response = client.post(f"/api/v1/clusters/{cluster_id}/terminate/")
    assert response.status_code == 202 and response.json()["status"] == "terminating", response.json()
    return client.get(f"/api/v1/clusters/{cluster_id}/").json()


def run_on_every_node(dashboard_url: str, host_ids: list[int], auth_token: str) -> set[str]:
    """A Ray task pinned to each host through the job submission address and the cluster's token (as the
    READY hand-off gives them); the IPs it ran on."""
    script = textwrap.dedent(f"""
        import ray
        ray.init()
        @ray.remote(num_cpus=0)
        def where():
            return ray.util.get_node_ip_address()
        refs = [where.options(resources={{"volt_host_{{}}".format(h): 0.01}}).remote() for h in {host_ids}]
        print("NODE_IPS", ",".join(sorted(ray.get(refs))))
    """)
    status, logs = ray_nodes.submit_job(
        dashboard_url, f"python -c '{script}'", timeout_s=120, auth_token=auth_token
    )
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
    assert sizes == cluster["probe_result"]["sizes_bytes"] and sizes[-1] == 2**23  # VOLT_PROBE_MAX_MB
    connection = cluster["connection"]
    assert connection["ray_address"].startswith("127.0.") and connection["dashboard_url"].startswith(
        "http://127.0."
    )
    assert client.get(f"/api/v1/clusters/{cluster['id']}/ssh-key/").content.startswith(b"-----BEGIN OPENSSH")
    events = client.get(f"/api/v1/clusters/{cluster['id']}/events/").json()["results"]
    timeline = [e["to_status"] for e in events if e["to_status"]]
    assert timeline[-2:] == ["verifying", "ready"]
    assert events[-1]["message"] == "SSH private key downloaded by alice"  # the download, audited

    hosts = [n["host"] for n in cluster["nodes"]]
    host_rows = list(Host.objects.filter(name__in=hosts))
    nodes_ran_on = run_on_every_node(
        connection["dashboard_url"], [h.pk for h in host_rows], connection["ray_auth_token"]
    )
    assert nodes_ran_on == {h.address for h in host_rows}

    assert terminate(client, committed, cluster["id"])["status"] == "terminated"
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
    terminate(client_for(alice), committed, cluster["id"])


def test_exhausted_retries_fail_cleanly(alice, local_hosts, client_for, committed, settings, no_leftovers):
    settings.VOLT_PROVISION_ATTEMPTS = 1
    set_fault(inventory.sandbox_path(local_hosts[0]), "unreachable")

    cluster = request(client_for(alice), committed, nodes=2)

    assert cluster["status"] == "failed" and cluster["failure_reason"] == "host_failed"
    assert "h0" in cluster["failure_message"] and "not answering" in cluster["failure_message"]
    assert not Allocation.objects.filter(active=True).exists()
    assert all(h.free_gpus == h.gpu_count for h in Host.objects.all())


@pytest.mark.django_db(transaction=True)
def test_two_clusters_provisioned_at_once_coexist_and_terminating_one_leaves_the_other(
    alice, team_a, local_hosts, settings, no_leftovers
):
    if connection.vendor != "postgresql":
        pytest.skip("two provisioning workers at once need PostgreSQL (CI sets DATABASE_URL to it)")
    # Local hosts share this machine's two CPUs: one cluster's probe slows the other's hosts, which
    # separate machines would not do. Keep the probes' per-host verdicts out of this test.
    settings.VOLT_SLOW_HOST_REPLACEMENTS = 0
    from concurrent.futures import ThreadPoolExecutor

    from clusters import provision, services

    clusters = []
    for name in ("first", "second"):
        cluster = services.request_cluster(
            team_a, alice, {"name": name, "nodes": 2, "gpus_per_node": 2, "gpu_models": ["H100"]}
        )
        clusters.append(services.place_cluster(cluster.pk))
    assert {c.status for c in clusters} == {"provisioning"}

    def bring_up(cluster_id):
        try:
            return provision.provision_cluster(cluster_id).status
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as pool:
        assert list(pool.map(bring_up, [c.pk for c in clusters])) == ["ready", "ready"]
    first, second = (Cluster.objects.get(pk=c.pk) for c in clusters)
    assert first.ray_address != second.ray_address

    services.terminate_cluster(first, wait=True)

    second_hosts = list(Host.objects.filter(cluster_nodes__cluster=second))
    token = services.cluster_ray_token(second)
    assert run_on_every_node(second.dashboard_url, [h.pk for h in second_hosts], token) == {
        h.address for h in second_hosts
    }
    services.terminate_cluster(Cluster.objects.get(pk=second.pk), wait=True)


def _start_worker(name: str, env: dict, log) -> subprocess.Popen:
    from django.conf import settings as django_settings

    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "voltweb",
        "worker",
        "-P",
        "solo",
        "-c",
        "1",
        "-Q",
        ",".join(django_settings.VOLT_QUEUES),
        "-n",
        f"{name}-%h",
        "--loglevel",
        "INFO",
    ]
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for(predicate, timeout_s: float, what: str):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.mark.django_db(transaction=True)
def test_celery_worker_killed_mid_provisioning_still_ends_ready(
    alice, team_a, local_hosts, settings, tmp_path, no_leftovers
):
    """SIGKILL the worker while it starts the Ray nodes; a new worker plus the reaper finish the job."""
    import os
    import signal

    from clusters import services
    from tests.browser.conftest import _database_url
    from voltweb.celery import app as celery_app

    if connection.vendor != "postgresql":
        pytest.skip("worker subprocesses share the test database: needs PostgreSQL (CI sets DATABASE_URL)")
    with celery_app.connection_for_write() as conn:
        for queue in settings.VOLT_QUEUES:
            conn.default_channel.queue_purge(queue)
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(connection.settings_dict),
        "VOLT_DATA_DIR": str(settings.VOLT_DATA_DIR),
        "VOLT_PROBE_MAX_MB": "8",
        "VOLT_PROBE_ITERS": "3",
        "VOLT_NODE_JOIN_TIMEOUT_S": "60",
        "VOLT_AUTO_PROVISION": "1",
    }
    log = open(tmp_path / "workers.log", "w")  # noqa: SIM115 - closed below
    first = _start_worker("doomed", env, log)
    second = None
    try:
        cluster = services.request_cluster(
            team_a, alice, {"name": "survivor", "nodes": 2, "gpus_per_node": 2, "gpu_models": ["H100"]}
        )
        _wait_for(
            lambda: cluster.events.filter(message__startswith="Ray head up").exists(), 90, "the Ray head"
        )
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        assert Cluster.objects.get(pk=cluster.pk).status == "provisioning"

        second = _start_worker("rescuer", env, log)
        assert services.reap_stuck_provisioning(older_than_s=0) == 1  # what beat runs every minute

        final = _wait_for(
            lambda: Cluster.objects.filter(pk=cluster.pk, status__in=["ready", "failed"]).first(),
            150,
            "READY or FAILED",
        )
        assert final.status == "ready", final.failure_message
        assert Allocation.objects.filter(cluster=final, active=True).count() == 4
        services.terminate_cluster(final, wait=True)
    finally:
        for worker in (first, second):
            if worker is not None and worker.poll() is None:
                os.killpg(worker.pid, signal.SIGTERM)
                worker.wait(timeout=30)
        log.close()


def test_worker_that_never_joins_is_replaced(
    alice, local_hosts, client_for, committed, settings, no_leftovers
):
    settings.VOLT_NODE_JOIN_TIMEOUT_S = 20
    set_fault(inventory.sandbox_path(local_hosts[1]), "partitioned")  # h1: a worker of the cheapest pair

    cluster = request(client_for(alice), committed, nodes=2)

    assert cluster["status"] == "ready", cluster["failure_message"]
    assert "h1" not in [n["host"] for n in cluster["nodes"]]
    events = [
        e["message"]
        for e in client_for(alice).get(f"/api/v1/clusters/{cluster['id']}/events/").json()["results"]
    ]
    assert any("h1 did not join" in e for e in events) and any(e.startswith("replaced h1 by") for e in events)
    assert Host.objects.get(pk=local_hosts[1].pk).state == "cordoned"
    terminate(client_for(alice), committed, cluster["id"])


def console_page(user, path: str) -> str:
    from django.test import Client

    browser = Client()
    browser.force_login(user)
    response = browser.get(path)
    assert response.status_code == 200
    return response.content.decode()


def events_of(client, cluster_id: int) -> list[dict]:
    return client.get(f"/api/v1/clusters/{cluster_id}/events/").json()["results"]


def test_slowest_host_is_replaced_before_ready(
    alice, local_hosts, client_for, committed, no_leftovers, settings
):
    settings.VOLT_NODE_JOIN_TIMEOUT_S = THROTTLED_JOIN_TIMEOUT_S
    set_fault(inventory.sandbox_path(local_hosts[1]), "throttled", "20")  # h1: a worker of the cheapest three
    client = client_for(alice)

    cluster = request(client, committed, nodes=3)

    assert cluster["status"] == "ready", cluster["failure_message"]
    assert sorted(n["host"] for n in cluster["nodes"]) == ["h0", "h2", "h3"]
    assert cluster["slow_hosts_replaced"] == 1
    events = events_of(client, cluster["id"])
    moves = [e["to_status"] for e in events if e["from_status"] != e["to_status"]]
    assert moves[-4:] == ["verifying", "provisioning", "verifying", "ready"]
    messages = [e["message"] for e in events]
    assert any("h1 is the slowest host" in m for m in messages), messages
    assert any(m.startswith("replaced h1 by h3") for m in messages), messages
    assert "slowest host" not in messages[-1]  # the second probe found no one behind
    bad = Host.objects.get(pk=local_hosts[1].pk)
    assert bad.state == "cordoned" and "slowest host in the all-reduce probe" in bad.events.first().message
    assert bad.free_gpus == 2

    page = console_page(alice, f"/clusters/{cluster['id']}/")
    assert "1 slow host replaced before READY" in page and 'id="probe-hosts"' in page
    topology = page.split('class="topology"')[1].split('class="explain"')[0]
    assert "<strong>h3</strong>" in topology and "<strong>h1</strong>" not in topology  # as it is now
    terminate(client, committed, cluster["id"])


def test_a_slow_host_with_no_replacement_is_kept_and_named(
    alice, priya, local_hosts, client_for, committed, no_leftovers, settings
):
    settings.VOLT_NODE_JOIN_TIMEOUT_S = THROTTLED_JOIN_TIMEOUT_S
    for host in local_hosts[2:]:  # only h0 and h1 can take the cluster
        inventory.act_on_host(host, "cordon", priya, reason="maintenance")
    set_fault(inventory.sandbox_path(local_hosts[1]), "throttled", "20")
    client = client_for(alice)

    cluster = request(client, committed, nodes=2)

    assert cluster["status"] == "ready", cluster["failure_message"]
    # Local hosts on plain loopback (emulation off in tests): the prediction is not compared, so the
    # cluster is not flagged, but the probe still names the slow host among its peers.
    assert sorted(n["host"] for n in cluster["nodes"]) == ["h0", "h1"] and not cluster["bandwidth_flagged"]
    assert cluster["slow_hosts_replaced"] == 0
    ready = events_of(client, cluster["id"])[-1]["message"]
    assert "h1 is the slowest host: local memory bandwidth" in ready
    assert "kept it: no free host can replace h1" in ready and "links not emulated" in ready
    assert Host.objects.get(pk=local_hosts[1].pk).state == "available"  # nothing better to move to
    page = console_page(alice, f"/clusters/{cluster['id']}/")
    assert "slowest</span>" in page
    terminate(client, committed, cluster["id"])
