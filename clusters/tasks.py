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
