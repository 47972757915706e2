"""Automatic recovery on local hosts: real Ray processes, the real watch, the real probe.

The first test runs through a real Celery worker and beat (the watch detects, the recovery task repairs,
the retry task resumes a recovery that waited for capacity): a 3-node cluster loses a worker (SIGKILL of
its Ray processes) and gets a replacement in the same block; loses its head and is re-formed around a
new head; loses a worker with no free host, waits in RECOVERING with the reason, and resumes once a host
is onboarded. The second test calls the task bodies in this thread: a replacement that dies (an
unreachable host) is replaced in turn; with VOLT_RECOVERY_ATTEMPTS spent the cluster ends FAILED with
every GPU released and no process left.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from clusters import drills, provision, recovery, services
from clusters.models import Allocation, Cluster, Recovery
from clusters.provision import ray_cluster_id
from clusters.provisioning import ray_nodes
from clusters.telemetry import watch
from inventory import services as inventory
from inventory.drivers.local import clear_fault, set_fault
from inventory.models import Host
from tests.clusters.live_helpers import Listener, start_cluster_ids_at, worker_and_beat
from tests.integration import checkpoint_files

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
INTERVAL_S = 3.0


@pytest.fixture(autouse=True)
def recovery_settings(settings):
    settings.VOLT_PROBE_MAX_MB = 4
    settings.VOLT_PROBE_ITERS = 2
    settings.VOLT_NODE_JOIN_TIMEOUT_S = 150  # a loaded shared machine starts heads slowly
    settings.VOLT_SLOW_HOST_REPLACEMENTS = 0
    settings.VOLT_WATCH_INTERVAL_S = INTERVAL_S
    settings.VOLT_AUTO_RECOVER = True
    settings.VOLT_RECOVERY_RETRY_S = 2.0


@pytest.fixture
def hosts(northwind, northwind_ib, add_local_host):
    start_cluster_ids_at(random.randrange(100_000, 900_000))
    made = [add_local_host(northwind, northwind_ib, f"r{i}", gpus=2, price=f"2.{i}0") for i in range(5)]
    yield made
    for cluster in Cluster.objects.all():
        if cluster.status not in ("terminated", "failed"):
            services.terminate_cluster(cluster, wait=True)
    every = list(Host.objects.filter(driver="local"))
    for host in every:
        clear_fault(inventory.sandbox_path(host), "unreachable")
    for cluster in Cluster.objects.all():
        for host in every:
            with inventory.driver_for(host) as driver:
                assert ray_nodes.node_processes(driver, ray_cluster_id(cluster)) == [], (cluster, host)


def ready_cluster(team, user, nodes: int, name: str) -> Cluster:
    cluster = services.request_cluster(team, user, {"name": name, "nodes": nodes, "gpus_per_node": 2,
                                                    "gpu_models": ["H100"]})  # fmt: skip
    services.place_cluster(cluster.pk)
    cluster = provision.provision_cluster(cluster.pk)
    assert cluster.status == "ready", cluster.failure_message
    return cluster


def node_of(cluster: Cluster, *, head: bool):
    return (
        cluster.nodes.select_related("host__provider").filter(is_head=head, released_at__isnull=True).first()
    )


def kill_node(cluster: Cluster, node) -> None:
    with inventory.driver_for(node.host) as driver:
        handle = ray_nodes.find_node(driver, ray_cluster_id(cluster))
    os.killpg(handle.pgid, signal.SIGKILL)


def wait_recovery(cluster: Cluster, since: int, *, status: str, timeout_s: float = 400) -> Recovery:
    """The first recovery after id `since` reaching `status` (fails after timeout_s, saying where it is)."""
    deadline = time.monotonic() + timeout_s
    found = None
    while time.monotonic() < deadline:
        found = Recovery.objects.filter(cluster=cluster, pk__gt=since).order_by("pk").first()
        if found is not None and found.status == status:
            return found
        time.sleep(0.5)
    cluster.refresh_from_db()
    raise AssertionError(f"{cluster}: recovery {found and recovery.as_json(found)}")


def last_recovery_id(cluster: Cluster) -> int:
    return Recovery.objects.filter(cluster=cluster).order_by("-pk").values_list("pk", flat=True).first() or 0


def running_hosts(cluster: Cluster) -> set[str]:
    names = set()
    for node in provision.active_nodes(cluster):
        with inventory.driver_for(node.host) as driver:
            if ray_nodes.find_node(driver, ray_cluster_id(cluster)) is not None:
                names.add(node.host.name)
    return names


def test_worker_and_head_loss_are_repaired_and_no_capacity_waits_then_resumes(
    alice, team_a, hosts, northwind, northwind_ib, add_local_host, tmp_path
):
    cluster = ready_cluster(team_a, alice, 3, "trio")
    assert {n.host.name for n in provision.active_nodes(cluster)} == {"r0", "r1", "r2"}
    worker = node_of(cluster, head=False)

    with worker_and_beat(tmp_path, INTERVAL_S, also={"retry-recoveries": 2.0}):
        listener = Listener(alice, cluster.pk)
        # 1. A worker's Ray processes SIGKILLed: replaced by the free host of the same block, READY again.
        before = last_recovery_id(cluster)
        kill_node(cluster, worker)
        done = wait_recovery(cluster, before, status="succeeded")
        cluster.refresh_from_db()
        assert cluster.status == "ready", cluster.failure_message
        assert [h["name"] for h in done.failed_hosts] == [worker.host.name]
        assert [h["name"] for h in done.replacement_hosts] == ["r3"] and not done.head_lost
        assert "same block" in done.replacement_reason
        assert [p["phase"] for p in done.phases] == [
            "detected", "stopping", "placing", "provisioning", "verifying", "resuming", "done"
        ]  # fmt: skip
        assert done.replacement_ready_at and done.ready_at and done.gpu_hours_lost > 0
        assert Host.objects.get(pk=worker.host_id).state == "cordoned"
        assert "suspect" in Host.objects.get(pk=worker.host_id).events.first().message
        assert running_hosts(cluster) == {"r0", "r1", "r2", "r3"} - {worker.host.name}
        listener.wait_for(lambda m: m.get("kind") == "recovery" and m["recovery"]["phase"] == "placing", 5)
        listener.wait_for(lambda m: m.get("kind") == "recovery" and m["recovery"]["status"] == "succeeded", 5)
        listener.close()

        # 2. The head's processes SIGKILLed: the cluster is re-formed around a new head on the last free host.
        head = node_of(cluster, head=True)
        old_dashboard = cluster.dashboard_url
        before = last_recovery_id(cluster)
        kill_node(cluster, head)
        done = wait_recovery(cluster, before, status="succeeded")
        cluster.refresh_from_db()
        assert cluster.status == "ready" and done.head_lost, cluster.failure_message
        assert [h["name"] for h in done.failed_hosts] == [head.host.name]
        assert done.replacement_hosts[0]["name"] == "r4" and done.replacement_hosts[0]["is_head"]
        assert node_of(cluster, head=True).host.name == "r4" and cluster.dashboard_url != old_dashboard
        assert len(running_hosts(cluster)) == 3

        # 3. No free host: the cluster waits in RECOVERING with the reason; a new host lets it resume.
        worker = node_of(cluster, head=False)
        before = last_recovery_id(cluster)
        kill_node(cluster, worker)
        waiting = wait_recovery(cluster, before, status="waiting", timeout_s=120)
        cluster.refresh_from_db()
        assert cluster.status == "recovering" and "no free host" in waiting.waiting_reason
        assert "waiting for capacity" in cluster.queue_reason
        time.sleep(5)  # retried by beat meanwhile: still waiting, nothing else happened
        assert Recovery.objects.get(pk=waiting.pk).status == "waiting"
        add_local_host(northwind, northwind_ib, "r5", gpus=2, price="2.90")
        done = wait_recovery(cluster, before, status="succeeded")
        cluster.refresh_from_db()
        assert cluster.status == "ready" and cluster.queue_reason == ""
        assert [h["name"] for h in done.replacement_hosts] == ["r5"]
        assert "waiting_for_capacity" in [p["phase"] for p in done.phases]


def timeline(cluster: Cluster) -> str:
    return "\n".join(f"{e.to_status}: {e.message}" for e in cluster.events.order_by("at", "pk"))


def sweep_until_degraded(cluster: Cluster) -> None:
    for _ in range(20):
        if watch.sweep_cluster(cluster.pk) == "degraded":
            return
        time.sleep(1)
    raise AssertionError(f"{cluster} never degraded")


def test_a_replacement_that_dies_is_replaced_again_and_spent_attempts_fail_cleanly(
    alice, root, team_a, hosts, settings
):
    settings.VOLT_AUTO_RECOVER = False  # the task bodies run here, in order
    cluster = ready_cluster(team_a, alice, 2, "pair")
    worker = node_of(cluster, head=False)
    set_fault(inventory.sandbox_path(hosts[2]), "unreachable")  # the cheapest free host: placed first

    # The fault drill (as a platform admin): SIGKILL of the worker's processes, audited on the timeline.
    result = drills.run_drill(cluster, root, "kill_processes", rank=worker.rank)
    assert result.host == worker.host.name and "SIGKILL sent" in result.detail
    assert cluster.events.filter(actor=root, message__contains="fault drill run by root").exists()
    sweep_until_degraded(cluster)
    assert recovery.recover_cluster(cluster.pk) == "ready", timeline(cluster)
    done = Recovery.objects.get(cluster=cluster)
    assert done.status == "succeeded" and done.attempts == 1
    assert [h["name"] for h in done.failed_hosts] == [worker.host.name, "r2"]
    assert [h["name"] for h in done.replacement_hosts] == ["r2", "r3"]
    assert {h.name for h in Host.objects.filter(state="cordoned")} == {worker.host.name, "r2"}

    # Attempts spent: the next replacement (r4, unreachable too) dies, the cluster ends FAILED, clean.
    settings.VOLT_RECOVERY_ATTEMPTS = 1
    set_fault(inventory.sandbox_path(hosts[4]), "unreachable")
    kill_node(cluster, node_of(cluster, head=False))
    sweep_until_degraded(cluster)
    assert recovery.recover_cluster(cluster.pk) == "failed"
    cluster.refresh_from_db()
    failed = Recovery.objects.filter(cluster=cluster).order_by("-pk").first()
    assert failed.status == "failed" and "gave up" in failed.message
    assert cluster.failure_reason == "host_failed"
    assert not Allocation.objects.filter(cluster=cluster, active=True).exists()
    assert running_hosts(cluster) == set()


def wait_job(job_id: int, predicate, timeout_s: float, what: str):
    from jobs.models import Job

    deadline = time.monotonic() + timeout_s
    job = None
    while time.monotonic() < deadline:
        job = Job.objects.get(pk=job_id)
        if predicate(job):
            return job
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s:g} s; job {job and (job.status, job.last_step)}")


@pytest.mark.parametrize("lost", ["worker", "head"])
def test_a_job_interrupted_by_a_node_loss_resumes_from_its_last_checkpoint_with_the_same_result(
    lost, alice, root, team_a, hosts, tmp_path, settings
):
    """A worker's or the head's processes SIGKILLed mid-run: the node is replaced (the cluster re-formed
    around a new head), the job resumes from its last synchronized checkpoint — never from one written
    during the failure (some shards, no manifest) — and ends bitwise equal to an uninterrupted run."""
    from jobs import recovery as job_recovery
    from jobs import services as jobs

    settings.VOLT_JOB_POLL_S = 1.0
    cluster = ready_cluster(team_a, alice, 3, "train")
    steps, every = 60, 10

    def demo(step_sleep: float):
        return jobs.submit_job(cluster, alice, jobs.demo_entrypoint(steps, every, 0, step_sleep),
                               working_dir=jobs.WORKLOADS_DIR, checkpoint_every=every, is_demo=True)  # fmt: skip

    with worker_and_beat(
        tmp_path, 2.0, entries=("watch-clusters", "poll-jobs"), also={"retry-recoveries": 2.0}
    ):
        # The uninterrupted run (same seed, same 3 ranks): its final parameters are the reference.
        reference = demo(0.0)
        reference = wait_job(
            reference.pk, lambda j: j.status in ("succeeded", "failed"), 300, "reference run"
        )
        assert reference.status == "succeeded", reference.status_reason
        expected = reference.result["params_sha256"]

        job = demo(0.4)
        wait_job(job.pk, lambda j: (j.last_step or 0) >= 25, 300, "the demo past its second checkpoint")
        victim = node_of(cluster, head=lost == "head")
        before = last_recovery_id(cluster)
        drills.run_drill(cluster, root, "kill_processes", rank=victim.rank)
        # A checkpoint caught by the failure: one rank's shard of a later step, and no manifest.
        synced = checkpoint_files.synchronized_paths(job)[-1]
        partial = synced.rsplit("/", 1)[0] + "/step-00000059"
        name = checkpoint_files.shard_names(job, synced)[0]
        checkpoint_files.copy_shard_without_manifest(job, synced, partial, name)
        done = wait_recovery(cluster, before, status="succeeded")
        job = wait_job(
            job.pk, lambda j: j.status in ("succeeded", "failed", "stopped"), 400, "the resumed demo"
        )
        assert job.status == "succeeded", (job.status_reason, jobs.read_log(job)["text"][-3000:])
        assert job.attempt == 2 and job.resume_from and job.last_step == steps
        resumed_from = job.resume_from.rsplit("/", 1)[-1]
        assert resumed_from != "step-00000059" and int(resumed_from[5:]) < 59
        assert job.checkpoints.get(path=partial).synchronized is False
        if os.environ.get("VOLT_STORE_ENDPOINT"):  # the replacement downloaded it from the store
            assert job.resume_from.startswith(f"s3://{settings.VOLT_STORE_BUCKET}/clusters/")
        assert job.result["params_sha256"] == expected  # bitwise the same model as the uninterrupted run
        entry = done.jobs[0]
        assert entry["job"] == job.pk and entry["checkpoint_step"] >= 20 and 0 <= entry["steps_lost"] <= every
        assert done.checkpoint_step == entry["checkpoint_step"] and done.job_resubmitted_at is not None
        done.refresh_from_db()  # the resumed attempt's first step, recorded as the poll saw it
        assert done.training_resumed_at is not None and done.training_resumed_at > done.job_resubmitted_at
        assert job_recovery.gpu_hours_lost(job) == done.gpu_hours_lost > 0  # one job: the record's figure


def test_policy_shrink_reforms_on_the_survivors_when_no_host_is_free(alice, team_a, hosts, settings):
    settings.VOLT_AUTO_RECOVER = False  # the task bodies run here, in order
    cluster = ready_cluster(team_a, alice, 2, "shrinking")
    Cluster.objects.filter(pk=cluster.pk).update(recovery_policy="shrink")
    for host in hosts[2:]:  # no free host
        inventory.act_on_host(host, "cordon", reason="test: full")
    head = node_of(cluster, head=True)
    kill_node(cluster, head)  # the head: the survivor becomes the head of a 1-node cluster
    sweep_until_degraded(cluster)
    assert recovery.recover_cluster(cluster.pk) == "ready", timeline(cluster)
    done = Recovery.objects.get(cluster=cluster)
    assert done.status == "succeeded" and "shrunk to 1 node" in done.replacement_reason
    survivor = node_of(Cluster.objects.get(pk=cluster.pk), head=True)
    assert survivor.host_id != head.host_id and len(provision.active_nodes(cluster)) == 1
    assert not Allocation.objects.filter(cluster=cluster, active=True, node__host_id=head.host_id).exists()
    assert running_hosts(cluster) == {survivor.host.name}


def test_a_drill_cordon_ends_with_the_cluster(alice, root, team_a, hosts, settings):
    """Issue 21 finding 4, end to end: a drill kills a worker's processes, the real watch and recovery
    replace it and cordon its host as the drill's; terminate lifts that cordon (the host passes its
    health check), and the same hosts serve the next cluster."""
    settings.VOLT_AUTO_RECOVER = False  # the task bodies run here, in order
    cluster = ready_cluster(team_a, alice, 2, "drilled")
    worker = node_of(cluster, head=False)
    drills.run_drill(cluster, root, "kill_processes", rank=worker.rank)
    sweep_until_degraded(cluster)
    assert recovery.recover_cluster(cluster.pk) == "ready", timeline(cluster)
    drilled = Host.objects.get(pk=worker.host_id)
    cordon = drilled.events.filter(to_state="cordoned").first()
    assert drilled.state == "cordoned" and cordon.drill is not None and cordon.drill.actor == root
    assert "after a fault drill (kill_processes by root)" in cordon.message

    services.terminate_cluster(Cluster.objects.get(pk=cluster.pk), root, wait=True)

    drilled.refresh_from_db()
    assert drilled.state == "available", list(drilled.events.values_list("message", flat=True)[:5])
    assert "cordon after a fault drill lifted" in drilled.events.filter(to_state="available").first().message
    assert not Host.objects.filter(state="cordoned").exists()
