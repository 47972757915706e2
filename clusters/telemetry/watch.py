"""The cluster watch: every VOLT_WATCH_INTERVAL_S, each live cluster's nodes get a verdict.

    beat ─▶ watch_clusters_task: one sweep task per READY/DEGRADED cluster (fan out; a queued sweep
            expires after one interval, so a slow worker never builds a backlog)
    worker ─▶ sweep_cluster(id): skipped while the cluster's previous sweep holds its lock
              ├─ the head's node list (ray_head.head_nodes), and per host in parallel, bounded by
              │  VOLT_WATCH_HOST_TIMEOUT_S: driver reachable, nvidia-smi (the discovery parser),
              │  this cluster's Ray node process alive
              ├─ health.judge() per node → NodeHealth (verdict, rule, readings) + GPU samples
              └─ a failed node or an unreachable head: READY → DEGRADED, the reason on the timeline,
                 and a recovery queued (clusters/recovery.py, VOLT_AUTO_RECOVER); a recovered node goes
                 back to ok (clears warnings), the cluster stays DEGRADED until recovery verifies it

Events on the cluster's group: `health` (every node's verdict and readings, each sweep) and `timeline`
(a node's verdict changed); the status change broadcasts itself (clusters/transitions.py).
"""

from __future__ import annotations

import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from clusters import recovery, tenancy, transitions
from clusters.choices import WATCHED, ClusterStatus, MetricSeries, Verdict
from clusters.models import Cluster, ClusterNode, MetricSample, NodeHealth
from clusters.placement.bandwidth import format_gbps
from clusters.probes import allreduce
from clusters.provision import active_nodes, ray_cluster_id
from clusters.provisioning import ray_nodes
from clusters.telemetry import health, metrics, ray_head
from inventory.discovery.nvidia_smi import parse_query_gpu
from inventory.discovery.probe import QUERY_COMMAND
from inventory.discovery.types import ParseError
from inventory.drivers.base import DriverError
from voltweb import locks, realtime
from voltweb.statemachine import IllegalTransition

logger = logging.getLogger(__name__)
SKIPPED = "skipped"
_SERIES = (MetricSeries.GPU_TEMP, MetricSeries.GPU_UTIL, MetricSeries.GPU_MEMORY, MetricSeries.GPU_POWER)


def watched_cluster_ids() -> list[int]:
    return list(Cluster.objects.filter(status__in=WATCHED).values_list("pk", flat=True))


def lock_key(cluster_id: int) -> str:
    return f"volt:watch:{cluster_id}"


def sweep_cluster(cluster_id: int) -> str:
    """One sweep of one cluster, unless its previous sweep still runs. Returns the cluster's status."""
    token = uuid.uuid4().hex
    # The lock outlives a sweep that died mid-way by at most this long.
    if not cache.add(lock_key(cluster_id), token, timeout=int(_sweep_budget_s() * 3) + 1):
        return SKIPPED
    try:
        cluster = Cluster.objects.get(pk=cluster_id)
        if cluster.status not in WATCHED:
            return cluster.status
        return _sweep(cluster).status
    finally:
        locks.release(lock_key(cluster_id), token)  # only its own: one that expired and was retaken stays


def _sweep_budget_s() -> float:
    return settings.VOLT_WATCH_HOST_TIMEOUT_S + 1.0


def _sweep(cluster: Cluster) -> Cluster:
    nodes = active_nodes(cluster)
    head_error, head_states = _head_view(cluster)
    readings = read_hosts(cluster, nodes)
    limits = health.Limits(settings.VOLT_GPU_MAX_TEMP_C, settings.VOLT_GPU_WARN_TEMP_C)
    blamed = blamed_links(cluster)
    judgements = {
        node.pk: health.judge(
            readings[node.pk],
            is_head=node.is_head,
            head_error=head_error,
            head_state=head_states.get(node.node_ip),
            limits=limits,
            link=blamed.get(node.node_ip, ""),
        )
        for node in nodes
    }
    changed = _store(cluster, nodes, judgements)
    _record_samples(cluster, nodes, judgements)
    _announce(cluster, nodes, judgements)
    failed = [(node, judgements[node.pk]) for node in nodes if judgements[node.pk].verdict == Verdict.FAILED]
    if failed and cluster.status == ClusterStatus.READY:
        reason = "; ".join(f"{node.host.name} failed: {j.rule}" for node, j in failed)
        try:
            cluster = transitions.transition(cluster, ClusterStatus.DEGRADED, reason)
        except IllegalTransition:  # terminated meanwhile: nothing to degrade
            cluster.refresh_from_db()
        else:  # automatic recovery (clusters/recovery.py): the record, and its task on commit
            recovery.on_degraded(cluster, [(node, j.rule) for node, j in failed], reason)
    elif changed:
        cluster.refresh_from_db()
    return cluster


def blamed_links(cluster: Cluster) -> dict[str, str]:
    """{node address: warning} for the host the cluster's latest probe blames, while the cluster is flagged:
    the per-host tests name the slowest host, so its node health says why the cluster is slow."""
    result = cluster.probe_result or {}
    if not (cluster.bandwidth_flagged and result):
        return {}
    slow = allreduce.slowest_host(result, settings.VOLT_SLOW_HOST_FRACTION)
    if slow is None:
        return {}
    return {
        slow["node_ip"]: (
            f"link: the bandwidth probe blames this host ({slow['what']} {format_gbps(slow['gbps'], 2)} GB/s, "
            f"{slow['ratio']:.0%} of the others' {format_gbps(slow['others_gbps'], 2)} GB/s)"
        )
    }


def _head_view(cluster: Cluster) -> tuple[str | None, dict[str, str]]:
    """(error or None, {node ip: state}) from the head's node list."""
    try:
        listed = ray_head.head_nodes(
            ray_head.dashboard_for(cluster), settings.VOLT_WATCH_HOST_TIMEOUT_S, ray_head.token_for(cluster)
        )
    except ray_head.HeadUnreachable as exc:
        return str(exc), {}
    states: dict[str, str] = {}
    for node in listed:  # a restarted node is listed twice (DEAD, then ALIVE): ALIVE wins
        ip = node.get("node_ip")
        if states.get(ip) != "ALIVE":
            states[ip] = node.get("state", "")
    return None, states


def read_hosts(cluster: Cluster, nodes: list[ClusterNode]) -> dict[int, health.HostReading]:
    """Each node's host read in parallel; a host not done within VOLT_WATCH_HOST_TIMEOUT_S is unreachable.

    Threads of hosts that overran finish in the background; the sweep does not wait for them.
    """
    timeout = settings.VOLT_WATCH_HOST_TIMEOUT_S
    ray_id = ray_cluster_id(cluster)
    pool = ThreadPoolExecutor(max_workers=min(32, max(1, len(nodes))), thread_name_prefix="watch")
    futures = {node.pk: pool.submit(read_host, node, ray_id, timeout) for node in nodes}
    wait_all(futures.values(), timeout=timeout)
    pool.shutdown(wait=False, cancel_futures=True)
    readings = {}
    for node_id, future in futures.items():
        if future.done() and future.exception() is None:
            readings[node_id] = future.result()
        else:
            why = future.exception() if future.done() else f"no answer within {timeout:g} s"
            readings[node_id] = health.HostReading(reachable=False, error=str(why))
    return readings


def read_host(node: ClusterNode, ray_id: str, timeout: float) -> health.HostReading:
    """Driver reachable, nvidia-smi on the node's GPUs, the cluster's Ray node process (runs in a thread)."""
    driver = tenancy.node_driver(node.host)
    try:
        driver.check_reachable(timeout)
        result = driver.run(QUERY_COMMAND, timeout)
        gpus, lost, smi_error = (), (), ""
        try:
            query = parse_query_gpu(result.stdout)
            wanted = set(node.gpu_indices or [])
            gpus = tuple(g for g in query.gpus if not wanted or g.index in wanted)
            lost = query.lost
        except ParseError as exc:
            smi_error = str(exc)[:200]
        pids = ray_nodes.node_processes(driver, ray_id)
        alive = ray_nodes.find_node(driver, ray_id) is not None
        return health.HostReading(
            True, gpus=gpus, lost=lost, smi_error=smi_error, ray_alive=alive, processes=len(pids)
        )
    except DriverError as exc:
        return health.HostReading(reachable=False, error=str(exc))
    finally:
        driver.close()


def _store(cluster: Cluster, nodes: list[ClusterNode], judgements: dict) -> bool:
    """Save each node's verdict; a change of verdict goes on the timeline. True if any changed."""
    now = timezone.now()
    existing = {h.node_id: h for h in NodeHealth.objects.filter(node__in=nodes)}
    changed = False
    for node in nodes:
        judgement = judgements[node.pk]
        row = existing.get(node.pk) or NodeHealth(node=node, changed_at=now)
        previous = row.verdict if row.pk else Verdict.OK
        if row.pk and (previous != judgement.verdict or row.rule != judgement.rule):
            row.changed_at = now
        row.verdict, row.rule, row.readings, row.checked_at = (
            judgement.verdict, judgement.rule, judgement.readings, now
        )  # fmt: skip
        row.save()
        if previous != judgement.verdict:
            changed = True
            transitions.note(cluster, _verdict_message(node, previous, judgement))
    return changed


def _verdict_message(node: ClusterNode, previous: str, judgement: health.Judgement) -> str:
    role = "head" if node.is_head else f"rank {node.rank}"
    if judgement.verdict == Verdict.OK:
        return f"{node.host.name} ({role}) recovered: ok (was {previous})"
    return f"{node.host.name} ({role}) {judgement.verdict}: {judgement.rule}"


def _record_samples(cluster: Cluster, nodes: list[ClusterNode], judgements: dict) -> None:
    now = timezone.now()
    rows = [
        MetricSample(cluster=cluster, host=node.host, series=name, value=value, ts=now)
        for node in nodes
        for name in _SERIES
        if (value := judgements[node.pk].readings.get(name)) is not None
    ]
    metrics.record_many(rows)


def node_health_payload(node: ClusterNode, row: NodeHealth | None) -> dict:
    """A node as the console's health table shows it."""
    return {
        "node": node.pk,
        "host": node.host.name,
        "address": node.node_ip,
        "rank": node.rank,
        "is_head": node.is_head,
        "verdict": row.verdict if row else None,
        "rule": row.rule if row else "",
        "readings": row.readings if row else {},
        "checked_at": row.checked_at.isoformat() if row else None,
    }


def _announce(cluster: Cluster, nodes: list[ClusterNode], judgements: dict) -> None:
    now = timezone.now().isoformat()
    payload = [
        {
            "node": node.pk,
            "host": node.host.name,
            "address": node.node_ip,
            "rank": node.rank,
            "is_head": node.is_head,
            "verdict": judgements[node.pk].verdict,
            "rule": judgements[node.pk].rule,
            "readings": judgements[node.pk].readings,
            "checked_at": now,
        }
        for node in nodes
    ]
    realtime.broadcast(f"cluster-{cluster.pk}", {"kind": "health", "ts": now, "nodes": payload})
    realtime.overview_changed("health")
