"""A cluster's network path, decided and set up before its Ray starts (issue 26): direct when its nodes all
reach each other (inventory/reachability.py's recorded checks), else a WireGuard overlay of its own
(provisioning/overlay.py), on which Ray, the probe and the job's collectives then bind.

- `set_up(cluster, nodes, drivers)`: called by nodes.bring_up once the hosts are prepared, for the first
  bring-up and for recovery alike. A cluster that has an overlay keeps it (its Ray runs on it): a
  replacement gets its key and address and every survivor's peers are rewritten (`wg syncconf`, the
  interface and its Ray untouched); a node gone from the cluster is gone from every peer list.
- `tear_down(cluster, nodes, drivers)`: the interface, key and config off each host (ending.teardown).
- `node_env(node)`: GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME on the overlay's interface.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction

from clusters import network_paths, transitions
from clusters.choices import TERMINAL
from clusters.models import Cluster, ClusterNode
from clusters.provisioning import overlay
from inventory import reachability
from inventory.drivers.base import fan_out

ALLOCATE_ATTEMPTS = 5


class OverlayHostsFailed(Exception):
    """Hosts on which the overlay could not be set up: {host id: why}."""

    def __init__(self, failed: dict[int, str], message: str):
        super().__init__(message)
        self.failed = failed


def interface_of(cluster: Cluster) -> str:
    return overlay.interface(cluster.pk)


def port_of(node: ClusterNode) -> int:
    """Its interface's UDP port, kept once chosen: the one a provider forwards (51820) for the host's first
    live overlay; the next free one for others on that host (which only peers that dial out, or the relay,
    then reach)."""
    if node.overlay_port is None:
        used = set(
            ClusterNode.objects.filter(
                host_id=node.host_id, released_at__isnull=True, overlay_port__isnull=False
            )
            .exclude(pk=node.pk)
            .values_list("overlay_port", flat=True)
        )
        node.overlay_port = next(p for p in range(overlay.DEFAULT_PORT, 65536) if p not in used)
        ClusterNode.objects.filter(pk=node.pk).update(overlay_port=node.overlay_port)
    return node.overlay_port


def members(nodes: list[ClusterNode], networks: dict[int, str]) -> list[overlay.Member]:
    """The nodes as the overlay plans them (`networks`: reachability.networks of their hosts); gives each
    its port."""
    result = []
    for node in nodes:
        port = port_of(node)
        endpoint = node.host.overlay_endpoint if port == overlay.DEFAULT_PORT else ""
        result.append(
            overlay.Member(node.host.name, networks[node.host_id], node.host.node_ip, endpoint, port)
        )
    return result


def set_up(cluster: Cluster, nodes: list[ClusterNode], drivers: list) -> str:
    """Decide the path and, for an overlay, set it up on every node's host; returns the path. Raises
    OverlayHostsFailed (the hosts to replace) or overlay.OverlayFailed (no relay possible: a fact of the
    hosts, not of one host)."""
    cluster.refresh_from_db(
        fields=["overlay_network", "network_path", "plan", "predicted_busbw_gbps", "predicted_allreduce_s"]
    )
    networks = reachability.networks([n.host for n in nodes])
    if not cluster.overlay_network and len({networks[n.host_id] for n in nodes}) == 1:
        _record_path(cluster, nodes, overlay.DIRECT, "its nodes reach each other directly: no overlay")
        return overlay.DIRECT
    network = cluster.overlay_network or _allocate(cluster)
    planned = members(nodes, networks)
    iface = interface_of(cluster)
    keys = fan_out(drivers, lambda d: overlay.make_key(d, iface))
    _raise_failed(nodes, keys, "could not make its overlay key")
    public = {node.host.name: key for node, key in zip(nodes, keys, strict=True)}
    kept = {n.host.name: n.overlay_address for n in nodes if n.overlay_address}
    try:
        plan = overlay.plan(planned, public, network, kept)
    except overlay.OverlayFailed as exc:  # no node to relay through: the hosts without an endpoint go
        stuck = {n.host_id: str(exc) for n, m in zip(nodes, planned, strict=True) if not m.endpoint}
        raise OverlayHostsFailed(stuck or {n.host_id: str(exc) for n in nodes}, str(exc)) from exc
    by_name = {node.host.name: node for node in nodes}
    applied = fan_out(drivers, lambda d: overlay.apply(d, iface, plan.nodes[_name_of(d, nodes, drivers)]))
    _raise_failed(nodes, applied, "could not set up the overlay")
    for name, node_plan in plan.nodes.items():
        node = by_name[name]
        node.overlay_address = node_plan.address
        ClusterNode.objects.filter(pk=node.pk).update(overlay_address=node_plan.address)
    kinds = sorted(set(applied))
    relay = f"; {', '.join(f'{a}-{b}' for (a, b), p in sorted(plan.paths.items()) if p == overlay.RELAY)} " \
        f"through the relay {plan.relay}" if plan.relay else ""  # fmt: skip
    _record_path(
        cluster,
        nodes,
        plan.path,
        f"overlay {iface} on {network}: {len(nodes)} nodes over {len({m.network for m in planned})} networks "
        f"({', '.join(kinds)}){relay}",
    )
    return plan.path


def _name_of(driver, nodes: list[ClusterNode], drivers: list) -> str:
    return nodes[next(i for i, d in enumerate(drivers) if d is driver)].host.name


def _raise_failed(nodes: list[ClusterNode], results: list, what: str) -> None:
    failed = {
        n.host_id: f"{n.host.name} {what}: {r}"
        for n, r in zip(nodes, results, strict=True)
        if isinstance(r, Exception)
    }
    if failed:
        raise OverlayHostsFailed(failed, "; ".join(failed.values()))


def _allocate(cluster: Cluster) -> str:
    """The first free /24 of the pool, held by the cluster (a unique constraint among live clusters settles
    a race: the loser takes the next)."""
    for _attempt in range(ALLOCATE_ATTEMPTS):
        taken = (
            Cluster.objects.exclude(status__in=TERMINAL)
            .exclude(overlay_network="")
            .values_list("overlay_network", flat=True)
        )
        network = overlay.cluster_network(taken)
        try:
            with transaction.atomic():
                Cluster.objects.filter(pk=cluster.pk).update(overlay_network=network)
        except IntegrityError:
            continue
        cluster.overlay_network = network
        return network
    raise overlay.OverlayFailed("could not take an overlay range: other clusters kept taking the same one")


def _record_path(cluster: Cluster, nodes: list[ClusterNode], path: str, message: str) -> None:
    Cluster.objects.filter(pk=cluster.pk).update(network_path=path)
    repriced = network_paths.reprice(cluster, nodes, path)  # the probe is judged against this path's figure
    if repriced:
        message += f"; {repriced}"
    if cluster.network_path != path or path != overlay.DIRECT or repriced:
        transitions.note(cluster, f"Network: {message}", heartbeat=True)
    cluster.network_path = path


def tear_down(cluster: Cluster, driver) -> None:
    """The cluster's interface, key and config off one host (nothing there: nothing done). Raises
    overlay.OverlayFailed (a DriverError) when the host would not."""
    if cluster.overlay_network:
        overlay.remove(driver, interface_of(cluster))


def node_env(cluster: Cluster) -> dict[str, str]:
    """Collectives on the overlay's interface (gloo and NCCL pick theirs by name)."""
    if not cluster.overlay_network:
        return {}
    iface = interface_of(cluster)
    return {"GLOO_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": iface}
