"""Metric samples of clusters: record, read a series for a time range, compact with retention.

Raw samples live VOLT_METRICS_RAW_RETENTION_H (a day); `compact()` folds every finished minute into a
`MetricMinute` (count/mean/min/max) and deletes raw rows past retention, and minutes past
VOLT_METRICS_MINUTE_RETENTION_D (30 days). A range read answers raw samples where they still exist and
per-minute means before that, so a chart over a week and one over the last minute use one call.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Avg, Count, Max, Min
from django.db.models.functions import TruncMinute
from django.utils import timezone

from clusters.choices import MetricSource
from clusters.models import Cluster, MetricMinute, MetricSample
from voltweb import realtime


@dataclass(frozen=True)
class Point:
    """One value of a series as the API and the console see it."""

    ts: datetime
    value: float
    host: str | None
    source: str
    aggregated: bool = False


def record(
    cluster: Cluster, series: str, value: float, *, host=None, source: str = MetricSource.WATCH, ts=None
) -> MetricSample:
    """Store one sample."""
    return MetricSample.objects.create(
        cluster=cluster, host=host, series=series, value=value, source=source, ts=ts or timezone.now()
    )


def record_many(samples: Iterable[MetricSample]) -> list[MetricSample]:
    """Store a sweep's samples in one INSERT."""
    return MetricSample.objects.bulk_create(list(samples))


def record_busbw(cluster: Cluster, busbw_gbps: float, source: str = MetricSource.PROBE) -> MetricSample:
    """A bandwidth sample (the probe's largest busbw), pushed to the cluster's page after commit."""
    sample = record(cluster, "busbw", busbw_gbps, source=source)
    realtime.broadcast(
        f"cluster-{cluster.pk}",
        {
            "kind": "bandwidth",
            "ts": sample.ts.isoformat(),
            "busbw_gbps": busbw_gbps,
            "predicted_busbw_gbps": cluster.predicted_busbw_gbps,
            "source": source,
        },
    )
    return sample


def series(cluster: Cluster, name: str, since: datetime, until: datetime | None = None) -> list[Point]:
    """Points of `name` in [since, until]: per-minute means where raw samples are gone, raw after."""
    until = until or timezone.now()
    raw = MetricSample.objects.filter(cluster=cluster, series=name, ts__gte=since, ts__lte=until)
    first_raw = raw.order_by("ts").values_list("ts", flat=True).first()
    # Minutes that still have raw samples are answered raw (the minute holding the first one included).
    minutes_until = first_raw.replace(second=0, microsecond=0) if first_raw is not None else until
    minutes = MetricMinute.objects.filter(
        cluster=cluster, series=name, minute__gte=since, minute__lt=minutes_until
    ).select_related("host")
    points = [
        Point(m.minute, m.mean, m.host.name if m.host else None, m.source, aggregated=True) for m in minutes
    ]
    points += [
        Point(s.ts, s.value, s.host.name if s.host else None, s.source) for s in raw.select_related("host")
    ]
    return sorted(points, key=lambda p: p.ts)


def compact(now: datetime | None = None) -> dict[str, int]:
    """Aggregate finished minutes not yet aggregated, then apply both retentions. Idempotent."""
    now = now or timezone.now()
    this_minute = now.replace(second=0, microsecond=0)
    raw_cutoff = now - timedelta(hours=settings.VOLT_METRICS_RAW_RETENTION_H)
    minute_cutoff = now - timedelta(days=settings.VOLT_METRICS_MINUTE_RETENTION_D)
    # Minutes from the latest aggregated one on are (re)computed from their raw rows; earlier ones are done.
    # Raw rows past retention are aggregated before they go (compaction may have been down a while).
    latest = MetricMinute.objects.aggregate(latest=Max("minute"))["latest"]
    earliest = MetricSample.objects.aggregate(earliest=Min("ts"))["earliest"]
    start = latest or earliest or this_minute
    groups = (
        MetricSample.objects.filter(ts__gte=start, ts__lt=this_minute)
        .annotate(minute=TruncMinute("ts"))
        .values("cluster_id", "host_id", "series", "source", "minute")
        .annotate(count=Count("id"), mean=Avg("value"), minimum=Min("value"), maximum=Max("value"))
    )
    rows = [MetricMinute(**group) for group in groups]
    with transaction.atomic():
        # Only minutes recomputed from raw rows are replaced; older aggregates have no raw rows left.
        MetricMinute.objects.filter(minute__in={row.minute for row in rows}).delete()
        MetricMinute.objects.bulk_create(rows)
        raw_deleted, _ = MetricSample.objects.filter(ts__lt=raw_cutoff).delete()
        minutes_deleted, _ = MetricMinute.objects.filter(minute__lt=minute_cutoff).delete()
    return {"minutes": len(rows), "raw_deleted": raw_deleted, "minutes_deleted": minutes_deleted}
