"""Team quotas, enforced (issue 28 item 3; Kueue's ClusterQueue nominal quota is the anchor).

A team's `voltweb.models.TeamQuota` caps the GPUs its clusters hold at once (in all, and per GPU model)
and its GPU-hours per calendar month (UTC). Use is read from the allocation table, never estimated: GPUs
in use are its active allocations; GPU-hours are each allocation's held time inside the month.

```
request_cluster ─▶ never_fits(): more GPUs asked than a cap allows, ever → QuotaNeverFits (400), nothing
                   recorded; the message says to ask for fewer GPUs or a platform admin for more quota
place_cluster   ─▶ narrow(): models whose cap has no room are left out of the request; nothing left, the
                   team's cap or its spent budget → the cluster queues with "over quota: …" and the figure
allocations.allocate ─▶ admit(): under the TeamQuota row lock (taken before the hosts' locks), recount
                   and refuse (OverQuota → queued): racing placements of one team pass one at a time
release         ─▶ kick_queue → the drain retries queued clusters; one over quota starts once use drops
set_team_quota  ─▶ drains the queue after commit: a raised cap starts what waited for it
```

The budget admits a cluster while the month's GPU-hours are under it (a cluster has no duration yet to
count ahead), so a month can end slightly over budget; the next cluster then waits for the next month.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, Sum, Value
from django.db.models.functions import Coalesce, Greatest, Least
from django.utils import timezone

from clusters import placement
from clusters.models import Allocation
from inventory import services as inventory
from voltweb.domain import DomainError
from voltweb.models import Team, TeamQuota


class OverQuota(Exception):
    """The placement would put the team over its quota now: the cluster queues with this reason."""


class QuotaNeverFits(DomainError):
    """The request asks for more GPUs than the team's quota ever allows: refused at submission."""

    code = "over_quota"
    status = 400


@dataclass(frozen=True)
class QuotaUse:
    """What a team uses against its quota now: GPUs held (in all, per precise model) and GPU-hours held
    since the month began."""

    gpus_in_use: int = 0
    gpus_by_model: dict[str, int] = field(default_factory=dict)
    gpu_hours_this_month: float = 0.0

    def gpus_of(self, capped_name: str) -> int:
        """GPUs in use that a cap named `capped_name` counts (a family counts its variants)."""
        return sum(
            n for model, n in self.gpus_by_model.items() if inventory.model_matches(capped_name, model)
        )


def month_start(now: datetime | None = None) -> datetime:
    """The first instant of `now`'s calendar month, UTC."""
    now = timezone.localtime(now or timezone.now(), UTC)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month_start(now: datetime | None = None) -> datetime:
    start = month_start(now)
    return (start + timedelta(days=32)).replace(day=1)


def use_of(team_ids, now: datetime | None = None) -> dict[int, QuotaUse]:
    """Each team's use, in two queries whatever the number of teams (lists and pages call it once)."""
    team_ids = list(team_ids)
    now = now or timezone.now()
    by_model: dict[int, dict[str, int]] = {pk: {} for pk in team_ids}
    held = (
        Allocation.objects.filter(active=True, cluster__team_id__in=team_ids)
        .values_list("cluster__team_id", "gpu__model")
        .annotate(n=Count("id"))
        .order_by()
    )
    for team_id, model, count in held:
        by_model[team_id][model] = count
    hours = gpu_hours_between(team_ids, month_start(now), now)
    return {pk: QuotaUse(sum(by_model[pk].values()), by_model[pk], hours.get(pk, 0.0)) for pk in team_ids}


def gpu_hours_between(team_ids, start: datetime, end: datetime) -> dict[int, float]:
    """GPU-hours each team's clusters held between `start` and `end`: every allocation's time inside the
    window (allocated → released, or still held), summed in the database."""
    until = Least(Coalesce(F("released_at"), Value(end)), Value(end))
    held = ExpressionWrapper(until - Greatest(F("allocated_at"), Value(start)), output_field=DurationField())
    rows = (
        Allocation.objects.filter(cluster__team_id__in=list(team_ids), allocated_at__lt=end)
        .filter(Q(released_at__isnull=True) | Q(released_at__gt=start))
        .values("cluster__team_id")
        .annotate(held=Sum(held))
        .order_by()
    )
    return {row["cluster__team_id"]: row["held"].total_seconds() / 3600 for row in rows if row["held"]}


# --- the rules --------------------------------------------------------------------------------------------


def tightest_cap(quota: TeamQuota, model: str) -> tuple[str, int] | None:
    """The per-model cap that binds `model` (a precise model, or a name asked for): the smallest of the
    caps whose name matches it, with that name; None when no cap names it."""
    caps = [
        (name, cap)
        for name, cap in (quota.gpu_model_caps or {}).items()
        if inventory.model_matches(name, model) or inventory.model_matches(model, name)
    ]
    return min(caps, key=lambda item: item[1]) if caps else None


def _budget_reason(team: Team, quota: TeamQuota, use: QuotaUse, now: datetime) -> str:
    budget = quota.gpu_hours_per_month
    if budget is None or use.gpu_hours_this_month < budget:
        return ""
    renews = next_month_start(now)
    return (
        f"over quota: {team.name} used {use.gpu_hours_this_month:,.1f} of {budget:,} GPU-hours this month "
        f"(the budget renews {renews:%Y-%m-%d} UTC, or a platform admin raises it)"
    )


def _cap_reason(team: Team, quota: TeamQuota, use: QuotaUse, asked: int) -> str:
    if quota.max_gpus is None or use.gpus_in_use + asked <= quota.max_gpus:
        return ""
    return (
        f"over quota: {team.name} would use {use.gpus_in_use + asked} of {quota.max_gpus} GPUs "
        f"({use.gpus_in_use} in use + {asked} asked)"
    )


def _model_reason(team: Team, quota: TeamQuota, use: QuotaUse, asked: int, model: str) -> str:
    cap = tightest_cap(quota, model)
    if cap is None:
        return ""
    name, limit = cap
    in_use = use.gpus_of(name)
    if in_use + asked <= limit:
        return ""
    return (
        f"over quota: {team.name} would use {in_use + asked} of {limit} {name} GPUs "
        f"({in_use} in use + {asked} asked)"
    )


def never_fits(team: Team, request: placement.PlacementRequest) -> None:
    """Refuse (QuotaNeverFits) a request no use of the team's could ever let start: more GPUs than its
    cap, more of every model asked than that model's cap, or a budget of 0 GPU-hours."""
    quota = TeamQuota.objects.filter(team=team).first()
    if quota is None or quota.is_unlimited:
        return
    asked = request.nodes * request.gpus_per_node
    fix = f"Request at most {{limit}} GPUs, or ask a platform admin to raise {team.name}'s quota"
    if quota.max_gpus is not None and asked > quota.max_gpus:
        raise QuotaNeverFits(
            f"{team.name}'s quota allows {quota.max_gpus} GPUs in use at once and this request asks for "
            f"{asked}: it could never start. {fix.format(limit=quota.max_gpus)}."
        )
    caps = [tightest_cap(quota, model) for model in request.models]
    if caps and all(cap is not None and asked > cap[1] for cap in caps):
        limits = ", ".join(f"{cap[1]} {cap[0]}" for cap in caps)
        largest = max(cap[1] for cap in caps)
        raise QuotaNeverFits(
            f"{team.name}'s quota allows {limits} GPUs in use at once and this request asks for {asked}: it "
            f"could never start. {fix.format(limit=largest)} (or another GPU model)."
        )
    if quota.gpu_hours_per_month == 0:
        raise QuotaNeverFits(
            f"{team.name}'s quota gives it 0 GPU-hours a month: no cluster can start. Ask a platform admin "
            "to give the team a GPU-hour budget."
        )


def narrow(
    team: Team, request: placement.PlacementRequest, now: datetime | None = None
) -> tuple[placement.PlacementRequest, str]:
    """The request placement may plan for now, within the team's quota: models whose cap has no room left
    are taken out. Returns (request, "") or (request, the "over quota: …" reason to queue with). No lock:
    admit() decides, under the quota row's lock."""
    quota = TeamQuota.objects.filter(team=team).first()
    if quota is None or quota.is_unlimited:
        return request, ""
    now = now or timezone.now()
    use = use_of([team.pk], now)[team.pk]
    asked = request.nodes * request.gpus_per_node
    reason = _budget_reason(team, quota, use, now) or _cap_reason(team, quota, use, asked)
    if reason:
        return request, reason
    reasons = {model: _model_reason(team, quota, use, asked, model) for model in request.models}
    room = tuple(model for model in request.models if not reasons[model])
    if not room:
        return request, next(iter(reasons.values()))
    return (replace(request, models=room) if room != request.models else request), ""


@dataclass(frozen=True)
class Planned:
    """GPUs a queued request of the team is planned to hold from `start` until `end` (None: for ever)."""

    start: datetime
    end: datetime | None
    gpus: int
    model: str


class TeamRoom:
    """A team's quota against its use over time, for the queue's reservations (clusters/reservations.py):
    its clusters' GPUs held until their requested ends (`Cluster.ends_at`; none: for ever), and the GPUs its
    other queued requests are planned to hold. Read once per request planned (one query, two with a
    budget).

    A monthly budget is projected forward: what the team will have used in a time's calendar month by
    then (so far this month, its clusters running on, its planned requests) must leave room, as admission
    will ask at that time; a month that starts later starts from nothing."""

    def __init__(self, team: Team, quota: TeamQuota, now: datetime):
        self.team, self.quota, self.now = team, quota, now
        self.held = list(
            Allocation.objects.filter(active=True, cluster__team=team).values_list(
                "gpu__model", "cluster__ends_at"
            )
        )
        self.renews: datetime | None = None  # the budget is spent: nothing starts before it renews
        self.spent = 0.0  # GPU-hours this month so far
        if quota.gpu_hours_per_month is not None:
            self.spent = gpu_hours_between([team.pk], month_start(now), now).get(team.pk, 0.0)
            if self.spent >= quota.gpu_hours_per_month:
                self.renews = next_month_start(now)

    def spent_by(self, at: datetime, planned: list[Planned]) -> float:
        """GPU-hours the team will have used in `at`'s calendar month by `at`."""
        start = month_start(at)
        total = self.spent if start == month_start(self.now) else 0.0
        since = max(start, self.now)

        def hours(begin: datetime, end: datetime | None) -> float:
            stop = at if end is None else min(end, at)
            return max(0.0, (stop - max(begin, since)).total_seconds() / 3600)

        total += sum(hours(since, until) for _, until in self.held)  # one row per GPU
        total += sum(other.gpus * hours(other.start, other.end) for other in planned)
        return total

    @classmethod
    def of(cls, team: Team, now: datetime) -> TeamRoom | None:
        """None for a team without a quota (or an unlimited one)."""
        quota = TeamQuota.objects.filter(team=team).first()
        return None if quota is None or quota.is_unlimited else cls(team, quota, now)

    def times(self) -> set[datetime]:
        """When its room may grow: its clusters' ends, and the budget's renewal."""
        renewal = self.renews or (
            next_month_start(self.now) if self.quota.gpu_hours_per_month is not None else None
        )
        return {end for _, end in self.held if end is not None} | ({renewal} if renewal else set())

    def models_at(
        self, request: placement.PlacementRequest, at: datetime, end: datetime | None, planned: list[Planned]
    ) -> tuple[str, ...]:
        """The models of `request` whose caps leave room for it over [at, end), counting every cluster of
        the team still running at `at` and every planned request overlapping that run; () if none."""
        if self.renews is not None and at < self.renews:
            return ()
        budget = self.quota.gpu_hours_per_month
        if budget is not None and at > self.now and self.spent_by(at, planned) >= budget:
            return ()  # admission at `at` would find the month's budget spent
        by_model: dict[str, int] = {}
        for model, until in self.held:
            if until is None or until > at:
                by_model[model] = by_model.get(model, 0) + 1
        for other in planned:
            if (end is None or other.start < end) and (other.end is None or other.end > at):
                by_model[other.model] = by_model.get(other.model, 0) + other.gpus
        use = QuotaUse(sum(by_model.values()), by_model, 0.0)
        asked = request.nodes * request.gpus_per_node
        if _cap_reason(self.team, self.quota, use, asked):
            return ()
        return tuple(m for m in request.models if not _model_reason(self.team, self.quota, use, asked, m))


def admit(team_id: int, gpus: int, model: str) -> None:
    """Within the caller's transaction, lock the team's quota row and raise OverQuota unless `gpus` more
    `model` GPUs fit it now. Every placement of the team takes this lock first (then the hosts'), so racing
    placements count each other's allocations: the cap holds however many race."""
    quota = TeamQuota.objects.select_for_update().filter(team_id=team_id).select_related("team").first()
    if quota is None or quota.is_unlimited:
        return
    now = timezone.now()
    use = use_of([team_id], now)[team_id]
    reason = (
        _budget_reason(quota.team, quota, use, now)
        or _cap_reason(quota.team, quota, use, gpus)
        or _model_reason(quota.team, quota, use, gpus, model)
    )
    if reason:
        raise OverQuota(reason)


@dataclass(frozen=True)
class TeamQuotaView:
    """A team's quota and use, for its page and the API: limits beside the figures they bound."""

    team: Team
    quota: TeamQuota | None
    use: QuotaUse
    month_start: datetime

    @property
    def models(self) -> list[dict]:
        """Per capped model, and per model in use: GPUs in use and the cap (None: no cap)."""
        caps = dict((self.quota.gpu_model_caps or {}) if self.quota else {})
        rows = [{"model": name, "in_use": self.use.gpus_of(name), "cap": cap} for name, cap in caps.items()]
        capped = {row["model"] for row in rows}
        rows += [
            {"model": model, "in_use": count, "cap": None}
            for model, count in sorted(self.use.gpus_by_model.items())
            if not any(inventory.model_matches(name, model) for name in capped)
        ]
        return rows

    def as_json(self) -> dict:
        limits = self.quota.as_json() if self.quota else TeamQuota(team=self.team).as_json()
        return {
            "team": self.team.slug,
            **limits,
            "use": {
                "gpus_in_use": self.use.gpus_in_use,
                "gpus_by_model": self.models,
                "gpu_hours_this_month": round(self.use.gpu_hours_this_month, 3),
                "month_start": self.month_start.isoformat(),
            },
            "updated_at": self.quota.updated_at.isoformat() if self.quota else None,
            "updated_by": self.quota.updated_by.get_username()
            if self.quota and self.quota.updated_by
            else None,
        }


def quota_views(teams) -> list[TeamQuotaView]:
    """Quota and use of each team (its `quota` selected with it), in a fixed number of queries."""
    teams = list(teams)
    now = timezone.now()
    uses = use_of([t.pk for t in teams], now)
    return [TeamQuotaView(t, getattr(t, "quota", None), uses[t.pk], month_start(now)) for t in teams]
