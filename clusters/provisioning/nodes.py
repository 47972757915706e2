"""Bringing a cluster's nodes up: prepare every host, start the Ray head and workers, wait until the head
reports every node ALIVE (clusters/provision.py runs it; recovery re-uses it for replacement nodes).

A host that cannot be prepared, or whose node does not start or join, raises HostsFailed naming it: the
caller replaces it (provisioning/replacement.py). Every step is idempotent (`ray_nodes.start_*` return a
node that already runs), so a redelivered task carries on where the last one stopped.
"""

from __future__ import annotations

import logging
import shlex
import socket

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from clusters import tenancy, transitions
from clusters.choices import ClusterStatus
from clusters.models import Cluster, ClusterNode
from clusters.provisioning import cluster_overlay, ray_nodes
from clusters.tenancy import (
    ensure_keys,
    ray_auth_token,
    ray_cluster_id,
    shared_storage_dir,
)
from inventory import local_runtime, runtimes, tunnels
from inventory import services as inventory
from inventory.choices import DriverKind
from inventory.drivers.base import DriverError, fan_out
from inventory.drivers.sudo import SudoDriver
from inventory.models import Host
from voltweb import namespace

logger = logging.getLogger(__name__)
S = ClusterStatus


class HostsFailed(Exception):
    """Some hosts of the cluster could not be brought up; they are to be replaced."""

    def __init__(self, host_ids, message: str):
        super().__init__(message)
        self.host_ids = sorted(set(host_ids))


class Abandoned(Exception):
    """The cluster was terminated (or failed) while this task was bringing it up."""


# Statuses in which bringing nodes up is still wanted (RECOVERING: clusters/recovery.py re-uses bring_up).
BRINGING_UP = (S.PROVISIONING, S.VERIFYING, S.RECOVERING)


def still_wanted(cluster: Cluster) -> None:
    if not Cluster.objects.filter(pk=cluster.pk, status__in=BRINGING_UP).exists():
        raise Abandoned(cluster.pk)


def active_nodes(cluster: Cluster) -> list[ClusterNode]:
    return list(cluster.nodes.active().select_related("host__provider").order_by("rank"))


def bring_up(cluster: Cluster) -> None:
    """Prepare the hosts, start the head and the workers, wait until all are ALIVE. Raises HostsFailed."""
    ensure_keys(cluster)
    nodes = assign_slots(cluster)
    _check_runtimes(nodes)
    drivers = [tenancy.node_driver(node.host) for node in nodes]
    try:
        run_as = _node_user(cluster, nodes, drivers)
        users = {id(d): tenancy.node_user_on(cluster, n.host) for n, d in zip(nodes, drivers, strict=True)}
        try:  # first: the head's dashboard (the cluster key's one forward) may be on the overlay
            cluster_overlay.set_up(cluster, nodes, drivers)
        except cluster_overlay.OverlayHostsFailed as exc:
            raise HostsFailed(list(exc.failed), str(exc)) from exc
        still_wanted(cluster)
        dashboard = tenancy.dashboard_target(nodes)
        prepared = fan_out(
            drivers, lambda d: prepare_host(d, cluster, users[id(d)] if run_as else None, dashboard)
        )
        _check(nodes, prepared, "could not be prepared")
        still_wanted(cluster)
        head_index = next(i for i, node in enumerate(nodes) if node.is_head)
        head = _start(
            cluster,
            nodes[head_index],
            drivers[head_index],
            None,
            users[id(drivers[head_index])] if run_as else None,
        )
        transitions.note(
            cluster, f"Ray head up on {nodes[head_index].host.name} ({head.gcs_address})", heartbeat=True
        )
        still_wanted(cluster)
        others = [i for i in range(len(nodes)) if i != head_index]
        started = fan_out(
            [drivers[i] for i in others],
            lambda d: _start(
                cluster, nodes[drivers.index(d)], d, head.gcs_address, users[id(d)] if run_as else None
            ),
        )
        _check([nodes[i] for i in others], started, "could not start its Ray worker")
        _wait_alive(cluster, nodes, head, nodes[head_index].host)
    finally:
        for driver in drivers:
            driver.close()


def _check(nodes: list[ClusterNode], results: list, what: str) -> None:
    failed = [
        (node, result) for node, result in zip(nodes, results, strict=True) if isinstance(result, Exception)
    ]
    if failed:
        detail = "; ".join(f"{node.host.name} {what}: {result}" for node, result in failed)
        raise HostsFailed([node.host_id for node, _ in failed], detail)


def _node_user(cluster: Cluster, nodes: list[ClusterNode], drivers: list) -> str | None:
    """The cluster's own Unix user where Volt has the privilege (created where missing), or None. Local
    hosts: this machine's user, Volt being root; SSH hosts (a cluster with no local node): one on each host
    whose login is root or has sudo, with one uid everywhere."""
    local = any(n.host.driver == DriverKind.LOCAL for n in nodes)
    try:
        run_as = tenancy.ensure_node_user(cluster, nodes, drivers)
    except DriverError as exc:
        raise HostsFailed([n.host_id for n in nodes if n.host.driver == DriverKind.LOCAL], str(exc)) from exc
    if not local:
        failed = tenancy.ensure_ssh_node_users(cluster, nodes, drivers)
        if failed:
            detail = "; ".join(f"{n.host.name}: {e}" for n, e in failed)
            raise HostsFailed([n.host_id for n, _ in failed], detail)
        return cluster.node_user or None
    if run_as is None and not cluster.events.filter(message=tenancy.NOT_ISOLATED).exists():
        transitions.note(cluster, tenancy.NOT_ISOLATED, heartbeat=True)
    if run_as is not None:
        try:
            closed = tenancy.close_volt_ports(cluster)
        except DriverError as exc:
            raise HostsFailed(
                [n.host_id for n in nodes if n.host.driver == DriverKind.LOCAL], str(exc)
            ) from exc
        if not closed and not cluster.events.filter(message=tenancy.NOT_FIREWALLED).exists():
            transitions.note(cluster, tenancy.NOT_FIREWALLED, heartbeat=True)
    return run_as


def _start(
    cluster: Cluster, node: ClusterNode, driver, head_address: str | None, run_as: str | None
) -> ray_nodes.NodeHandle:
    """Start the node (`run_as`: the cluster's user on this host, tenancy.node_user_on; runs in a thread)."""
    local = node.host.driver == DriverKind.LOCAL
    if run_as is None and isinstance(driver, SudoDriver):  # never Ray as root on a provider's host
        raise HostsFailed([node.host_id], f"{node.host.name}: the cluster has no Unix user of its own there")
    options = {
        "cluster_id": ray_cluster_id(cluster),
        "ports": ray_nodes.ports_for(node.slot),
        "num_gpus": len(node.gpu_indices),
        "gpu_indices": node.gpu_indices,
        "host_id": node.host_id,
        "temp_dir": tenancy.node_temp_dir(cluster, node),
        "python": python_for(node.host),
        "env": {
            **node_env(node.host),
            **cluster_overlay.node_env(cluster),
            **_join_patience(head_address),
            **_health_checks(head_address),
        },
        "auth_token": ray_auth_token(cluster),
        "node_ip": node.node_ip,
        "run_as": run_as,
        "open_workdir": not local,
        "hidden_paths": tenancy.volt_socket_dirs() if local and run_as else (),
    }
    try:
        if head_address is None:
            return ray_nodes.start_head(driver, **options)
        return ray_nodes.start_worker(driver, head_address=head_address, **options)
    except (DriverError, ValueError) as exc:
        if head_address is None:
            raise HostsFailed(
                [node.host_id], f"{node.host.name} could not start the Ray head: {exc}"
            ) from exc
        raise


def _wait_alive(
    cluster: Cluster, nodes: list[ClusterNode], head: ray_nodes.NodeHandle, head_host: Host
) -> None:
    ips = {node.node_ip: node for node in nodes}
    try:
        dashboard = tunnels.http_url(head_host, head.dashboard_url)
    except DriverError as exc:
        raise HostsFailed(
            [head_host.pk], f"Volt could not reach {head_host.name}'s Ray dashboard: {exc}"
        ) from exc
    try:
        ray_nodes.wait_for_nodes(
            dashboard,
            len(nodes),
            settings.VOLT_NODE_JOIN_TIMEOUT_S,
            expected_ips=set(ips),
            poll_s=0.3,
            auth_token=ray_auth_token(cluster),
        )
    except ray_nodes.NodesNotReady as exc:
        missing = [ips[ip] for ip in exc.missing if ip in ips] or [n for n in nodes if n.is_head]
        raise HostsFailed(
            [n.host_id for n in missing],
            f"{', '.join(n.host.name for n in missing)} did not "
            f"join within {settings.VOLT_NODE_JOIN_TIMEOUT_S:g} s ({exc})",
        ) from exc
    Cluster.objects.filter(pk=cluster.pk).update(
        ray_address=head.gcs_address,
        dashboard_url=head.dashboard_url,
        storage_path=tenancy.storage_location(cluster),
        updated_at=timezone.now(),
    )


def python_for(host: Host) -> str:
    """The Python a host runs Ray, the probe and job drivers from (DESIGN.md "Host runtime"): the local
    runtime on local hosts, the host's own recorded runtime on SSH hosts (inventory/runtimes.py)."""
    if host.driver == DriverKind.LOCAL:
        return local_runtime.python_for_local_hosts()
    return runtimes.python_of(host)


def _check_runtimes(nodes: list[ClusterNode]) -> None:
    """Head and workers run exactly Volt's pins (Volt submits and reads over Ray's HTTP API: the same Ray):
    each SSH node's runtime is checked on the host before Ray starts; a mismatch names the host and the fix."""
    refused = runtimes.check_nodes([node.host for node in nodes])
    if refused:
        raise HostsFailed(list(refused), "; ".join(refused.values()))


def node_env(host: Host) -> dict[str, str]:
    # gloo takes its address from the hostname; on local hosts keep it on loopback (DESIGN.md).
    return {"GLOO_SOCKET_IFNAME": "lo"} if host.driver == DriverKind.LOCAL else {}


def _join_patience(head_address: str | None) -> dict[str, str]:
    """A worker looks for its head in the GCS 20 times 2 s by default, then exits: on a loaded machine a
    head can take longer to register, so the worker keeps looking as long as Volt waits for it to join."""
    if head_address is None:
        return {}
    return {"RAY_NUM_REDIS_GET_RETRIES": str(max(20, int(settings.VOLT_NODE_JOIN_TIMEOUT_S // 2)))}


def _health_checks(head_address: str | None) -> dict[str, str]:
    """The head's GCS checks its nodes every VOLT_RAY_HEALTH_CHECK_PERIOD_MS (Ray reads RAY_<config>)."""
    if head_address is not None:
        return {}
    return {"RAY_health_check_period_ms": str(settings.VOLT_RAY_HEALTH_CHECK_PERIOD_MS)}


def prepare_host(driver, cluster: Cluster, run_as: str | None = None, dashboard: str | None = None) -> None:
    """Workspace, the cluster's public key authorized (forwards to `dashboard` alone, when given: its head's),
    shared storage reachable. Idempotent.

    With `run_as` (the cluster's own user) the shared storage belongs to that user, mode 0700. On an SSH
    host its user must also reach that storage through the workdir's link, which sits in the login user's
    home: the folders above it get o+x (search, no listing); the home's own files keep their modes.
    """
    workdir = ray_nodes.workdir_for(ray_cluster_id(cluster))
    traverse = []
    if isinstance(driver, inventory.LocalDriver):
        shared = shared_storage_dir(cluster)
        shared.mkdir(parents=True, exist_ok=True)
        storage = f"ln -sfn {shlex.quote(str(shared))} ~/{workdir}/storage"
        if run_as:  # the cluster's user alone: another cluster's user must not read its checkpoints
            storage += f" && chown {run_as}:{run_as} {shlex.quote(str(shared))} && chmod 700 {shlex.quote(str(shared))}"
    elif settings.VOLT_SSH_SHARED_DIR:  # one folder every SSH host mounts at the same path
        shared = shlex.quote(f"{settings.VOLT_SSH_SHARED_DIR.rstrip('/')}/{ray_cluster_id(cluster)}")
        link = f"~/{workdir}/storage"
        # The shared folder is often writable by all (the lab's is 1777): a job may have planted a link, or a
        # folder of its own, where a later cluster's storage goes, and root would chmod and chown what it points
        # at. So root changes only a folder that is root's (it made it; no user can rename a root-owned entry
        # of a sticky folder), and takes one that already is the cluster user's as it is (its owner could swap
        # it for a link between a check and a chmod).
        if run_as:
            settle = (
                f'u=$(id -u {run_as}) && {{ [ "$o" = "$u" ] || '
                f'{{ [ "$o" = 0 ] && chmod 700 {shared} && chown {run_as}: {shared}; }}; }}'
            )
        else:
            settle = f'[ "$o" = "$(id -u)" ] && chmod 700 {shared}'
        storage = (
            f"{{ {{ [ ! -L {shared} ] && mkdir -p {shared} && o=$(stat -c %u {shared}) && {settle}; }} || "
            f"{{ echo 'the storage folder '{shared}' is a link or another user made it: refusing it' >&2; exit 5; }}; }}"
            f" && {{ [ -L {link} ] || [ ! -d {link} ] || rmdir {link}; }} && ln -sfn {shared} {link}"
        )
    else:
        storage = f"mkdir -p ~/{workdir}/storage" + (
            f" && chown {run_as}:{run_as} ~/{workdir}/storage" if run_as else ""
        )
    if run_as and not isinstance(driver, inventory.LocalDriver):
        traverse = [f"chmod o+x ~ ~/volt ~/volt/clusters ~/{workdir}"]
    script = " && ".join(
        [
            f"mkdir -p ~/{workdir}",
            # One line per key: a recovered cluster's head moved, and with it the one place a forward may go.
            tenancy.authorized_keys_script(
                cluster.ssh_public_key, tenancy.authorized_key_line(cluster, dashboard)
            ),
            storage,
            *traverse,
        ]
    )
    result = driver.run(script, timeout=30)
    if not result.ok:
        raise DriverError(
            f"preparing {driver.address} failed: {(result.stderr or result.stdout).strip()[:300]}"
        )


def assign_slots(cluster: Cluster) -> list[ClusterNode]:
    """Give every active node a Ray port slot, unique per machine among active nodes (a DB constraint).

    Two clusters provisioned at once may pick the same free slot; the constraint refuses the second
    and it takes the next one.
    """
    nodes = active_nodes(cluster)
    for node in nodes:
        if node.slot is None:
            node.machine = _machine_of(node.host)
            node.slot = _claim_slot(node)
    return nodes


def _machine_of(host: Host) -> str:
    """Which machine's ports a node uses: every loopback address is this machine (Ray binds wildcards)."""
    if host.driver == DriverKind.LOCAL or host.node_ip.startswith("127.") or host.node_ip == "localhost":
        return "local"
    return f"host-{host.pk}"


def _claim_slot(node: ClusterNode) -> int:
    refused: set[int] = set()
    while True:
        taken = refused | set(
            ClusterNode.objects.filter(
                machine=node.machine, released_at__isnull=True, slot__isnull=False
            ).values_list("slot", flat=True)
        )
        start = namespace.first_slot()  # this install's end of the range first
        order = [(start + i) % (ray_nodes.MAX_SLOT + 1) for i in range(ray_nodes.MAX_SLOT + 1)]
        usable = (s for s in order if s not in taken)
        if node.machine == "local":  # another Volt (a demo, a test run) may use this machine's ports too
            usable = (s for s in usable if _ports_free(ray_nodes.ports_for(s)))
        slot = next(usable, None)
        if slot is None:
            raise HostsFailed([node.host_id], f"no free Ray port slot on {node.machine}")
        try:
            with transaction.atomic():
                ClusterNode.objects.filter(pk=node.pk).update(machine=node.machine, slot=slot)
            return slot
        except IntegrityError:
            refused.add(slot)


def _ports_free(ports: ray_nodes.NodePorts) -> bool:
    """Whether every fixed port of a slot is free on this machine, on any address (Ray binds wildcards,
    and a node left over from elsewhere may hold one on its own 127.0.0.N)."""
    fixed = [port for name, port in vars(ports).items() if name not in ("min_worker", "max_worker")]
    fixed.append(ports.gcs + ray_nodes.PROBE_PORT_OFFSET)  # the probe's rendezvous, on a head's host
    for port in fixed:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "held"
            try:
                probe.bind(("0.0.0.0", port))  # refused while any address holds the port
            except OSError:
                return False
    return True
