"""Undoing a cluster on its hosts: stop its Ray processes (and only those), remove its key and, at the
end, its Unix user; `fail` does that and moves the cluster to FAILED with its GPUs released."""

from __future__ import annotations

import logging
import shlex

from django.utils import timezone

from clusters import allocations, checkpoint_store, drills, tenancy, transitions
from clusters.choices import ClusterStatus
from clusters.models import Cluster, ClusterNode
from clusters.provisioning import cluster_overlay, ray_nodes
from clusters.tenancy import ray_cluster_id
from inventory.choices import DriverKind
from inventory.drivers.base import DriverError, fan_out

logger = logging.getLogger(__name__)
S = ClusterStatus


def fail(cluster: Cluster, reason: str, message: str) -> Cluster:
    """FAILED with everything undone: nodes stopped, key removed, GPUs released, its drills' faults and
    cordons taken back (after the status changed too: a drill that raced it is undone as well)."""
    drills.clear_drill_faults(cluster)
    teardown(cluster, final=True)
    allocations.release(cluster)
    cluster = transitions.transition(
        cluster,
        S.FAILED,
        message,
        extra={
            "failure_reason": reason,
            "failure_message": message,
            "ended_at": timezone.now(),
        },
    )
    drills.end_drills(cluster)
    return cluster


def teardown(cluster: Cluster, nodes: list[ClusterNode] | None = None, *, final: bool = False) -> list[str]:
    """Stop this cluster's Ray processes (and only those) and remove its key, on every host it used.

    `final` (the cluster is done: terminated or failed) also removes its Unix user, with whatever
    still runs as it, its nodes' temp dirs, and gives its shared storage back to root (this machine's for
    local hosts; each SSH host's own where it has one); on SSH hosts, which are the provider's machines and
    not Volt's, its workdir goes too (logs, token, node files). A host that does not answer keeps them.
    """
    nodes = nodes if nodes is not None else list(cluster.nodes.select_related("host__provider"))
    hosts = {node.host_id: node.host for node in nodes}
    drivers = [tenancy.node_driver(host) for host in hosts.values()]
    problems = []
    try:
        ssh = {id(drivers[i]) for i, host in enumerate(hosts.values()) if host.driver == DriverKind.SSH}
        # The cluster's own user on an SSH host goes with its last node there (final teardown only).
        users = {
            id(drivers[i]): [n for n in nodes if n.host_id == host.pk]
            for i, host in enumerate(hosts.values())
            if final and host.driver == DriverKind.SSH and tenancy.node_user_on(cluster, host)
        }
        results = fan_out(
            drivers, lambda d: _stop_on_host(d, cluster, final and id(d) in ssh, users.get(id(d)))
        )
    finally:
        for driver in drivers:
            driver.close()
    cleaned = []
    for host, result in zip(hosts.values(), results, strict=True):
        if isinstance(result, Exception) or result:
            problems.append(f"{host.name}: {result if isinstance(result, Exception) else f'left {result}'}")
        else:
            cleaned.append(host.pk)
    if final and cleaned:  # what is left on the others is the reaper's (services.reap_cluster_leftovers)
        ClusterNode.objects.filter(cluster=cluster, host_id__in=cleaned, cleaned_at__isnull=True).update(
            cleaned_at=timezone.now()
        )
    if final and cluster.node_user:
        problems += tenancy.remove_node_user(cluster)
    if final:
        problems += checkpoint_store.revoke_identity(cluster)
    if problems:
        logger.warning("teardown of cluster %s incomplete: %s", cluster.pk, "; ".join(problems))
    return problems


def _stop_on_host(
    driver, cluster: Cluster, remove_workdir: bool, user_nodes: list[ClusterNode] | None = None
) -> list[int]:
    left = ray_nodes.stop_node(driver, ray_cluster_id(cluster))
    cluster_overlay.tear_down(cluster, driver)  # its interface, key and config (nothing without an overlay)
    if cluster.ssh_public_key:  # every line of the key, whatever its options (the head it forwarded to moved)
        result = driver.run(tenancy.authorized_keys_script(cluster.ssh_public_key), timeout=40)
        if not result.ok:
            raise DriverError(
                f"could not remove the cluster's key: {(result.stderr or result.stdout).strip()[:200]}"
            )
    if user_nodes is not None:  # and whatever still runs as the cluster's user (a job that left its node)
        tenancy.remove_ssh_node_user(cluster, driver, user_nodes)
        left = []
    if remove_workdir and not left:  # after the key: a failed removal must not leave the team's key behind
        workdir = ray_nodes.workdir_for(ray_cluster_id(cluster))
        driver.run(
            f"rm -rf -- ~/{shlex.quote(workdir)}; rmdir ~/volt/clusters ~/volt 2>/dev/null; true", timeout=60
        )
    return left
