"""A Volt cluster on lab machines that are really apart (issue 25): four machines, each its own network,
mount and PID namespace behind its own sshd, onboarded over SSH with their private addresses, given
Volt's runtime over SSH, then one API call: placement, Ray started over SSH on the machines' lab
addresses as a Unix user of the cluster's own (Volt's login there has sudo), the head's dashboard reached
through an SSH forward (the root namespace never targets a lab address), the all-reduce probe over the
shaped veth links, work on every machine, a job that finds no secret (Volt's login's files, the machine's
keys, another cluster's token and storage, other users' /proc/*/environ, sudo), and terminate leaving
nothing of the cluster on any machine, its user included."""

from __future__ import annotations

import json
import textwrap
from urllib.parse import urlsplit

import pytest
from django.test import Client

from clusters import tenancy
from clusters.models import Allocation, Cluster
from clusters.provision import ray_cluster_id
from clusters.provisioning import ray_http, ray_nodes
from clusters.telemetry import ray_head
from inventory import runtimes, services, tunnels
from inventory.choices import HostState
from inventory.drivers.base import DriverError
from inventory.drivers.ssh import SshDriver
from inventory.lab import operations
from inventory.models import Host
from tests.integration.test_provisioning import run_on_every_node
from tests.lab.conftest import onboard_machine

pytestmark = [pytest.mark.django_db]


def machine(name: str, block: str) -> dict:
    return {"name": name, "provider": "northwind", "fabric": "iad1-ndr", "block": block,
            "gpu_model": "H100", "gpu_count": 2}  # fmt: skip


TOPOLOGY = {
    "sites": {"iad1": {"region": "us-east", "backbone_gbytes_per_s": 12.5}},
    "fabrics": {"iad1-ndr": {"site": "iad1", "kind": "ib_ndr", "per_host_gbytes_per_s": 400}},
    "machines": [
        machine("nw-01", "r01"),
        machine("nw-02", "r01"),
        machine("nw-03", "r02"),
        machine("nw-04", "r02"),
    ],
}


@pytest.fixture(scope="module")
def lab(make_lab):
    return make_lab(TOPOLOGY)


@pytest.fixture
def lab_hosts(lab, northwind, northwind_ib, settings):
    settings.VOLT_AUTO_PROVISION = True
    settings.VOLT_SSH_SHARED_DIR = "/mnt/volt-shared"
    settings.VOLT_PROBE_MAX_MB = 8
    settings.VOLT_NODE_JOIN_TIMEOUT_S = 90
    blocks = {b.name: b for b in northwind_ib.blocks.all()}
    hosts = []
    for spec in TOPOLOGY["machines"]:
        host = onboard_machine(lab, northwind, northwind_ib, spec["name"], blocks[spec["block"]])
        assert host.state == HostState.AVAILABLE, host.error_message
        host = runtimes.install_runtime(host.pk)
        assert host.runtime["state"] == "ready", host.runtime
        hosts.append(host)
    yield hosts
    tunnels.close_all()


def test_a_four_machine_cluster_forms_over_ssh_runs_work_and_leaves_nothing(
    lab, lab_hosts, alice, priya, client_for, committed
):
    status = lab.status()
    assert {h.node_ip for h in lab_hosts} == {status.machine(h.name).address for h in lab_hosts}
    page = Client()
    page.force_login(priya)  # the provider's admin: the host's addresses, and who its tenants are
    html = page.get(f"/inventory/hosts/{lab_hosts[0].pk}/").content.decode()
    assert f'clusters use <span class="mono">{lab_hosts[0].private_address}</span>' in html
    assert 'id="host-tenancy"' in html and "one team at a time" in html
    assert "a Unix user of the cluster's own, made and removed by Volt through sudo" in html
    client = client_for(alice)
    body = {"name": "on-the-lab", "nodes": 4, "gpus_per_node": 1, "gpu_models": ["H100"]}
    with committed():
        created = client.post("/api/v1/clusters/", body, format="json").json()
    cluster = client.get(f"/api/v1/clusters/{created['id']}/").json()

    assert cluster["status"] == "ready", cluster["failure_message"]
    # Ray runs on the machines' lab addresses; Volt reached the head only through SSH.
    assert cluster["connection"]["ray_address"].startswith("10.77.")
    assert "-N -L 8265:10.77." in cluster["connection"]["ssh_command"]
    # The probe ran over the veth links, shaped to the lab's fabric rate between the two blocks.
    record, topology = operations.read_lab(lab.base, lab.number)
    shaped = topology.rate_bytes(topology.machine("nw-01"), topology.machine("nw-03"), record.scale)
    measured = cluster["measured_busbw_gbps"] * 1e9
    assert cluster["probe_result"]["nodes"] == 4
    assert 0.7 <= measured / shaped <= 1.3, (
        f"probe {measured / 1e6:.1f} MB/s, links shaped to {shaped / 1e6:.1f}"
    )

    # The team's key (the hand-off's SSH command) forwards the dashboard but runs nothing as Volt's user.
    model = Cluster.objects.get(pk=cluster["id"])
    head = model.nodes.select_related("host").get(is_head=True).host
    key = client.get(f"/api/v1/clusters/{cluster['id']}/ssh-key/").content.decode()
    team = SshDriver(host=head.address, port=head.ssh_port, username=head.ssh_user, private_key=key,
                     known_host_key=head.ssh_host_key)  # fmt: skip
    try:
        shell = team.run("id")
        assert not shell.ok and "uid=" not in shell.stdout
        dashboard = urlsplit(model.dashboard_url)
        forwarded = f"http://127.0.0.1:{team.forward(dashboard.hostname, dashboard.port)}"
        assert len(ray_http.list_nodes(forwarded, 10, cluster["connection"]["ray_auth_token"])) == 4
        # Nowhere else: not the head's GCS, not another host's sshd on the provider's network.
        gcs = int(model.ray_address.rsplit(":", 1)[1])
        for target in ((dashboard.hostname, gcs), (lab_hosts[1].node_ip, 22)):
            with pytest.raises(DriverError, match="would not forward"):
                team.forward(*target)
    finally:
        team.close()

    # Work lands on every machine, submitted as a pipeline would, over the same SSH forward.
    ran_on = run_on_every_node(
        ray_head.dashboard_for(model), [h.pk for h in lab_hosts], cluster["connection"]["ray_auth_token"]
    )
    assert ran_on == {h.node_ip for h in lab_hosts}

    # A second cluster of the team's, on one of the same machines: its token and storage are its own.
    with committed():
        other = client.post(
            "/api/v1/clusters/", {**body, "name": "neighbour", "nodes": 1}, format="json"
        ).json()
    other = Cluster.objects.get(pk=other["id"])
    assert other.status == "ready", other.failure_message
    other_node = other.nodes.select_related("host").get()
    seen = find_secrets(model, other, other_node, head.ssh_user)
    model.refresh_from_db()
    assert model.node_user and seen["user"] == model.node_user
    assert seen["uid"] == tenancy.ssh_node_uid(model) and seen["uid"] != 0
    assert seen["own storage"] == "written", "the job uses its own storage"
    assert {k: v for k, v in seen["found"].items() if not v.startswith("shut")} == {}, seen["found"]
    assert seen["other storage"].startswith("shut"), seen["other storage"]
    assert seen["environ"] == [], "a job reads no other user's /proc/<pid>/environ"
    assert seen["sudo"] != 0, "the cluster's user has no sudo"

    with committed():
        for number in (cluster["id"], other.pk):
            assert client.post(f"/api/v1/clusters/{number}/terminate/").json()["status"] == "terminating"
    assert client.get(f"/api/v1/clusters/{cluster['id']}/").json()["status"] == "terminated"
    for host in Host.objects.filter(pk__in=[h.pk for h in lab_hosts]):
        assert host.free_gpus == 2
        with services.driver_for(host) as driver:
            assert ray_nodes.node_processes(driver, ray_cluster_id(model)) == []
        leftover = lab.ssh(
            host.name,
            f"ls -d ~/{ray_nodes.workdir_for(ray_cluster_id(model))} 2>/dev/null; "
            f"id -u {model.node_user} {other.node_user} 2>/dev/null; "
            f"ps -eo uid= | awk '$1 == {tenancy.ssh_node_uid(model)} || $1 == {tenancy.ssh_node_uid(other)}'; true",
        )
        assert leftover.strip() == "", f"{host.name} kept {leftover!r}"
    assert not Allocation.objects.filter(active=True).exists()


SECRETS = textwrap.dedent("""
    import glob, json, os, pwd, subprocess
    import ray

    ray.init()

    @ray.remote(num_cpus=0)
    def look(files, other_storage, own_storage):
        me = os.getuid()
        found = {}
        for name, path in files.items():
            try:
                with open(path, "rb") as handle:
                    found[name] = "open: " + repr(handle.read(16))
            except OSError as exc:
                found[name] = "shut: " + type(exc).__name__
        try:
            other = "open: " + repr(os.listdir(other_storage))
        except OSError as exc:
            other = "shut: " + type(exc).__name__
        try:
            with open(os.path.join(os.path.expanduser(own_storage), "mine.txt"), "w") as handle:
                handle.write("x")
            own = "written"
        except OSError as exc:
            own = "failed: " + repr(exc)
        environ = []
        for path in glob.glob("/proc/[0-9]*/environ"):
            try:
                if os.stat(path).st_uid == me:
                    continue
                with open(path, "rb") as handle:
                    handle.read(1)
                environ.append(path)
            except OSError:
                pass
        sudo = subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode
        return {"uid": me, "user": pwd.getpwuid(me).pw_name, "found": found, "other storage": other,
                "own storage": own, "environ": environ, "sudo": sudo}

    print("VOLT_SECRETS " + json.dumps(ray.get(look.options(resources={RESOURCE: 0.01}).remote(*ARGS))))
""")


def find_secrets(cluster: Cluster, other: Cluster, other_node, login: str) -> dict:
    """What a job of `cluster`, run on the machine of `other`'s node, can read of secrets not its own."""
    files = {
        "authorized keys of Volt login": f"/home/{login}/.ssh/authorized_keys",
        "host key of the machine": "/etc/ssh/ssh_host_ed25519_key",
        "shadow": "/etc/shadow",
        "Ray token of the other cluster": f"{tenancy.node_temp_dir(other, other_node)}/auth-token",
    }
    args = [files, f"/mnt/volt-shared/{ray_cluster_id(other)}", tenancy.storage_location(cluster)]
    script = SECRETS.replace(
        "RESOURCE", json.dumps(ray_nodes.host_resource_name(other_node.host_id))
    ).replace("ARGS", json.dumps(args))
    assert "'" not in script  # it goes to the shell inside single quotes
    status, logs = ray_nodes.submit_job(
        ray_head.dashboard_for(cluster), f"python -c '{script}'", timeout_s=120,
        auth_token=tenancy.ray_auth_token(cluster),
    )  # fmt: skip
    assert status == "SUCCEEDED", logs
    line = next(line for line in logs.splitlines() if line.startswith("VOLT_SECRETS "))
    return json.loads(line.removeprefix("VOLT_SECRETS "))
