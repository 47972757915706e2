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
from inventory import runtimes
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
        # Volt's runtime: the local runtime of this box sits where a provider pre-installs one
        # (/opt/volt/runtime-<key>); Volt verifies it rather than installing (tests/lab installs one).
        host = runtimes.install_runtime(host.pk)
        assert host.runtime["state"] == "ready", host.runtime
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


def test_checkpoints_on_an_ssh_head_are_scanned_through_its_driver(alice, team_a, ssh_hosts):
    """On ssh hosts the checkpoint dir lives under the cluster's workdir on the head (${HOME} expanded by
    Ray), and Volt reads it by running volt_ckpt.py scan there: what recovery resumes from. A complete
    checkpoint is synchronized; one missing a rank's shard is not, with why."""
    from clusters.models import ClusterNode
    from jobs import services as jobs
    from jobs.models import Job
    from jobs.workloads import volt_ckpt

    head, sandbox = ssh_hosts[0]
    cluster = Cluster.objects.create(
        team=team_a, created_by=alice, name="ckpt-over-ssh", status="ready",
        spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]},
    )  # fmt: skip
    workdir = ray_nodes.workdir_for(ray_cluster_id(cluster))
    cluster.storage_path = f"~/{workdir}/storage"  # as provisioning records it
    cluster.save(update_fields=["storage_path"])
    ClusterNode.objects.create(cluster=cluster, host=head, rank=0, is_head=True, gpu_indices=[0], slot=7)
    job = Job.objects.create(cluster=cluster, team=team_a, created_by=alice, entrypoint="python train.py")

    home = sandbox / "home"
    (home / workdir).mkdir(parents=True)  # what prepare_host leaves on the head
    folder = Path(jobs.checkpoint_dir(job).replace("${HOME}", str(home)))
    for step in (10, 20):  # two ranks in one process: rank 1 writes first, rank 0 gathers its entry
        other = [None]
        volt_ckpt.save(folder, step, {"w": [1, step]}, rank=1, world_size=2,
                       gather=lambda mine, seen=other: seen.__setitem__(0, mine) or [mine])  # fmt: skip
        volt_ckpt.save(folder, step, {"w": [0, step]}, rank=0, world_size=2,
                       gather=lambda mine, seen=other: [mine, seen[0]])  # fmt: skip
    (folder / volt_ckpt.step_dir_name(20) / volt_ckpt.shard_file_name(1, 2)).unlink()  # rank 1's died with it

    rows = {row.step: row for row in jobs.rescan_checkpoints(job)}

    assert sorted(rows) == [10, 20]
    assert rows[10].synchronized and rows[10].world_size == 2 and rows[10].size_bytes > 0
    assert rows[10].path == str(folder / volt_ckpt.step_dir_name(10))  # the head's own path
    assert not rows[20].synchronized and "missing" in rows[20].reason
    assert jobs.latest_synchronized_checkpoint(job).step == 10
    assert (home / workdir / "volt_ckpt.py").exists()  # shipped to the head through the driver


def test_a_jobs_log_on_an_ssh_head_is_read_through_its_driver_by_byte_offset(alice, team_a, ssh_hosts):
    """Volt reads a job's Ray driver log where Ray writes it on the head, a piece at a time from the byte the
    last read stopped at, through asyncssh: the bytes come back exactly (multi-byte text cut anywhere)."""
    import shutil

    from clusters.models import ClusterNode
    from clusters.tenancy import node_temp_dir
    from jobs import services as jobs
    from jobs.models import Job

    head, _ = ssh_hosts[0]
    cluster = Cluster.objects.create(
        team=team_a, created_by=alice, name="logs-over-ssh", status="ready",
        spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]},
    )  # fmt: skip
    node = ClusterNode.objects.create(
        cluster=cluster, host=head, rank=0, is_head=True, gpu_indices=[0], slot=8
    )
    job = Job.objects.create(cluster=cluster, team=team_a, created_by=alice, entrypoint="python train.py",
                             ray_submission_id="volt-test-job-1-a1")  # fmt: skip
    temp_dir = Path(node_temp_dir(cluster, node))
    try:
        assert jobs.read_head_log(job, 0, 100) is None  # not written yet
        logs = temp_dir / "session_2026-12-04_03-00-00_000000_9" / "logs"
        logs.mkdir(parents=True)
        (temp_dir / "session_latest").symlink_to(logs.parent)
        content = "".join(f"step {i} — données ✓\n" for i in range(3000)).encode()
        (logs / "job-driver-volt-test-job-1-a1.log").write_bytes(content)
        pieces, offset = [], 0
        while offset < len(content):
            data, size = jobs.read_head_log(job, offset, 7001)  # an odd size: cuts inside characters
            assert size == len(content) and 0 < len(data) <= 7001
            pieces.append(data)
            offset += len(data)
        assert b"".join(pieces) == content
        assert jobs.read_head_log(job, len(content), 7001) == (b"", len(content))
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_a_ready_runtime_found_at_another_path_is_recorded_not_refused(ssh_hosts):
    """Before a cluster, a host whose record names another path (a provider put one in place since) is
    checked for real: the runtime found is ready, so it is recorded and the host is not refused."""
    host = ssh_hosts[0][0]
    found = host.runtime["python"]
    Host.objects.filter(pk=host.pk).update(runtime=host.runtime | {"python": "/nowhere/bin/python"})
    host.refresh_from_db()
    assert runtimes.check_nodes([host]) == {}
    assert Host.objects.get(pk=host.pk).runtime["python"] == found
