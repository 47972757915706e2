"""Requested durations (issue 28.2): a cluster may ask for `duration_s`; it runs from placement
(`Cluster.ends_at`). VOLT_DURATION_WARN_S before the end the timeline (and the page, live) warns; at the
end Volt terminates it, unless a team member extended it. Beat runs `expire_clusters` every 30 s.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from clusters import reservations, services, transitions
from clusters.choices import HOLDS_GPUS, ClusterStatus
from clusters.models import Cluster
from voltweb import realtime
from voltweb import services as accounts
from voltweb.domain import DomainError
from voltweb.statemachine import IllegalTransition

logger = logging.getLogger(__name__)
RUNNING = HOLDS_GPUS - {ClusterStatus.TERMINATING}
MAX_DURATION_S = 30 * 24 * 3600


def describe(seconds: float) -> str:
    """4h 30m, 45m, 20s: a duration for people."""
    seconds = max(0, int(round(seconds)))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days}d" if days else "", f"{hours}h" if hours else "", f"{minutes}m" if minutes else ""]
    text = " ".join(p for p in parts if p)
    return text or f"{secs}s"


def time_left_s(cluster: Cluster, now: datetime | None = None) -> float | None:
    """Seconds until its requested duration runs out (0 once it has); None without one or once ended."""
    if cluster.ends_at is None or cluster.status not in RUNNING:
        return None
    return max(0.0, (cluster.ends_at - (now or timezone.now())).total_seconds())


def expire_clusters(now: datetime | None = None) -> dict:
    """Warn the clusters whose end is near; terminate those whose end has come. Returns the counts."""
    now = now or timezone.now()
    warn = timedelta(seconds=settings.VOLT_DURATION_WARN_S)
    counts = {"warned": 0, "terminated": 0}
    due = Cluster.objects.filter(status__in=RUNNING, ends_at__isnull=False, ends_at__lte=now + warn)
    for cluster in due.order_by("ends_at"):
        if cluster.ends_at <= now:
            counts["terminated"] += _end(cluster, now)
        elif cluster.end_warned_at is None:
            counts["warned"] += _warn(cluster, now)
    return counts


def _warn(cluster: Cluster, now: datetime) -> int:
    left = describe((cluster.ends_at - now).total_seconds())
    message = (
        f"its requested duration ends at {cluster.ends_at:%Y-%m-%d %H:%M} UTC (in {left}); Volt terminates it "
        "then unless a team member extends it"
    )
    with transaction.atomic():
        if not Cluster.objects.filter(
            pk=cluster.pk, end_warned_at__isnull=True, ends_at=cluster.ends_at, status=cluster.status
        ).update(end_warned_at=now):
            return 0  # extended, ending, or another beat warned first
        transitions.note(cluster, message, status=cluster.status)
    event = {"kind": "duration", "ends_at": cluster.ends_at.isoformat(), "warning": message}
    transaction.on_commit(lambda: realtime.broadcast(f"cluster-{cluster.pk}", event))
    return 1


def _end(cluster: Cluster, now: datetime) -> int:
    asked = describe(cluster.spec.get("duration_s") or 0)
    try:
        with transaction.atomic():
            fresh = Cluster.objects.select_for_update().get(pk=cluster.pk)
            if fresh.ends_at is None or fresh.ends_at > now or fresh.status not in RUNNING:
                return 0  # extended meanwhile, or already ending
            transitions.note(fresh, f"its requested duration ({asked}, with extensions) ran out")
            services.terminate_cluster(fresh)
    except IllegalTransition as exc:
        logger.info("cluster %s: not terminated at its duration's end: %s", cluster.pk, exc)
        return 0
    return 1


class CannotExtend(DomainError):
    code = "cannot_extend"
    status = 409


class NotYourTeam(DomainError):
    code = "team_members_only"
    status = 403


def extend(cluster: Cluster, user: AbstractBaseUser, seconds: int) -> Cluster:
    """Move the cluster's end `seconds` later (team members; audited on its timeline)."""
    if not accounts.is_team_member(user, cluster.team):
        raise NotYourTeam(f"Only members of {cluster.team.name} extend its clusters.")
    if not 0 < seconds <= MAX_DURATION_S:
        raise CannotExtend(
            f"Extend by more than 0 and at most {describe(MAX_DURATION_S)} ({seconds} s asked)."
        )
    with transaction.atomic():
        fresh = Cluster.objects.select_for_update().get(pk=cluster.pk)
        if fresh.status not in RUNNING:
            raise CannotExtend(f"{fresh.name} is {fresh.status}: only a running cluster is extended.")
        if fresh.ends_at is None:
            raise CannotExtend(f"{fresh.name} has no requested duration: it runs until terminated.")
        # From now at the earliest: an end already past (its termination pending) is not "extended" into
        # another past time.
        base = max(fresh.ends_at, timezone.now())
        new_end = base + timedelta(seconds=seconds)
        window = reservations.conflicts_with_extension(fresh, new_end)
        if window is not None:  # its hosts are promised to a queued request from then
            most = int((window.start - base).total_seconds())
            room = f"extend by at most {describe(most)}" if most >= 60 else "it cannot be extended"
            raise CannotExtend(
                f"{fresh.name}'s hosts are reserved for queued cluster #{window.cluster_id} from "
                f"{window.start:%Y-%m-%d %H:%M} UTC (its start bound): {room}, or end this one and request "
                "again."
            )
        fresh.ends_at = new_end
        fresh.end_warned_at = None
        fresh.save(update_fields=["ends_at", "end_warned_at", "updated_at"])
        transitions.note(
            fresh,
            f"extended by {describe(seconds)} by {user}: now ends at {fresh.ends_at:%Y-%m-%d %H:%M} UTC",
            actor=user,
        )
    event = {"kind": "duration", "ends_at": fresh.ends_at.isoformat(), "warning": ""}
    transaction.on_commit(lambda: realtime.broadcast(f"cluster-{fresh.pk}", event))
    return fresh
