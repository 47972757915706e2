"""Thin Celery tasks for clusters: load by id, call a service."""

from clusters import durations, provision, recovery, services
from clusters.choices import ClusterStatus
from clusters.models import Cluster
from clusters.telemetry import bandwidth_watch, metrics, watch
from voltweb.taskutils import volt_task


@volt_task("placement", soft_time_limit=50, time_limit=60)
def place_cluster_task(cluster_id: int) -> str:
    """Place a requested or queued cluster (idempotent)."""
    return services.place_cluster(cluster_id).status


@volt_task("placement", soft_time_limit=110, time_limit=120)
def drain_queue_task() -> int:
    """Place queued clusters that now fit, in priority then FIFO order."""
    return services.drain_queue()


@volt_task("placement", soft_time_limit=50, time_limit=60)
def expire_clusters_task() -> dict:
    """Clusters whose requested duration ends soon are warned; those past it are terminated."""
    return durations.expire_clusters()


@volt_task("placement", soft_time_limit=50, time_limit=60)
def reap_stuck_placing() -> int:
    """Send clusters stuck in PLACING (their worker died) back through placement."""
    return services.reap_stuck_placing()


@volt_task("provisioning", soft_time_limit=1500, time_limit=1560)
def provision_cluster_task(cluster_id: int) -> str:
    """Bring a placed cluster up: Ray head and workers, all-reduce probe, READY (or a clean FAILED)."""
    return provision.provision_cluster(cluster_id).status


@volt_task("provisioning", soft_time_limit=240, time_limit=300)
def terminate_cluster_task(cluster_id: int) -> str:
    """Finish a termination whose worker died: stop processes, release GPUs."""
    cluster = Cluster.objects.get(pk=cluster_id)
    if cluster.status != ClusterStatus.TERMINATING:
        return cluster.status
    return services.finish_termination(cluster).status


@volt_task("monitoring", soft_time_limit=50, time_limit=60)
def reap_stuck_provisioning() -> int:
    """Re-queue clusters whose provisioning or termination stopped making progress."""
    return services.reap_stuck_provisioning()


@volt_task("monitoring", soft_time_limit=240, time_limit=300)
def reap_cluster_leftovers() -> dict:
    """Retry what ended clusters left: their Unix user, their store key, their drills' faults and cordons."""
    return services.reap_cluster_leftovers()


# --- telemetry (clusters/telemetry/watch.py, clusters/telemetry/metrics.py, clusters/telemetry/bandwidth_watch.py) -----------------


@volt_task("monitoring", soft_time_limit=20, time_limit=30)
def watch_clusters_task() -> int:
    """Fan out: one sweep task per live cluster, each expiring after one watch interval."""
    from django.conf import settings

    ids = watch.watched_cluster_ids()
    for cluster_id in ids:
        sweep_cluster_task.apply_async((cluster_id,), expires=settings.VOLT_WATCH_INTERVAL_S)
    return len(ids)


@volt_task("monitoring", soft_time_limit=60, time_limit=90)
def sweep_cluster_task(cluster_id: int) -> str:
    """Check one cluster's head and hosts and give each node a verdict (skipped while one still runs)."""
    return watch.sweep_cluster(cluster_id)


@volt_task("monitoring", soft_time_limit=240, time_limit=300)
def compact_metrics_task() -> dict:
    """Fold raw samples into per-minute aggregates and apply both retentions."""
    return metrics.compact()


# On the provisioning queue (long tasks): a probe must not hold up the watch on the monitoring queue.
@volt_task("provisioning", soft_time_limit=900, time_limit=960)
def probe_cluster_task(cluster_id: int) -> float | None:
    """Run the light all-reduce probe on a READY cluster; store the sample, raise or clear the alert."""
    result = bandwidth_watch.run_probe(cluster_id)
    return (result or {}).get("max_busbw_gbps")


@volt_task("monitoring", soft_time_limit=50, time_limit=60)
def probe_idle_clusters_task() -> int:
    """Queue a probe for every READY cluster that is due one and runs no job."""
    return bandwidth_watch.probe_idle_clusters()


# --- recovery (clusters/recovery.py) ------------------------------------------------------------------


@volt_task("provisioning", soft_time_limit=1500, time_limit=1560)
def recover_cluster_task(cluster_id: int) -> str:
    """Replace a DEGRADED cluster's failed nodes, verify, READY (or wait for capacity, or a clean FAILED)."""
    return recovery.recover_cluster(cluster_id)


@volt_task("monitoring", soft_time_limit=50, time_limit=60)
def retry_recoveries_task() -> int:
    """Retry recoveries waiting for capacity or stalled, and start one for a DEGRADED cluster without."""
    return recovery.retry_recoveries()
