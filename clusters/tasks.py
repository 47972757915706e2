"""Thin Celery tasks for clusters: load by id, call a service."""

from clusters import services
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
def reap_stuck_placing() -> int:
    """Send clusters stuck in PLACING (their worker died) back through placement."""
    return services.reap_stuck_placing()


@volt_task("provisioning", soft_time_limit=1500, time_limit=1560)
def provision_cluster_task(cluster_id: int) -> str:
    """Bring a placed cluster up: Ray head and workers, all-reduce probe, READY (or a clean FAILED)."""
    from clusters import provision

    return provision.provision_cluster(cluster_id).status


@volt_task("provisioning", soft_time_limit=240, time_limit=300)
def terminate_cluster_task(cluster_id: int) -> str:
    """Finish a termination whose worker died: stop processes, release GPUs."""
    from clusters.models import Cluster

    cluster = Cluster.objects.get(pk=cluster_id)
    if cluster.status != "terminating":
        return cluster.status
    return services.finish_termination(cluster).status


@volt_task("monitoring", soft_time_limit=50, time_limit=60)
def reap_stuck_provisioning() -> int:
    """Re-queue clusters whose provisioning or termination stopped making progress."""
    return services.reap_stuck_provisioning()
