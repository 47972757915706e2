"""Reservations and backfill for the queue (issue 28 item 2; Slurm's backfill scheduler is the anchor).

Every queue drain, `schedule()` walks the queue in placement order (priority, then first come) and gives
each of its first VOLT_QUEUE_RESERVATIONS requests a reservation: the earliest time it could start, and
the hosts it would start on, from what runs now and when that ends (the clusters' requested durations,
`Cluster.ends_at`). The time is the request's start bound, shown on its page and in the API.

    now, and each end of a running cluster or of an earlier reservation, in order:
        free GPUs at T = free now + the GPUs of clusters that end by T
        hosts left out = those still serving another team at T, and those of earlier reservations whose
                         window overlaps this request's [T, T + its duration)
        the first T the placement engine can plan the request on → its reservation

Starting anything now (a new request, or one further down the queue) leaves out the hosts of every
reservation whose window overlaps its own [now, now + duration): a request that ends before a
reservation starts may use its hosts, one that runs elsewhere may start at once (backfill), and one
without a duration never touches reserved hosts. Reservations are whole hosts, so a backfilled request
can never take GPUs a reservation counted on. A request is late for its bound only when a cluster ran
past its end (Volt terminates it within a beat), a host failed, or a request of higher priority arrived;
the next drain plans again.

A cluster without a duration never ends, as far as this module knows: GPUs it holds are never counted
on, and a request that needs them gets no bound ("held by clusters without a duration"). A request of a
team with a quota is planned only at times its team has room for it (`quotas.TeamRoom`: the team's
clusters held until their requested ends, its earlier reservations, a spent budget's renewal), so one over
quota now is planned from when its team's own clusters leave room; it gets no bound when that room depends
on clusters without a duration, or when it is beyond the reservation depth.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db.models import Case, F, Value, When
from django.utils import timezone

from clusters import locality, placement, planning, quotas
from clusters.choices import HOLDS_GPUS, ClusterStatus
from clusters.models import Allocation, Cluster
from inventory.choices import GpuHealth
from inventory.models import GPU, Host
from voltweb import locks, realtime

logger = logging.getLogger(__name__)
NO_BOUND_NO_DURATION = (
    "no start bound yet: the GPUs it needs are held by clusters without a duration (a bound is set once "
    "enough of them have an end)"
)
TIMES_PER_REQUEST = 64  # candidate start times planned per request, at most
BUDGET_S = 20.0  # schedule()'s share of a drain (DRAIN_BUDGET_S, 60 s)
SPAN = "site"  # a collective request is reserved in one site when one could hold it
LOCK_KEY = "queue-reservations-planning"
LOCK_SLACK_S = 60  # the lock outlives the planning budget by this much, then a dead holder's expires


def span_of(cluster: Cluster, now: datetime) -> str | None:
    """The span a queued cluster waits for until its reservation starts: "site" when its reserved hosts
    are in one site and the reservation is still ahead (it starts there, not earlier across sites)."""
    if cluster.reserved_from is None or now >= cluster.reserved_from or not cluster.reserved_hosts:
        return None
    if cluster.spec.get("wait_for_locality") == []:  # it asked never to wait for locality
        return None
    sites = Host.objects.filter(pk__in=cluster.reserved_hosts).values("site_id").distinct().count()
    return SPAN if sites == 1 else None


@dataclass(frozen=True)
class Window:
    """Hosts reserved for one queued cluster from `start` until `end` (None: it asks for no duration)."""

    cluster_id: int
    start: datetime
    end: datetime | None
    host_ids: frozenset[str]
    gpus: int = 0  # what it counts against its team's quota over the window
    model: str = ""

    def overlaps(self, start: datetime, end: datetime | None) -> bool:
        return (end is None or self.start < end) and (self.end is None or self.end > start)


@dataclass
class _Held:
    """A host's active allocations, (team, its cluster's end or None, GPU index), and the NVLink domain of
    each of its healthy GPUs by index."""

    gpus: list[tuple[int, datetime | None, int]]
    domain_of: dict[int, int]


def duration_of(spec: dict) -> timedelta | None:
    seconds = spec.get("duration_s")
    return timedelta(seconds=int(seconds)) if seconds else None


def schedule(now: datetime | None = None, budget_s: float = BUDGET_S) -> dict[int, Window | None]:
    """Plan the reservations of the queue's first VOLT_QUEUE_RESERVATIONS requests and store them on
    their rows (`reserved_from`, `reserved_until`, `reserved_hosts`, or the reason there is no bound).
    Returns them by cluster id (None: no bound). Past `budget_s` the rest keep what they had (the drain
    must still place), and one request's planning error is logged and noted, never the drain's end.

    One drain plans at a time (a lock in Volt's cache, Redis): two workers draining at once would each
    plan every reservation against the other's half-written windows. A drain that finds the lock taken
    plans none and places against the stored ones ({} returned); a lock left by a dead worker expires."""
    token = uuid.uuid4().hex
    if not cache.add(LOCK_KEY, token, timeout=int(budget_s) + LOCK_SLACK_S):
        logger.info("reservations: another drain is planning them; this one places against the stored ones")
        return {}
    try:
        return _schedule(now, budget_s)
    finally:
        locks.release(LOCK_KEY, token)  # only its own: one that expired and was retaken stays


def _schedule(now: datetime | None, budget_s: float) -> dict[int, Window | None]:
    now = now or timezone.now()
    deadline = time.monotonic() + budget_s
    depth = settings.VOLT_QUEUE_RESERVATIONS
    # Those holding a reservation first, earliest first: a reservation given is kept, or moved earlier, so
    # a later arrival of higher priority never pushes a bound back; then the rest of the queue.
    held_first = Case(When(reserved_from__isnull=False, then=Value(0)), default=Value(1))
    ordered = Cluster.objects.queued().order_by(
        held_first, F("reserved_from").asc(nulls_last=True), F("priority").desc(), "queued_at", "id"
    )
    queue = list(ordered.select_related("team")[:depth]) if depth else []
    held = _held_gpus()
    ends = sorted({end for host in held.values() for _, end, _ in host.gpus if end is not None})
    windows: list[Window] = []
    team_planned: dict[int, list[quotas.Planned]] = {}  # what each team's reservations hold of its quota
    result: dict[int, Window | None] = {}
    for cluster in queue:
        if time.monotonic() > deadline:
            logger.warning(
                "reservations: planning stopped after %.0f s; the rest keep their bounds", budget_s
            )
            return result
        try:
            window, why = _reserve(
                cluster, now, held, ends, windows, team_planned.setdefault(cluster.team_id, [])
            )
        except Exception:  # one request's bad state must not stop the queue from draining
            logger.exception("cluster %s: planning its reservation failed", cluster.pk)
            window, why = None, "no start bound: planning it failed (see the worker's log)"
        result[cluster.pk] = window
        if window is not None:
            windows.append(window)
            team_planned[cluster.team_id].append(
                quotas.Planned(window.start, window.end, window.gpus, window.model)
            )
        _store(cluster, window, why)
    # Clusters that left the queue dropped their reservation as they left (transitions.transition); beyond
    # the depth, nothing is reserved (and nothing stale stays): they get bounds as they move up.
    stale = Cluster.objects.filter(status=ClusterStatus.QUEUED).exclude(pk__in=[c.pk for c in queue])
    stale.exclude(reserved_from=None, start_bound_note="").update(
        reserved_from=None,
        reserved_until=None,
        reserved_hosts=[],
        start_bound_note=f"no start bound yet: bounds are set for the first {depth} in the queue",
    )
    return result


def avoid_for(cluster: Cluster, now: datetime | None = None) -> tuple[frozenset[str], list[Window]]:
    """The hosts `cluster` may not start on now: those of other queued clusters' reservations whose
    windows overlap its own run from now. Returns (host ids, the windows that hold them)."""
    now = now or timezone.now()
    duration = duration_of(cluster.spec)
    return reserved_during(now, now + duration if duration else None, exclude=cluster.pk)


def reserved_during(
    start: datetime, end: datetime | None, exclude: int | None = None
) -> tuple[frozenset[str], list[Window]]:
    """The hosts held by queued clusters' reservations (other than `exclude`'s) whose windows overlap
    [start, end) (end None: for ever). Returns (host ids, the windows that hold them)."""
    rows = (
        Cluster.objects.filter(status=ClusterStatus.QUEUED, reserved_from__isnull=False)
        .exclude(pk=exclude)
        .values_list("pk", "reserved_from", "reserved_until", "reserved_hosts")
    )
    windows = [Window(pk, first, until, frozenset(map(str, hosts))) for pk, first, until, hosts in rows]
    binding = [w for w in windows if w.overlaps(start, end)]
    return frozenset().union(*(w.host_ids for w in binding)), binding


def avoided_line(windows: list[Window], duration: timedelta | None) -> str:
    """A refusal's line naming the reservations a request had to leave alone."""
    hosts = len(frozenset().union(*(w.host_ids for w in windows)))
    first = min(w.start for w in windows)
    why = (
        "it asks for no duration, so it may not use them at all"
        if duration is None
        else "it would not end before they start"
    )
    return (
        f"{hosts} host{'s' if hosts != 1 else ''} reserved for {len(windows)} request"
        f"{'s' if len(windows) != 1 else ''} ahead in the queue (the first from "
        f"{first:%Y-%m-%d %H:%M} UTC): {why}"
    )


def conflicts_with_extension(cluster: Cluster, new_end: datetime) -> Window | None:
    """The earliest reservation on `cluster`'s hosts that its run until `new_end` would overlap (an
    extension past it would break that request's start bound), or None."""
    hosts = {str(h) for h in cluster.allocations.filter(active=True).values_list("gpu__host_id", flat=True)}
    rows = (
        Cluster.objects.filter(status=ClusterStatus.QUEUED, reserved_from__isnull=False)
        .exclude(pk=cluster.pk)
        .order_by("reserved_from")
        .values_list("pk", "reserved_from", "reserved_until", "reserved_hosts")
    )
    for pk, start, end, reserved in rows:
        window = Window(pk, start, end, frozenset(map(str, reserved)))
        # Only a reservation from after its current end counted on its hosts being free then (one that
        # starts earlier shares the host with it, on other GPUs).
        if window.host_ids & hosts and cluster.ends_at <= start < new_end:
            return window
    return None


# --- planning at a future time ------------------------------------------------------------------------


def _reserve(
    cluster: Cluster,
    now: datetime,
    held: dict[str, _Held],
    ends: list[datetime],
    windows: list[Window],
    team_planned: list[quotas.Planned],
) -> tuple[Window | None, str]:
    try:
        request = planning.validate_spec(cluster.spec)
    except planning.InvalidSpec:
        return None, "no start bound: the request no longer fits the inventory"
    # A team with a quota: each candidate time is checked against what the team holds then, its clusters
    # until their ends and its earlier reservations (quotas.TeamRoom): over quota now, it is planned from
    # when its team's own clusters leave room; two of its requests never share the same room.
    room = quotas.TeamRoom.of(cluster.team, now)
    duration = duration_of(cluster.spec)
    snapshots = planning.schedulable_snapshots(request)
    candidates = {
        *(e for e in ends if e > now),
        *(w.end for w in windows if w.end and w.end > now),
        *((room.times() | {p.end for p in team_planned if p.end}) if room else ()),
    }
    times = sorted({now, *(t for t in candidates if t > now)})
    # A collective request one site could hold is reserved in one site, however much later that is than a
    # plan across sites: the bound holds either way, and across a WAN it would run many times slower
    # (bench/churn.py: 17-162x). Then, if no site could by any time planned, as written.
    # A spec that says never to wait for locality (`wait_for_locality: []`) is not held to one site.
    never_wait = cluster.spec.get("wait_for_locality") == []
    passes = [SPAN] if not never_wait and locality.could_tighten(request, SPAN) else []
    for span in (*passes, None):
        window = _earliest(
            cluster, request, span, now, times, snapshots, held, windows, duration, room, team_planned
        )
        if window is not None:
            return window, ""
    if len(times) > TIMES_PER_REQUEST:
        return None, (
            f"no start bound yet: it needs more than the next {TIMES_PER_REQUEST} ends of running clusters "
            "(a bound is set as they end)"
        )
    over_quota = quotas.narrow(cluster.team, request, now)[1] if room else ""
    if over_quota:
        return None, (
            f"no start bound while {over_quota}: the team's clusters holding its quota have no "
            "duration (a bound is set once they have an end)"
        )
    return None, NO_BOUND_NO_DURATION


def _earliest(
    cluster, request, span, now, times, snapshots, held, windows, duration, room, team_planned
) -> Window | None:
    """The first of `times` at which `request` (held to one `span`, if given) fits its team's quota and
    plans; None if none does."""
    measured = planning.measured_bandwidth()
    band = settings.VOLT_PLACEMENT_PRICE_BAND
    whole = request
    for at in times[:TIMES_PER_REQUEST]:
        if room is not None:
            models = room.models_at(
                whole, max(at, now), max(at, now) + duration if duration else None, team_planned
            )
            if not models:
                continue
            request = replace(whole, models=models) if models != whole.models else whole
        avoid = frozenset().union(
            *(w.host_ids for w in windows if w.overlaps(at, at + duration if duration else None))
        )
        hosts = [s for s in (_at(snap, held, at, cluster.team_id) for snap in snapshots) if s is not None]
        hosts = [s for s in hosts if s.host_id not in avoid]
        wait = locality.current_wait(cluster.spec, request, cluster.created_at, at)
        planned = locality.at_level(request, span) if span else request
        planned = locality.narrowed(planned, wait) if wait and not span else planned
        try:
            result = placement.plan(planned, hosts, measured, validate_inventory=False, price_band=band)
        except placement.InvalidRequest:
            return None
        if isinstance(result, placement.Plan):
            start = max(at, now)
            end = start + duration if duration else None
            model = next((h.gpu_model for h in hosts if h.host_id in result.host_ids), "")
            gpus = request.nodes * request.gpus_per_node
            return Window(cluster.pk, start, end, frozenset(result.host_ids), gpus, model)
    return None


def _held_gpus() -> dict[str, _Held]:
    """Every active allocation of a cluster holding GPUs, by host: who holds it, until when (two queries)."""
    rows = Allocation.objects.filter(active=True, cluster__status__in=HOLDS_GPUS).values_list(
        "gpu__host_id", "cluster__team_id", "cluster__ends_at", "gpu__index"
    )
    held: dict[str, _Held] = {}
    for host_id, team_id, end, index in rows.iterator(chunk_size=5000):
        held.setdefault(str(host_id), _Held([], {})).gpus.append((team_id, end, index))
    healthy = GPU.objects.filter(host_id__in=[int(h) for h in held], health=GpuHealth.HEALTHY)
    for host_id, domain, index in healthy.values_list("host_id", "nvlink_domain", "index").iterator(5000):
        held[str(host_id)].domain_of[index] = domain
    return held


def _at(
    snap: placement.HostSnapshot, held: dict[str, _Held], at: datetime, team_id: int
) -> placement.HostSnapshot | None:
    """The host as it will be at `at` for team `team_id`: the healthy GPUs of clusters that have ended by
    then given back, or None if it still serves another team then (a host serves one team at a time)."""
    host = held.get(snap.host_id)
    if host is None:
        return snap
    freed: set[int] = set()
    for team, end, index in host.gpus:
        ended = end is not None and end <= at
        if not ended and team != team_id:
            return None
        if ended and index in host.domain_of:
            freed.add(index)
    if not freed:
        return snap
    free = {i for domain in snap.free_gpus for i in domain} | freed
    domains: dict[int, list[int]] = {}
    for index in sorted(free):
        domains.setdefault(host.domain_of.get(index, 0), []).append(index)
    return replace(snap, free_gpus=tuple(tuple(domains[d]) for d in sorted(domains)))


def _store(cluster: Cluster, window: Window | None, why: str) -> None:
    fields = {
        "reserved_from": window.start if window else None,
        "reserved_until": window.end if window else None,
        "reserved_hosts": sorted(int(h) for h in window.host_ids) if window else [],
        "start_bound_note": why,
    }
    if all(getattr(cluster, k) == v for k, v in fields.items()):
        return
    Cluster.objects.filter(pk=cluster.pk, status=ClusterStatus.QUEUED).update(**fields)
    # The cluster's page shows its start bound ("Starts by …"): it reloads its static part on this.
    realtime.broadcast(f"cluster-{cluster.pk}", {"kind": "queue"})
    if window is not None and cluster.reserved_from != window.start:
        logger.info(
            "cluster %s: reserved from %s on %d hosts", cluster.pk, window.start, len(window.host_ids)
        )
