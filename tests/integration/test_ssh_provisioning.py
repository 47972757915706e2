"""A 2-node Ray cluster provisioned over SSH: two real sshd on their own loopback addresses.

Each "host" is an sshd on 127.0.0.3x whose sessions get a sandbox HOME and a PATH with the simulated
nvidia-smi first (SetEnv), so onboarding, key distribution, `ray start` and teardown all run through
asyncssh exactly as on a provider's machine.
"""

from __future__ import annotations

import sys
from decimal import Decimal
from pathlib import Path

import pytest

from clusters.models import Allocation, Cluster
from clusters.provision import ray_cluster_id
from clusters.provisioning import ray_nodes
from inventory import services as inventory
from inventory.choices import DriverKind
from inventory.drivers.local import create_sandbox
from inventory.models import Host
from tests.integration.test_provisioning import run_on_every_node

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture
def ssh_hosts(sshd_factory, tmp_path, northwind, northwind_ib, settings):
    settings.VOLT_AUTO_PROVISION = True
    settings.VOLT_PROBE_MAX_MB = 4
    settings.VOLT_PROBE_ITERS = 3
    settings.VOLT_NODE_JOIN_TIMEOUT_S = 60
    settings.VOLT_HOST_PYTHON = sys.executable  # the Python with the platform's pinned Ray on these hosts
    hosts = []
    for i, address in enumerate(("127.0.0.31", "127.0.0.32")):
        sandbox = tmp_path / f"host{i}"
        create_sandbox(sandbox, inventory.default_local_spec("H100", 2, "ib_ndr") | {"seed": f"ssh-prov-{i}"})
        env = {
            "PATH": f"{sandbox}/bin:{Path(sys.executable).parent}:/usr/bin:/bin",
            "VOLT_HOST_ROOT": str(sandbox),
            "HOME": str(sandbox / "home"),
        }
        server = sshd_factory(env, listen=address)
        request = inventory.HostRequest(
            name=f"ssh-{i}",
            block=northwind_ib.blocks.first(),
            driver=DriverKind.SSH,
            price_per_gpu_hour=Decimal("2.00"),
            address=address,
            ssh_port=server.port,
            ssh_user=server.username,
            ssh_private_key=server.client_private_key,
        )
        host = inventory.onboard_host(inventory.add_host(northwind, request, queue=False).pk)
        assert host.state == "available", host.error_message
        hosts.append((host, sandbox))
    yield hosts
    for cluster in Cluster.objects.all():
        for host, _ in hosts:
            with inventory.driver_for(host) as driver:
                assert ray_nodes.node_processes(driver, ray_cluster_id(cluster)) == []


def test_two_node_cluster_over_ssh_reaches_ready_and_tears_down(alice, ssh_hosts, client_for, committed):
    client = client_for(alice)
    body = {"name": "over-ssh", "nodes": 2, "gpus_per_node": 2, "gpu_models": ["H100"]}
    with committed():
        created = client.post("/api/v1/clusters/", body, format="json").json()
    cluster = client.get(f"/api/v1/clusters/{created['id']}/").json()

    assert cluster["status"] == "ready", cluster["failure_message"]
    assert cluster["probe_result"]["nodes"] == 2
    assert cluster["connection"]["ssh_command"].startswith("ssh -i volt-cluster-")
    public_key = Cluster.objects.get(pk=cluster["id"]).ssh_public_key
    for _, sandbox in ssh_hosts:  # the cluster's key is authorized on every host
        assert public_key in (sandbox / "home/.ssh/authorized_keys").read_text()
    hosts = [host for host, _ in ssh_hosts]
    connection = cluster["connection"]
    nodes_ran_on = run_on_every_node(
        connection["dashboard_url"], [h.pk for h in hosts], connection["ray_auth_token"]
    )
    assert nodes_ran_on == {h.address for h in hosts}

    with committed():  # the terminate task runs at commit, as a worker would run it
        assert client.post(f"/api/v1/clusters/{cluster['id']}/terminate/").json()["status"] == "terminating"
    assert client.get(f"/api/v1/clusters/{cluster['id']}/").json()["status"] == "terminated"
    for _, sandbox in ssh_hosts:  # and removed again
        assert public_key not in (sandbox / "home/.ssh/authorized_keys").read_text()
    assert not Allocation.objects.filter(active=True).exists()
    assert all(h.free_gpus == 2 for h in Host.objects.all())
