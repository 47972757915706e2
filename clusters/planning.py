"""Planning: from the database to the placement engine and back, without allocating anything.

Rows become the engine's frozen snapshots (clusters/placement/), a request is validated against what
inventory could ever offer, previews and placements are planned over free capacity, and a plan becomes
the JSON the API, the timeline and the console show. Operations (clusters.services: placing and the
queue; clusters.provisioning: replacing hosts) call this; it calls nothing above it.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import asdict, replace
from decimal import Decimal

from django.conf import settings as django_settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db.models import Case, Count, Exists, F, OuterRef, QuerySet, When
from django.utils import timezone

from clusters import network_paths, placement, quotas
from clusters.choices import BandwidthSource
from clusters.models import Allocation, BandwidthSample, Cluster
from inventory import services as inventory
from inventory.choices import HostState, ProviderStatus
from inventory.models import Block, Fabric, Host, Site
from voltweb import services as accounts
from voltweb.models import Team

MEASURED_MAX_AGE_DAYS = 7


class InvalidSpec(ValueError):
    """The request cannot ever be met as written; `problems` say what to change."""

    def __init__(self, problems):
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


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
    samples = (
        BandwidthSample.objects.filter(measured_at__gte=since)
        .exclude(source_local=True, emulated=False)
        .exclude(level__in=network_paths.OVER)  # an overlay's cost, not a domain's (network_paths.cost)
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
    if team is not None:  # the team's quota, as a request would meet it (clusters/quotas.py)
        try:
            quotas.never_fits(team, request)
        except quotas.QuotaNeverFits as exc:
            return placement.Refusal(reasons=(str(exc),))
        request, over_quota = quotas.narrow(team, request)
        if over_quota:
            return placement.Refusal(reasons=(f"{over_quota}: the request would queue until it fits",))
    return plan_request(request, team.pk if team is not None else None)


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


def plan_request(
    request: placement.PlacementRequest, team_id: int | None = None, avoid_hosts: frozenset[str] = frozenset()
) -> placement.Plan | placement.Refusal:
    """Plan `request` over free capacity (for team `team_id`), leaving out `avoid_hosts` (host ids held for
    queued requests' reservations: clusters/reservations.py)."""
    measured = measured_bandwidth()
    try:
        narrow = _without(candidate_inventory(request, team_id=team_id), avoid_hosts)
        band = django_settings.VOLT_PLACEMENT_PRICE_BAND
        result = placement.plan(request, narrow, measured, validate_inventory=False, price_band=band)
        if isinstance(result, placement.Refusal):  # rare: look again with every host to explain why
            wide = _without(candidate_inventory(request, narrow=False, team_id=team_id), avoid_hosts)
            result = placement.plan(request, wide, measured, validate_inventory=False, price_band=band)
    except placement.InvalidRequest as exc:
        raise InvalidSpec(exc.problems) from None
    if isinstance(result, placement.Plan):  # the engine knows topology; the path is reachability's
        result = network_paths.annotate(result, request)
    return _explain_other_teams(request, team_id, result)


def _without(index: placement.Inventory, avoid_hosts: frozenset[str]) -> placement.Inventory:
    if not avoid_hosts or not avoid_hosts & index.hosts.keys():
        return index  # the cached index, untouched
    return placement.Inventory(h for h in index.hosts.values() if h.host_id not in avoid_hosts)


def schedulable_snapshots(request: placement.PlacementRequest) -> list[placement.HostSnapshot]:
    """Snapshots of every offerable host that could give a node of `request` once its GPUs are free,
    whatever they hold now (the hard filters applied): what a reservation plans over."""
    hosts = inventory.offerable_hosts().filter(
        gpu_model__in=request.models, gpu_count__gte=request.gpus_per_node
    )
    return snapshots_of(_hard_filters(hosts, request))


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
