"""Cluster telemetry API: a metric series over a time range, and an on-demand bandwidth probe."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from clusters.api.serializers import ClusterSerializer
from clusters.choices import MetricSeries
from clusters.models import Cluster
from clusters.telemetry import bandwidth_watch, metrics
from voltweb.api.errors import ErrorResponseSerializer

ERRORS = {400: ErrorResponseSerializer, 401: ErrorResponseSerializer, 404: ErrorResponseSerializer}
MAX_POINTS = 10_000


class MetricsQuerySerializer(serializers.Serializer):
    series = serializers.ChoiceField(choices=MetricSeries.choices, default=MetricSeries.BUSBW)
    since = serializers.DateTimeField(required=False, help_text="ISO 8601; default: one hour ago.")
    until = serializers.DateTimeField(required=False, help_text="ISO 8601; default: now.")

    def validate(self, attrs):
        attrs.setdefault("until", timezone.now())
        attrs.setdefault("since", attrs["until"] - timedelta(hours=1))
        if attrs["since"] > attrs["until"]:
            raise serializers.ValidationError({"since": ["since must not be after until."]})
        return attrs


class MetricPointSerializer(serializers.Serializer):
    ts = serializers.DateTimeField()
    value = serializers.FloatField()
    host = serializers.CharField(allow_null=True, help_text="The host measured; null for the whole cluster.")
    source = serializers.CharField(help_text="probe, watch or job.")
    aggregated = serializers.BooleanField(help_text="A per-minute mean (raw samples are kept one day).")


class MetricsSerializer(serializers.Serializer):
    series = serializers.CharField()
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    predicted_busbw_gbps = serializers.FloatField(allow_null=True)
    truncated = serializers.BooleanField(help_text=f"More than {MAX_POINTS} points: narrow the range.")
    points = MetricPointSerializer(many=True)


class ProbeSettingsSerializer(serializers.Serializer):
    probe_interval_min = serializers.IntegerField(
        min_value=0, max_value=10_080, allow_null=True,
        help_text="Minutes between probes while the cluster is idle; 0: off; null: the default.",
    )  # fmt: skip


class ClusterTelemetryViewSet(viewsets.GenericViewSet):
    """Telemetry of your teams' clusters (another team's cluster is a 404, as everywhere)."""

    queryset = Cluster.objects.none()
    serializer_class = MetricsSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Cluster.objects.none()
        return Cluster.objects.visible_to(self.request.user)

    @extend_schema(
        parameters=[MetricsQuerySerializer],
        responses={200: MetricsSerializer, **ERRORS},
    )
    @action(detail=True, methods=["get"])
    def metrics(self, request, pk=None):
        """One series of the cluster over [since, until]: raw samples of the last day, per-minute means
        (kept 30 days) before that. Series: busbw (GB/s, from probes), gpu_temp_c, gpu_util_pct,
        gpu_memory_used_mib, gpu_power_w (per host, from the cluster watch every few seconds)."""
        cluster = self.get_object()
        query = MetricsQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        q = query.validated_data
        points = metrics.series(cluster, q["series"], q["since"], q["until"])
        body = {
            "series": q["series"],
            "since": q["since"],
            "until": q["until"],
            "predicted_busbw_gbps": cluster.predicted_busbw_gbps,
            "truncated": len(points) > MAX_POINTS,
            "points": [vars(p) for p in points[-MAX_POINTS:]],
        }
        return Response(MetricsSerializer(body).data)

    @extend_schema(request=None, responses={202: ClusterSerializer, 409: ErrorResponseSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    def probe(self, request, pk=None):
        """Measure the cluster's all-reduce bandwidth now (the light probe, in the background): answers 202;
        the result is a `busbw` sample (GET metrics/?series=busbw) and, below the flag fraction of the
        prediction, the cluster's `bandwidth_alert` naming the slow host when one stands out."""
        cluster = self.get_object()
        bandwidth_watch.request_probe(cluster, request.user)
        return Response(ClusterSerializer(cluster).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=ProbeSettingsSerializer, responses={200: ClusterSerializer, **ERRORS})
    @action(detail=True, methods=["patch"], url_path="probe-settings")
    def probe_settings(self, request, pk=None):
        """How often the cluster is probed while idle (its own setting; null: VOLT_PROBE_INTERVAL_MIN)."""
        cluster = self.get_object()
        body = ProbeSettingsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        cluster = bandwidth_watch.set_probe_interval(cluster, body.validated_data["probe_interval_min"])
        return Response(ClusterSerializer(cluster).data)
