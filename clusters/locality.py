"""Waiting for locality within a bound (issue 28.1; Slurm's `--switches=N@max-time` is the anchor).

A collective request that Volt would spread across sites because no site has room *now* runs many times
slower and holds GPUs that in-site work would use well. So it may wait — up to a bound — for a tighter
span: `wait_for_locality: [{"level": "site", "max_wait_s": 1800}]` in its spec ("one site, up to 30 min;
then anywhere, with the warning"), several levels allowed (block first, then site, ...). Collective
multi-node requests that say nothing get VOLT_LOCALITY_WAIT_S at the site level. A request no single
domain of a level could ever hold (capacity, not occupancy) never waits for that level.

While a wait holds, placement plans the request with that level *required*; a refusal queues it with what
it waits for and until when. Past the bound it is planned as written, and the plan says it waited.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.core.cache import cache
from django.db.models import Case, Count, F, When

from clusters.choices import ConstraintMode, TopologyLevel
from clusters.placement import PlacementRequest
from inventory import services as inventory
from inventory.choices import HostState, ProviderStatus
from inventory.models import Host

# Tightest first; each level's domain as a Host field.
LEVELS = (TopologyLevel.BLOCK, TopologyLevel.FABRIC, TopologyLevel.SITE, TopologyLevel.REGION)
DOMAIN_FIELD = {
    TopologyLevel.BLOCK: "block_id",
    TopologyLevel.FABRIC: "fabric_id",
    TopologyLevel.SITE: "site_id",
    TopologyLevel.REGION: "site__region",
}
MAX_WAIT_S = 7 * 24 * 3600


@dataclass(frozen=True)
class Wait:
    level: str
    until: datetime
    max_wait_s: int


def waits_of(spec: dict, request: PlacementRequest) -> list[dict]:
    """The request's locality waits, tightest level first: its own, or the default for a collective one."""
    asked = spec.get("wait_for_locality")
    if asked is None:
        default = settings.VOLT_LOCALITY_WAIT_S
        asked = (
            [{"level": TopologyLevel.SITE, "max_wait_s": default}]
            if default and request.is_collective()
            else []
        )
    return sorted(
        (w for w in asked if int(w.get("max_wait_s") or 0) > 0), key=lambda w: LEVELS.index(w["level"])
    )


def current_wait(spec: dict, request: PlacementRequest, requested_at: datetime, now: datetime) -> Wait | None:
    """The wait in force now: the tightest level whose bound has not passed, that the request does not
    already require (or something tighter), and that some domain of it could ever hold."""
    if request.nodes < 2:
        return None
    for wait in waits_of(spec, request):
        level, bound = wait["level"], int(wait["max_wait_s"])
        until = requested_at + timedelta(seconds=bound)
        if now >= until:
            continue
        if request.topology_mode == ConstraintMode.REQUIRED and _rank(request.topology_level) <= _rank(level):
            return None  # it already requires as tight a span: nothing to wait for
        if could_ever_hold(request, level):
            return Wait(level, until, bound)
    return None


def narrowed(request: PlacementRequest, wait: Wait) -> PlacementRequest:
    """The request as planned while `wait` holds: its level required."""
    return at_level(request, wait.level)


def at_level(request: PlacementRequest, level: str) -> PlacementRequest:
    """The request with `level` required (one site, one region...)."""
    return replace(request, topology_level=level, topology_mode=ConstraintMode.REQUIRED)


def could_tighten(request: PlacementRequest, level: str) -> bool:
    """Whether holding a collective multi-node request to one `level` is worth planning: it does not
    already require as tight a span, and one domain of the level could ever hold it."""
    if not request.is_collective():
        return False
    if request.topology_mode == ConstraintMode.REQUIRED and _rank(request.topology_level) <= _rank(level):
        return False
    return could_ever_hold(request, level)


def could_ever_hold(request: PlacementRequest, level: str) -> bool:
    """Whether one domain of `level` has enough hosts (whatever their state, short of gone; free or not)
    able to give a node of the request: capacity, not occupancy."""
    kinds = (
        sorted(request.interconnect_kinds()) if request.interconnect_mode == ConstraintMode.REQUIRED else []
    )
    key = (
        f"clusters:locality:{inventory.capacity_version()}:{level}:{request.gpus_per_node}:"
        f"{','.join(sorted(request.models))}:{','.join(sorted(request.regions))}:{','.join(kinds)}:"
        f"{request.max_price_per_gpu_hour}"
    )
    largest = cache.get(key)
    if largest is None:
        largest = _largest_domain(request, level)
        cache.set(key, largest, 300)
    return largest >= request.nodes


def _largest_domain(request: PlacementRequest, level: str) -> int:
    node_size = Case(When(nvlink_domain_size__gt=1, then=F("nvlink_domain_size")), default=F("gpu_count"))
    hosts = (
        Host.objects.exclude(state__in=[HostState.RETIRED, HostState.FAILED])
        .filter(provider__status=ProviderStatus.APPROVED, gpu_model__in=request.models)
        .annotate(node_size=node_size)
        .filter(node_size__gte=request.gpus_per_node)
    )
    # The hard filters placement applies (clusters/planning.py _hard_filters): hosts a plan could never use
    # make no domain worth waiting for.
    if request.regions:
        hosts = hosts.filter(site__region__in=request.regions)
    if request.interconnect_mode == ConstraintMode.REQUIRED and request.interconnect:
        hosts = hosts.filter(fabric__kind__in=request.interconnect_kinds())
    if request.max_price_per_gpu_hour is not None:
        hosts = hosts.filter(price_per_gpu_hour__lte=Decimal(str(request.max_price_per_gpu_hour)))
    counts = hosts.values(DOMAIN_FIELD[level]).annotate(n=Count("id")).values_list("n", flat=True)
    return max(counts, default=0)


def waiting_reason(wait: Wait, reasons: str) -> str:
    """The queue's reason while a wait holds: what it waits for, until when, and why not now."""
    return (
        f"waiting for one {wait.level} until {wait.until:%Y-%m-%d %H:%M} UTC (then anywhere, with a "
        f"warning): {reasons}"
    )


def _rank(level: str | None) -> int:
    """Finest first: one host below every level, "global" (across regions) above them all."""
    if level in LEVELS:
        return LEVELS.index(level)
    return -1 if level == "host" else len(LEVELS)


def waited_warning(
    spec: dict, request: PlacementRequest, spanned_level: str | None, requested_at: datetime, now: datetime
) -> str:
    """The plan's warning when a request that waited for locality was placed wider after its bound (not
    when it never waited: a level no domain could ever hold, or a bound not reached)."""
    waits = [
        w for w in waits_of(spec, request)
        if now >= requested_at + timedelta(seconds=int(w["max_wait_s"])) and could_ever_hold(request, w["level"])
    ]  # fmt: skip
    if not waits or request.nodes < 2:
        return ""
    wanted = waits[-1]  # the loosest level it waited for
    if _rank(spanned_level) <= _rank(wanted["level"]):
        return ""
    minutes = int(wanted["max_wait_s"]) // 60
    return (
        f"waited {minutes} min (its bound) for one {wanted['level']}; none had room, so it spans one "
        f"{spanned_level}"
    )


def parse_wait(text: str) -> dict:
    """`site:30m` (CLI, console) → {"level": "site", "max_wait_s": 1800}; ValueError saying what to write."""
    level, _, span = text.strip().partition(":")
    if level not in LEVELS:
        raise ValueError(f"{text!r}: the level is one of {', '.join(LEVELS)} (e.g. site:30m)")
    seconds = parse_duration(span)
    return {"level": level, "max_wait_s": seconds}


def parse_duration(text: str, maximum: int = MAX_WAIT_S) -> int:
    """`90s`, `30m`, `4h`, `2d` or a number of seconds → seconds (at most `maximum`); ValueError otherwise."""
    text = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a duration: write 90s, 30m, 4h or 2d") from None
    if not value > 0 or value * units[unit] > maximum:
        raise ValueError(f"{text!r}: a duration above 0 and at most {maximum // 86400}d")
    return int(round(value * units[unit]))
