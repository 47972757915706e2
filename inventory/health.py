"""Host health: discovery run again on every host that is (or could come back) in service, and what its
outcome does to the host (GPUs set aside or back, reliability, OFFLINE / CORDONED / AVAILABLE).

The health sweep (beat, inventory.tasks.health_sweep) and fault drills (inventory.drill_effects) call it.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from inventory import onboarding, services, transitions
from inventory.choices import DriverKind, HostEventKind, HostState
from inventory.discovery.probe import Discovery, DiscoveryFailed, discover
from inventory.local_fabric import sync as sync_local_fabric
from inventory.models import Host, HostEvent

logger = logging.getLogger(__name__)

_RELIABILITY_WEIGHT = 0.1  # exponential moving average over sweeps


def probe_host(host: Host) -> Discovery | DiscoveryFailed:
    """Run discovery on a host without touching the database (safe in a thread pool)."""
    try:
        with services.driver_for(host) as driver:
            return discover(driver, settings.VOLT_DRIVER_TIMEOUT_S, settings.VOLT_GPU_MAX_TEMP_C)
    except DiscoveryFailed as failure:
        return failure
    except ValueError as exc:
        return DiscoveryFailed("driver_error", str(exc))


def record_health(host: Host, result: Discovery | DiscoveryFailed) -> str:
    """Store one health check's outcome. Returns "ok", "offline", "cordoned" or "unchanged"."""
    if isinstance(result, DiscoveryFailed):
        return _record_unhealthy(host, result)
    with transaction.atomic():
        changes = onboarding.apply_health(host, result)
        for change in changes:
            HostEvent.objects.create(host=host, kind=HostEventKind.HEALTH, message=change)
        if changes:  # a GPU left or rejoined free capacity; the host stays in service while one is healthy
            Host.objects.filter(pk=host.pk).update(nvlink_domain_size=onboarding.healthy_domain_size(host))
            services.refresh_free_capacity([host.pk])
            services.capacity_changed()
        reliability = min(1.0, host.reliability * (1 - _RELIABILITY_WEIGHT) + _RELIABILITY_WEIGHT)
        Host.objects.filter(pk=host.pk).update(last_heartbeat_at=timezone.now(), reliability=reliability)
        if host.state == HostState.OFFLINE:
            transitions.transition_host(host, HostState.AVAILABLE, reason="reachable and healthy again")
    return "ok"


def _record_unhealthy(host: Host, failure: DiscoveryFailed) -> str:
    """A failed check lowers the host's reliability, unless a fault drill's fault is on the host: the
    failure is the drill's, not the provider's (and what it does to the host's state ends with the
    drill's cluster)."""
    drill = services.held_drill_fault(host)
    message = failure.message
    if drill is not None:
        message += f" (fault drill {drill.drill} by {drill.actor_name} on cluster {drill.cluster_pk})"
    with transaction.atomic():
        if drill is None:
            Host.objects.filter(pk=host.pk).update(reliability=host.reliability * (1 - _RELIABILITY_WEIGHT))
        HostEvent.objects.create(host=host, kind=HostEventKind.HEALTH, message=message, drill=drill)
        unreachable = failure.code in {"unreachable", "timeout", "auth_refused", "host_key_mismatch"}
        target = HostState.OFFLINE if unreachable else HostState.CORDONED
        if host.state in (HostState.AVAILABLE, HostState.DRAINING) or (
            host.state == HostState.OFFLINE and target == HostState.CORDONED
        ):
            transitions.transition_host(
                host,
                target,
                reason=message,
                extra={"error_code": failure.code, "error_message": failure.message},
                drill=drill,
            )
            return target
    return "unchanged"


def health_sweep() -> dict:
    """Check every host that is (or could come back) in service; returns a count per outcome.

    Hosts are probed in parallel; results are written from this thread, one host at a time.
    """
    live = [HostState.AVAILABLE, HostState.DRAINING, HostState.OFFLINE]
    hosts = list(Host.objects.filter(state__in=live).select_related("provider"))  # threads must not query
    outcomes: dict[str, int] = {}
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(probe_host, hosts))
    for host, result in zip(hosts, results, strict=True):
        try:
            outcome = record_health(host, result)
        except Exception:  # noqa: BLE001 - one bad host must not stop the sweep
            logger.exception("recording the health of host %s failed", host.pk)
            outcome = "error"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    if any(host.driver == DriverKind.LOCAL for host in hosts):
        sync_local_fabric()  # fault files written by hand take effect here
    return outcomes
