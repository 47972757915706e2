"""Console pages of the live telemetry: the probe button, and the overview of cluster and host health."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from clusters import bandwidth_watch, services
from clusters.choices import ClusterStatus, Verdict
from clusters.models import NodeHealth
from inventory import services as inventory
from inventory.choices import HostState


@login_required
@require_POST
def cluster_probe(request, pk):
    """Queue a bandwidth probe (the page's button; answers 202 JSON to fetch, else redirects back)."""
    cluster = get_object_or_404(services.visible_clusters(request.user), pk=pk)
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
    clusters = services.visible_clusters(user)
    by_status = dict(clusters.values_list("status").annotate(n=Count("id")).order_by())
    nodes = NodeHealth.objects.filter(node__cluster__in=clusters.filter(status__in=[ClusterStatus.READY,
                                                                                     ClusterStatus.DEGRADED]))  # fmt: skip
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


@login_required
def overview(request):
    """Live counts (the counts panel refreshes itself every few seconds through htmx)."""
    context = {"counts": overview_counts(request.user)}
    if request.htmx:
        return render(request, "clusters/_overview_counts.html", context)
    return render(request, "clusters/overview.html", context)
