"""Console pages of the live telemetry: the probe button, and the overview of cluster and host health."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from clusters.choices import ClusterStatus, Verdict
from clusters.models import Cluster, ClusterNode, NodeHealth
from clusters.telemetry import bandwidth_watch
from inventory import services as inventory
from inventory.choices import HostState

_VERDICT_RANK = {Verdict.OK: 0, Verdict.WARNING: 1, Verdict.FAILED: 2}


@login_required
@require_POST
def cluster_probe(request, pk):
    """Queue a bandwidth probe (the page's button; answers 202 JSON to fetch, else redirects back)."""
    cluster = get_object_or_404(Cluster.objects.visible_to(request.user), pk=pk)
    try:
        bandwidth_watch.request_probe(cluster, request.user)
        ok, text = True, "Bandwidth probe queued; the chart gains a point when it is done."
    except bandwidth_watch.NotProbeable as exc:
        ok, text = False, str(exc)
    if request.headers.get("X-Requested-With") == "fetch":
        return JsonResponse({"queued": ok, "message": text}, status=202 if ok else 409)
    (messages.success if ok else messages.error)(request, text)
    return redirect("clusters:detail", pk=pk)


def overview_counts(user) -> dict:
    """Healthy/degraded clusters of the user's teams, failed/warning nodes, and visible hosts by state."""
    clusters = Cluster.objects.visible_to(user)
    by_status = dict(clusters.values_list("status").annotate(n=Count("id")).order_by())
    # Nodes in service only: a replaced node's last verdict (failed) is history, not a failure now.
    nodes = NodeHealth.objects.filter(node__released_at__isnull=True, node__cluster__in=clusters.filter(
        status__in=[ClusterStatus.READY, ClusterStatus.DEGRADED]))  # fmt: skip
    verdicts = dict(nodes.values_list("verdict").annotate(n=Count("id")).order_by())
    hosts = dict(inventory.visible_hosts(user).values_list("state").annotate(n=Count("id")).order_by())
    return {
        "clusters_healthy": by_status.get(ClusterStatus.READY, 0),
        "clusters_degraded": by_status.get(ClusterStatus.DEGRADED, 0),
        "clusters_starting": sum(
            by_status.get(s, 0) for s in (ClusterStatus.PROVISIONING, ClusterStatus.VERIFYING)
        ),
        "nodes_failed": verdicts.get(Verdict.FAILED, 0),
        "nodes_warning": verdicts.get(Verdict.WARNING, 0),
        "hosts_healthy": hosts.get(HostState.AVAILABLE, 0),
        "hosts_unhealthy": sum(
            hosts.get(s, 0) for s in (HostState.CORDONED, HostState.OFFLINE, HostState.FAILED)
        ),
        "hosts_other": sum(
            n
            for s, n in hosts.items()
            if s
            not in (
                HostState.AVAILABLE,
                HostState.CORDONED,
                HostState.OFFLINE,
                HostState.FAILED,
                HostState.RETIRED,
            )
        ),  # fmt: skip
    }


def provider_host_health(user) -> list[dict]:
    """The hosts of the providers `user` acts for (platform admins: all), each with the latest verdict of
    the cluster nodes on it (the worst, with its rule), its hottest GPU and when the watch last looked.
    Researchers act for no provider: an empty list. Retired hosts are left out."""
    hosts = list(
        inventory.managed_hosts(user)
        .exclude(state=HostState.RETIRED)
        .select_related("provider")
        .order_by("provider__name", "name")
    )
    rows = {
        host.pk: {
            "host": host.name, "host_id": host.pk, "provider": host.provider.name, "state": host.state,
            "verdict": None, "rule": "", "gpu_temp_c": None, "checked_at": None, "clusters": 0,
        }
        for host in hosts
    }  # fmt: skip
    nodes = ClusterNode.objects.filter(
        host_id__in=rows, released_at__isnull=True, cluster__status__in=[ClusterStatus.READY, ClusterStatus.DEGRADED]
    ).select_related("health")  # fmt: skip
    for node in nodes:
        row = rows[node.host_id]
        row["clusters"] += 1
        health = getattr(node, "health", None)
        if health is None:
            continue
        if row["verdict"] is None or _VERDICT_RANK[health.verdict] > _VERDICT_RANK[row["verdict"]]:
            row["verdict"], row["rule"] = health.verdict, health.rule
        temp = (health.readings or {}).get("gpu_temp_c")
        if temp is not None and (row["gpu_temp_c"] is None or temp > row["gpu_temp_c"]):
            row["gpu_temp_c"] = temp
        checked = health.checked_at.isoformat()
        row["checked_at"] = max(row["checked_at"] or checked, checked)
    return list(rows.values())


def overview_snapshot(user) -> dict:
    """What the overview page shows, as its websocket sends it (on connect and after every change)."""
    return {"kind": "overview", "counts": overview_counts(user), "hosts": provider_host_health(user)}


@login_required
def overview(request):
    """Counts and the provider's host health, rendered once; the page then follows ws/overview/."""
    return render(request, "clusters/overview.html", overview_snapshot(request.user))
