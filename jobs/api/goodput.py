"""Goodput API (issue 28.4): `/api/v1/goodput/` — per team and per provider, per UTC day, where the clusters'
time and GPU-hours went (jobs/goodput.py); `?format=csv` exports the same as rows. One cluster's ledger is
`/api/v1/goodput/clusters/{id}/`, one job's `/api/v1/jobs/{id}/goodput/`.

It lives in the jobs app because a cluster's READY time is split by its jobs (clusters do not read jobs).
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, time, timedelta

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import renderers, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from clusters.models import Cluster
from jobs import goodput
from voltweb.api.errors import ErrorResponseSerializer
from voltweb.services import teams_of

DEFAULT_DAYS = 30
MAX_DAYS = 366
ERRORS = {400: ErrorResponseSerializer, 401: ErrorResponseSerializer, 404: ErrorResponseSerializer}
CSV_COLUMNS = ("day", "team", "provider", "category", "gpu_hours")


class CSVRenderer(renderers.BaseRenderer):
    """Selected by `?format=csv`; the view writes the rows itself (goodput_csv)."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return data if isinstance(data, str | bytes) else str(data)


class FiguresSerializer(serializers.Serializer):
    seconds = serializers.DictField(child=serializers.FloatField(), required=False,
                                    help_text="Cluster-seconds per category (a team's clusters, added up).")  # fmt: skip
    gpu_hours = serializers.DictField(child=serializers.FloatField(), help_text="GPU-hours per category.")


class DayFiguresSerializer(FiguresSerializer):
    day = serializers.DateField(help_text="UTC day.")


class TeamGoodputSerializer(serializers.Serializer):
    team = serializers.CharField(help_text="The team's slug.")
    days = DayFiguresSerializer(many=True)
    totals = FiguresSerializer()


class ProviderGoodputSerializer(serializers.Serializer):
    provider = serializers.CharField()
    days = DayFiguresSerializer(many=True, help_text="GPU-hours only: the provider's GPUs the teams held.")
    totals = FiguresSerializer()


class GoodputSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField(help_text="The window's end (now at the latest).")
    clusters = serializers.IntegerField(help_text="Clusters that lived in the window.")
    categories = serializers.ListField(child=serializers.CharField())
    teams = TeamGoodputSerializer(many=True)
    providers = ProviderGoodputSerializer(many=True)


class SegmentSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    category = serializers.CharField()


class LedgerSerializer(serializers.Serializer):
    start = serializers.DateTimeField(allow_null=True)
    end = serializers.DateTimeField(allow_null=True, help_text="Its end, or now while it lives.")
    wall_s = serializers.FloatField(help_text="Wall-clock seconds: the categories' seconds add up to it.")
    seconds = serializers.DictField(child=serializers.FloatField())
    gpu_hours = serializers.DictField(child=serializers.FloatField(), help_text="From the GPUs' allocations.")
    segments = SegmentSerializer(many=True, help_text="The timeline, one category per segment.")


def window(params) -> tuple[datetime, datetime]:
    """(since, until) from `since` / `until` (a date, UTC midnight, or an ISO time); default: the last 30
    days. Refused with what to do: an unreadable value, an end before the start, more than a year."""
    now = timezone.now()

    def read(name: str, default: datetime) -> datetime:
        raw = (params.get(name) or "").strip()
        if not raw:
            return default
        try:
            moment = parse_datetime(raw)
        except ValueError:  # well formed, but no such time (month 13, hour 25)
            moment = None
        if moment is None and (day := _date(raw)) is not None:
            moment = datetime.combine(day, time(), tzinfo=UTC)
        if moment is None or not 2000 <= moment.year <= 9000:
            raise ValidationError({name: [f"Give a date (2026-12-01) or an ISO time, not {raw[:30]!r}."]})
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)

    since = read("since", datetime.combine(now.date() - timedelta(days=DEFAULT_DAYS), time(), tzinfo=UTC))
    until = read("until", now)
    if until <= since:
        raise ValidationError({"until": [f"Must come after since ({since.isoformat()})."]})
    if until - since > timedelta(days=MAX_DAYS):
        raise ValidationError({"until": [f"At most {MAX_DAYS} days after since: ask for a year at a time."]})
    return since, until


def _date(raw: str):
    try:
        return parse_date(raw)
    except ValueError:
        return None


def goodput_csv(report: dict) -> str:
    """One row per day, team, provider and category with GPU-hours held (categories with none left out)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for team in report["teams"]:
        for day in team["days"]:
            for provider, categories in day["gpu_hours_by_provider"].items():
                for category, hours in categories.items():
                    if hours:
                        writer.writerow([day["day"], team["team"], provider, category, f"{hours:.6f}"])
    return out.getvalue()


class GoodputView(APIView):
    """Where your teams' clusters' time went (platform admins: every team's), by day. (An APIView, not a
    viewset's `list`: the answer is one report, not a collection, and the schema says so.)"""

    renderer_classes = [renderers.JSONRenderer, renderers.BrowsableAPIRenderer, CSVRenderer]

    @extend_schema(
        parameters=[
            OpenApiParameter("team", str, description="A team's slug (default: every team of yours)."),
            OpenApiParameter("since", str, description=f"Date or ISO time (default: {DEFAULT_DAYS} days ago)."),
            OpenApiParameter("until", str, description=f"Date or ISO time (default: now); at most {MAX_DAYS} days."),
            OpenApiParameter("format", str, enum=["json", "csv"], description="`csv`: day, team, provider, category, gpu_hours rows."),
        ],
        responses={200: GoodputSerializer, **ERRORS},
    )  # fmt: skip
    def get(self, request):
        """Per team and per provider, per UTC day: cluster-seconds and GPU-hours split into productive,
        queued, provisioning, verification, checkpoint_save, recovery, lost_work, idle and teardown — from
        the recorded timelines, not estimated."""
        since, until = window(request.query_params)
        teams = teams_of(request.user)
        slug = (request.query_params.get("team") or "").strip()
        if slug:
            if not teams.filter(slug=slug).exists():
                yours = ", ".join(teams.values_list("slug", flat=True)[:10]) or "none"
                raise ValidationError({"team": [f"No team {slug[:50]!r} of yours (yours: {yours})."]})
            teams = teams.filter(slug=slug)
        report = goodput.by_day(Cluster.objects.filter(team__in=teams), since, until, by_provider=True)
        if request.accepted_renderer.format == "csv":
            response = HttpResponse(goodput_csv(report), content_type="text/csv; charset=utf-8")
            response["Content-Disposition"] = (
                f'attachment; filename="goodput-{since:%Y%m%d}-{until:%Y%m%d}.csv"'
            )
            return response
        for team in report["teams"]:
            for day in team["days"]:
                day.pop("gpu_hours_by_provider", None)
        return Response(report)


class GoodputClusterViewSet(viewsets.GenericViewSet):
    """One cluster's ledger: `/api/v1/goodput/clusters/{id}/`."""

    queryset = Cluster.objects.none()
    serializer_class = LedgerSerializer
    pagination_class = None

    @extend_schema(responses={200: LedgerSerializer, **ERRORS})
    @action(detail=False, methods=["get"], url_path=r"clusters/(?P<cluster_id>\d+)")
    def cluster(self, request, cluster_id=None):
        """One cluster's ledger: its life from request to end (or now), by category, with its timeline."""
        cluster = get_object_or_404(Cluster.objects.visible_to(request.user), pk=cluster_id)
        return Response(goodput.cluster_ledger(cluster))
