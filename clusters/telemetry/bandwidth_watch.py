"""Bandwidth, actively: the all-reduce probe on a READY cluster, on demand and while it is idle.

API/console ─▶ request_probe(): 202, probe_cluster_task queued on commit (queue: provisioning)
beat ─▶ probe_idle_clusters(): READY clusters whose interval (cluster.probe_interval_min, else
        VOLT_PROBE_INTERVAL_MIN; 0 = off) has passed and on whose head no Ray job runs
worker ─▶ run_probe(id): one at a time per cluster (provision.probe_lock_key), the light probe (sized to
          VOLT_PROBE_BUDGET_S at the prediction, as verification: provision.run_probe) on every host →
          a `busbw` sample (source probe) → below VOLT_PROBE_MIN_FRACTION of the
          prediction: `bandwidth_alert` on the cluster, naming the slow host when the per-host
          phase finds one; at or above: the alert clears
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from clusters import provision, transitions
from clusters.choices import WATCHED, ClusterStatus, MetricSource
from clusters.models import Cluster
from clusters.placement.bandwidth import format_gbps
from clusters.probes import allreduce
from clusters.telemetry import metrics, ray_head
from voltweb import realtime
from voltweb.domain import DomainError
from voltweb.taskutils import enqueue, enqueue_on_commit

logger = logging.getLogger(__name__)
BUSY_JOB_STATES = {"PENDING", "RUNNING"}


class NotProbeable(DomainError):
    """The cluster is not in a state where a probe can run (only READY and DEGRADED clusters)."""

    code = "not_ready"


def request_probe(cluster: Cluster, user=None) -> Cluster:
    """Queue a probe of `cluster` (answers at once; the result arrives as a bandwidth event)."""
    if cluster.status not in WATCHED:
        raise NotProbeable(f"Cluster {cluster.name} is {cluster.status}; only a ready cluster can be probed.")
    who = f" by {user.get_username()}" if user is not None else ""
    transitions.note(cluster, f"bandwidth probe requested{who}")
    enqueue_on_commit("clusters.tasks.probe_cluster_task", cluster.pk)
    return cluster


def set_probe_interval(cluster: Cluster, minutes: int | None) -> Cluster:
    """The cluster's own idle-probe interval (None: the default, 0: off)."""
    Cluster.objects.filter(pk=cluster.pk).update(probe_interval_min=minutes, updated_at=timezone.now())
    cluster.refresh_from_db()
    return cluster


def interval_min(cluster: Cluster) -> int:
    return (
        settings.VOLT_PROBE_INTERVAL_MIN if cluster.probe_interval_min is None else cluster.probe_interval_min
    )


def probe_idle_clusters(now=None) -> int:
    """Queue a probe for each READY cluster due one whose head runs no job. Returns how many."""
    now = now or timezone.now()
    queued = 0
    for cluster in Cluster.objects.filter(status=ClusterStatus.READY):
        every = interval_min(cluster)
        last = cluster.last_probe_at or cluster.ready_at
        if every <= 0 or (last and now - last < timedelta(minutes=every)) or job_running(cluster):
            continue
        enqueue("clusters.tasks.probe_cluster_task", cluster.pk)
        queued += 1
    return queued


def job_running(cluster: Cluster) -> bool:
    """Whether a Ray job holds the cluster (the probe is none); an unanswering head counts as busy."""
    try:
        jobs = ray_head.head_request(
            ray_head.dashboard_for(cluster),
            "/api/jobs/",
            settings.VOLT_WATCH_HOST_TIMEOUT_S,
            ray_head.token_for(cluster),
        )
    except ray_head.HeadUnreachable:
        return True
    return any(job.get("status") in BUSY_JOB_STATES for job in jobs or [])


def run_probe(cluster_id: int) -> dict | None:
    """Probe one cluster (skipped while another probe of it runs); store, alert, broadcast. The result."""
    key = provision.probe_lock_key(cluster_id)
    if not cache.add(key, 1, timeout=provision.probe_lock_s()):
        return None
    try:
        cluster = Cluster.objects.get(pk=cluster_id)
        if cluster.status not in WATCHED:
            return None
        return _probe(cluster)
    finally:
        cache.delete(key)


def _probe(cluster: Cluster) -> dict | None:
    nodes = provision.active_nodes(cluster)
    realtime.broadcast(f"cluster-{cluster.pk}", {"kind": "probe", "state": "running"})
    if len(nodes) < 2:
        _finish(cluster, None, "probe skipped: a single node has no inter-node all-reduce to measure")
        return None
    probe = provision.run_probe(cluster, nodes)  # light: its time budget
    result = probe.result
    if result is None:
        tail = " ".join(probe.output.strip().splitlines()[-2:])[:300]
        _finish(cluster, None, f"bandwidth probe {probe.status.lower()}: {tail}")
        return None
    measured = result.get("max_busbw_gbps") or 0.0
    metrics.record_busbw(cluster, measured, MetricSource.PROBE)
    alert = alert_for(cluster, result, {n.node_ip: n.host.name for n in nodes})
    summary = (
        f"probe: max busbw {format_gbps(measured, 2)} GB/s over {result['nodes']} ranks ({result['backend']})"
    )
    _finish(cluster, result, summary + (f"; {alert}" if alert else ""), alert=alert, measured=measured)
    return result


def alert_for(cluster: Cluster, result: dict, names_by_ip: dict[str, str]) -> str:
    """The alert text when busbw is below the flag fraction of the prediction, else ''."""
    measured = result.get("max_busbw_gbps")
    predicted = cluster.predicted_busbw_gbps
    fraction = settings.VOLT_PROBE_MIN_FRACTION
    if measured is None or not predicted or measured >= fraction * predicted:
        return ""
    text = (
        f"all-reduce busbw {format_gbps(measured, 2)} GB/s is {measured / predicted:.0%} of the predicted "
        f"{format_gbps(predicted, 1)} GB/s (alert below {fraction:.0%})"
    )
    slow = allreduce.slowest_host(result, settings.VOLT_SLOW_HOST_FRACTION)
    if slow is not None:
        name = names_by_ip.get(slow["node_ip"], slow["node_ip"])
        text += (
            f"; slowest host: {name} ({slow['what']} {format_gbps(slow['gbps'], 2)} GB/s, "
            f"{slow['ratio']:.0%} of the others' {format_gbps(slow['others_gbps'], 2)} GB/s)"
        )
    return text


def _finish(cluster: Cluster, result, message: str, alert: str = "", measured: float | None = None) -> None:
    now = timezone.now()
    fields = {"last_probe_at": now, "bandwidth_alert": alert, "updated_at": now}
    if measured is not None:
        # One answer per probe: the headline figure, the size table, the per-host rows and the API's
        # `probe_result` all come from the latest probe (earlier ones stay in the timeline and the chart).
        fields["measured_busbw_gbps"] = measured
        fields["probe_result"] = result
        fields["bandwidth_flagged"] = bool(alert) and bool((result or {}).get("links_emulated", True))
    Cluster.objects.filter(pk=cluster.pk).update(**fields)
    transitions.note(cluster, message)
    realtime.broadcast(
        f"cluster-{cluster.pk}",
        {"kind": "probe", "state": "done" if result else "failed", "message": message, "alert": alert},
    )
