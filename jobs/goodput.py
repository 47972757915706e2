"""The goodput ledger (issue 28): where a job's and a cluster's wall-clock time and GPU-hours went.

Every figure is read from what Volt recorded — status timelines (JobEvent, ClusterEvent), the job's first
step per attempt (Job.first_step_at, RecoveryJob.training_resumed_at), its checkpoints' manifest times and
save durations, the recoveries' checkpoint steps, and the GPUs' allocation rows — never estimated. A ledger
splits [start, end) into segments of one category each, so its parts add up to the wall-clock time exactly
(microseconds); GPU-hours integrate the allocations the cluster held over each segment.

Categories:
  queued          the cluster waited for placement (held no GPUs); a job waited for Ray to start it
  provisioning    hosts were brought up; for a job, its processes started until its first training step
  verification    the cluster's verification and all-reduce probe
  productive      training steps that were kept
  checkpoint_save a checkpoint being written (every rank waits for it)
  recovery        from a failure's detection until the resumed job stepped again
  lost_work       training after the checkpoint resumed from, up to the failure: steps done again
  idle            the cluster READY with no job training (or a job waiting in Ray)
  teardown        the cluster terminating
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from django.db.models import Q
from django.utils import timezone

from clusters.choices import ClusterStatus
from clusters.models import Allocation, Cluster, RecoveryJob
from jobs.choices import JobStatus
from jobs.models import Job

CATEGORIES = (
    "productive", "queued", "provisioning", "verification", "checkpoint_save", "recovery", "lost_work",
    "idle", "teardown",
)  # fmt: skip
US = timedelta(microseconds=1)
MAX_SAVE_S = 7 * 86400  # a checkpoint save said to last longer is not believed (the manifest is the job's)
US_PER_HOUR = 3_600_000_000
# What a cluster's status makes of its time, before its jobs are laid over its READY spans.
CLUSTER_CATEGORY = {
    ClusterStatus.PENDING: "queued",
    ClusterStatus.PLACING: "queued",
    ClusterStatus.QUEUED: "queued",
    ClusterStatus.PROVISIONING: "provisioning",
    ClusterStatus.VERIFYING: "verification",
    ClusterStatus.READY: "idle",
    ClusterStatus.DEGRADED: "recovery",
    ClusterStatus.RECOVERING: "recovery",
    ClusterStatus.TERMINATING: "teardown",
}
# On a READY cluster running several jobs at once, an instant counts as the best any job made of it.
JOB_PRIORITY = ("productive", "checkpoint_save", "lost_work", "recovery", "provisioning")


@dataclass(frozen=True)
class Segment:
    start: datetime
    end: datetime
    category: str

    @property
    def us(self) -> int:
        return (self.end - self.start) // US


# ----------------------------------------------------------------------------------------- timelines


def status_spans(
    start: datetime, end: datetime, initial: str, changes: list[tuple[datetime, str]], terminal: set[str]
) -> list[tuple[datetime, datetime, str]]:
    """[(from, to, status)] covering [start, end) from the status changes (time, new status), in order.
    A terminal status entered last ends the record (its time is `end`'s business: finished_at, ended_at)."""
    changes = sorted(changes, key=lambda change: change[0])
    while changes and changes[-1][1] in terminal:
        changes.pop()
    spans, at, status = [], start, initial
    for when, new in changes:
        when = min(max(when, at), end)
        if when > at:
            spans.append((at, when, status))
        at, status = when, new
    if end > at:
        spans.append((at, end, status))
    return spans


def _overlay(base: list[Segment], layers: list[Segment], *, over: set[str] | None = None) -> list[Segment]:
    """`base` with each of `layers` (in increasing precedence) laid over it, where the base's category is
    in `over` (every category when None). Segments stay contiguous and cover exactly what `base` covers."""
    cuts = sorted({s.start for s in base} | {s.end for s in base}
                  | {t for layer in layers for t in (layer.start, layer.end)})  # fmt: skip
    out: list[Segment] = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        if b <= a:
            continue
        under = next((s for s in base if s.start <= a and b <= s.end), None)
        if under is None:
            continue
        category = under.category
        if over is None or category in over:
            for layer in layers:
                if layer.start <= a and b <= layer.end:
                    category = layer.category
        if out and out[-1].category == category and out[-1].end == a:
            out[-1] = Segment(out[-1].start, b, category)
        else:
            out.append(Segment(a, b, category))
    return out


# --------------------------------------------------------------------------------------------- a job


def job_end(job: Job, now: datetime | None = None) -> datetime:
    if job.finished_at is not None and job.status in (
        JobStatus.SUCCEEDED,
        JobStatus.FAILED,
        JobStatus.STOPPED,
    ):
        return job.finished_at
    return now or timezone.now()


def job_segments(job: Job, now: datetime | None = None, resumed_rows: list | None = None) -> list[Segment]:
    """The job's [created_at, finished_at (or now)) split by category (module docstring). `resumed_rows`:
    its RecoveryJob rows, when the caller read them (else they are read here)."""
    end = job_end(job, now)
    if end <= job.created_at:
        return []
    changes = [(e.at, e.to_status) for e in job.events.all() if e.to_status and e.to_status != e.from_status]
    terminal = {JobStatus.SUCCEEDED, JobStatus.STOPPED, JobStatus.FAILED}
    spans = status_spans(job.created_at, end, JobStatus.PENDING, changes, terminal)
    if resumed_rows is None:
        resumed_rows = list(RecoveryJob.objects.filter(job_id=job.pk))
    resumed = {row.attempt: row for row in resumed_rows}
    first_step = {1: job.first_step_at} | {k: row.training_resumed_at for k, row in resumed.items()}
    checkpoints = [c for c in job.checkpoints.all() if c.created is not None]

    # Recovery resubmits a job as its next attempt: interrupted -> pending.
    resubmitted = sorted(e.at for e in job.events.all()
                         if e.from_status == JobStatus.INTERRUPTED and e.to_status == JobStatus.PENDING)  # fmt: skip
    base: list[Segment] = []
    layers: list[Segment] = []
    running: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
    for a, b, status in spans:
        attempt = 1 + sum(1 for at in resubmitted if at <= a)
        if status == JobStatus.RUNNING:
            running[attempt].append((a, b))
            stepped = first_step.get(attempt)
            cut = min(max(stepped, a), b) if stepped is not None else b
            if cut > a:
                base.append(Segment(a, cut, "provisioning" if attempt == 1 else "recovery"))
            if b > cut:
                base.append(Segment(cut, b, "productive"))
        elif status == JobStatus.PENDING and attempt == 1:
            base.append(Segment(a, b, "queued"))
        else:  # interrupted, failed then taken back by recovery, or resubmitted and waiting for Ray
            base.append(Segment(a, b, "recovery"))
    # Checkpoint saves: [manifest time - save duration, manifest time].
    for c in checkpoints:
        if c.save_s and 0 < c.save_s <= MAX_SAVE_S:  # the manifest is the workload's to write: bounded
            layers.append(Segment(c.created - timedelta(seconds=c.save_s), c.created, "checkpoint_save"))
    # Lost work: an interrupted attempt's training after the checkpoint the next attempt resumed from.
    for k, windows in running.items():
        row = resumed.get(k + 1)
        if row is None or not windows:
            continue
        kept = _resumed_checkpoint(checkpoints, row)
        stepped = first_step.get(k)
        start = kept.created if kept is not None else (stepped or windows[0][0])
        if stepped is not None:
            start = max(start, stepped)
        stop = windows[-1][1]
        if stop > start:
            layers.append(Segment(start, stop, "lost_work"))
    return _overlay(base, layers, over={"productive"})


def _resumed_checkpoint(checkpoints, row: RecoveryJob):
    if row.checkpoint_step is None:
        return None
    same = [c for c in checkpoints if c.path == row.checkpoint_path] or [
        c for c in checkpoints if c.step == row.checkpoint_step and c.synchronized
    ]
    return same[0] if same else None


# ----------------------------------------------------------------------------------------- a cluster


def cluster_end(cluster: Cluster, now: datetime | None = None) -> datetime:
    if cluster.ended_at is not None:
        return cluster.ended_at
    return now or timezone.now()


def cluster_segments(
    cluster: Cluster, now: datetime | None = None, resumed_rows: list | None = None
) -> list[Segment]:
    """The cluster's [created_at, ended_at (or now)) split by category; its READY time by its jobs.
    `resumed_rows`: the RecoveryJob rows of its jobs, when the caller read them."""
    end = cluster_end(cluster, now)
    if end <= cluster.created_at:
        return []
    # A note (an audit line, a warning) repeats the status it was written in: not a change, and perhaps
    # stale (written from a row read before the status moved).
    changes = [
        (e.at, e.to_status) for e in cluster.events.all() if e.to_status and e.to_status != e.from_status
    ]
    terminal = {ClusterStatus.TERMINATED, ClusterStatus.FAILED}
    spans = status_spans(cluster.created_at, end, ClusterStatus.PENDING, changes, terminal)
    base = [Segment(a, b, CLUSTER_CATEGORY.get(status, "idle")) for a, b, status in spans]
    layers: list[Segment] = []
    if resumed_rows is None:
        resumed_rows = list(RecoveryJob.objects.filter(recovery__cluster=cluster))
    rows_of: dict[int, list] = defaultdict(list)
    for row in resumed_rows:
        rows_of[row.job_id].append(row)
    jobs = [job_segments(job, end, rows_of.get(job.pk, [])) for job in cluster.jobs.all()]
    for category in reversed(JOB_PRIORITY):  # lowest precedence first
        layers += [s for segments in jobs for s in segments if s.category == category]
    return _overlay(base, layers, over={"idle"})


# ---------------------------------------------------------------------------------------- GPU-hours


def allocation_windows(cluster: Cluster, end: datetime, rows=None) -> list[tuple[datetime, datetime, str]]:
    """(from, to, provider name) for each GPU the cluster held (`rows`: its allocations as
    (allocated_at, released_at, provider name), when the caller read them)."""
    if rows is None:
        rows = Allocation.objects.filter(cluster=cluster).values_list(
            "allocated_at", "released_at", "gpu__host__provider__name"
        )
    return [(a, b or end, provider) for a, b, provider in rows]


def gpu_us(segment: Segment, windows) -> dict[str, int]:
    """GPU-microseconds per provider held during `segment`."""
    held: dict[str, int] = defaultdict(int)
    for a, b, provider in windows:
        overlap = (min(b, segment.end) - max(a, segment.start)) // US
        if overlap > 0:
            held[provider] += overlap
    return held


def summary(segments: list[Segment], windows) -> dict:
    """{"start", "end", "wall_s", "seconds": {category: s}, "gpu_hours": {category: h}, "segments"}."""
    us = dict.fromkeys(CATEGORIES, 0)
    gpu = dict.fromkeys(CATEGORIES, 0)
    for segment in segments:
        us[segment.category] += segment.us
        gpu[segment.category] += sum(gpu_us(segment, windows).values())
    start = segments[0].start if segments else None
    end = segments[-1].end if segments else None
    return {
        "start": start.isoformat() if start else None,
        "end": end.isoformat() if end else None,
        "wall_s": ((end - start) // US) / 1e6 if segments else 0.0,
        "seconds": {c: us[c] / 1e6 for c in CATEGORIES},
        "gpu_hours": {c: round(gpu[c] / US_PER_HOUR, 6) for c in CATEGORIES},
        "segments": [
            {"start": s.start.isoformat(), "end": s.end.isoformat(), "category": s.category} for s in segments
        ],
    }


def job_ledger(job: Job, now: datetime | None = None) -> dict:
    now = now or timezone.now()
    job = Job.objects.select_related("cluster").prefetch_related("events", "checkpoints").get(pk=job.pk)
    segments = job_segments(job, now)
    return summary(segments, allocation_windows(job.cluster, job_end(job, now)))


def cluster_ledger(cluster: Cluster, now: datetime | None = None) -> dict:
    now = now or timezone.now()
    cluster = Cluster.objects.prefetch_related("events", "jobs__events", "jobs__checkpoints").get(
        pk=cluster.pk
    )
    segments = cluster_segments(cluster, now)
    return summary(segments, allocation_windows(cluster, cluster_end(cluster, now)))


# --------------------------------------------------------------------------------- by team, provider, day


def day_pieces(segment: Segment, since: datetime, until: datetime):
    """`segment` clipped to [since, until) and cut at UTC midnights: (day, piece)."""
    a, b = max(segment.start, since), min(segment.end, until)
    while a < b:
        midnight = datetime.combine(a.astimezone(UTC).date() + timedelta(days=1), time(), tzinfo=UTC)
        cut = min(b, midnight)
        yield a.astimezone(UTC).date(), Segment(a, cut, segment.category)
        a = cut


def clusters_between(clusters, since: datetime, until: datetime):
    """The clusters (a queryset) whose life overlaps [since, until), with what a ledger reads prefetched."""
    return (
        clusters.filter(created_at__lt=until)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=since))
        .select_related("team")
        .prefetch_related("events", "jobs__events", "jobs__checkpoints")
        .order_by("created_at", "id")
    )


def by_day(
    clusters, since: datetime, until: datetime, now: datetime | None = None, *, by_provider: bool = False
) -> dict:
    """Per team and per provider, per UTC day: cluster-seconds and GPU-hours by category, over every cluster
    of `clusters` (a queryset) that lived in [since, until). `by_provider`: each team's day also splits its
    GPU-hours by provider (`gpu_hours_by_provider`: {provider: {category: hours}})."""
    now = now or timezone.now()
    until = min(until, now)
    teams: dict[str, dict[date, dict]] = defaultdict(lambda: defaultdict(_empty_day))
    providers: dict[str, dict[date, dict]] = defaultdict(lambda: defaultdict(_empty_day))
    lived = list(clusters_between(clusters, since, until))
    ids = [cluster.pk for cluster in lived]
    held: dict[int, list] = defaultdict(list)
    for cluster_id, *row in Allocation.objects.filter(cluster_id__in=ids).values_list(
        "cluster_id", "allocated_at", "released_at", "gpu__host__provider__name"
    ):
        held[cluster_id].append(row)
    resumed: dict[int, list] = defaultdict(list)
    for row in RecoveryJob.objects.filter(recovery__cluster_id__in=ids).select_related("recovery"):
        resumed[row.recovery.cluster_id].append(row)
    for cluster in lived:
        windows = allocation_windows(cluster, cluster_end(cluster, now), held[cluster.pk])
        for segment in cluster_segments(cluster, now, resumed[cluster.pk]):
            for day, piece in day_pieces(segment, since, until):
                team_day = teams[cluster.team.slug][day]
                team_day["seconds"][piece.category] += piece.us
                for provider, gpu_time in gpu_us(piece, windows).items():
                    team_day["gpu_hours"][piece.category] += gpu_time
                    team_day["by_provider"][provider][piece.category] += gpu_time
                    providers[provider][day]["gpu_hours"][piece.category] += gpu_time
    return {
        "since": since.isoformat(),
        "until": until.isoformat(),
        "clusters": len(lived),
        "categories": list(CATEGORIES),
        "teams": [
            {"team": name, **_rows(days, by_provider=by_provider)} for name, days in sorted(teams.items())
        ],
        "providers": [
            {"provider": name, **_rows(days, seconds=False)} for name, days in sorted(providers.items())
        ],
    }


def _empty_day() -> dict:
    return {
        "seconds": dict.fromkeys(CATEGORIES, 0),
        "gpu_hours": dict.fromkeys(CATEGORIES, 0),
        "by_provider": defaultdict(lambda: dict.fromkeys(CATEGORIES, 0)),
    }


def _hours(us: dict[str, int]) -> dict[str, float]:
    return {c: round(v / US_PER_HOUR, 6) for c, v in us.items()}


def _rows(days: dict, *, seconds: bool = True, by_provider: bool = False) -> dict:
    out, total_s, total_h = [], dict.fromkeys(CATEGORIES, 0), dict.fromkeys(CATEGORIES, 0)
    for day, figures in sorted(days.items()):
        row = {"day": day.isoformat(), "gpu_hours": _hours(figures["gpu_hours"])}
        if seconds:
            row["seconds"] = {c: v / 1e6 for c, v in figures["seconds"].items()}
        if by_provider:
            row["gpu_hours_by_provider"] = {p: _hours(us) for p, us in sorted(figures["by_provider"].items())}
        out.append(row)
        for c in CATEGORIES:
            total_s[c] += figures["seconds"][c]
            total_h[c] += figures["gpu_hours"][c]
    totals = {"gpu_hours": _hours(total_h)}
    if seconds:
        totals["seconds"] = {c: v / 1e6 for c, v in total_s.items()}
    return {"days": out, "totals": totals}


def useful_fraction(gpu_hours: dict[str, float]) -> float | None:
    """Productive GPU-hours over all GPU-hours held (None when none were held)."""
    held = sum(gpu_hours.values())
    return gpu_hours.get("productive", 0) / held if held else None
