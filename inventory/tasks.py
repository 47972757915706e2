"""Thin Celery tasks for the inventory: load by id, call a service."""

from inventory import services
from voltweb.taskutils import volt_task


@volt_task("provisioning", soft_time_limit=240, time_limit=300)
def onboard_host_task(host_id: int) -> str:
    """Discover a new host's hardware and make it available (or record why not)."""
    return services.onboard_host(host_id).state


@volt_task("monitoring", soft_time_limit=50, time_limit=60)
def reap_stuck_onboarding() -> int:
    """Fail hosts whose onboarding task was lost, so they never sit in ONBOARDING for ever."""
    return services.reap_stuck_onboarding()


@volt_task("monitoring", soft_time_limit=100, time_limit=120)
def health_sweep() -> dict:
    """Check every schedulable host's GPUs and reachability; cordon or mark offline what fails."""
    return services.health_sweep()
