"""Thin Celery tasks for the inventory: load by id, call a service."""

from inventory import health, reachability, runtimes, services
from inventory.models import Host
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
    return health.health_sweep()


@volt_task("provisioning", soft_time_limit=1900, time_limit=1960)
def install_runtime_task(host_id: int) -> str:
    """Install (or verify) Volt's runtime on an SSH host; the host joins the offers when it is ready."""
    return runtimes.install_runtime(host_id).runtime.get("state", "")


@volt_task("monitoring", soft_time_limit=50, time_limit=60)
def refresh_runtimes() -> int:
    """Bring idle SSH hosts' runtimes up to Volt's current pins (busy ones after their cluster ends)."""
    return runtimes.refresh_runtimes()


@volt_task("provisioning", soft_time_limit=100, time_limit=120)
def check_reachability_task(host_id: int) -> int:
    """Record which peers of its provider reach a new SSH host directly (inventory/reachability.py)."""
    host = Host.objects.filter(pk=host_id).first()
    return len(reachability.check(host)) if host is not None else 0


@volt_task("monitoring", soft_time_limit=200, time_limit=240)
def recheck_reachability() -> int:
    """Check again the SSH hosts whose reachability is the stalest (VOLT_REACHABILITY_RECHECK_S)."""
    return reachability.recheck()
