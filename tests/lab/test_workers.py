"""Volt's own workers on two machines of the lab (issue 25, item 5): real Celery workers run on two control
machines (`"role": "control"`), each in its own network, mount and PID namespaces, reaching the control
plane's PostgreSQL and Redis over the lab network (the gate's back routes) and the provider's machines
through their gates, as the root namespace does. They share the placement, provisioning and monitoring
queues. The one provisioning a 4-node cluster is powered off once the Ray head is up: every process of its
machine ends mid-task. The other finishes the cluster (the reaper, as beat sends it, re-queues the task
that stopped beating; every step is idempotent): READY, four nodes, one Ray node per machine, each GPU
booked once; terminate then leaves nothing."""

from __future__ import annotations

import os
import subprocess
import time
from urllib.parse import urlsplit

import pytest
from django.conf import settings as django_settings
from django.db import connection

from clusters import services
from clusters.models import Allocation, Cluster, ClusterEvent, ClusterNode
from clusters.provision import ray_cluster_id
from clusters.provisioning import ray_http, ray_nodes
from clusters.telemetry import ray_head
from clusters.tenancy import node_temp_dir, ray_auth_token, ssh_node_uid
from inventory import runtimes, tunnels
from inventory import services as inventory
from inventory.choices import HostState
from inventory.lab import operations
from inventory.models import Host
from tests.clusters.live_helpers import start_cluster_ids_at
from tests.lab.conftest import onboard_machine
from voltweb.celery import app as celery_app
from voltweb.periodic import SCHEDULE

pytestmark = [pytest.mark.django_db(transaction=True)]

HOSTS = ["nw-01", "nw-02", "nw-03", "nw-04"]
CONTROL = ["ctl-01", "ctl-02"]
QUEUES = "placement,provisioning,monitoring"
STALE_S = 30  # VOLT_PROVISION_STALE_S of the workers: a task that stopped beating this long is re-queued


def machine(name: str, block: str, role: str = "gpu") -> dict:
    return {"name": name, "provider": "northwind", "fabric": "iad1-ndr", "block": block,
            "gpu_model": "H100", "gpu_count": 1, "role": role}  # fmt: skip


TOPOLOGY = {
    "sites": {"iad1": {"region": "us-east", "backbone_gbytes_per_s": 12.5}},
    "fabrics": {"iad1-ndr": {"site": "iad1", "kind": "ib_ndr", "per_host_gbytes_per_s": 400}},
    "machines": [
        *(machine(name, "r01") for name in HOSTS),
        *(machine(name, "ctl", "control") for name in CONTROL),
    ],
}


@pytest.fixture(scope="module")
def lab(make_lab):
    return make_lab(TOPOLOGY)


def database_url() -> str:
    """The test database, as this process reaches it (the workers get it through the lab's gate)."""
    db = connection.settings_dict
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture
def lab_hosts(lab, northwind, northwind_ib, settings):
    if connection.vendor != "postgresql":
        pytest.skip(
            "workers on other machines share the control plane's database: run with DATABASE_URL=postgres://…"
        )
    settings.VOLT_INSTALL_ID = f"labt{lab.number}"
    settings.VOLT_SSH_SHARED_DIR = "/mnt/volt-shared"
    start_cluster_ids_at(700_000 + lab.number * 100)
    hosts = []
    for name in HOSTS:
        host = onboard_machine(lab, northwind, northwind_ib, name)
        assert host.state == HostState.AVAILABLE, host.error_message
        host = runtimes.install_runtime(host.pk)
        assert host.runtime["state"] == "ready", host.runtime
        hosts.append(host)
    yield hosts
    for cluster in Cluster.objects.exclude(status__in=["terminated", "failed"]):
        services.terminate_cluster(cluster, wait=True)
    tunnels.close_all()


@pytest.fixture
def lab_workers(lab, lab_hosts, tmp_path):
    """One Volt worker per control machine, as `lab worker` starts them; {name: its log file}."""
    with celery_app.connection_for_write() as conn:
        for queue in django_settings.VOLT_QUEUES:
            conn.default_channel.queue_purge(queue)
    environ = dict(
        os.environ,
        DATABASE_URL=database_url(),
        REDIS_URL=django_settings.REDIS_URL,
        VOLT_INSTALL_ID=django_settings.VOLT_INSTALL_ID,
        SECRET_KEY=django_settings.SECRET_KEY,  # decrypts the hosts' SSH keys, as here
        VOLT_SSH_SHARED_DIR="/mnt/volt-shared",
        VOLT_AUTO_PROVISION="1",
        VOLT_AUTO_RECOVER="0",
        VOLT_LOCAL_FABRIC_EMULATION="off",
        VOLT_PROBE_MAX_MB="4",
        VOLT_PROBE_ITERS="2",
        VOLT_NODE_JOIN_TIMEOUT_S="150",
        VOLT_SLOW_HOST_REPLACEMENTS="0",
        VOLT_PROVISION_STALE_S=str(STALE_S),
    )
    env = operations.worker_environment(lab.base, lab.number, environ)
    assert env["DATABASE_URL"].split("@")[1].startswith("10.77.0.1:") and "10.77.0.1:" in env["REDIS_URL"]
    logs, processes = {}, []
    for name in CONTROL:
        logs[name] = tmp_path / f"{name}.log"
        argv = ["-Q", QUEUES, "-n", f"volt@{name}", "--prefetch-multiplier", "1", "-c", "2", "-l", "INFO"]
        command = operations.worker_command(lab.base, lab.number, name, argv)
        assert env["SECRET_KEY"] not in " ".join(command)  # secrets go in its environment, not its argv
        with open(logs[name], "wb") as log:
            processes.append(
                subprocess.Popen(
                    command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
    names = {f"volt@{name}" for name in CONTROL}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        replies = celery_app.control.ping(destination=sorted(names), timeout=2)
        if {name for reply in replies for name in reply} == names:
            break
        assert all(p.poll() is None for p in processes), {n: logs[n].read_text()[-2000:] for n in CONTROL}
    else:
        pytest.fail(f"the workers did not answer: { {n: logs[n].read_text()[-2000:] for n in CONTROL} }")
    yield logs
    for name in CONTROL:
        if lab.status().machine(name).power == "on":
            lab.manage("power-off", name)  # ends its worker
    for process in processes:
        process.wait(30)


def provisioning_worker(cluster: Cluster) -> str | None:
    """The control machine whose worker runs `cluster`'s provisioning task now."""
    active = celery_app.control.inspect(destination=[f"volt@{n}" for n in CONTROL], timeout=3).active() or {}
    for worker, tasks in active.items():
        for task in tasks:
            if task["name"] == "clusters.tasks.provision_cluster_task" and task["args"] == [cluster.pk]:
                return worker.split("@", 1)[1]
    return None


def send_reaper() -> None:
    """What beat sends every minute (voltweb/periodic.py), sent now."""
    entry = SCHEDULE["reap-stuck-provisioning"]
    celery_app.send_task(entry["task"], **entry["options"])


def test_a_worker_machine_powered_off_mid_provisioning_leaves_the_other_to_finish_the_cluster(
    lab, lab_hosts, lab_workers, alice, team_a
):
    # Only control machines are served: a provider's machine, where jobs run, gets no answer from Redis.
    port = urlsplit(django_settings.REDIS_URL).port or 6379
    ping = (f"import socket; s = socket.create_connection(('10.77.0.1', {port}), 5); s.settimeout(5); "
            "s.sendall(b'PING\\r\\n'); print(repr(s.recv(16)))")  # fmt: skip
    assert "PONG" in lab.exec(CONTROL[0], "python3", "-c", ping).stdout
    refused = lab.exec(HOSTS[0], "python3", "-c", ping)
    assert "PONG" not in refused.stdout, refused  # closed at once (or reset): nothing is relayed

    cluster = services.request_cluster(
        team_a, alice, {"name": "two-workers", "nodes": 4, "gpus_per_node": 1, "gpu_models": ["H100"]}
    )  # committed at once: placement is queued for the lab's workers
    deadline, victim = time.monotonic() + 240, None
    while time.monotonic() < deadline and victim is None:
        if ClusterEvent.objects.filter(cluster=cluster, message__startswith="Ray head up on").exists():
            victim = provisioning_worker(cluster)
        cluster.refresh_from_db()
        assert cluster.status in ("pending", "placing", "provisioning"), (
            cluster.status,
            cluster.failure_message,
        )
        time.sleep(0.2)
    assert victim, f"no worker was seen provisioning with the head up ({cluster.status})"
    lab.manage("power-off", victim)  # its worker and every SSH connection of it end mid-task
    survivor = next(name for name in CONTROL if name != victim)

    deadline = time.monotonic() + STALE_S + 300
    while time.monotonic() < deadline:
        cluster.refresh_from_db()
        if cluster.status in ("ready", "failed"):
            break
        send_reaper()
        time.sleep(3)
    assert cluster.status == "ready", (cluster.status, cluster.failure_message)
    finished = lab_workers[survivor].read_text()
    assert "provision_cluster_task" in finished and "succeeded" in finished, finished[-3000:]

    # Whole, and booked once: four nodes on four machines, one Ray node each, each GPU allocated once.
    nodes = list(ClusterNode.objects.filter(cluster=cluster, released_at__isnull=True).select_related("host"))
    assert sorted(n.host.name for n in nodes) == HOSTS
    active = list(Allocation.objects.filter(active=True))
    assert len(active) == 4 and all(a.cluster_id == cluster.pk for a in active)
    assert len({a.gpu_id for a in active}) == 4
    assert all(h.free_gpus == 0 for h in Host.objects.filter(name__in=HOSTS))
    alive = ray_http.list_nodes(ray_head.dashboard_for(cluster), 10, ray_auth_token(cluster))
    assert len([n for n in alive if n.get("state", "ALIVE") == "ALIVE"]) == 4, alive
    counts = {
        name: lab.ssh(name, "pgrep -c -x raylet; pgrep -c -x gcs_server; true").split() for name in HOSTS
    }
    assert all(c[0] == "1" for c in counts.values()), counts  # one Ray node per machine, not two
    assert sum(int(c[1]) for c in counts.values()) == 1, counts  # one head

    # Every node's Ray temp dir is under the install's id, whichever worker started it (the test's process
    # tears it down below by that same name).
    made = {name: lab.ssh(name, f"ls -d /tmp/volt-ray/*/{cluster.pk}-*").split() for name in HOSTS}
    assert all(len(dirs) == 1 for dirs in made.values()), made
    assert all(d[0].startswith(f"/tmp/volt-ray/{django_settings.VOLT_INSTALL_ID}/") for d in made.values()), (
        made
    )

    services.terminate_cluster(cluster, wait=True)
    cluster.refresh_from_db()
    assert cluster.status == "terminated"
    assert not Allocation.objects.filter(active=True).exists()
    for host in Host.objects.filter(name__in=HOSTS):
        assert host.free_gpus == 1
        with inventory.driver_for(host) as driver:
            assert ray_nodes.node_processes(driver, ray_cluster_id(cluster)) == []
        # Its Ray temp dirs under any install's name: a worker naming the install otherwise than the one
        # that tears down would leave them (node_temp_dir is where this install looks).
        assert all(
            node_temp_dir(cluster, n).startswith(f"/tmp/volt-ray/{django_settings.VOLT_INSTALL_ID}/")
            for n in nodes
        )
        leftover = lab.ssh(
            host.name,
            f"ls -d ~/{ray_nodes.workdir_for(ray_cluster_id(cluster))} /tmp/volt-ray/*/{cluster.pk}-* 2>/dev/null; "
            f"id -u {cluster.node_user} 2>/dev/null; ps -eo uid= | awk '$1 == {ssh_node_uid(cluster)}'; true",
        )
        assert leftover.strip() == "", f"{host.name} kept {leftover!r}"
