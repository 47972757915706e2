"""Console pages for clusters: list, request with live placement preview, detail with timeline."""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from clusters import drills, durations, live, planning, provision, recovery, services
from clusters.api.serializers import ClusterSpecSerializer
from clusters.choices import ClusterStatus
from clusters.forms import ClusterForm
from clusters.models import Cluster
from clusters.probes import allreduce
from inventory import services as inventory
from inventory.choices import DriverKind
from voltweb import services as accounts
from voltweb.domain import DomainError
from voltweb.statemachine import IllegalTransition


@login_required
def cluster_list(request):
    clusters = Cluster.objects.visible_to(request.user).select_related("team", "created_by")
    status = request.GET.get("status")
    if status:
        clusters = clusters.filter(status=status)
    page = Paginator(clusters, 25).get_page(request.GET.get("page"))
    return render(request, "clusters/list.html", {"page": page, "status": status, "query": ""})


def _spec_serializer(request, form: ClusterForm, needs_team=True) -> ClusterSpecSerializer:
    payload = form.to_payload()
    if not needs_team:
        payload.pop("team", None)
    serializer = ClusterSpecSerializer(data=payload, context={"request": request, "needs_team": needs_team})
    serializer.is_valid()
    for field, errors in serializer.errors.items():
        form.add_error(field if field in form.fields else None, errors)
    return serializer


@login_required
def cluster_new(request):
    teams = list(accounts.teams_of(request.user))
    form = ClusterForm(request.POST or None, teams=teams)
    if request.method == "POST" and form.is_valid():
        serializer = _spec_serializer(request, form)
        if not serializer.errors:
            data = serializer.validated_data
            try:
                cluster = services.request_cluster(data["team"], request.user, serializer.spec(data))
            except DomainError as exc:  # over the team's quota for good: the message says what to do
                form.add_error(None, str(exc))
            else:
                messages.success(request, f"Cluster {cluster.name} requested; placement is running.")
                return redirect("clusters:detail", pk=cluster.pk)
    return render(request, "clusters/new.html", {"form": form, "teams": teams})


@login_required
@require_POST
def cluster_preview(request):
    """The live preview panel (htmx): the plan placement would make now, or why nothing fits."""
    form = ClusterForm(request.POST, teams=list(accounts.teams_of(request.user)))
    result, problems = None, []
    if not planning.may_request_clusters(request.user):
        problems = [str(planning.NoTeam())]
    elif form.is_valid():
        serializer = _spec_serializer(request, form, needs_team=False)
        if not serializer.errors:
            result = planning.preview(serializer.spec(serializer.validated_data), request.user)
            result = planning.plan_as_json(result)
    if result is None and not problems:
        problems = [e for errors in form.errors.values() for e in errors]
    return render(
        request,
        "clusters/_preview.html",
        {"plan": result, "problems": problems, "topology": _topology(result)},
    )


def _placed_nodes(cluster) -> list[dict]:
    """The cluster's nodes as they are now (a replaced host shows its replacement), as plan nodes; a
    finished cluster's as they were at its end (its first plan's ranks were shown swapped after a head
    replacement)."""
    related = ("host__provider", "host__site", "host__fabric", "host__block")
    nodes = list(cluster.nodes.active().select_related(*related).order_by("rank"))
    if not nodes:
        ended = {n.pk for n in live.last_nodes(cluster)}
        nodes = list(cluster.nodes.filter(pk__in=ended).select_related(*related).order_by("rank"))
    return [
        {
            "rank": n.rank,
            "is_head": n.is_head,
            "host": n.host.name,
            "provider": n.host.provider.name,
            "region": n.host.site.region,
            "site": n.host.site.name,
            "fabric": n.host.fabric.name,
            "block": n.host.block.name,
            "gpu_indices": n.gpu_indices,
        }
        for n in nodes
    ]


def _topology(plan: dict | None, nodes: list[dict] | None = None) -> list[dict]:
    """Nodes grouped region > site > fabric > block, for the topology view (the plan's if none given)."""
    if not plan or not plan.get("placed"):
        return []
    if not nodes:
        nodes = [{**n, "is_head": n["rank"] == 0} for n in plan["nodes"]]  # a plan's head is rank 0
    tree: dict = {}
    for node in nodes:
        site = tree.setdefault((node["region"], node["site"]), {})
        fabric = site.setdefault(node["fabric"], {})
        fabric.setdefault(node["block"], []).append(node)
    return [
        {
            "region": region,
            "site": site,
            "fabrics": [
                {"name": fabric, "blocks": [{"name": b, "nodes": n} for b, n in blocks.items()]}
                for fabric, blocks in fabrics.items()
            ],
        }
        for (region, site), fabrics in tree.items()
    ]


@login_required
def cluster_detail(request, pk):
    cluster = get_object_or_404(Cluster.objects.visible_to(request.user).select_related("team"), pk=pk)
    context = {
        "cluster": cluster,
        "events": cluster.events.all(),
        "topology": _topology(cluster.plan, _placed_nodes(cluster)),
        "queue_position": services.queue_position(cluster),
        "can_terminate": cluster.status in services.LIVE,
        "time_left": durations.time_left_s(cluster),
        "extend_hours": EXTEND_HOURS,
        "cluster_live": cluster.status in services.LIVE,
        "connection": services.connection_details(cluster, request.user),
        "can_download_key": accounts.is_team_member(request.user, cluster.team),
        # Team members only, as jobs.services.check_may_submit says (clusters import nothing of jobs).
        "can_submit_jobs": accounts.is_team_member(request.user, cluster.team),
        "probe_hosts": _probe_hosts(cluster),
        "emulation_scale": _emulation_scale(cluster),
        "network": _network(cluster),
        **_recovery_context(request.user, cluster),
    }
    return render(request, "clusters/detail.html", context)


def _network(cluster) -> dict | None:
    """The page's Network fact: the path bring-up set (else the one the plan named), with the figure the
    overlay's cost was taken from; None for one node or a plan from before paths were named."""
    plan = cluster.plan or {}
    path = cluster.network_path or plan.get("network_path")
    if not path or not cluster.predicted_busbw_gbps:
        return None
    return {"path": path, "direct_gbps": plan.get("direct_busbw_gbps")}


def _emulation_scale(cluster) -> float | None:
    """The scale a local cluster's figures are at when its links are emulated (the probe's record, else
    the emulation now, for a cluster on local hosts not probed yet); None elsewhere. Without it on the
    page, a block of 400 GB/s NDR hosts "predicted at 0.1 GB/s (declared)" reads as a broken cluster."""
    result = cluster.probe_result or {}
    if result.get("fabric_scale"):
        return result["fabric_scale"]
    if result.get("links_emulated") is False or not cluster.predicted_busbw_gbps:
        return None
    if not cluster.nodes.filter(host__driver=DriverKind.LOCAL).exists():
        return None
    scale = inventory.bandwidth_scale(DriverKind.LOCAL)
    return scale if scale != 1.0 else None


def _recovery_context(user, cluster) -> dict:
    """The cluster's recovery records, and the drill form for those who may run drills."""
    records = [recovery.as_json(r) for r in recovery.recoveries(cluster)[:20]]
    can_drill = drills.may_run_drills(user, cluster) and cluster.status in drills.DRILLABLE
    return {
        "recoveries": records,
        "latest_recovery": records[0] if records else None,
        "can_drill": can_drill,
        "drills": drills.describe() if can_drill else [],
        "drill_nodes": provision.active_nodes(cluster) if can_drill else [],
        "drill_kept_out": inventory.hosts_kept_out_by(cluster.pk) if can_drill else [],
    }


@login_required
@require_POST
def cluster_drill(request, pk):
    """Run (or clear) a fault drill from the cluster page's form (admins; audited on the timeline)."""
    cluster = get_object_or_404(Cluster.objects.visible_to(request.user).select_related("team"), pk=pk)
    if not drills.may_run_drills(request.user, cluster):
        raise PermissionDenied("Only platform admins and the admins of the cluster's team run drills.")
    try:
        rank = int(request.POST.get("rank", ""))
    except ValueError:
        messages.error(request, "Choose the node (its rank) to run the drill on.")
        return redirect("clusters:detail", pk=pk)
    try:
        result = drills.run_drill(
            cluster,
            request.user,
            request.POST.get("drill", ""),
            rank=rank,
            value=request.POST.get("value", "").strip(),
            clear=request.POST.get("action") == "clear",
        )
        messages.success(request, f"Drill {result.drill} on {result.host}: {result.detail}.")
    except drills.DrillRefused as exc:
        messages.error(request, str(exc))
    return redirect("clusters:detail", pk=pk)


def _probe_hosts(cluster) -> list[dict]:
    """The probe's per-host figures, with host names, the slowest host marked."""
    result = cluster.probe_result or {}
    if not result.get("hosts"):
        return []
    # Every node it ever had: a terminated cluster's nodes are all released, its probe still names them.
    names = {node.node_ip: node.host.name for node in cluster.nodes.select_related("host")}
    slow = allreduce.slowest_host(result, settings.VOLT_SLOW_HOST_FRACTION)
    return [
        {
            **row,
            "name": names.get(row["node_ip"], row["node_ip"]),
            "slowest": bool(slow and slow["rank"] == row["rank"]),
        }
        for row in result["hosts"]
    ]


@login_required
@require_POST
def cluster_terminate(request, pk):
    cluster = get_object_or_404(Cluster.objects.visible_to(request.user), pk=pk)
    try:
        cluster = services.terminate_cluster(cluster, request.user)
        if cluster.status == ClusterStatus.TERMINATING:
            messages.success(
                request, f"Terminating {cluster.name}: stopping its Ray processes, then freeing its GPUs."
            )
        else:
            messages.success(request, f"{cluster.name} cancelled; it held no GPUs.")
    except IllegalTransition as exc:
        messages.error(request, str(exc))
    return redirect("clusters:detail", pk=pk)


EXTEND_HOURS = (1, 2, 4, 8, 24)


@login_required
@require_POST
def cluster_extend(request, pk):
    """The page's "Extend" form: its end `hours` later (clusters/durations.py says who may)."""
    cluster = get_object_or_404(Cluster.objects.visible_to(request.user).select_related("team"), pk=pk)
    if not accounts.is_team_member(request.user, cluster.team):  # platform admins see it, do not extend it
        raise PermissionDenied(f"Only members of {cluster.team.name} extend its clusters.")
    raw = request.POST.get("hours", "")
    if raw not in {str(hours) for hours in EXTEND_HOURS}:
        messages.error(request, f"Extend by one of {', '.join(map(str, EXTEND_HOURS))} hours.")
        return redirect("clusters:detail", pk=pk)
    try:
        cluster = durations.extend(cluster, request.user, int(raw) * 3600)
    except DomainError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"{cluster.name} now ends at {cluster.ends_at:%Y-%m-%d %H:%M} UTC.")
    return redirect("clusters:detail", pk=pk)
