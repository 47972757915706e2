"""Recovery on lab machines (issues 25 and 27): a 3-node cluster of five machines that are really apart
runs the demo job with checkpoints in the checkpoint store, which the machines reach through the lab's
gate (without a store: on the lab's shared folder, VOLT_SSH_SHARED_DIR). A worker's machine is powered off —
every process of it ends, its sshd included — then the head's: each time the real watch (Celery beat and
worker, through Redis) finds the cluster DEGRADED, recovery re-forms it on a spare machine, and the job
resumes from its last synchronized checkpoint. Its final parameters are bitwise those of an uninterrupted
run on the same cluster.

With the store (issue 27), a worker's machine is also powered off while its shard is on the wire (its path to
the store slowed with tc inside its own namespace): that checkpoint stays without a manifest, is reported
incomplete, and the job resumes from the one before; at the end retention has left exactly K, and another
team's key, used from a lab machine against the store's S3 API, gets "AccessDenied"."""

from __future__ import annotations

import os
import random
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from clusters import provision, services
from clusters.models import Allocation, Cluster
from clusters.provision import ray_cluster_id
from clusters.provisioning import ray_nodes
from inventory import runtimes, tunnels
from inventory import services as inventory
from inventory.choices import HostState
from inventory.lab import network
from inventory.models import Host
from tests.clusters.live_helpers import start_cluster_ids_at, worker_and_beat
from tests.integration.test_recovery import last_recovery_id, node_of, wait_job, wait_recovery
from tests.lab.conftest import onboard_machine

pytestmark = [pytest.mark.django_db(transaction=True)]

NAMES = ["nw-01", "nw-02", "nw-03", "nw-04", "nw-05"]
TOPOLOGY = {
    "sites": {"iad1": {"region": "us-east", "backbone_gbytes_per_s": 12.5}},
    "fabrics": {"iad1-ndr": {"site": "iad1", "kind": "ib_ndr", "per_host_gbytes_per_s": 400}},
    "machines": [
        {
            "name": name,
            "provider": "northwind",
            "fabric": "iad1-ndr",
            "block": "r01",
            "gpu_model": "H100",
            "gpu_count": 1,
        }  # fmt: skip
        for name in NAMES
    ],
}


@pytest.fixture(scope="module")
def lab(make_lab):
    return make_lab(TOPOLOGY)


@pytest.fixture
def lab_hosts(lab, northwind, northwind_ib, settings):
    settings.VOLT_SSH_SHARED_DIR = "/mnt/volt-shared"
    # With a store (scripts/test starts one), the machines reach it through the lab's gate: checkpoints go
    # there, not to the shared folder.
    settings.VOLT_STORE_NODE_ENDPOINT = lab.status().store_endpoint
    settings.VOLT_PROBE_MAX_MB = 4
    settings.VOLT_PROBE_ITERS = 2
    settings.VOLT_NODE_JOIN_TIMEOUT_S = 150
    settings.VOLT_SLOW_HOST_REPLACEMENTS = 0
    settings.VOLT_WATCH_INTERVAL_S = 2.0
    settings.VOLT_AUTO_RECOVER = True
    settings.VOLT_RECOVERY_RETRY_S = 2.0
    settings.VOLT_JOB_POLL_S = 1.0
    start_cluster_ids_at(random.randrange(100_000, 900_000))
    hosts = [onboard_machine(lab, northwind, northwind_ib, name) for name in NAMES]
    assert all(h.state == HostState.AVAILABLE for h in hosts), [h.error_message for h in hosts]

    def install(host_id: int):
        try:
            return runtimes.install_runtime(host_id)
        finally:
            connection.close()

    # Machines bootstrap in parallel, as onboarding queues them (SQLite, one writer at a time: in turn).
    with ThreadPoolExecutor(len(hosts) if connection.vendor == "postgresql" else 1) as pool:
        hosts = list(pool.map(install, [h.pk for h in hosts]))
    assert all(h.runtime["state"] == "ready" for h in hosts), [h.runtime for h in hosts]
    yield hosts
    for cluster in Cluster.objects.exclude(status__in=["terminated", "failed"]):
        services.terminate_cluster(cluster, wait=True)
    tunnels.close_all()


# Run by a lab machine's Python (Volt's runtime, which has boto3): list a checkpoint's prefix and read its
# manifest with the key given, printing what the store answered to each.
OTHER_KEY_PROBE = """
import sys, boto3
from botocore.exceptions import ClientError
endpoint, key, secret, bucket, prefix = sys.argv[1:6]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=key,
                  aws_secret_access_key=secret)
for call in (lambda: s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/"),
             lambda: s3.get_object(Bucket=bucket, Key=prefix + "/manifest.json")):
    try:
        call()
        print("allowed")
    except ClientError as error:
        print(error.response["Error"]["Code"])
"""


def slow_store_path(lab, name: str, bits_per_s: int | None) -> None:
    """Slow (None: restore) what machine `name` sends to the lab's store address, inside its own namespace
    (whatever its power): an HTB root whose one class, where only the store's traffic goes, has that rate (the
    rest goes direct, as in the lab's own shaping)."""
    namespace = network.machine_namespace(lab.number, name)
    store = lab.status().store_endpoint.split("//", 1)[1].split(":")[0]
    device = network.MACHINE_DEVICE
    lines = [f"qdisc del dev {device} root"]
    if bits_per_s is not None:
        lines = [
            f"qdisc replace dev {device} root handle 1: htb",
            f"class add dev {device} parent 1: classid 1:1 htb rate {bits_per_s}bit ceil {bits_per_s}bit "
            "burst 70000 cburst 70000",
            f"filter add dev {device} parent 1: protocol ip prio 1 u32 match ip dst {store}/32 flowid 1:1",
        ]
    subprocess.run(["ip", "netns", "exec", namespace, "tc", "-force", "-batch", "-"],
                   input="\n".join(lines) + "\n", text=True, check=bits_per_s is not None, capture_output=True)  # fmt: skip


def wait_for(what: str, predicate, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout_s:g} s")


def power_off(lab, node) -> str:
    lab.manage("power-off", node.host.name)
    return node.host.name


def test_powering_off_a_worker_then_the_head_recovers_onto_spares_and_the_job_ends_bitwise_equal(
    lab, lab_hosts, alice, team_a, tmp_path
):
    from jobs import services as jobs

    cluster = services.request_cluster(
        team_a, alice, {"name": "lab-train", "nodes": 3, "gpus_per_node": 1, "gpu_models": ["H100"]}
    )
    services.place_cluster(cluster.pk)
    cluster = provision.provision_cluster(cluster.pk)
    assert cluster.status == "ready", cluster.failure_message
    steps, every = 100, 10

    def demo(step_sleep: float):
        return jobs.submit_job(cluster, alice, jobs.demo_entrypoint(steps, every, 0, step_sleep),
                               working_dir=jobs.WORKLOADS_DIR, checkpoint_every=every, is_demo=True)  # fmt: skip

    off = []
    try:
        with worker_and_beat(
            tmp_path, 2.0, entries=("watch-clusters", "poll-jobs"), also={"retry-recoveries": 2.0}
        ):
            reference = wait_job(
                demo(0.0).pk, lambda j: j.status in ("succeeded", "failed"), 400, "reference"
            )
            assert reference.status == "succeeded", reference.status_reason
            expected = reference.result["params_sha256"]

            job = demo(0.5)
            wait_job(job.pk, lambda j: (j.last_step or 0) >= 25, 300, "the demo past its second checkpoint")
            before = last_recovery_id(cluster)
            off.append(power_off(lab, node_of(cluster, head=False)))
            first = wait_recovery(cluster, before, status="succeeded")
            assert [h["name"] for h in first.failed_hosts] == off and not first.head_lost

            resumed_at = wait_job(job.pk, lambda j: j.attempt == 2 and (j.last_step or 0) > 0, 300, "resumed")
            wait_job(
                job.pk, lambda j: (j.last_step or 0) >= resumed_at.last_step + every, 300, "a checkpoint"
            )
            before = last_recovery_id(cluster)
            off.append(power_off(lab, node_of(cluster, head=True)))
            second = wait_recovery(cluster, before, status="succeeded")
            assert [h["name"] for h in second.failed_hosts] == off[1:] and second.head_lost

            job = wait_job(job.pk, lambda j: j.status in ("succeeded", "failed", "stopped"), 500, "the end")
        assert job.status == "succeeded", (job.status_reason, jobs.read_log(job)["text"][-3000:])
        assert job.attempt == 3 and job.last_step == steps
        assert job.result["params_sha256"] == expected  # bitwise the same model as the uninterrupted run
        if os.environ.get("VOLT_STORE_ENDPOINT"):  # the replacements downloaded it from the store
            assert lab.status().store_endpoint and job.resume_from.startswith("s3://"), job.resume_from
        cluster.refresh_from_db()
        assert cluster.status == "ready"
        assert {n.host.name for n in provision.active_nodes(cluster)}.isdisjoint(off)
        assert set(Host.objects.filter(state=HostState.CORDONED).values_list("name", flat=True)) == set(off)

        assert cluster.node_user  # the job ran as the cluster's own user on every machine, replacements too

        services.terminate_cluster(cluster, alice, wait=True)
        assert not Allocation.objects.filter(active=True).exists()
        for host in Host.objects.exclude(name__in=off):
            with inventory.driver_for(host) as driver:
                assert ray_nodes.node_processes(driver, ray_cluster_id(cluster)) == []
            assert lab.ssh(host.name, f"id -u {cluster.node_user} 2>/dev/null; true").strip() == ""
    finally:
        for name in off:
            lab.manage("power-on", name, check=False)


def test_a_machine_powered_off_mid_upload_leaves_its_checkpoint_incomplete_and_never_resumed_from(
    lab, lab_hosts, alice, team_a, tmp_path, settings
):
    from jobs import checkpoints, onray
    from jobs import services as jobs
    from jobs.workloads import volt_ckpt, volt_store
    from voltweb import object_store

    assert lab.status().store_endpoint, "this test needs the checkpoint store: run it under scripts/test"
    settings.VOLT_CHECKPOINT_KEEP = 2
    cluster = services.request_cluster(
        team_a, alice, {"name": "lab-upload", "nodes": 3, "gpus_per_node": 1, "gpu_models": ["H100"]}
    )
    services.place_cluster(cluster.pk)
    cluster = provision.provision_cluster(cluster.pk)
    assert cluster.status == "ready", cluster.failure_message
    steps, every = 50, 10
    job = jobs.submit_job(cluster, alice, jobs.demo_entrypoint(steps, every, 0, 1.0),
                          working_dir=jobs.WORKLOADS_DIR, checkpoint_every=every, is_demo=True)  # fmt: skip
    root, store = onray.checkpoint_dir(job), checkpoints.store_client(cluster)
    step_10, step_20 = volt_ckpt.checkpoint_path(root, 10), volt_ckpt.checkpoint_path(root, 20)
    worker_node = node_of(cluster, head=False)
    worker = worker_node.host.name
    off = []
    try:
        with worker_and_beat(
            tmp_path, 2.0, entries=("watch-clusters", "poll-jobs"), also={"retry-recoveries": 2.0}
        ):
            wait_for("step 10's manifest", lambda: store.info(f"{step_10}/{volt_ckpt.MANIFEST}"), 300)
            shard = max(store.listing(step_10)[1].values())
            # From now on the worker's shard takes about 40 s to reach the store; its next save is step 20's,
            # 10 s of training later.
            slow_store_path(lab, worker, max(64_000, shard * 8 // 40))

            def on_the_wire():  # the worker's shard of step 20 in its staging folder, not yet in the store
                staged = lab.exec(worker, "find", "/tmp", "/var/tmp", "-path", "*/volt-ckpt-*/step-00000020/*",
                                  "-type", "f").stdout  # fmt: skip
                files = [line.rsplit("/", 1)[1] for line in staged.split()]  # <shard>.<save token>
                names = [file.rsplit(".", 1)[0] for file in files if not file.startswith(".")]
                return [n for n in names if store.info(f"{step_20}/{n}") is None]

            try:
                in_flight = wait_for("the worker's upload of step 20", on_the_wire, 120)
            except AssertionError as exc:
                seen = lab.exec(
                    worker, "sh", "-c", "find /tmp /var/tmp -path '*volt-ckpt*'; tc -s class show dev eth0"
                )
                job.refresh_from_db()
                raise AssertionError(f"{exc}; job at step {job.last_step}; on {worker}: {seen.stdout[-2000:]}; "
                                     f"in the store: {store.listing(step_20)}") from None  # fmt: skip
            before = last_recovery_id(cluster)
            off.append(power_off(lab, worker_node))
            recovery = wait_recovery(cluster, before, status="succeeded")
            assert [h["name"] for h in recovery.failed_hosts] == off

            resumed = wait_job(job.pk, lambda j: j.attempt == 2 and j.resume_from, 300, "resumed")
            assert resumed.resume_from == step_10, resumed.resume_from  # never from step 20
            row = resumed.checkpoints.get(path=step_20)  # as the recovery's rescan saw it
            assert not row.synchronized and row.reason == "no manifest", (row.synchronized, row.reason)
            assert store.info(f"{step_20}/{in_flight[0]}") is None

            job = wait_job(job.pk, lambda j: j.status in ("succeeded", "failed", "stopped"), 400, "the end")
        assert job.status == "succeeded", (job.status_reason, jobs.read_log(job)["text"][-3000:])
        assert job.attempt == 2 and job.last_step == steps

        # Retention, once the job has ended: exactly its last K synchronized checkpoints stay in the store.
        checkpoints.rescan_checkpoints(job)
        left = volt_ckpt.scan(root, store=store)
        assert [(e["step"], e["synchronized"]) for e in left] == [(40, True), (50, True)], left
        assert job.checkpoints.get(path=step_20).synchronized is False  # the new attempt's, then retention's

        # Another team's cluster key, used from a lab machine straight against the store's S3 API: the store
        # itself refuses it this cluster's checkpoints.
        admin, other_name = object_store.from_settings(), f"volt-lab-other-{cluster.pk}"
        other = admin.grant(other_name, f"clusters/{other_name}/")
        try:
            bucket, key = volt_store.split(volt_ckpt.checkpoint_path(root, steps))
            head = node_of(cluster, head=True).host
            tried = lab.exec(head.name, head.runtime["python"], "-c", OTHER_KEY_PROBE, lab.status().store_endpoint,
                             other.access_key, other.secret_key, bucket, key)  # fmt: skip
            assert tried.stdout.split() == ["AccessDenied", "AccessDenied"], (tried.stdout, tried.stderr)
        finally:
            admin.revoke(other_name)
        services.terminate_cluster(cluster, alice, wait=True)
    finally:
        slow_store_path(lab, worker, None)
        for name in off:
            lab.manage("power-on", name, check=False)
