"""What fault drills leave on hosts, and taking it back when their cluster ends (issue 21, finding 4).

A drill (clusters/drills.py) is recorded here as a HostDrill row before it touches the host. Two things
can outlast it: the fault file it injected, and a cordon recovery put on the host because the drill made
the node there fail (that cordon's HostEvent names the drill). When the cluster ends, terminated or
failed, both are undone, and only those: a fault the host already had, or a cordon someone else put,
stays.

    cluster ends ─▶ clear_drill_faults(): the fault files its drills hold (unless a drill of another live
                    cluster holds the same one), before its hosts are torn down: they answer again
                 ─▶ end_drills(): faults again (a drill that raced the end), then every host its drills left
                    cordoned or offline is health-checked: passing → back in service ("cordon after a
                    fault drill lifted"), failing → stays out with the check's message (a real fault);
                    its rows are closed
    beat ─▶ clusters' reaper ends the drills of clusters that ended without it (a worker died)

A failed health check while a drill's fault is on the host is the drill's, not the provider's: it does
not lower the host's reliability (inventory.health.record_health).
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from inventory import drill_records, health, local_fabric, services
from inventory.choices import HostEventKind, HostState
from inventory.discovery.probe import DiscoveryFailed
from inventory.models import Host, HostDrill, HostEvent


def record_drill(
    host: Host,
    *,
    cluster_pk: int,
    cluster_name: str,
    team,
    actor: AbstractBaseUser | None,
    drill: str,
    fault: str = "",
    value: str = "",
) -> HostDrill:
    """The row of a drill about to run on `host`. A fault the host already has (not a drill's) is real: the
    drill does not hold it, so its cluster's end leaves it there."""
    held = bool(fault) and (
        fault not in local_fabric.active_faults(host) or drill_records.holding(host.pk, fault).exists()
    )
    return HostDrill.objects.create(
        host=host,
        cluster_pk=cluster_pk,
        cluster_name=cluster_name[:100],
        team=team,
        actor=actor if actor is not None and actor.is_authenticated else None,
        drill=drill,
        fault=fault,
        value=value[:20],
        fault_held=held,
    )


def clear_drill_faults(cluster_pk: int, why: str) -> int:
    """Take back the fault files the cluster's drills hold. Returns how many files were removed."""
    removed = 0
    rows = HostDrill.objects.filter(
        cluster_pk=cluster_pk, fault_held=True, fault_cleared_at__isnull=True
    ).select_related("host__provider")
    for row in rows:
        shared = (
            drill_records.holding(row.host_id, row.fault)
            .exclude(cluster_pk=cluster_pk)
            .filter(ended_at__isnull=True)
        )
        if shared.exists():  # a live cluster's drill put it there too: its own end takes it back
            HostDrill.objects.filter(pk=row.pk).update(fault_cleared_at=timezone.now())
            continue
        local_fabric.clear_host_fault(row.host, row.fault, reason=why)
        removed += 1
    return removed


def take_back_drill(drill: HostDrill, why: str) -> None:
    """Remove the fault file `drill` put there (a drill that raced its cluster's end: the end may have run
    before the file was written), unless a drill of another live cluster holds it too."""
    if not drill.fault_held:
        return
    shared = drill_records.holding(drill.host_id, drill.fault).exclude(cluster_pk=drill.cluster_pk)
    if not shared.filter(ended_at__isnull=True).exists():
        local_fabric.clear_host_fault(
            Host.objects.select_related("provider").get(pk=drill.host_id), drill.fault, reason=why
        )


def end_drills(cluster_pk: int, why: str) -> None:
    """The cluster ended: nothing its drills did stays on its hosts (see the module docstring). Idempotent."""
    clear_drill_faults(cluster_pk, why)
    rows = list(HostDrill.objects.filter(cluster_pk=cluster_pk, ended_at__isnull=True).select_related("host"))
    for host_id in sorted({row.host_id for row in rows}):
        _restore(Host.objects.select_related("provider").get(pk=host_id), cluster_pk, why)
    HostDrill.objects.filter(pk__in=[row.pk for row in rows]).update(ended_at=timezone.now())


def _restore(host: Host, cluster_pk: int, why: str) -> None:
    """Back in service if the host is out because of this cluster's drill and passes a health check now."""
    drill = drill_records.drill_keeping_out(host)
    if drill is None or drill.cluster_pk != cluster_pk:
        return
    result = health.probe_host(host)
    if isinstance(result, DiscoveryFailed):
        HostEvent.objects.create(
            host=host,
            kind=HostEventKind.ERROR,
            message=f"stays {host.state} after its fault drill ended ({why}): "
            f"its health check fails: {result.message}",
        )
        return
    if host.state == HostState.CORDONED:
        services.act_on_host(host, "uncordon", reason=f"cordon after a fault drill lifted: {why}")
    health.record_health(Host.objects.select_related("provider").get(pk=host.pk), result)
