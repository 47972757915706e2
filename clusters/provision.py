"""Provisioning: from allocated GPUs to a verified Ray cluster, and back (DESIGN.md "Cluster lifecycle").

    PROVISIONING: cluster key pair → prepare every host in parallel (workspace, authorized key, shared
                  storage) → Ray head → workers in parallel → the head reports every node ALIVE
    VERIFYING:    the all-reduce probe runs on every host (clusters/probes/launch.py) → stored next to
                  the prediction, flagged when below VOLT_PROBE_MIN_FRACTION of it; a flagged cluster
                  whose probe names one host as the slowest gets it replaced (back to PROVISIONING, up
                  to VOLT_SLOW_HOST_REPLACEMENTS times) and is probed again
    READY:        credentials on the cluster (Ray address, dashboard, storage path, SSH key)

A host that cannot be prepared, whose node does not start or does not join, is cordoned as suspect and
its nodes are placed again near the survivors; when VOLT_PROVISION_ATTEMPTS run out the cluster is
FAILED with every node stopped, the key removed and every GPU released. Every step is idempotent
(`ray_nodes.start_*` return a node that already runs), so a redelivered task — or the reaper, after a
worker died — carries on where the last one stopped.
"""

from __future__ import annotations

import logging
import shlex
import socket
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from clusters import allocations, drills, metrics, placement, planning, tenancy, transitions
from clusters.choices import ClusterStatus, FailureReason
from clusters.models import Cluster, ClusterNode
from clusters.placement.bandwidth import format_gbps
from clusters.probes import allreduce, launch
from clusters.provisioning import ray_nodes
from clusters.tenancy import (  # noqa: F401 - ray_cluster_id, ensure_keys: re-exported for callers
    ensure_keys,
    ray_auth_token,
    ray_cluster_id,
    shared_storage_dir,
)
from inventory import local_runtime
from inventory import services as inventory
from inventory.choices import DriverKind, HostState
from inventory.drivers.base import DriverError, fan_out
from inventory.models import Host
from voltweb import namespace
from voltweb.statemachine import IllegalTransition

logger = logging.getLogger(__name__)
S = ClusterStatus


class HostsFailed(Exception):
    """Some hosts of the cluster could not be brought up; they are to be replaced."""

    def __init__(self, host_ids, message: str):
        super().__init__(message)
        self.host_ids = sorted(set(host_ids))


class NoReplacement(Exception):
    """No free host can take the place of a failed one."""


@dataclass(frozen=True)
class Replacement:
    """What replace_hosts() did: the new nodes' hosts and why they were chosen (how close to the survivors)."""

    failed: tuple[str, ...]  # host names replaced
    hosts: tuple[dict, ...]  # {"id", "name", "rank", "is_head"} of each new node
    level: str  # block, fabric, site or anywhere: the closest tier to the survivors that had room
    reason: str  # the explanation recorded on the timeline and the recovery record


# --- the task body -----------------------------------------------------------------------------------


def provision_cluster(cluster_id: int) -> Cluster:
    """Bring a PROVISIONING cluster to READY (or FAILED); resume a VERIFYING one. Idempotent.

    Verification may send the cluster back to PROVISIONING once a slow host is replaced; the loop
    brings the new node up and probes again. A cluster terminated meanwhile is abandoned: whatever
    this task started is stopped again.
    """
    cluster = Cluster.objects.get(pk=cluster_id)
    try:
        for _ in range(settings.VOLT_SLOW_HOST_REPLACEMENTS + 2):
            if cluster.status == S.PROVISIONING:
                cluster = _provision_pass(cluster)
                if cluster.status != S.PROVISIONING:
                    return abandon(cluster)
                cluster = transitions.transition(
                    cluster, S.VERIFYING, "every node joined; running the all-reduce probe"
                )
            if cluster.status != S.VERIFYING:
                break
            cluster = verify(cluster)
            if cluster.status != S.PROVISIONING:
                break
    except (Abandoned, IllegalTransition):
        return abandon(cluster)
    return cluster


def _provision_pass(cluster: Cluster) -> Cluster:
    Cluster.objects.filter(pk=cluster.pk).update(
        provision_attempts=F("provision_attempts") + 1, updated_at=timezone.now()
    )
    if cluster.provisioning_started_at is None:
        Cluster.objects.filter(pk=cluster.pk).update(provisioning_started_at=timezone.now())
    return _bring_up_with_replacements(cluster)


class Abandoned(Exception):
    """The cluster was terminated (or failed) while this task was bringing it up."""


# Statuses in which bringing nodes up is still wanted (RECOVERING: clusters/recovery.py re-uses bring_up).
BRINGING_UP = (S.PROVISIONING, S.VERIFYING, S.RECOVERING)


def _still_wanted(cluster: Cluster) -> None:
    if not Cluster.objects.filter(pk=cluster.pk, status__in=BRINGING_UP).exists():
        raise Abandoned(cluster.pk)


def abandon(cluster: Cluster) -> Cluster:
    """Someone terminated the cluster meanwhile: stop what this task may have started after their teardown."""
    cluster = Cluster.objects.get(pk=cluster.pk)
    if cluster.status in (S.TERMINATING, S.TERMINATED, S.FAILED):
        started = list(cluster.nodes.filter(slot__isnull=False).select_related("host__provider"))
        teardown(cluster, started, final=True)
    return cluster


def _bring_up_with_replacements(cluster: Cluster) -> Cluster:
    attempts = settings.VOLT_PROVISION_ATTEMPTS
    if any(node.host.driver == DriverKind.LOCAL for node in active_nodes(cluster)):
        try:  # a runtime that does not match Volt's pins fails every host alike: no replacement helps
            local_runtime.python_for_local_hosts()
        except local_runtime.RuntimeMismatch as exc:
            return fail(cluster, FailureReason.CONFIG_INVALID, str(exc))
    for attempt in range(1, attempts + 1):
        try:
            bring_up(cluster)
            return Cluster.objects.get(pk=cluster.pk)
        except HostsFailed as failure:
            transitions.note(cluster, f"attempt {attempt}/{attempts}: {failure}", heartbeat=True)
            if attempt == attempts:
                return fail(
                    cluster, FailureReason.HOST_FAILED, f"gave up after {attempts} attempts: {failure}"
                )
            try:
                replace_hosts(cluster, failure.host_ids, str(failure))
            except NoReplacement as exc:
                return fail(cluster, FailureReason.HOST_FAILED, f"{failure}; {exc}")
    return Cluster.objects.get(pk=cluster.pk)


# --- bringing the nodes up ---------------------------------------------------------------------------


def active_nodes(cluster: Cluster) -> list[ClusterNode]:
    return list(cluster.nodes.active().select_related("host__provider").order_by("rank"))


def bring_up(cluster: Cluster) -> None:
    """Prepare the hosts, start the head and the workers, wait until all are ALIVE. Raises HostsFailed."""
    ensure_keys(cluster)
    nodes = assign_slots(cluster)
    drivers = [inventory.driver_for(node.host) for node in nodes]
    try:
        run_as = _node_user(cluster, nodes, drivers)
        prepared = fan_out(drivers, lambda d: prepare_host(d, cluster, run_as))
        _check(nodes, prepared, "could not be prepared")
        _still_wanted(cluster)
        head_index = next(i for i, node in enumerate(nodes) if node.is_head)
        head = _start(cluster, nodes[head_index], drivers[head_index], None, run_as)
        transitions.note(
            cluster, f"Ray head up on {nodes[head_index].host.name} ({head.gcs_address})", heartbeat=True
        )
        _still_wanted(cluster)
        others = [i for i in range(len(nodes)) if i != head_index]
        started = fan_out(
            [drivers[i] for i in others],
            lambda d: _start(cluster, nodes[drivers.index(d)], d, head.gcs_address, run_as),
        )
        _check([nodes[i] for i in others], started, "could not start its Ray worker")
        _wait_alive(cluster, nodes, head)
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
    try:
        run_as = tenancy.ensure_node_user(cluster, nodes, drivers)
    except DriverError as exc:
        raise HostsFailed([n.host_id for n in nodes if n.host.driver == DriverKind.LOCAL], str(exc)) from exc
    local = any(n.host.driver == DriverKind.LOCAL for n in nodes)
    if local and run_as is None and not cluster.events.filter(message=tenancy.NOT_ISOLATED).exists():
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
    local = node.host.driver == DriverKind.LOCAL
    options = {
        "cluster_id": ray_cluster_id(cluster),
        "ports": ray_nodes.ports_for(node.slot),
        "num_gpus": len(node.gpu_indices),
        "gpu_indices": node.gpu_indices,
        "host_id": node.host_id,
        "temp_dir": tenancy.node_temp_dir(cluster, node),
        "python": python_for(node.host),
        "env": {
            **_node_env(node.host),
            **_join_patience(head_address),
            **_health_checks(head_address),
        },
        "auth_token": ray_auth_token(cluster),
        "run_as": run_as if local else None,
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


def _wait_alive(cluster: Cluster, nodes: list[ClusterNode], head: ray_nodes.NodeHandle) -> None:
    ips = {node.host.address: node for node in nodes}
    try:
        ray_nodes.wait_for_nodes(
            head.dashboard_url,
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
    """The Python a host runs Ray, the probe and job drivers from (DESIGN.md "Host runtime")."""
    return (
        local_runtime.python_for_local_hosts()
        if host.driver == DriverKind.LOCAL
        else settings.VOLT_HOST_PYTHON
    )


def _node_env(host: Host) -> dict[str, str]:
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


def prepare_host(driver, cluster: Cluster, run_as: str | None = None) -> None:
    """Workspace, the cluster's public key authorized, shared storage reachable. Idempotent.

    With `run_as` (local hosts, the cluster's own user) the shared storage belongs to that user.
    """
    workdir = ray_nodes.workdir_for(ray_cluster_id(cluster))
    key = shlex.quote(cluster.ssh_public_key)
    if isinstance(driver, inventory.LocalDriver):
        shared = shared_storage_dir(cluster)
        shared.mkdir(parents=True, exist_ok=True)
        storage = f"ln -sfn {shlex.quote(str(shared))} ~/{workdir}/storage"
        if run_as:  # the cluster's user alone: another cluster's user must not read its checkpoints
            storage += f" && chown {run_as}:{run_as} {shlex.quote(str(shared))} && chmod 700 {shlex.quote(str(shared))}"
    else:
        storage = f"mkdir -p ~/{workdir}/storage"
    script = " && ".join(
        [
            f"mkdir -p ~/{workdir} ~/.ssh",
            "chmod 700 ~/.ssh",
            "touch ~/.ssh/authorized_keys",
            f"(grep -qxF {key} ~/.ssh/authorized_keys || echo {key} >> ~/.ssh/authorized_keys)",
            storage,
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
    if host.driver == DriverKind.LOCAL or host.address.startswith("127.") or host.address == "localhost":
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
        start = namespace.first_slot(settings.VOLT_DATA_DIR)  # this install's end of the range first
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


# --- verification ------------------------------------------------------------------------------------


def run_probe(cluster: Cluster, nodes: list[ClusterNode]) -> launch.ProbeRun:
    """The all-reduce probe over the cluster's hosts, sized to VOLT_PROBE_BUDGET_S at its predicted busbw
    (allreduce.budget_plan): verification and the live probe (on demand, idle) alike.

    One rank per node, started through the host's driver as the node's own processes start (its user,
    environment and marker: teardown stops a leftover rank with the node), rank 0 on the head's host
    serving the rendezvous on its slot's probe port. The caller holds `probe_lock_key` (one probe of a
    cluster at a time: the port fits one). A host that cannot be reached answers an ERROR run."""
    plan = allreduce.budget_plan(
        cluster.predicted_busbw_gbps,
        settings.VOLT_PROBE_BUDGET_S,
        len(nodes),
        settings.VOLT_PROBE_ITERS,
        _PROBE_WARMUP,
        settings.VOLT_PROBE_MAX_MB * allreduce.MB,
    )
    ordered = sorted(nodes, key=lambda node: (not node.is_head, node.host.address))
    drivers = []
    try:
        drivers = [inventory.driver_for(node.host) for node in ordered]
        hosts = [_probe_host(cluster, node, driver) for node, driver in zip(ordered, drivers, strict=True)]
        return launch.run_probe(
            hosts,
            ray_nodes.probe_port(ordered[0].slot),
            plan=plan,
            max_mb=settings.VOLT_PROBE_MAX_MB,
            iters=settings.VOLT_PROBE_ITERS,
            warmup=_PROBE_WARMUP,
            timeout_s=settings.VOLT_PROBE_TIMEOUT_S,
            hosts_below_gbps=_hosts_phase_threshold(cluster, ordered),
        )
    except DriverError as exc:  # a host that cannot even be reached to start its rank
        return launch.ProbeRun("ERROR", str(exc), None)
    finally:
        for driver in drivers:
            driver.close()


def _hosts_phase_threshold(cluster: Cluster, nodes: list[ClusterNode]) -> float | None:
    """Below what busbw the probe's per-host phase runs: where the cluster would be flagged. None (always)
    when the measurement is not compared with the prediction (no prediction; local hosts over plain
    loopback), where the hosts' relative verdict alone names a slow one."""
    local = any(node.host.driver == DriverKind.LOCAL for node in nodes)
    if not cluster.predicted_busbw_gbps or (local and not inventory.links_emulated()):
        return None
    return settings.VOLT_PROBE_MIN_FRACTION * cluster.predicted_busbw_gbps


def _probe_host(cluster: Cluster, node: ClusterNode, driver) -> launch.ProbeHost:
    local = node.host.driver == DriverKind.LOCAL
    python = python_for(node.host)
    env = {
        ray_nodes.NODE_MARKER_VAR: ray_nodes.node_marker(ray_cluster_id(cluster), driver),
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, node.gpu_indices)),  # the cluster's GPUs, as its node's
        **_node_env(node.host),
    }
    run_as = (cluster.node_user or None) if local else None
    prefix = ray_nodes.launcher(
        tenancy.node_temp_dir(cluster, node),
        run_as,
        env,
        python,
        tenancy.volt_socket_dirs() if run_as else (),
    )
    return launch.ProbeHost(driver, node.host.address, python, prefix)


def probe_lock_key(cluster_id: int) -> str:
    """The cache key held while a probe of the cluster runs (its rendezvous port fits one probe)."""
    return f"volt:probe:{cluster_id}"


def probe_lock_s() -> int:
    """How long the lock outlives a worker that died holding it: the probe's own time limit, and a minute."""
    return int(settings.VOLT_PROBE_TIMEOUT_S) + 60


def verify(cluster: Cluster, *, replace_slow: bool = True) -> Cluster:
    """Run the all-reduce probe and store it beside the prediction: READY (flagged if slow), FAILED, or
    back to PROVISIONING with the slowest host replaced (a flagged cluster, VOLT_SLOW_HOST_REPLACEMENTS).

    `replace_slow=False` (recovery): a slow host is named, never replaced."""
    nodes = active_nodes(cluster)
    if len(nodes) == 1:
        return _ready(cluster, None, "single node: no inter-node all-reduce to measure")
    local = nodes[0].host.driver == DriverKind.LOCAL
    probe = _probe_waiting_for_others(cluster, nodes)
    result = probe.result
    if result is None:
        tail = "\n".join(probe.output.strip().splitlines()[-5:])
        return fail(
            cluster, FailureReason.VERIFICATION_FAILED, f"all-reduce probe {probe.status.lower()}: {tail}"
        )
    _still_wanted(cluster)
    result["links_emulated"] = not local or inventory.links_emulated()
    if local and result["links_emulated"]:  # the figures are at this scale (the page says so)
        result["fabric_scale"] = inventory.bandwidth_scale(DriverKind.LOCAL)
    message = _probe_summary(cluster, result)
    slow = allreduce.slowest_host(result, settings.VOLT_SLOW_HOST_FRACTION)
    node = next((n for n in nodes if slow and n.host.address == slow["node_ip"]), None)
    if node is not None:
        message += (
            f"; {node.host.name} is the slowest host: {slow['what']} {format_gbps(slow['gbps'], 2)} GB/s, "
            f"{slow['ratio']:.0%} of the other hosts' {format_gbps(slow['others_gbps'], 2)} GB/s"
        )
    # Over plain loopback the prediction says nothing (never flagged), so the hosts' relative verdict
    # alone decides, as it did when such clusters were always flagged against their declared fabric.
    compared = result["links_emulated"]
    if (compared and not _flagged(cluster, result)) or node is None:
        return _ready(cluster, result, message)
    if not replace_slow:
        return _ready(cluster, result, message + " (not replaced while recovering)")
    if cluster.slow_hosts_replaced >= settings.VOLT_SLOW_HOST_REPLACEMENTS:
        return _ready(cluster, result, message + " (not replaced: VOLT_SLOW_HOST_REPLACEMENTS reached)")
    transitions.note(cluster, message, heartbeat=True)
    try:
        replace_hosts(cluster, [node.host_id], f"the slowest host in the all-reduce probe ({slow['what']} "
                      f"{slow['ratio']:.0%} of the other hosts')", keep_without_replacement=True)  # fmt: skip
    except NoReplacement as exc:
        return _ready(cluster, result, f"{message}; kept it: {exc}")
    Cluster.objects.filter(pk=cluster.pk).update(slow_hosts_replaced=F("slow_hosts_replaced") + 1)
    cluster.refresh_from_db()
    return transitions.transition(
        cluster, S.PROVISIONING, f"replacing the slow host {node.host.name}; probing again once it joins"
    )


_PROBE_WARMUP = 2


def _probe_waiting_for_others(cluster: Cluster, nodes: list[ClusterNode]) -> launch.ProbeRun:
    """Verification's probe: it waits while a live probe of the cluster (a DEGRADED one) finishes."""
    key = probe_lock_key(cluster.pk)
    deadline = time.monotonic() + settings.VOLT_PROBE_TIMEOUT_S
    while not cache.add(key, 1, timeout=probe_lock_s()):
        if time.monotonic() > deadline:
            return launch.ProbeRun(
                "ERROR", "another probe of this cluster held it past VOLT_PROBE_TIMEOUT_S", None
            )
        time.sleep(0.2)
    try:
        return run_probe(cluster, nodes)
    finally:
        cache.delete(key)


def _flagged(cluster: Cluster, result: dict | None) -> bool:
    """Below VOLT_PROBE_MIN_FRACTION of the prediction; never for local hosts on plain loopback, whose
    links do not run at the fabric they declare (the page says "links not emulated" instead)."""
    measured = (result or {}).get("max_busbw_gbps")
    predicted = cluster.predicted_busbw_gbps
    if not (result or {}).get("links_emulated", True):
        return False
    return bool(
        measured is not None and predicted and measured < settings.VOLT_PROBE_MIN_FRACTION * predicted
    )


def _probe_summary(cluster: Cluster, result: dict) -> str:
    measured = result.get("max_busbw_gbps") or 0.0
    predicted = cluster.predicted_busbw_gbps
    ratio = (
        f" ({measured / predicted:.1%} of the predicted {format_gbps(predicted, 1)} GB/s)"
        if predicted
        else ""
    )
    if not result.get("links_emulated", True):
        ratio = " (local hosts, links not emulated: plain loopback, not compared with the prediction)"
    sizes = result.get("sizes_bytes") or []
    ran = f"; sizes {sizes[0] // 1024} KB-{sizes[-1] // 1024} KB" if sizes else ""
    return f"probe: {result['nodes']} ranks over {result['backend']}, max busbw {format_gbps(measured, 2)} GB/s{ratio}{ran}"


def _ready(cluster: Cluster, result: dict | None, message: str) -> Cluster:
    measured = (result or {}).get("max_busbw_gbps")
    flagged = _flagged(cluster, result)
    if flagged:
        message += f"; below {settings.VOLT_PROBE_MIN_FRACTION:.0%} of the prediction: flagged"
    if measured is not None:
        _record_sample(cluster, measured, result)
        metrics.record_busbw(cluster, measured)  # the first point of the cluster's bandwidth chart
    return transitions.transition(
        cluster,
        S.READY,
        message,
        extra={
            "probe_result": result,
            "measured_busbw_gbps": measured,
            "bandwidth_flagged": flagged,
            "ready_at": timezone.now(),
        },
    )


def _record_sample(cluster: Cluster, busbw: float, result: dict) -> None:
    """Feed the measurement back to placement for the domain the cluster spans (block/fabric/site).

    Local hosts: over emulated links the sample is in the emulation's units (as their predictions);
    on plain loopback it is kept but never steers placement."""

    plan = cluster.plan or {}
    level, domain = plan.get("spanned_level"), plan.get("spanned_domain") or []
    index = {"block": 3, "fabric": 2, "site": 1, "region": 0}.get(level)
    local = cluster.nodes.filter(host__driver=DriverKind.LOCAL).exists()
    emulated = bool(result.get("links_emulated", True))
    if index is not None and len(domain) > index:
        planning.record_bandwidth_sample(
            level,
            domain[index],
            busbw,
            nodes=result["nodes"],
            cluster=cluster,
            source_local=local,
            emulated=local and emulated,
        )


# --- failure, replacement and teardown -----------------------------------------------------------


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
    still runs as it, its nodes' temp dirs, and gives its shared storage back to root.
    """
    nodes = nodes if nodes is not None else list(cluster.nodes.select_related("host__provider"))
    hosts = {node.host_id: node.host for node in nodes}
    drivers = [inventory.driver_for(host) for host in hosts.values()]
    problems = []
    try:
        results = fan_out(drivers, lambda d: _stop_on_host(d, cluster))
    finally:
        for driver in drivers:
            driver.close()
    for host, result in zip(hosts.values(), results, strict=True):
        if isinstance(result, Exception) or result:
            problems.append(f"{host.name}: {result if isinstance(result, Exception) else f'left {result}'}")
    if final and cluster.node_user:
        problems += tenancy.remove_node_user(cluster)
    if problems:
        logger.warning("teardown of cluster %s incomplete: %s", cluster.pk, "; ".join(problems))
    return problems


def _stop_on_host(driver, cluster: Cluster) -> list[int]:
    left = ray_nodes.stop_node(driver, ray_cluster_id(cluster))
    if cluster.ssh_public_key:
        key = shlex.quote(cluster.ssh_public_key)
        driver.run(
            f"[ -f ~/.ssh/authorized_keys ] && grep -vxF {key} ~/.ssh/authorized_keys > ~/.ssh/.ak.volt; "
            "[ -f ~/.ssh/.ak.volt ] && cat ~/.ssh/.ak.volt > ~/.ssh/authorized_keys && rm -f ~/.ssh/.ak.volt; true",
            timeout=20,
        )
    return left


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
        plan, level = _replacement_plan(cluster, nodes)
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


def _replacement_plan(cluster: Cluster, failed: list[ClusterNode]) -> tuple[placement.Plan, str]:

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
    plan, level = near_survivors(request, candidates, survivors)
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
    plan = placement.plan_for_nodes(
        planning.to_request(cluster.spec),
        pairs,
        str(head.host_id),
        price,
        planning.measured_bandwidth(),
        f"after: {why}",
    )
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
    transitions.note(
        cluster, f"plan now: spans one {plan.spanned_level} (was {before_level}), {figures}", heartbeat=True
    )


_LEVEL_WHY = {
    "block": "same block as the survivors' anchor (the head, or the first survivor)",
    "fabric": "no free host in the anchor's block; same fabric",
    "site": "no free host in the anchor's fabric; same site",
    "anywhere": "no free host in the anchor's site; the best free host anywhere",
}


def near_survivors(
    request: placement.PlacementRequest, candidates, survivors: list[ClusterNode]
) -> tuple[placement.Plan | None, str]:
    """The replacement plan closest to the survivors, and how close: the anchor's (the surviving head, else
    the first survivor) block, then its fabric, then its site, then anywhere. (None, "") when none fits."""
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
        result = placement.plan(request, pool, validate_inventory=False) if pool else None
        if isinstance(result, placement.Plan):
            return result, level
    return None, ""
