"""Replacing failed (or slow) hosts: place their nodes again near the survivors, cordon the hosts as
suspect, and recompute the cluster's plan (spans, prediction, reference all-reduce time) for its nodes."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import IntegrityError
from django.utils import timezone

from clusters import allocations, network_paths, placement, planning, reservations, transitions
from clusters.choices import ClusterStatus
from clusters.models import Cluster, ClusterNode
from clusters.placement.bandwidth import format_gbps
from clusters.provisioning.ending import teardown
from clusters.provisioning.nodes import active_nodes
from inventory import services as inventory
from inventory.choices import HostState
from inventory.models import Host
from voltweb.statemachine import IllegalTransition

logger = logging.getLogger(__name__)
S = ClusterStatus


class NoReplacement(Exception):
    """No free host can take the place of a failed one."""


@dataclass(frozen=True)
class Replacement:
    """What replace_hosts() did: the new nodes' hosts and why they were chosen (how close to the survivors)."""

    failed: tuple[str, ...]  # host names replaced
    hosts: tuple[dict, ...]  # {"id", "name", "rank", "is_head"} of each new node
    level: str  # block, fabric, site or anywhere: the closest tier to the survivors that had room
    reason: str  # the explanation recorded on the timeline and the recovery record


def replace_hosts(
    cluster: Cluster,
    host_ids: list[int],
    reason: str,
    keep_without_replacement: bool = False,
    context: str = "provisioning",
) -> Replacement:
    """Place the hosts' nodes again near the survivors, stop them and cordon the hosts as suspect.

    Raises NoReplacement when no free host fits; the hosts are then cordoned all the same (they failed),
    unless `keep_without_replacement` (a slow host still works: it keeps its node and its state).
    `context` ("provisioning", "recovering") goes into the cordon's reason.
    """
    nodes = [n for n in active_nodes(cluster) if n.host_id in host_ids]
    try:
        plan, level = replacement_plan(cluster, nodes)
    except NoReplacement:
        if not keep_without_replacement:
            _cordon_suspects(cluster, host_ids, reason, context)
        raise
    if any(node.is_head for node in nodes):  # the head goes: re-form around a new head
        teardown(cluster, active_nodes(cluster))
    else:
        teardown(cluster, nodes)
    _cordon_suspects(cluster, host_ids, reason, context)
    try:
        return _swap_nodes(cluster, nodes, plan, level)
    except (allocations.CapacityChanged, IntegrityError) as exc:  # taken while this cluster was torn down
        raise NoReplacement(
            f"the replacement for {', '.join(n.host.name for n in nodes)} was taken: {exc}"
        ) from exc


def _cordon_suspects(
    cluster: Cluster, host_ids: list[int], reason: str, context: str = "provisioning"
) -> None:
    for host in Host.objects.filter(pk__in=host_ids, state__in=[HostState.AVAILABLE, HostState.DRAINING]):
        # A drill of this cluster hit the host: the failure is the drill's, and so is the cordon (lifted
        # when the cluster ends).
        drill = inventory.drill_behind(host.pk, cluster.pk)
        after = f" after a fault drill ({drill.drill} by {drill.actor_name})" if drill else ""
        try:
            inventory.act_on_host(
                host,
                "cordon",
                reason=f"suspect{after}: while {context} cluster {cluster.name}: {reason}"[:500],
                drill=drill,
            )
        except IllegalTransition:
            pass


def replacement_plan(cluster: Cluster, failed: list[ClusterNode]) -> tuple[placement.Plan, str]:
    """Where `failed` nodes go: the free host(s) nearest the survivors (near_survivors), a host no queued
    request's reservation holds during the cluster's remaining run before one that is at the same level.
    A reserved host still takes a replacement when it is nearer, or the only one: keeping a running
    cluster whole comes first; the reservation is planned again at the next queue drain (a host failure
    is one way a queued request can be late for its bound). Raises NoReplacement."""

    survivors = [n for n in active_nodes(cluster) if n not in failed]
    request = planning.to_request(cluster.spec)
    request = placement.PlacementRequest(
        **{
            **request.__dict__,
            "nodes": len(failed),
            "models": (cluster.gpu_model,),
            "topology_level": None,
            "topology_mode": "any",
        }
    )
    used = {str(n.host_id) for n in cluster.nodes.all()}
    candidates = [
        s for s in planning.candidate_snapshots(request, team_id=cluster.team_id) if s.host_id not in used
    ]
    reserved, _ = reservations.reserved_during(timezone.now(), cluster.ends_at, exclude=cluster.pk)
    plan, level = near_survivors(request, candidates, survivors, reserved)
    if plan is None:
        raise NoReplacement(f"no free host can replace {', '.join(n.host.name for n in failed)}")
    return plan, level


def _swap_nodes(cluster: Cluster, failed: list[ClusterNode], plan: placement.Plan, level: str) -> Replacement:
    ranks = allocations.swap_nodes(cluster, failed, plan)
    new = list(
        ClusterNode.objects.active()
        .filter(cluster=cluster, rank__in=ranks)
        .select_related("host")
        .order_by("rank")
    )
    hosts = tuple({"id": n.host_id, "name": n.host.name, "rank": n.rank, "is_head": n.is_head} for n in new)
    failed_names = tuple(n.host.name for n in failed)
    names = ", ".join(h["name"] for h in hosts)
    why = _LEVEL_WHY[level]
    reason = f"replaced {', '.join(failed_names)} by {names}: {why}"
    transitions.note(cluster, reason, heartbeat=True)
    refresh_plan(cluster, f"{', '.join(failed_names)} replaced by {names}")
    return Replacement(failed=failed_names, hosts=hosts, level=level, reason=reason)


def refresh_plan(cluster: Cluster, why: str) -> None:
    """After a change of the cluster's nodes: the plan, span, predicted busbw and reference all-reduce time
    of the nodes it now has (placement.plan_for_nodes), stored before any probe is judged against them.
    The earlier figures stay on the timeline, in the line this writes."""

    nodes = active_nodes(cluster)
    if not nodes:
        return
    snapshots = planning.snapshots_by_id([n.host_id for n in nodes])
    pairs = [(snapshots[str(n.host_id)], tuple(n.gpu_indices)) for n in nodes]
    head = next((n for n in nodes if n.is_head), nodes[0])
    price = sum(float(n.host.price_per_gpu_hour) * len(n.gpu_indices) for n in nodes)
    request = planning.to_request(cluster.spec)
    plan = placement.plan_for_nodes(
        request, pairs, str(head.host_id), price, planning.measured_bandwidth(), f"after: {why}"
    )
    plan = network_paths.annotate(plan, request)  # the path its nodes now take, and its cost
    before_level = (cluster.plan or {}).get("spanned_level") or "host"
    before_busbw = cluster.predicted_busbw_gbps
    Cluster.objects.filter(pk=cluster.pk).update(
        plan=planning.plan_as_json(plan),
        predicted_busbw_gbps=plan.predicted_busbw_gbps,
        predicted_allreduce_s=plan.predicted_allreduce_s,
    )
    cluster.refresh_from_db(fields=["plan", "predicted_busbw_gbps", "predicted_allreduce_s"])
    figures = (
        f"predicted busbw {format_gbps(plan.predicted_busbw_gbps)} GB/s (was {format_gbps(before_busbw)})"
        if plan.predicted_busbw_gbps or before_busbw
        else "one node: no inter-node figure"
    )
    span = (
        f"spans one {plan.spanned_level} as before"
        if plan.spanned_level == before_level
        else f"spans one {plan.spanned_level} (was one {before_level})"
    )
    transitions.note(cluster, f"plan now: {span}, {figures}", heartbeat=True)


_LEVEL_WHY = {
    "block": "same block as the survivors' anchor (the head, or the first survivor)",
    "fabric": "no free host in the anchor's block; same fabric",
    "site": "no free host in the anchor's fabric; same site",
    "anywhere": "no free host in the anchor's site; the best free host anywhere",
}


def near_survivors(
    request: placement.PlacementRequest,
    candidates,
    survivors: list[ClusterNode],
    reserved: frozenset[str] = frozenset(),
) -> tuple[placement.Plan | None, str]:
    """The replacement plan closest to the survivors, and how close: the anchor's (the surviving head, else
    the first survivor) block, then its fabric, then its site, then anywhere. Within a level, hosts not in
    `reserved` are tried first. (None, "") when none fits."""
    anchor = next((n.host for n in survivors if n.is_head), survivors[0].host if survivors else None)
    tiers = [("anywhere", lambda s: True)]
    if anchor is not None:
        tiers = [
            ("block", lambda s: s.path.block_id == str(anchor.block_id)),
            ("fabric", lambda s: s.path.fabric_id == str(anchor.fabric_id)),
            ("site", lambda s: s.path.site_id == str(anchor.site_id)),
            ("anywhere", lambda s: True),
        ]
    for level, keep in tiers:
        pool = [s for s in candidates if keep(s)]
        unreserved = [s for s in pool if s.host_id not in reserved]
        for chosen in (unreserved, pool) if len(unreserved) < len(pool) else (pool,):
            result = placement.plan(request, chosen, validate_inventory=False) if chosen else None
            if isinstance(result, placement.Plan):
                return result, level
    return None, ""
