"""Cluster operations: validate a request, preview and place it, allocate and release GPUs, the queue.

Placement itself is the pure engine in clusters/placement/; this module turns database rows into its
snapshots and its plans into allocations. The partial unique index on Allocation(gpu) WHERE active is
the guarantee against double booking; the host row locks taken here only make conflicts rare.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, replace
from decimal import Decimal

from django.conf import settings as django_settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db import transaction
from django.db.models import Case, Count, Exists, F, OuterRef, QuerySet, When
from django.utils import timezone

from clusters import placement, transitions
from clusters.allocations import (  # noqa: F401 - re-exported: allocation used to live here
    CapacityChanged,
    allocate,
    create_allocations,
    hosts_serving_other_teams,
    release,
)
from clusters.choices import HOLDS_GPUS, LIVE, TERMINAL, BandwidthSource, ClusterStatus, FailureReason
from clusters.models import Allocation, BandwidthSample, Cluster
from inventory import services as inventory
from inventory.choices import HostState, ProviderStatus
from inventory.models import Block, Fabric, Host, Site
from voltweb import realtime
from voltweb import services as accounts
from voltweb.models import Team
from voltweb.statemachine import IllegalTransition

logger = logging.getLogger(__name__)

S = ClusterStatus
PLACEMENT_ATTEMPTS = 5  # a racing request re-plans this often before it queues
DRAIN_BUDGET_S = 60.0  # one queue drain tries clusters this long (drain_queue_task's soft limit: 110 s)
MEASURED_MAX_AGE_DAYS = 7


class InvalidSpec(ValueError):
    """The request cannot ever be met as written; `problems` say what to change."""

    def __init__(self, problems):
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


# --- visibility --------------------------------------------------------------------------------------


def visible_clusters(user: AbstractBaseUser) -> QuerySet[Cluster]:
    """Clusters of the caller's teams (platform admins: all). Another team's cluster is a 404."""
    return Cluster.objects.filter(team__in=accounts.teams_of(user))


# --- from the database to the engine -----------------------------------------------------------------


def to_request(spec: dict) -> placement.PlacementRequest:
    """The engine's request for a validated spec (see api/serializers.ClusterSpecSerializer)."""
    fields = {f: spec[f] for f in ("nodes", "gpus_per_node") if f in spec}
    # "A100" asks for every A100 variant the inventory has (A100-40GB, A100-80GB): inventory's matching rule.
    fields["models"] = inventory.offered_models_matching(spec.get("gpu_models") or ())
    for key in (
        "model_policy",
        "interconnect_mode",
        "topology_level",
        "topology_mode",
        "parallelism",
        "pipeline_stages",
        "name",
        "priority",
    ):
        if spec.get(key) not in (None, ""):
            fields[key] = spec[key]
    fields["interconnect"] = tuple(spec.get("interconnect") or ())
    fields["regions"] = tuple(spec.get("regions") or ())
    if spec.get("max_price_per_gpu_hour") is not None:
        fields["max_price_per_gpu_hour"] = float(spec["max_price_per_gpu_hour"])
    return placement.PlacementRequest(**fields)


def candidate_snapshots(
    request: placement.PlacementRequest, narrow: bool = True, team_id: int | None = None
) -> list[placement.HostSnapshot]:
    """Offerable hosts that could give one node of `request` (of team `team_id`).

    `narrow` pushes the hard price / region / interconnect filters into SQL (fast); without it the
    engine sees those hosts too and can name the constraint that binds in a refusal. With `team_id`,
    hosts serving another team are left out: a host serves one team at a time (allocations.py).
    """
    hosts = _fitting_hosts(request)
    if team_id is not None:
        hosts = hosts.exclude(_serving_other_team(team_id))
    if narrow:
        hosts = _hard_filters(hosts, request)
    return snapshots_of(hosts)


def snapshots_of(hosts: QuerySet[Host]) -> list[placement.HostSnapshot]:
    """The engine's snapshots of these hosts, whatever their state (one query)."""
    rows = hosts.values_list(
        "id",
        "provider_id",
        "gpu_model",
        "free_gpu_map",
        "gpu_count",
        "site__region",
        "site_id",
        "fabric_id",
        "block_id",
        "fabric__kind",
        "fabric__per_host_gbytes_per_s",
        "fabric__oversubscription",
        "site__backbone_gbytes_per_s",
        "price_per_gpu_hour",
        "reliability",
        "nvlink_domain_size",
        "pcie_topology",
        "driver",
        "discovered_gbytes_per_s",
    )
    scales = {driver: inventory.bandwidth_scale(driver) for driver in ("local", "ssh")}
    return [_snapshot(row, scales) for row in rows.iterator(chunk_size=5000)]


def snapshots_by_id(host_ids: list[int]) -> dict[str, placement.HostSnapshot]:
    """Snapshots of exactly these hosts, whatever they hold (a cluster's own hosts), by host id."""
    return {s.host_id: s for s in snapshots_of(Host.objects.filter(pk__in=host_ids))}


def _fitting_hosts(request: placement.PlacementRequest) -> QuerySet[Host]:
    return inventory.offerable_hosts().filter(
        gpu_model__in=request.models, free_gpus__gte=request.gpus_per_node
    )


def _serving_other_team(team_id: int) -> Exists:
    """True for a host where a cluster of another team holds GPUs."""
    return Exists(
        Allocation.objects.filter(active=True, gpu__host_id=OuterRef("pk")).exclude(cluster__team_id=team_id)
    )


def _hard_filters(hosts: QuerySet[Host], request: placement.PlacementRequest) -> QuerySet[Host]:
    if request.max_price_per_gpu_hour is not None:
        hosts = hosts.filter(price_per_gpu_hour__lte=Decimal(str(request.max_price_per_gpu_hour)))
    if request.regions:
        hosts = hosts.filter(site__region__in=request.regions)
    if request.interconnect_mode == "required" and request.interconnect:
        hosts = hosts.filter(fabric__kind__in=request.interconnect_kinds())
    return hosts


def _snapshot(row, scales: dict[str, float]) -> placement.HostSnapshot:
    (
        host_id,
        provider_id,
        model,
        free_map,
        total,
        region,
        site,
        fabric,
        block,
        kind,
        host_gbps,
        oversub,
        backbone,
        price,
        reliability,
        nvlink_domain_size,
        pcie,
        driver,
        discovered_gbps,
    ) = row
    pcie = pcie or {}
    return placement.HostSnapshot(
        host_id=str(host_id),
        provider_id=str(provider_id),
        gpu_model=model,
        free_gpus=tuple(tuple(domain) for domain in free_map or ()),
        total_gpus=total,
        path=placement.TopologyPath(region, str(site), str(fabric), str(block)),
        fabric_kind=kind,
        fabric_host_gbps=host_gbps,
        fabric_oversubscription=oversub,
        site_backbone_gbps=backbone,
        price_per_gpu_hour=float(price),
        reliability=reliability,
        # Discovery makes each GPU without NVLink a domain of its own: such a host is PCIe-only.
        nvlink=nvlink_domain_size > 1,
        pcie_switches=tuple(tuple(group) for group in pcie.get("switches", ())),
        numa_nodes=tuple(tuple(group) for group in pcie.get("numa", ())),
        bandwidth_scale=scales.get(driver, 1.0),
        discovered_host_gbps=discovered_gbps,  # the engine predicts from min(declared, discovered)
    )


# Levels at which a provider's own figure may steer placement: its blocks and fabrics are its alone, while a
# site (and a region) holds other providers' hosts too.
PROVIDER_SAMPLE_LEVELS = ("block", "fabric")


def measured_bandwidth() -> dict[tuple[str, str], float]:
    """The newest measured busbw per topology domain from the last week. The engine applies each as an
    efficiency of its domain. Samples between `local` hosts describe this machine's loopback, not a
    fabric: they count only when the fabric emulation shaped the links.

    A provider's uploaded figure (BandwidthSource.PROVIDER) counts only for its blocks and fabrics, only
    where Volt measured nothing there itself, and never above what Volt predicted for those hosts: a
    provider can tell placement its links are slower than declared, not make them look faster."""
    since = timezone.now() - timezone.timedelta(days=MEASURED_MAX_AGE_DAYS)
    samples = BandwidthSample.objects.filter(measured_at__gte=since).exclude(
        source_local=True, emulated=False
    )
    volt: dict[tuple[str, str], float] = {}
    provider: dict[tuple[str, str], float] = {}
    rows = samples.values_list("level", "domain_id", "busbw_gbps", "source", "predicted_gbps")
    for level, domain, busbw, source, predicted in rows:  # rows come newest first
        if source != BandwidthSource.PROVIDER:
            volt.setdefault((level, domain), busbw)
        elif level in PROVIDER_SAMPLE_LEVELS:
            provider.setdefault((level, domain), busbw if predicted is None else min(busbw, predicted))
    return provider | volt


def record_bandwidth_sample(
    level: str,
    domain_id: str,
    busbw_gbps: float,
    nodes: int = 2,
    cluster: Cluster | None = None,
    source_local: bool = False,
    emulated: bool = False,
) -> BandwidthSample:
    """Store a measured busbw for the domain a probe's cluster spanned (the verification probe calls this).

    `source_local`: measured between local hosts; `emulated`: over shaped local links (in the
    emulation's scaled units, like local hosts' predictions). A local sample on plain loopback says
    nothing about the fabric its hosts declare: kept for the record, never used by placement.
    """
    return BandwidthSample.objects.create(
        level=level,
        domain_id=str(domain_id),
        busbw_gbps=busbw_gbps,
        nodes=nodes,
        cluster=cluster,
        source_local=source_local,
        emulated=emulated,
    )


# --- validation --------------------------------------------------------------------------------------


def validate_spec(spec: dict) -> placement.PlacementRequest:
    """The engine request for `spec`, or InvalidSpec saying what to change (never a capacity problem)."""
    request = to_request(spec)
    problems = request.problems()
    if not problems:
        problems = _inventory_problems(request)
    if problems:
        raise InvalidSpec(problems)
    return request


def _model_stats() -> dict[str, dict]:
    """Over every host that exists at an approved provider (whatever its state, short of gone): per GPU
    model the host count, the largest node one host can give (its largest NVLink domain; every GPU on a
    host without NVLink) and hosts per such node size; and the regions and fabric kinds found.
    (Unapproved providers' hosts are nobody's to request, nor to hint at.)"""
    live = (
        Host.objects.exclude(state__in=[HostState.RETIRED, HostState.FAILED])
        .exclude(gpu_model="")
        .filter(provider__status=ProviderStatus.APPROVED)
    )
    node_size = Case(When(nvlink_domain_size__gt=1, then=F("nvlink_domain_size")), default=F("gpu_count"))
    stats: dict[str, dict] = {"models": {}, "regions": set(), "kinds": set()}
    rows = (
        live.annotate(node_size=node_size)
        .values("gpu_model", "node_size", "site__region", "fabric__kind")
        .annotate(hosts=Count("id"))
    )
    for row in rows:
        entry = stats["models"].setdefault(row["gpu_model"], {"largest": 0, "by_domain": {}})
        size = row["node_size"]
        entry["largest"] = max(entry["largest"], size)
        entry["by_domain"][size] = entry["by_domain"].get(size, 0) + row["hosts"]
        stats["regions"].add(row["site__region"])
        stats["kinds"].add(row["fabric__kind"])
    return stats


def _inventory_problems(request: placement.PlacementRequest) -> list[str]:
    """Compare with every host that exists (whatever its state): could this request ever be met?"""
    key = f"clusters:inventory-stats:{inventory.capacity_version()}"
    inventory_stats = cache.get_or_set(key, _model_stats, 300)
    stats = inventory_stats["models"]
    offered = ", ".join(sorted(stats)) or "no GPUs yet"
    unknown = [m for m in request.models if m not in stats]
    if unknown:
        return [f"unknown GPU model {m!r}; the inventory offers {offered}" for m in unknown]
    problems = _never_offered(request, inventory_stats)
    if problems:
        return problems
    asked = request.gpus_per_node
    if all(stats[m]["largest"] < asked for m in request.models):
        return [
            f"{asked} GPUs per node asked; the largest {m} host has {stats[m]['largest']} GPUs in one NVLink "
            f"domain (or in all, without NVLink) — ask for at most {stats[m]['largest']} per node, or more nodes"
            for m in request.models
        ]
    fitting = {
        m: sum(n for size, n in stats[m]["by_domain"].items() if size >= asked) for m in request.models
    }
    if all(count < request.nodes for count in fitting.values()):
        best = max(fitting.values())
        return [
            f"{request.nodes} nodes asked; only {best} hosts in the whole inventory can give {asked} "
            f"{' or '.join(request.models)} GPUs to one node"
        ]
    return []


def _never_offered(request: placement.PlacementRequest, inventory_stats: dict) -> list[str]:
    """Regions and required interconnects that no host of the inventory has: such a request could only
    wait in the queue forever."""
    problems = []
    regions = sorted(inventory_stats["regions"])
    for region in request.regions:
        if region not in inventory_stats["regions"]:
            problems.append(f"unknown region {region!r}; the inventory has hosts in {', '.join(regions)}")
    if request.interconnect_mode == "required" and request.interconnect:
        if not request.interconnect_kinds() & inventory_stats["kinds"]:
            kinds = ", ".join(sorted(inventory_stats["kinds"]))
            asked = ", ".join(request.interconnect)
            problems.append(f"no fabric offers the required interconnect {asked}; the inventory has {kinds}")
    return problems


# --- preview and placement ---------------------------------------------------------------------------


class NoTeam(PermissionError):
    """The caller belongs to no team, so there is nothing they could request a cluster with."""

    def __init__(self):
        super().__init__(
            "Placement previews are for team members: join a team (or ask its admin to add you) to "
            "request clusters."
        )


def may_request_clusters(user: AbstractBaseUser) -> bool:
    """Team members and platform admins may request clusters (and so preview their placement)."""
    return accounts.is_platform_admin(user) or accounts.teams_of(user).exists()


def preview(
    spec: dict, user: AbstractBaseUser, team: Team | None = None
) -> placement.Plan | placement.Refusal:
    """Plan `spec` for `user` (for `team`, when known: hosts serving other teams are out) against free
    capacity now, without allocating anything.

    Plans only over what the caller may request with: offerable hosts (available, approved provider),
    which is exactly what the hosts API shows a team member; a caller with no team gets NoTeam instead
    of a plan naming hosts they may not see.
    """
    if not may_request_clusters(user):
        raise NoTeam()
    request = validate_spec(spec)
    return _plan(request, team.pk if team is not None else None)


class _IndexCache:
    """Placement indexes by (capacity version, candidate filter), in this process.

    Loading ~15k candidate snapshots and indexing them costs a few hundred ms at 125k hosts; previews
    repeat far more often than capacity changes. Any allocation, release or host state change bumps
    the capacity version, so a stale index is never used for a new version; allocation re-checks
    every GPU under row locks anyway.
    """

    size = 16

    def __init__(self):
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, build):
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        value = build()
        with self._lock:
            self._entries[key] = value
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return value


_indexes = _IndexCache()


def candidate_inventory(
    request: placement.PlacementRequest, narrow: bool = True, team_id: int | None = None
) -> placement.Inventory:
    """The engine's index over `candidate_snapshots(request, narrow, team_id)`, reused while capacity is
    unchanged (every allocation and release changes it, so a host's team never goes stale here)."""
    filters = (
        (
            request.max_price_per_gpu_hour,
            request.regions,
            request.interconnect_mode,
            tuple(sorted(request.interconnect_kinds())),
        )
        if narrow
        else None
    )
    scale = inventory.bandwidth_scale("local")  # emulation switched on/off changes local hosts' figures
    key = (inventory.capacity_version(), request.models, request.gpus_per_node, filters, team_id, scale)
    return _indexes.get(key, lambda: placement.Inventory(candidate_snapshots(request, narrow, team_id)))


def _plan(
    request: placement.PlacementRequest, team_id: int | None = None
) -> placement.Plan | placement.Refusal:
    measured = measured_bandwidth()
    try:
        narrow = candidate_inventory(request, team_id=team_id)
        band = django_settings.VOLT_PLACEMENT_PRICE_BAND
        result = placement.plan(request, narrow, measured, validate_inventory=False, price_band=band)
        if isinstance(result, placement.Refusal):  # rare: look again with every host to explain why
            wide = candidate_inventory(request, narrow=False, team_id=team_id)
            result = placement.plan(request, wide, measured, validate_inventory=False, price_band=band)
    except placement.InvalidRequest as exc:
        raise InvalidSpec(exc.problems) from None
    return _explain_other_teams(request, team_id, result)


def _explain_other_teams(
    request: placement.PlacementRequest, team_id: int | None, result: placement.Plan | placement.Refusal
) -> placement.Plan | placement.Refusal:
    """Say how many hosts that would fit were left out because they serve another team."""
    if team_id is None:
        return result
    excluded = _fitting_hosts(request).filter(_serving_other_team(team_id)).count()
    if not excluded:
        return result
    line = (
        f"{excluded} host{'s' if excluded != 1 else ''} with {request.gpus_per_node} free "
        f"{' or '.join(request.models)} GPUs left out: serving another team (a host serves one team "
        "at a time)"
    )
    if isinstance(result, placement.Refusal):
        return replace(result, reasons=(*result.reasons, line), explanation=(*result.explanation, line))
    return replace(result, explanation=(*result.explanation, line))


_DOMAIN = re.compile(r"\b([a-z][a-z0-9-]*)/(\d+)(?:/(\d+))?(?:/(\d+))?\b")


def humanize(lines) -> list[str]:
    """The engine names domains by database ids ("us-east/3/7/12"); people want "us-east/iad1/iad1-ib/r01"."""
    lines = list(lines)
    ids = [m.groups() for line in lines for m in _DOMAIN.finditer(line)]
    sites = dict(Site.objects.filter(pk__in={int(g[1]) for g in ids}).values_list("pk", "name"))
    fabrics = dict(Fabric.objects.filter(pk__in={int(g[2]) for g in ids if g[2]}).values_list("pk", "name"))
    blocks = dict(Block.objects.filter(pk__in={int(g[3]) for g in ids if g[3]}).values_list("pk", "name"))

    def name(match: re.Match) -> str:
        region, site, fabric, block = match.groups()
        parts = [region, sites.get(int(site), site)]
        parts += [fabrics.get(int(fabric), fabric)] if fabric else []
        parts += [blocks.get(int(block), block)] if block else []
        return "/".join(parts)

    return [_DOMAIN.sub(name, line) for line in lines]


def plan_as_json(result: placement.Plan | placement.Refusal) -> dict:
    if isinstance(result, placement.Refusal):
        return {
            "placed": False,
            "reasons": humanize(result.reasons),
            "explanation": humanize(result.explanation),
        }
    hosts = {
        h.pk: h
        for h in Host.objects.filter(pk__in=[int(i) for i in result.host_ids]).select_related(
            "site", "fabric", "block", "provider"
        )
    }
    data = asdict(result)
    data["placed"] = True
    data["explanation"] = humanize(result.explanation)
    data["warnings"] = [
        line.removeprefix(placement.WARNING_PREFIX)
        for line in data["explanation"]
        if line.startswith(placement.WARNING_PREFIX)
    ]
    data["nodes"] = [
        {
            "rank": rank,
            "host_id": int(node.host_id),
            "gpu_indices": list(node.gpu_indices),
            **_host_facts(hosts.get(int(node.host_id))),
        }
        for rank, node in enumerate(result.nodes)
    ]
    return data


def _host_facts(host: Host | None) -> dict:
    if host is None:
        return {}
    return {
        "host": host.name,
        "provider": host.provider.name,
        "region": host.site.region,
        "site": host.site.name,
        "fabric": host.fabric.name,
        "fabric_kind": host.fabric.kind,
        "block": host.block.name,
        "price_per_gpu_hour": str(host.price_per_gpu_hour),
    }


def request_cluster(team: Team, user: AbstractBaseUser, spec: dict) -> Cluster:
    """Record a cluster request (PENDING) and queue its placement. InvalidSpec if it can never fit."""
    validate_spec(spec)
    with transaction.atomic():
        cluster = Cluster.objects.create(
            team=team,
            created_by=user,
            name=spec.get("name") or "cluster",
            priority=spec.get("priority", 0),
            spec=spec,
        )
        transitions.ClusterEvent.objects.create(cluster=cluster, to_status=S.PENDING, message="requested")
        _queue_placement(cluster.pk)
    return cluster


def _queue_placement(cluster_id: int) -> None:
    from clusters.tasks import place_cluster_task

    transaction.on_commit(lambda: place_cluster_task.delay(cluster_id))


def place_cluster(cluster_id: int) -> Cluster:
    """Place a PENDING or QUEUED cluster: allocate its plan, or queue it with the binding reasons.

    Idempotent: a cluster in any other status is returned unchanged.
    """
    cluster = Cluster.objects.get(pk=cluster_id)
    if cluster.status not in (S.PENDING, S.QUEUED):
        return cluster
    try:
        first = None
        if cluster.status == S.QUEUED:
            place_now, first = _plan_queued(cluster)
            if not place_now:
                return Cluster.objects.get(pk=cluster_id)
        transitions.transition(cluster, S.PLACING, "placement started")
        return _place_placing(cluster, first)
    except IllegalTransition as exc:
        # Another worker got there first, or the cluster was terminated while it was being placed: the
        # row moved on, so this task's work is over (allocate() rolled back anything it wrote).
        logger.info("cluster %s: placement ends, the cluster is %s (%s)", cluster_id, exc.current, exc)
        return Cluster.objects.get(pk=cluster_id)


def _plan_queued(cluster: Cluster) -> tuple[bool, placement.Plan | None]:
    """A queued cluster tried again (the queue drains every 30 s and on every release): (whether to
    place it now, the plan that fits if one was made).

    Still waiting writes no timeline event and changes no status: it keeps the one "waiting for
    capacity" event of when it was queued, and only a reason that changed is stored and announced. (A
    retry used to go QUEUED -> PLACING -> QUEUED: two events and two status broadcasts each time.) A
    spec that no longer validates goes the usual way, to FAILED with its problems.
    """
    try:
        result = _plan(validate_spec(cluster.spec), cluster.team_id)
    except InvalidSpec:
        return True, None  # _place_placing fails it, naming the problems
    if isinstance(result, placement.Plan):
        return True, result
    reason = "; ".join(result.reasons) or "no capacity"
    if reason != cluster.queue_reason:
        changed = Cluster.objects.filter(pk=cluster.pk, status=S.QUEUED).update(
            queue_reason=reason, plan=plan_as_json(result), updated_at=timezone.now()
        )
        if changed:  # the page re-reads its reason on a status event
            event = {"kind": "status", "status": S.QUEUED, "reason": reason}
            transaction.on_commit(lambda: realtime.broadcast(f"cluster-{cluster.pk}", event))
    return False, None


def _place_placing(cluster: Cluster, first: placement.Plan | None = None) -> Cluster:
    """Plan and allocate a PLACING cluster, or queue or fail it. IllegalTransition if it moved meanwhile.
    `first`: a plan just made for it (a queued cluster's retry), allocated before planning again."""
    try:
        request = validate_spec(cluster.spec)
    except InvalidSpec as exc:
        return _fail(cluster, FailureReason.CONFIG_INVALID, "; ".join(exc.problems))
    for attempt in range(PLACEMENT_ATTEMPTS):
        result = first if attempt == 0 and first is not None else _plan(request, cluster.team_id)
        if isinstance(result, placement.Refusal):
            return _enqueue(cluster, result)
        try:
            return allocate(cluster, result)
        except CapacityChanged as exc:
            logger.info("cluster %s: %s; re-planning", cluster.pk, exc)
    refusal = placement.Refusal(("capacity kept changing while placing; retrying from the queue",))
    return _enqueue(cluster, refusal)


def _enqueue(cluster: Cluster, refusal: placement.Refusal) -> Cluster:
    reason = "; ".join(refusal.reasons) or "no capacity"
    extra = {"queue_reason": reason, "plan": plan_as_json(refusal)}
    if cluster.queued_at is None:
        extra["queued_at"] = timezone.now()
    return transitions.transition(cluster, S.QUEUED, f"waiting for capacity: {reason}", extra=extra)


def _fail(cluster: Cluster, reason: str, message: str) -> Cluster:
    release(cluster)
    return transitions.transition(
        cluster,
        S.FAILED,
        message,
        extra={"failure_reason": reason, "failure_message": message, "ended_at": timezone.now()},
    )


def connection_details(cluster: Cluster, viewer: AbstractBaseUser | None = None) -> dict | None:
    """The READY hand-off: what a researcher (or a pipeline) needs to use the cluster.

    The cluster's Ray token is in it only for `viewer`s who are members of the cluster's team (a
    platform admin who is not gets a placeholder); list views pass no viewer.
    """
    if cluster.status not in (S.READY, S.DEGRADED, S.RECOVERING) or not cluster.ray_address:
        return None
    token = cluster_ray_token(cluster) if viewer is not None and is_team_member(viewer, cluster) else None
    shown = token or "<the cluster's Ray token: shown to its team on the cluster's page>"
    head = next((n for n in cluster.nodes.all() if n.is_head and n.released_at is None), None)
    ssh = None
    if head is not None and head.host.driver == "ssh":
        user = head.host.ssh_user or "root"
        ssh = f"ssh -i volt-cluster-{cluster.pk}.key -p {head.host.ssh_port} {user}@{head.host.address}"
    return {
        "ray_address": cluster.ray_address,
        "dashboard_url": cluster.dashboard_url,
        "job_submission_address": cluster.dashboard_url,
        "ssh_command": ssh,
        "storage_path": cluster.storage_path,
        "ssh_key_url": f"/api/v1/clusters/{cluster.pk}/ssh-key/",
        "ray_auth_token": token,
        "snippet": (
            f"# the cluster refuses calls without its token (Ray token authentication)\n"
            f"export RAY_AUTH_MODE=token RAY_AUTH_TOKEN={shown}\n"
            f"RAY_ADDRESS={cluster.dashboard_url} ray job submit --working-dir . -- python train.py\n"
            f"# or from Python:\nfrom ray.job_submission import JobSubmissionClient\n"
            f'client = JobSubmissionClient("{cluster.dashboard_url}", '
            f'headers={{"Authorization": "Bearer {shown}"}})\n'
            f'client.submit_job(entrypoint="python train.py", runtime_env={{"working_dir": "."}})\n'
            f"# checkpoints: write them under {cluster.storage_path} (shared by every node)"
        ),
    }


def is_team_member(user: AbstractBaseUser, cluster: Cluster) -> bool:
    """Whether `user` belongs to the cluster's team (platform admins are not members by their role)."""
    return bool(user.is_authenticated) and cluster.team.memberships.filter(user=user).exists()


def cluster_ray_token(cluster: Cluster) -> str:
    """The cluster's Ray token in clear, for its team and Volt's own calls ("" before provisioning)."""
    from clusters import tenancy

    return tenancy.ray_auth_token(cluster)


def record_training_resumed(cluster_id: int, job_id: int, attempt: int, at) -> bool:
    """A resubmitted job stepped again: its recovery's record counts its lost GPU-hours up to `at`."""
    from clusters import recovery

    return recovery.training_resumed(cluster_id, job_id, attempt, at)


def cluster_private_key(cluster: Cluster) -> str:
    """The cluster's SSH private key (OpenSSH), for Volt's own use; people get it via download_cluster_key."""
    from voltweb import crypto

    return crypto.decrypt(cluster.ssh_private_key_encrypted)


class KeyNotYours(Exception):
    """Only members of the cluster's team download its key (platform admins included: not theirs)."""


def download_cluster_key(cluster: Cluster, user: AbstractBaseUser) -> str:
    """The cluster's private key for a member of its team, audited on the cluster's timeline.

    Returns "" while the cluster has no key yet (nothing is audited then). Raises KeyNotYours for
    anyone outside the team: a platform admin sees every cluster but holds no team's key.
    """
    if not accounts.is_team_member(user, cluster.team):
        raise KeyNotYours(
            f"Only members of {cluster.team.name} download this cluster's SSH key; platform admins see "
            "every cluster but do not hold teams' keys."
        )
    key = cluster_private_key(cluster)
    if key:
        transitions.ClusterEvent.objects.create(
            cluster=cluster, message=f"SSH private key downloaded by {user.get_username()}", actor=user
        )
    return key


def terminate_cluster(
    cluster: Cluster, actor: AbstractBaseUser | None = None, *, wait: bool = False
) -> Cluster:
    """Cancel a waiting cluster at once; send a running one to TERMINATING.

    Stopping its Ray processes, removing its key and freeing its GPUs is host work, so a worker does it
    (terminate_cluster_task, after commit; the reaper re-sends it if that worker dies). `wait=True`
    does it in this call instead: for workers, scripts and tests, never a web request.
    """
    if cluster.status in (S.PENDING, S.PLACING, S.QUEUED):
        return transitions.transition(
            cluster, S.TERMINATED, f"cancelled by {actor or 'system'}", extra={"ended_at": timezone.now()}
        )
    if cluster.status not in LIVE:
        raise IllegalTransition(cluster, cluster.status, S.TERMINATING)
    cluster = transitions.transition(
        cluster, S.TERMINATING, f"terminate requested by {actor or 'system'}; stopping its Ray processes"
    )
    if wait:
        return finish_termination(cluster)
    from clusters.tasks import terminate_cluster_task

    cluster_id = cluster.pk
    transaction.on_commit(lambda: terminate_cluster_task.delay(cluster_id))
    return cluster


def finish_termination(cluster: Cluster) -> Cluster:
    """Stop every process the cluster started (only on hosts where provisioning reached), then release.

    Its jobs are stopped first (hooks registered by the jobs app), so they end STOPPED with the reason.
    """
    from clusters import drills, hooks, provision, tenancy

    hooks.before_teardown(cluster)

    drills.clear_drill_faults(cluster)  # a host its drill made `unreachable` answers the teardown again
    started = list(cluster.nodes.filter(slot__isnull=False).select_related("host__provider"))
    if started:
        problems = provision.teardown(cluster, started, final=True)
    else:  # ended before any node started: its user (made before the hosts were prepared) may exist
        problems = tenancy.remove_node_user(cluster)
    release(cluster)
    detail = f"; could not reach {'; '.join(problems)}" if problems else ""
    cluster = transitions.transition(
        cluster,
        S.TERMINATED,
        f"Ray processes stopped and GPUs released{detail}",
        extra={"ended_at": timezone.now()},
    )
    drills.end_drills(cluster)  # cordons after its drills lifted: they end with the cluster
    return cluster


# --- the queue ---------------------------------------------------------------------------------------


def queued() -> QuerySet[Cluster]:
    """Queued clusters in placement order: priority first, then first come first served."""
    return Cluster.objects.filter(status=S.QUEUED).order_by(F("priority").desc(), "queued_at", "id")


def queue_position(cluster: Cluster) -> int | None:
    """1-based position in the queue, or None when not queued."""
    if cluster.status != S.QUEUED:
        return None
    ahead = queued().filter(priority__gt=cluster.priority).count()
    ahead += queued().filter(priority=cluster.priority, queued_at__lt=cluster.queued_at).count()
    ahead += (
        queued().filter(priority=cluster.priority, queued_at=cluster.queued_at, id__lt=cluster.pk).count()
    )
    return ahead + 1


def drain_queue(budget_s: float = DRAIN_BUDGET_S) -> int:
    """Try every queued cluster in priority then FIFO order; returns how many were placed.

    A cluster that still does not fit stays queued (quietly: _plan_queued) and the next one is tried (no
    reservation), so a small request can start while large ones wait, however many wait ahead of it
    (the first 100 only, before). Stops after `budget_s`; the next drain starts from the head again.
    """
    deadline = time.monotonic() + budget_s
    placed = tried = 0
    ids = list(queued().values_list("id", flat=True))
    for cluster_id in ids:
        if time.monotonic() > deadline:
            logger.warning(
                "queue drain stopped after %.0f s: %d of %d queued clusters tried", budget_s, tried, len(ids)
            )
            break
        cluster = place_cluster(cluster_id)
        placed += cluster.status in HOLDS_GPUS
        tried += 1
    return placed


def kick_queue() -> None:
    """Ask a worker to drain the queue now (capacity changed)."""
    from clusters.tasks import drain_queue_task

    if Cluster.objects.filter(status=S.QUEUED).exists():
        drain_queue_task.delay()


def reap_stuck_provisioning(older_than_s: int | None = None) -> int:
    """PROVISIONING/VERIFYING/TERMINATING with no progress past the deadline: the worker died. Re-queue.

    Provisioning steps are idempotent and beat `updated_at` as they go, so the new task carries on.
    """
    from django.conf import settings

    from clusters.tasks import provision_cluster_task, terminate_cluster_task

    stale_s = settings.VOLT_PROVISION_STALE_S if older_than_s is None else older_than_s
    deadline = timezone.now() - timezone.timedelta(seconds=stale_s)
    stuck = Cluster.objects.filter(
        status__in=[S.PROVISIONING, S.VERIFYING, S.TERMINATING], updated_at__lt=deadline
    )
    count = 0
    for cluster in stuck:
        Cluster.objects.filter(pk=cluster.pk).update(updated_at=timezone.now())
        task = terminate_cluster_task if cluster.status == S.TERMINATING else provision_cluster_task
        task.delay(cluster.pk)
        count += 1
    return count


def reap_cluster_leftovers(limit: int = 5) -> dict:
    """What ended clusters could not undo at their end, tried again: their Unix user (a host that did not
    answer, a process that would not die) and their drills' faults and cordons (a worker that died
    between the final status and their end). `limit` users per run, least recently tried first (one that
    keeps failing goes to the back). Returns counts."""
    from clusters import drills, provision, tenancy

    pending = (
        Cluster.objects.filter(status__in=TERMINAL, node_user_removed_at__isnull=True)
        .exclude(node_user="")
        .order_by("updated_at", "pk")[:limit]
    )
    users = 0
    for cluster in pending:
        problems = tenancy.remove_node_user(cluster)
        if problems:
            Cluster.objects.filter(pk=cluster.pk).update(updated_at=timezone.now())
            logger.warning("cluster %s: its Unix user is still there: %s", cluster.pk, "; ".join(problems))
        else:
            users += 1
            provision.note(cluster, f"Unix user {cluster.node_user} removed (it could not be at the end)")
    ended = 0
    open_pks = inventory.open_drill_cluster_pks()
    live = set(
        Cluster.objects.filter(pk__in=open_pks).exclude(status__in=TERMINAL).values_list("pk", flat=True)
    )
    for cluster_pk in sorted(open_pks - live):
        cluster = Cluster.objects.filter(pk=cluster_pk).first()
        if cluster is not None:
            drills.end_drills(cluster)
        else:  # deleted: its drills end all the same
            inventory.end_drills(cluster_pk, f"cluster #{cluster_pk} deleted")
        ended += 1
    return {"node_users_removed": users, "clusters_drills_ended": ended}


def reap_stuck_placing(older_than_s: int = 120) -> int:
    """PLACING past the deadline means the worker died mid-placement: queue the cluster again.

    Allocation is one transaction, so a cluster still PLACING holds no GPUs and is safe to re-place.
    """
    deadline = timezone.now() - timezone.timedelta(seconds=older_than_s)
    reaped = 0
    for cluster in Cluster.objects.filter(status=S.PLACING, updated_at__lt=deadline):
        try:
            _enqueue(cluster, placement.Refusal(("placement was interrupted; retrying",)))
            reaped += 1
        except IllegalTransition:
            continue
    if reaped:
        kick_queue()
    return reaped
