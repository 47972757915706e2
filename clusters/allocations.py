"""Allocation and release of GPUs: the one place clusters take and give back capacity.

Placement (clusters.services.place_cluster), host replacement (clusters.provision) and recovery
(clusters.recovery: release_nodes when a cluster shrinks to its survivors) call these. Three rules hold here,
under the team's quota row lock and the plan's host row locks:

- no GPU is held by two active clusters: re-checked under the locks, and guaranteed by the partial
  unique index `allocation_one_active_per_gpu` (a race the locks miss raises CapacityChanged);
- a host serves one team at a time (DESIGN.md "Security"): Volt cannot yet isolate tenants on one
  host (every cluster's key goes into the same SSH user's authorized_keys), so a host with active
  allocations of another team's cluster is refused (CapacityChanged) and re-planned without it;
- a team stays within its quota (clusters/quotas.py: `admit` recounts under the quota row's lock).
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from clusters import placement, planning, quotas, transitions
from clusters.choices import ClusterStatus
from clusters.models import Allocation, Cluster, ClusterNode
from clusters.placement.bandwidth import format_gbps
from inventory import services as inventory
from inventory.choices import HostState
from inventory.models import GPU, Host
from voltweb.taskutils import enqueue, enqueue_on_commit

S = ClusterStatus


class CapacityChanged(Exception):
    """A GPU in the plan was taken between planning and allocating."""


def allocate(cluster: Cluster, plan: placement.Plan) -> Cluster:
    """Turn a plan into allocations and move the cluster to PROVISIONING, atomically.

    Raises CapacityChanged (and changes nothing) if another request took any of the plan's GPUs, or
    another team's cluster took a place on one of its hosts; quotas.OverQuota if the plan would put the
    team over its quota (the quota row is locked first, then the hosts: every placement takes them in
    that order).
    """

    host_ids = sorted({int(h) for h in plan.host_ids})
    try:
        with transaction.atomic():
            quotas.admit(cluster.team_id, sum(len(n.gpu_indices) for n in plan.nodes), plan.model)
            locked = lock_hosts_for_team(cluster.team_id, host_ids)
            _check_still_free(plan, locked)
            create_allocations(cluster, plan)
            inventory.refresh_free_capacity(host_ids)
            _queue_provisioning(cluster.pk)
            now = timezone.now()
            duration_s = cluster.spec.get("duration_s")
            return transitions.transition(
                cluster,
                S.PROVISIONING,
                _placed_message(plan),
                extra={
                    "plan": planning.plan_as_json(plan),
                    "gpu_model": plan.model,
                    "placed_at": now,
                    # A requested duration runs from placement: the GPUs are the team's from then on.
                    "ends_at": now + timedelta(seconds=duration_s) if duration_s else None,
                    "predicted_busbw_gbps": plan.predicted_busbw_gbps,
                    "predicted_allreduce_s": plan.predicted_allreduce_s,
                    "price_per_hour": Decimal(str(round(plan.price_per_hour, 2))),
                    "queue_reason": "",
                },
            )
    except IntegrityError as exc:  # the database constraint caught a race the locks did not
        raise CapacityChanged(str(exc)) from None


def _check_still_free(plan: placement.Plan, hosts: dict[int, Host]) -> None:
    for node in plan.nodes:
        host = hosts.get(int(node.host_id))
        free = {i for domain in (host.free_gpu_map if host else []) for i in domain}
        if host is None or host.state != HostState.AVAILABLE or not set(node.gpu_indices) <= free:
            raise CapacityChanged(f"GPUs {list(node.gpu_indices)} of host {node.host_id} were taken")


def create_allocations(cluster: Cluster, plan: placement.Plan, ranks=None, head: bool = True) -> None:
    """Nodes and allocations for `plan`; `ranks` (replacements) gives each plan node the rank it takes over."""
    stage_of = {host: number for number, stage in enumerate(plan.stage_order) for host in stage}
    ranks = list(ranks) if ranks is not None else list(range(len(plan.nodes)))
    gpu_ids = {
        (host_id, index): pk
        for pk, host_id, index in GPU.objects.filter(host_id__in=[int(h) for h in plan.host_ids]).values_list(
            "pk", "host_id", "index"
        )
    }
    allocations = []
    for rank, assignment in zip(ranks, plan.nodes, strict=True):
        node = ClusterNode.objects.create(
            cluster=cluster,
            host_id=int(assignment.host_id),
            rank=rank,
            is_head=head and assignment.host_id == plan.head_host_id,
            stage=stage_of.get(assignment.host_id),
            gpu_indices=list(assignment.gpu_indices),
        )
        allocations += [
            Allocation(cluster=cluster, node=node, gpu_id=gpu_ids[(node.host_id, i)])
            for i in assignment.gpu_indices
        ]
    Allocation.objects.bulk_create(allocations)


def _placed_message(plan: placement.Plan) -> str:
    figures = (
        f"predicted busbw {format_gbps(plan.predicted_busbw_gbps)} GB/s, "
        if plan.predicted_busbw_gbps
        else ""
    )
    return (
        f"placed {len(plan.nodes)} x {len(plan.nodes[0].gpu_indices)} {plan.model} within one "
        f"{plan.spanned_level}: {figures}${plan.price_per_hour:.2f}/hour"
    )


def release(cluster: Cluster) -> int:
    """Free every GPU the cluster holds, exactly once; returns how many were freed by this call."""

    with transaction.atomic():
        active = Allocation.objects.select_for_update().filter(cluster=cluster, active=True)
        host_ids = sorted(set(active.values_list("gpu__host_id", flat=True)))
        list(Host.objects.select_for_update().filter(pk__in=host_ids).order_by("pk").values_list("pk"))
        freed = active.update(active=False, released_at=timezone.now())
        cluster.nodes.active().update(released_at=timezone.now())
        if freed:
            inventory.refresh_free_capacity(host_ids)
            kick_queue()
    return freed


def release_nodes(cluster: Cluster, node_ids) -> int:
    """Free the GPUs of some nodes of a cluster and mark the nodes released (a cluster shrinking to its
    survivors). Exactly once, like release(); returns how many GPUs this call freed."""
    node_ids = list(node_ids)
    with transaction.atomic():
        active = Allocation.objects.select_for_update().filter(
            cluster=cluster, node_id__in=node_ids, active=True
        )
        host_ids = sorted(set(active.values_list("gpu__host_id", flat=True)))
        list(Host.objects.select_for_update().filter(pk__in=host_ids).order_by("pk").values_list("pk"))
        now = timezone.now()
        freed = active.update(active=False, released_at=now)
        ClusterNode.objects.active().filter(cluster=cluster, pk__in=node_ids).update(released_at=now)
        if freed:
            inventory.refresh_free_capacity(host_ids)
            kick_queue()
    return freed


def swap_nodes(cluster: Cluster, failed: list[ClusterNode], plan: placement.Plan) -> list[int]:
    """Replace the `failed` nodes by the plan's hosts, atomically under the hosts' row locks: the failed
    nodes' GPUs freed and the nodes released, the replacements allocated with the same ranks (and the
    head's role, if the head failed). Returns those ranks. CapacityChanged if the plan's hosts were taken
    (nothing changed then)."""
    with transaction.atomic():
        lock_hosts_for_team(cluster.team_id, sorted(int(h) for h in plan.host_ids))
        now = timezone.now()
        Allocation.objects.filter(node__in=failed, active=True).update(active=False, released_at=now)
        ClusterNode.objects.filter(pk__in=[n.pk for n in failed]).update(released_at=now)
        ranks = sorted(n.rank for n in failed)
        create_allocations(cluster, plan, ranks=ranks, head=any(n.is_head for n in failed))
        inventory.refresh_free_capacity(sorted({n.host_id for n in failed} | {int(h) for h in plan.host_ids}))
    return ranks


def hosts_serving_other_teams(team_id: int, host_ids) -> set[int]:
    """Of `host_ids`, those where a cluster of another team holds GPUs now."""
    return set(
        Allocation.objects.filter(active=True, gpu__host_id__in=list(host_ids))
        .exclude(cluster__team_id=team_id)
        .values_list("gpu__host_id", flat=True)
        .distinct()
    )


def lock_hosts_for_team(team_id: int, host_ids) -> dict[int, Host]:
    """Lock the hosts' rows (in id order: no deadlock) and check none serves another team.

    Allocations on a host are only made under its row lock, so the check cannot be overtaken before
    the caller's transaction commits. Raises CapacityChanged naming the hosts taken meanwhile.
    """
    locked = {h.pk: h for h in Host.objects.select_for_update().filter(pk__in=host_ids).order_by("pk")}
    taken = hosts_serving_other_teams(team_id, locked)
    if taken:
        raise CapacityChanged(f"hosts {sorted(taken)} now serve another team")
    return locked


def _queue_provisioning(cluster_id: int) -> None:
    if settings.VOLT_AUTO_PROVISION:
        enqueue_on_commit("clusters.tasks.provision_cluster_task", cluster_id)


def kick_queue() -> None:
    """Once the surrounding transaction commits, ask a worker to drain the queue (capacity changed)."""

    def kick() -> None:
        if Cluster.objects.filter(status=S.QUEUED).exists():
            enqueue("clusters.tasks.drain_queue_task")

    transaction.on_commit(kick)
