"""How a cluster's nodes reach each other, and what that costs its bandwidth (issue 26, item 4).

The placement engine ranks hosts by topology; whether hosts reach each other's addresses is recorded
inventory data (inventory/reachability.py), and how an overlay routes them is provisioning/overlay.py's
pure `route`. This module joins them, for a plan and for a running cluster:

- `annotate(plan, request)`: the plan names its path (direct / overlay / relay, as bring-up will set it up
  for these hosts); off the direct path its prediction is the direct figure times the path's cost;
- `cost(path, host_class)`: that cost, the newest probe of a cluster on that path between hosts of that
  class (measured busbw / the direct figure predicted for it), else a declared default;
- `reprice(cluster, nodes, path)`: bring-up found another path than the plan named (a reachability check
  ran in between): the prediction follows before the probe is judged against it;
- `record(cluster, nodes, busbw)`: a probe on an overlay is kept as that path's cost, never as its topology
  domain's figure (which it would drag down for every direct cluster there);
- `blame(cluster, nodes, result)`: what the probe's per-host phase says of the overlay or the relay.

A host class is the fabric kinds of the cluster's hosts: an overlay's cost is its encryption against the
rate of the links under it (userspace wireguard-go on this machine's lab: 0.22 of a 100 MB/s link).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import replace

from django.utils import timezone

from clusters import placement
from clusters.models import BandwidthSample, Cluster, ClusterNode
from clusters.placement.bandwidth import format_gbps
from clusters.provisioning import overlay
from inventory import reachability
from inventory.models import Host

DIRECT, OVERLAY, RELAY = overlay.DIRECT, overlay.OVERLAY, overlay.RELAY
OVER = (OVERLAY, RELAY)
COST_MAX_AGE_DAYS = 7  # as placement's measured figures (planning.MEASURED_MAX_AGE_DAYS)

# Declared until a probe measures them: kernel WireGuard keeps ~0.9 of a 10-25 GbE link; a relayed byte
# crosses the relay's link and its encryption twice.
DEFAULT_COST = {OVERLAY: 0.9, RELAY: 0.45}


def members_of(hosts: Iterable[Host], cluster: Cluster | None = None) -> list[overlay.Member]:
    """The hosts as the overlay would plan them (each once), from their recorded reachability. A host whose
    forwarded port another live overlay holds has no endpoint for a new one (cluster_overlay.port_of)."""
    unique = list({host.pk: host for host in hosts}.values())
    networks = reachability.networks(unique)
    taken = ClusterNode.objects.filter(
        host__in=unique, released_at__isnull=True, overlay_port=overlay.DEFAULT_PORT
    )
    if cluster is not None:
        taken = taken.exclude(cluster=cluster)
    busy = set(taken.values_list("host_id", flat=True))
    return [
        overlay.Member(h.name, networks[h.pk], h.node_ip, "" if h.pk in busy else h.overlay_endpoint)
        for h in unique
    ]


def route_of(hosts: Iterable[Host], cluster: Cluster | None = None) -> overlay.Route:
    """Raises overlay.OverlayFailed when some pair needs a relay and no host can be it."""
    return overlay.route(members_of(hosts, cluster))


def host_class(hosts: Iterable[Host]) -> str:
    return "+".join(sorted({host.fabric.kind for host in hosts}))


def cost(path: str, klass: str) -> tuple[float, str]:
    """(measured busbw / direct prediction on `path` between hosts of `klass`, where the figure came from)."""
    if path not in OVER:
        return 1.0, ""
    since = timezone.now() - timezone.timedelta(days=COST_MAX_AGE_DAYS)
    sample = (
        BandwidthSample.objects.filter(
            level=path, domain_id=klass, measured_at__gte=since, predicted_gbps__gt=0
        )
        .order_by("-measured_at")
        .first()
    )
    if sample is None:
        return DEFAULT_COST[path], "declared: no probe has measured it yet"
    when = timezone.localtime(sample.measured_at).strftime("%Y-%m-%d %H:%M")
    factor = min(1.0, sample.busbw_gbps / sample.predicted_gbps)
    return factor, f"measured by cluster {sample.cluster_id or '(ended)'}'s probe, {when}"


def describe(routed: overlay.Route) -> str:
    """'overlay: its nodes sit in 3 networks …' for a plan's explanation and the timeline."""
    line = (
        f"{routed.path}: its nodes sit in {routed.networks} networks that do not reach each other's addresses"
    )
    relayed = sorted(f"{a}-{b}" for (a, b), path in routed.paths.items() if path == RELAY)
    if relayed:
        line += f"; {', '.join(relayed)} through the relay {routed.relay}"
    return line


def annotate(plan: placement.Plan, request: placement.PlacementRequest) -> placement.Plan:
    """The plan with its path named and, off the direct path, its prediction at the path's cost."""
    if len(set(plan.host_ids)) < 2 or plan.predicted_busbw_gbps is None:
        return plan
    hosts = list(Host.objects.filter(pk__in=[int(i) for i in plan.host_ids]).select_related("fabric"))
    try:
        routed = route_of(hosts)
    except overlay.OverlayFailed as exc:
        line = f"{placement.WARNING_PREFIX}network: {exc}; bring-up would replace them"
        return replace(plan, network_path=OVERLAY, explanation=(*plan.explanation, line))
    if routed.path == DIRECT:
        return plan
    klass = host_class(hosts)
    factor, source = cost(routed.path, klass)
    unable = [h for h in hosts if (h.system or {}).get("overlay") == ""]  # discovery found no WireGuard
    warnings = tuple(
        f"{placement.WARNING_PREFIX}network: {h.name} cannot join an overlay (needs "
        f"{h.system.get('overlay_missing')}): bring-up would replace it"
        for h in unable
    )
    direct = plan.predicted_busbw_gbps
    busbw = direct * factor
    line = (
        f"network: {describe(routed)}. Predicted busbw {format_gbps(direct)} -> {format_gbps(busbw)} GB/s: "
        f"x{factor:.2f}, the {routed.path}'s cost between {klass} hosts ({source})"
    )
    return replace(
        plan,
        network_path=routed.path,
        direct_busbw_gbps=direct,
        predicted_busbw_gbps=busbw,
        predicted_allreduce_s=placement.allreduce_seconds(
            request.reference_gradient_bytes, len(plan.nodes), busbw, plan.spanned_level
        ),
        explanation=(*plan.explanation, line, *warnings),
    )


def reprice(cluster: Cluster, nodes: Sequence[ClusterNode], path: str) -> str:
    """Follow bring-up's path where the plan named another; returns the timeline's words ("" when unchanged)."""
    plan = dict(cluster.plan or {})
    planned = plan.get("network_path", DIRECT)
    direct = plan.get("direct_busbw_gbps") or cluster.predicted_busbw_gbps
    if planned == path or not direct or not plan.get("nodes"):
        return ""
    factor, source = cost(path, host_class(n.host for n in nodes))
    busbw = direct * factor
    nbytes = placement.PlacementRequest.reference_gradient_bytes
    plan.update(
        network_path=path,
        direct_busbw_gbps=direct if path in OVER else None,
        predicted_busbw_gbps=busbw,
        predicted_allreduce_s=placement.allreduce_seconds(
            nbytes, len(plan["nodes"]), busbw, plan["spanned_level"]
        ),
    )
    before = cluster.predicted_busbw_gbps
    Cluster.objects.filter(pk=cluster.pk).update(
        plan=plan, predicted_busbw_gbps=busbw, predicted_allreduce_s=plan["predicted_allreduce_s"]
    )
    cluster.plan, cluster.predicted_busbw_gbps = plan, busbw
    cluster.predicted_allreduce_s = plan["predicted_allreduce_s"]
    cost_words = f"x{factor:.2f}, the {path}'s cost ({source})" if path in OVER else "the direct figure"
    return (
        f"the plan named the {planned} path, bring-up found {path}: predicted busbw now {format_gbps(busbw)} "
        f"GB/s (was {format_gbps(before)}): {cost_words}"
    )


def record(cluster: Cluster, nodes: Sequence[ClusterNode], busbw: float) -> str:
    """Keep an overlay cluster's probe as its path's cost; returns why not ("" when kept)."""
    path = cluster.network_path
    direct = (cluster.plan or {}).get("direct_busbw_gbps")
    if not direct:
        return f"{path}'s cost: the plan has no direct figure to compare it with"
    BandwidthSample.objects.create(
        level=path,
        domain_id=host_class(n.host for n in nodes),
        busbw_gbps=busbw,
        nodes=len(nodes),
        cluster=cluster,
        predicted_gbps=direct,
    )
    return ""


def blame(cluster: Cluster, nodes: Sequence[ClusterNode], result: dict, fraction: float) -> str:
    """What the probe's link tests say of the overlay: "" on the direct path, without link tests, or when
    the path's links run at least `fraction` of what they are compared with."""
    links, ips = result.get("links") or [], result.get("node_ips") or []
    if cluster.network_path not in OVER or not links:
        return ""
    by_ip = {node.node_ip: node.host.name for node in nodes}
    names = [by_ip.get(ip, ip) for ip in ips]
    try:
        routed = route_of((node.host for node in nodes), cluster)
    except overlay.OverlayFailed:
        return ""
    rated = []
    for link in links:
        a, b = (names[rank] for rank in link["ranks"])
        rated.append((f"{a}-{b}", link["gbps"], routed.paths.get(tuple(sorted((a, b))), OVERLAY)))
    return judge(rated, routed.relay, (cluster.plan or {}).get("direct_busbw_gbps"), fraction)


def judge(rated: list[tuple[str, float, str]], relay: str, direct: float | None, fraction: float) -> str:
    """Pure: `rated` is (link, GB/s, its path) per tested link. The relay is blamed when the links through it
    run below `fraction` of the others; the overlay when its links run below `fraction` of `direct`."""
    through = [gbps for _, gbps, path in rated if path == RELAY]
    around = [gbps for _, gbps, path in rated if path != RELAY]
    if through and around:
        slow, others = statistics.median(through), statistics.median(around)
        if others > 0 and slow < fraction * others:
            pairs = ", ".join(name for name, _, path in rated if path == RELAY)
            return (
                f"the per-host tests blame the relay {relay}: links through it ({pairs}) run at "
                f"{format_gbps(slow, 2)} GB/s, {slow / others:.0%} of the {format_gbps(others, 2)} GB/s of "
                "links that do not pass it"
            )
    over = [gbps for _, gbps, path in rated if path != DIRECT]
    if over and direct:
        slow = statistics.median(over)
        if slow < fraction * direct:
            what = (
                f"relay {relay}" if all(path == RELAY for *_, path in rated if path != DIRECT) else "overlay"
            )
            return (
                f"the per-host tests blame the {what}: links over it run at {format_gbps(slow, 2)} GB/s, "
                f"{slow / direct:.0%} of the {format_gbps(direct, 2)} GB/s predicted without it"
            )
    return ""
