"""VERIFYING: the all-reduce probe on every host (clusters/probes/launch.py), judged against the
prediction; a flagged cluster whose probe names one host as the slowest gets it replaced (up to
VOLT_SLOW_HOST_REPLACEMENTS times) and is probed again; READY with the sample recorded."""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.core.cache import cache
from django.db.models import F
from django.utils import timezone

from clusters import network_paths, planning, tenancy, transitions
from clusters.choices import ClusterStatus, FailureReason
from clusters.models import Cluster, ClusterNode
from clusters.placement.bandwidth import format_gbps
from clusters.probes import allreduce, launch
from clusters.provisioning import ray_nodes
from clusters.provisioning.ending import fail
from clusters.provisioning.nodes import active_nodes, node_env, python_for, still_wanted
from clusters.provisioning.replacement import NoReplacement, replace_hosts
from clusters.telemetry import metrics
from clusters.tenancy import ray_cluster_id
from inventory import services as inventory
from inventory.choices import DriverKind
from inventory.drivers.base import DriverError
from inventory.drivers.sudo import SudoDriver

logger = logging.getLogger(__name__)
S = ClusterStatus


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
    ordered = sorted(nodes, key=lambda node: (not node.is_head, node.node_ip))
    drivers = []
    try:
        drivers = [tenancy.node_driver(node.host) for node in ordered]
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
        **node_env(node.host),
    }
    run_as = tenancy.node_user_on(cluster, node.host)  # its ranks run as its nodes do
    if run_as is None and isinstance(driver, SudoDriver):  # never as root on a provider's host
        raise DriverError(f"{node.host.name}: the cluster has no Unix user of its own there")
    prefix = ray_nodes.launcher(
        tenancy.node_temp_dir(cluster, node),
        run_as,
        env,
        python,
        tenancy.volt_socket_dirs() if run_as and local else (),
    )
    return launch.ProbeHost(driver, node.node_ip, python, prefix)


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
    still_wanted(cluster)
    result["links_emulated"] = not local or inventory.links_emulated()
    if local and result["links_emulated"]:  # the figures are at this scale (the page says so)
        result["fabric_scale"] = inventory.bandwidth_scale(DriverKind.LOCAL)
    message = _probe_summary(cluster, result)
    slow = allreduce.slowest_host(result, settings.VOLT_SLOW_HOST_FRACTION)
    node = next((n for n in nodes if slow and n.node_ip == slow["node_ip"]), None)
    path_blamed = network_paths.blame(cluster, nodes, result, settings.VOLT_SLOW_HOST_FRACTION)
    if path_blamed:
        message += f"; {path_blamed}"
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
        withheld = _record_sample(cluster, measured, result)
        if withheld:
            message += f"; not kept as the {withheld}"
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


def _record_sample(cluster: Cluster, busbw: float, result: dict) -> str:
    """Feed the measurement back to placement for the domain the cluster spans (block/fabric/site).

    Local hosts: over emulated links the sample is in the emulation's units (as their predictions);
    on plain loopback it is kept but never steers placement. A probe that measured one host's fault
    says nothing of its domain: when a node's host carries a link fault, or the per-host tests blame one
    host, nothing is recorded (a 25% link_degraded drill had lowered every later prediction for the
    whole fabric to a quarter, and the next healthy cluster there measured "266%" of it). Returns why
    not ("<level>'s measured figure: <why>"), or "" when recorded (or nothing spans a domain)."""

    plan = cluster.plan or {}
    nodes = active_nodes(cluster)
    if cluster.network_path in network_paths.OVER:  # the overlay's cost: its domain's links ran beneath it
        slow = allreduce.slowest_host(result, settings.VOLT_SLOW_HOST_FRACTION)
        if slow is not None and slow["metric"] != "link_gbps":
            return f"{cluster.network_path}'s cost: the per-host tests blame a host's {slow['what']}"
        return network_paths.record(cluster, nodes, busbw)
    level, domain = plan.get("spanned_level"), plan.get("spanned_domain") or []
    index = {"block": 3, "fabric": 2, "site": 1, "region": 0}.get(level)
    if index is None or len(domain) <= index:
        return ""
    local = any(node.host.driver == DriverKind.LOCAL for node in nodes)
    emulated = bool(result.get("links_emulated", True))
    why = _host_fault(nodes, result)
    if why:
        return f"{level}'s measured figure: {why}"
    planning.record_bandwidth_sample(
        level,
        domain[index],
        busbw,
        nodes=result["nodes"],
        cluster=cluster,
        source_local=local,
        emulated=local and emulated,
    )
    return ""


def _host_fault(nodes: list[ClusterNode], result: dict) -> str:
    """Why this probe measured a host rather than its domain: a link fault on one of the nodes' hosts, or
    the per-host tests naming the slowest host; "" when neither."""
    for node in nodes:
        link = inventory.link_faults(node.host) if node.host.driver == DriverKind.LOCAL else []
        if link:
            return f"{node.host.name} carries {', '.join(link)} (a host's fault, not the domain's figure)"
    slow = allreduce.slowest_host(result, settings.VOLT_SLOW_HOST_FRACTION)
    if slow is not None:
        name = next((n.host.name for n in nodes if n.node_ip == slow["node_ip"]), slow["node_ip"])
        return f"the per-host tests blame {name} ({slow['what']} {format_gbps(slow['gbps'], 2)} GB/s)"
    return ""
