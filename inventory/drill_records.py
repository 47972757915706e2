"""The rows of fault drills (HostDrill): which drill holds a fault on a host, which keeps a host out of
service, which clusters still have drills open. Queries and row writes only; what drills do to hosts and
undoing it at their cluster's end is inventory/drill_effects.py, above the host operations."""

from __future__ import annotations

from django.db.models import QuerySet
from django.utils import timezone

from inventory.choices import HostEventKind, HostState
from inventory.models import Host, HostDrill, HostEvent

# The states a drill can leave a host in: recovery cordons a failed node's host; a health sweep marks an
# `unreachable` one offline.
LEFT_OUT = (HostState.CORDONED, HostState.OFFLINE)


def forget_drill(drill: HostDrill) -> None:
    """A drill that did nothing to the host (refused, or no process to kill) leaves no row."""
    HostDrill.objects.filter(pk=drill.pk).delete()


def holding(host_id: int, fault: str) -> QuerySet[HostDrill]:
    return HostDrill.objects.filter(
        host_id=host_id, fault=fault, fault_held=True, fault_cleared_at__isnull=True
    )


def fault_cleared(host: Host, fault: str) -> None:
    """The fault file is gone (cleared by a drill, by hand, or at a cluster's end): no drill holds it now."""
    holding(host.pk, fault).update(fault_cleared_at=timezone.now())


def fault_adopted(host: Host, fault: str) -> None:
    """Someone injected by hand a fault a drill holds: it is theirs now, and stays when the cluster ends."""
    holding(host.pk, fault).update(fault_held=False)


def drill_holds(host: Host, cluster_pk: int, fault: str) -> bool:
    """Whether a drill of the cluster put `fault` on the host and it is still there (the drill may clear it)."""
    return holding(host.pk, fault).filter(cluster_pk=cluster_pk).exists()


def drill_behind(host_id: int, cluster_pk: int) -> HostDrill | None:
    """The latest drill of a live cluster on `host_id`: a failure of its node there is the drill's doing."""
    return (
        HostDrill.objects.filter(host_id=host_id, cluster_pk=cluster_pk, ended_at__isnull=True)
        .select_related("actor")
        .first()
    )


def held_drill_fault(host: Host) -> HostDrill | None:
    """A drill's fault on the host now, while its cluster lives: the host fails its checks because of it."""
    return (
        HostDrill.objects.filter(
            host_id=host.pk, fault_held=True, fault_cleared_at__isnull=True, ended_at__isnull=True
        )
        .select_related("actor")
        .first()
    )


def drill_keeping_out(host: Host) -> HostDrill | None:
    """The drill whose effect keeps the host out of service now (a cordon after it), while its cluster lives.

    The host's latest state change says: a cordon (or offline) recorded with a drill. A later change by
    anyone else (a manual cordon, an uncordon) is the latest instead, and the host is no drill's any more.
    """
    if host.state not in LEFT_OUT:
        return None
    event = (
        HostEvent.objects.filter(host_id=host.pk, kind=HostEventKind.STATE)
        .select_related("drill__actor", "drill__team")
        .order_by("-at", "-id")
        .first()
    )
    drill = event.drill if event is not None else None
    return drill if drill is not None and drill.ended_at is None else None


def hosts_kept_out_by(cluster_pk: int) -> list[tuple[Host, HostDrill]]:
    """The hosts a live cluster's drills keep out of service now (cordoned or offline after them)."""
    host_ids = HostDrill.objects.filter(cluster_pk=cluster_pk, ended_at__isnull=True).values("host_id")
    kept = []
    for host in Host.objects.filter(pk__in=host_ids, state__in=LEFT_OUT).order_by("name"):
        drill = drill_keeping_out(host)
        if drill is not None and drill.cluster_pk == cluster_pk:
            kept.append((host, drill))
    return kept


def open_drill_cluster_pks() -> set[int]:
    """Clusters with drills not yet ended (the clusters app's reaper ends those of ended clusters)."""
    return set(HostDrill.objects.filter(ended_at__isnull=True).values_list("cluster_pk", flat=True))
