"""What the cluster page draws: one snapshot (on websocket connect and on first render) of status,
node health, bandwidth and GPU series and the timeline. Events after it extend it (clusters/telemetry/watch.py).
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from clusters import recovery
from clusters.choices import LIVE, MetricSeries
from clusters.models import Cluster, MetricMinute, MetricSample, NodeHealth
from clusters.provision import active_nodes
from clusters.telemetry import metrics
from clusters.telemetry.watch import node_health_payload

BANDWIDTH_WINDOW = timedelta(days=1)
GPU_WINDOW = timedelta(minutes=15)
TIMELINE_LINES = 100


def last_nodes(cluster: Cluster) -> list:
    """A finished cluster's nodes as they were at its end: per rank the last node (a replaced node keeps
    its rank; listing every node showed a 2-node cluster with 5 nodes, two of them heads)."""
    latest: dict[int, object] = {}
    for node in cluster.nodes.select_related("host").order_by("rank", "pk"):
        latest[node.rank] = node
    return list(latest.values())


def snapshot(cluster: Cluster) -> dict:
    """Everything the live parts of the cluster page show, as JSON-ready values."""
    live = cluster.status in LIVE
    # A finished cluster shows what was recorded while it lived: its nodes (released since) and the
    # series' windows ending at its last sample, not at now (which holds nothing).
    now = timezone.now() if live else _last_sample_at(cluster) or timezone.now()
    nodes = active_nodes(cluster) if live else last_nodes(cluster)
    rows = {h.node_id: h for h in NodeHealth.objects.filter(node__in=nodes)}
    events = list(cluster.events.order_by("-at", "-id")[:TIMELINE_LINES])[::-1]
    return {
        "kind": "snapshot",
        "cluster": cluster.pk,
        "status": cluster.status,
        "live": live,
        "failure_message": cluster.failure_message,
        "predicted_busbw_gbps": cluster.predicted_busbw_gbps,
        "measured_busbw_gbps": cluster.measured_busbw_gbps,
        "bandwidth_alert": cluster.bandwidth_alert,
        "nodes": [node_health_payload(node, rows.get(node.pk)) for node in nodes],
        "bandwidth": _points(cluster, MetricSeries.BUSBW, now - BANDWIDTH_WINDOW, now),
        "gpu": {
            name: _points(cluster, name, now - GPU_WINDOW, now)
            for name in (MetricSeries.GPU_TEMP, MetricSeries.GPU_UTIL)
        },
        "recovery": _latest_recovery(cluster),
        "timeline": [
            {"at": e.at.isoformat(), "status": e.to_status, "from": e.from_status, "message": e.message}
            for e in events
        ],
    }


def _points(cluster: Cluster, name: str, since, until) -> list[dict]:
    return [
        {"ts": p.ts.isoformat(), "value": p.value, "host": p.host, "source": p.source}
        for p in metrics.series(cluster, name, since, until)
    ]


def _last_sample_at(cluster: Cluster):
    raw = MetricSample.objects.filter(cluster=cluster).order_by("-ts").values_list("ts", flat=True).first()
    minute = MetricMinute.objects.filter(cluster=cluster).order_by("-minute").values_list("minute", flat=True)
    candidates = [t for t in (raw, minute.first()) if t is not None]
    return max(candidates) if candidates else None


def _latest_recovery(cluster: Cluster) -> dict | None:
    latest = recovery.recoveries(cluster).first()
    return recovery.as_json(latest) if latest else None
